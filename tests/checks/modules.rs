//! No module circles, in any crate: the module graph of each crate's `src`
//! (one node per file), read from the source, has no cycle. `tests/checks/layers.rs`
//! holds the layers between crates; this holds them inside each one, so a
//! module can be read, and moved, with what it names and nothing that names
//! it back.
//!
//! An edge A -> B is any path A names that leads into B: `crate::b::..`,
//! `super::..`, `self::..`, or a child module by its bare name; a name
//! re-exported by a module (`pub use b::Thing`) leads on to where it comes
//! from, and the re-export is itself an edge. Code under `#[cfg(test)]` is
//! left out: a module's tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};

type Module = Vec<String>;

/// Every file of a crate's `src` as its module path (the crate root,
/// `lib.rs` or `main.rs` as `root` says, is `[]`; `store/mod.rs` and
/// `store.rs` are `["store"]`). A package with both has two crates: the
/// other root is left out, and each is read on its own.
fn modules(src: &Path, root: &str) -> BTreeMap<Module, PathBuf> {
    let mut files = crate::rust_files(src);
    let other_root = if root == "lib.rs" {
        "main.rs"
    } else {
        "lib.rs"
    };
    files.retain(|path| path != &src.join(other_root));
    files
        .into_iter()
        .map(|path| {
            let rel = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut module: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            (module, path)
        })
        .collect()
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test")
    })
}

/// The `use` paths of an item list, each as its segments, with whether the
/// `use` is public (a re-export).
fn uses(items: &[syn::Item], out: &mut Vec<(Vec<String>, bool, String)>) {
    fn flatten(
        tree: &syn::UseTree,
        prefix: &mut Vec<String>,
        public: bool,
        out: &mut Vec<(Vec<String>, bool, String)>,
    ) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                flatten(&p.tree, prefix, public, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                out.push((path, public, n.ident.to_string()));
            }
            // `use a::b as c` is seen as `c`.
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                out.push((path, public, r.rename.to_string()));
            }
            syn::UseTree::Glob(_) => out.push((prefix.clone(), public, String::new())),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    flatten(tree, prefix, public, out);
                }
            }
        }
    }
    for item in items {
        if let syn::Item::Use(u) = item {
            if !is_test_only(&u.attrs) {
                let public = !matches!(u.vis, syn::Visibility::Inherited);
                flatten(&u.tree, &mut Vec::new(), public, out);
            }
        }
    }
}

/// Every `a::b::c` path in the tokens (outside `use` items, which are read
/// as trees), as its segments.
fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => {
                token_paths(g.stream(), out);
                i += 1;
            }
            TokenTree::Ident(first) => {
                let mut path = vec![first.to_string()];
                let mut j = i + 1;
                while let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(next)),
                ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                {
                    if a.as_char() != ':' || b.as_char() != ':' {
                        break;
                    }
                    path.push(next.to_string());
                    j += 3;
                }
                if path.len() > 1 {
                    out.push(path);
                }
                i = j;
            }
            _ => i += 1,
        }
    }
}

/// What one file names: its `use` paths and the paths in its code, leaving
/// out items under `#[cfg(test)]`.
struct Names {
    uses: Vec<(Vec<String>, bool, String)>,
    paths: Vec<Vec<String>>,
    /// Child modules declared inline (`mod tests { .. }` aside).
    children: BTreeSet<String>,
}

fn names(path: &Path) -> Names {
    let text = std::fs::read_to_string(path).expect("read");
    let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let items: Vec<syn::Item> = file
        .items
        .into_iter()
        .filter(|item| {
            let attrs = match item {
                syn::Item::Mod(m) => &m.attrs,
                syn::Item::Fn(f) => &f.attrs,
                syn::Item::Impl(i) => &i.attrs,
                syn::Item::Use(u) => &u.attrs,
                syn::Item::Struct(s) => &s.attrs,
                syn::Item::Enum(e) => &e.attrs,
                syn::Item::Const(c) => &c.attrs,
                syn::Item::Static(s) => &s.attrs,
                syn::Item::Trait(t) => &t.attrs,
                _ => return true,
            };
            !is_test_only(attrs)
        })
        .collect();
    let mut uses_found = Vec::new();
    uses(&items, &mut uses_found);
    let mut children = BTreeSet::new();
    let mut paths = Vec::new();
    for item in &items {
        match item {
            syn::Item::Use(_) => {}
            syn::Item::Mod(m) => {
                children.insert(m.ident.to_string());
                if let Some((_, inner)) = &m.content {
                    // An inline module's names count as its file's.
                    uses(inner, &mut uses_found);
                    for item in inner {
                        if !matches!(item, syn::Item::Use(_)) {
                            token_paths(quote::ToTokens::to_token_stream(item), &mut paths);
                        }
                    }
                }
            }
            other => token_paths(quote::ToTokens::to_token_stream(other), &mut paths),
        }
    }
    Names {
        uses: uses_found,
        paths,
        children,
    }
}

