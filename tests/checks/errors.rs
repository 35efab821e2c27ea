//! No `Result<_, String>` outside tests: an error is a type that says what
//! went wrong (a variant per reason, the field and the range named), which
//! a caller can match on and a log can label, never a sentence a caller
//! can only print. The check reads every crate's `src` but the testkit's
//! (test code) with syn and names each file and line; code under
//! `#[cfg(test)]`, and the files only such a module includes, are left out.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The `Result<_, String>`s of one file, by line, and the files its
/// `#[cfg(test)] mod name;` declarations include.
#[derive(Default)]
struct Finder {
    lines: Vec<usize>,
    /// Each as its name and its `#[path]`, if it has one.
    test_modules: Vec<(String, Option<String>)>,
}

/// A module's `#[path = "..."]`.
fn path_attribute(module: &syn::ItemMod) -> Option<String> {
    module.attrs.iter().find_map(|a| {
        let syn::Meta::NameValue(nv) = &a.meta else {
            return None;
        };
        let syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) = &nv.value
        else {
            return None;
        };
        nv.path.is_ident("path").then(|| s.value())
    })
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        } else if let syn::Item::Mod(module) = item {
            if module.content.is_none() {
                self.test_modules
                    .push((module.ident.to_string(), path_attribute(module)));
            }
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if let Some(last) = path.segments.last() {
            if last.ident == "Result" {
                if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
                    let error = args.args.iter().nth(1);
                    if let Some(syn::GenericArgument::Type(syn::Type::Path(error))) = error {
                        let is_string = error.qself.is_none()
                            && error
                                .path
                                .segments
                                .last()
                                .is_some_and(|s| s.ident == "String" && s.arguments.is_none());
                        if is_string {
                            self.lines.push(last.ident.span().start().line);
                        }
                    }
                }
            }
        }
        syn::visit::visit_path(self, path);
    }
}

/// The file a bodiless `mod name;` (with its `#[path]`, if any) in `file`
/// includes.
fn module_file(file: &Path, (name, path): &(String, Option<String>)) -> PathBuf {
    let dir = file.parent().expect("a file's directory");
    if let Some(path) = path {
        return dir.join(path);
    }
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let base = if matches!(stem, "mod" | "lib" | "main") {
        dir.to_owned()
    } else {
        dir.join(stem)
    };
    let flat = base.join(format!("{name}.rs"));
    if flat.is_file() {
        flat
    } else {
        base.join(name).join("mod.rs")
    }
}

/// Each `file:line` of a `Result<_, String>` under the `src` directories
/// given, outside test code.
fn string_errors(srcs: &[PathBuf]) -> Vec<String> {
    let files: Vec<PathBuf> = srcs.iter().flat_map(|src| crate::rust_files(src)).collect();
    let mut test_files = Vec::new();
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a source");
        let syntax = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut finder = Finder::default();
        finder.visit_file(&syntax);
        test_files.extend(finder.test_modules.iter().map(|m| module_file(file, m)));
        found.extend(finder.lines.into_iter().map(|line| (file.clone(), line)));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    found
        .into_iter()
        .filter(|(file, _)| !test_files.contains(file))
        .map(|(file, line)| {
            let rel = file.strip_prefix(root).unwrap_or(&file);
            format!("{}:{line}", rel.display())
        })
        .collect()
}

#[test]
fn no_result_outside_tests_carries_a_string_error() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut srcs = vec![root.join("src")];
    for krate in std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
    {
        // The testkit is test code.
        if krate.file_name() != "testkit" {
            srcs.push(krate.path().join("src"));
        }
    }
    let found = string_errors(&srcs);
    assert!(
        found.is_empty(),
        "Result<_, String> outside tests (give the error a type of its own, a variant per reason):\n  {}",
        found.join("\n  ")
    );
}

/// The check sees one in a signature, an alias and a nested type, and
/// leaves out `#[cfg(test)]` code and the file a test module includes.
#[test]
fn the_check_sees_a_string_error() {
    let dir = std::env::temp_dir().join(format!("leasehold-errors-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    std::fs::write(
        src.join("lib.rs"),
        "pub fn a() -> Result<(), String> { Ok(()) }\n\
         pub type B = std::result::Result<u8, std::string::String>;\n\
         pub fn c() -> Option<Result<u8, String>> { None }\n\
         pub fn d() -> Result<String, u8> { Ok(String::new()) }\n\
         #[cfg(test)]\nmod tests { fn e() -> Result<(), String> { Ok(()) } }\n\
         #[cfg(test)]\n#[path = \"lib_tests.rs\"]\nmod more;\n",
    )
    .expect("write");
    std::fs::write(
        src.join("lib_tests.rs"),
        "fn f() -> Result<(), String> { Ok(()) }\n",
    )
    .expect("write");
    let found = string_errors(std::slice::from_ref(&src));
    let _ = std::fs::remove_dir_all(&dir);
    let at = |line: usize| format!("{}:{line}", src.join("lib.rs").display());
    assert_eq!(found, [at(1), at(2), at(3)]);
}