/// The modules one level under `parent`, by name.
fn children_of(files: &BTreeMap<Module, PathBuf>, parent: &Module) -> BTreeSet<String> {
    files
        .keys()
        .filter(|k| k.len() == parent.len() + 1 && k.starts_with(parent))
        .map(|k| k.last().expect("a child").clone())
        .collect()
}

/// The module graph of one crate.
fn graph(src: &Path, root: &str) -> BTreeMap<Module, BTreeSet<Module>> {
    let files = modules(src, root);
    let names: BTreeMap<&Module, Names> = files.iter().map(|(m, p)| (m, names(p))).collect();
    // Where each module's public re-exports lead: (module, name) -> target path.
    let mut reexports: BTreeMap<(Module, String), Vec<String>> = BTreeMap::new();
    for (module, n) in &names {
        for (path, public, seen_as) in &n.uses {
            if *public && !seen_as.is_empty() {
                reexports.insert(((*module).clone(), seen_as.clone()), path.clone());
            }
        }
    }
    // The module a path starting in `from` leads into, if one of this crate.
    fn resolve(
        from: &Module,
        path: &[String],
        files: &BTreeMap<Module, PathBuf>,
        reexports: &BTreeMap<(Module, String), Vec<String>>,
        children: &BTreeSet<String>,
        depth: usize,
    ) -> Option<Module> {
        let (mut base, rest): (Module, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "super" => {
                let mut base = from.clone();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                (base, rest)
            }
            "self" => (from.clone(), &path[1..]),
            child if children.contains(child) => (from.clone(), path),
            _ => return None,
        };
        let mut consumed = 0;
        for segment in rest {
            let mut next = base.clone();
            next.push(segment.clone());
            if files.contains_key(&next) {
                base = next;
                consumed += 1;
            } else {
                break;
            }
        }
        // A name re-exported by the module reached leads on.
        if depth < 8 {
            if let Some(name) = rest.get(consumed) {
                if let Some(target) = reexports.get(&(base.clone(), name.clone())) {
                    let through = resolve(
                        &base,
                        target,
                        files,
                        reexports,
                        &children_of(files, &base),
                        depth + 1,
                    );
                    if let Some(through) = through {
                        return Some(through);
                    }
                }
            }
        }
        files.contains_key(&base).then_some(base)
    }
    let mut graph = BTreeMap::new();
    for (module, n) in &names {
        let declared: BTreeSet<String> = children_of(&files, module)
            .into_iter()
            .filter(|c| n.children.contains(c))
            .collect();
        let mut edges = BTreeSet::new();
        for path in n.uses.iter().map(|(p, _, _)| p).chain(&n.paths) {
            if let Some(to) = resolve(module, path, &files, &reexports, &declared, 0) {
                edges.insert(to);
            }
        }
        edges.remove(*module);
        graph.insert((*module).clone(), edges);
    }
    graph
}

/// The cycles of a graph, as the strongly connected sets of more than one
/// module (Tarjan).
fn cycles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in &self.graph[v] {
                let Some((w, _)) = self.graph.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = Vec::new();
                loop {
                    let w = self.stack.pop().expect("on the stack");
                    set.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    self.found.push(set);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

fn show(set: &[Module]) -> String {
    set.iter()
        .map(|m| {
            if m.is_empty() {
                "<root>".to_owned()
            } else {
                m.join("/")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut srcs = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
    {
        let src = entry.path().join("src");
        if src.is_dir() {
            srcs.push(src);
        }
    }
    srcs.sort();
    srcs
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let mut found = Vec::new();
    let mut roots = 0;
    for src in crate_sources() {
        for root in ["lib.rs", "main.rs"] {
            if !src.join(root).is_file() {
                continue;
            }
            roots += 1;
            for set in cycles(&graph(&src, root)) {
                found.push(format!("{}: {}", src.join(root).display(), show(&set)));
            }
        }
    }
    // The binary, the bench and the five library crates.
    assert!(roots >= 7, "read only {roots} crate roots");
    assert!(found.is_empty(), "module circles:\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_a_circle() {
    // Two modules that name each other, and a third that names only one.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("modules-check");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).expect("mkdir");
    std::fs::write(
        dir.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\npub use c::Thing;\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("a/mod.rs"),
        "mod inner;\npub fn f() { crate::b::g() }\n",
    )
    .expect("write");
    std::fs::write(dir.join("a/inner.rs"), "pub fn h() {}\n").expect("write");
    std::fs::write(
        dir.join("b.rs"),
        "use super::a;\npub fn g() { let _ = crate::Thing; a::f() }\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("c.rs"),
        "pub struct Thing;\n#[cfg(test)]\nmod tests { use crate::b; }\n",
    )
    .expect("write");
    let graph = graph(&dir, "lib.rs");
    let set = |names: &[&str]| {
        names
            .iter()
            .map(|n| vec![n.to_string()])
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(graph[&vec!["b".to_string()]], set(&["a", "c"]), "{graph:?}");
    assert_eq!(
        graph[&vec!["c".to_string()]],
        BTreeSet::new(),
        "tests are left out"
    );
    assert_eq!(cycles(&graph).len(), 1, "{graph:?}");
    assert_eq!(show(&cycles(&graph)[0]).split(", ").count(), 2);
}
