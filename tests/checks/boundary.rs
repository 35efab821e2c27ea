//! One store boundary: above the engine's `store/` (the rest of the engine,
//! the daemon, the kube crate, the agent and the binary), nothing imports
//! `store::redis` or `store::postgres`, and the code that ships names
//! neither Redis nor PostgreSQL, in code or in comments, save on the lines
//! of [`ALLOWED`]: the deprecated flag names, the metric and condition
//! names that dashboards and alerts use, help of what is one store's
//! only, and the demo's throwaway servers. Each store's own code, and tests, may name it.
//!
//! The imports are read as tokens (`proc-macro2`), so no spelling of a
//! path escapes: `store::{postgres::X}`, a path in an expression, one
//! split over lines. The words are read as text, comments included.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use proc_macro2::{Delimiter, TokenStream, TokenTree};

/// The code above `store/`, from the workspace root; `store/` itself is
/// [`BELOW`].
const ABOVE: [&str; 5] = [
    "src",
    "crates/engine/src",
    "crates/daemon/src",
    "crates/kube/src",
    "crates/agent/src",
];
const BELOW: &str = "crates/engine/src/store/";

/// Lines that may name a store: (a path or path prefix, a fragment the line
/// holds, why); the first entry a line matches allows it. An entry that
/// allows nothing fails the check too, so the list cannot outlive what it
/// was for.
const ALLOWED: [(&str, &str, &str); 19] = [
    (
        "crates/daemon/src/store_args.rs",
        "alias = \"redis-",
        "the deprecated flag names",
    ),
    (
        "crates/daemon/src/store_args.rs",
        "/// The store holding the engine's state. Redis:",
        "each store's URL forms",
    ),
    (
        "crates/daemon/src/store_args.rs",
        "/// Redis behind Sentinel only",
        "a flag of one store only",
    ),
    (
        "crates/daemon/src/store_args.rs",
        "rediss+sentinel:// --store-url",
        "that flag's error",
    ),
    (
        "crates/daemon/src/store_args.rs",
        "a rediss:// server's, if not a public one; PostgreSQL's",
        "what the CA does on each store",
    ),
    (
        "crates/daemon/src/store_args.rs",
        "/// Key prefix in Redis, schema in PostgreSQL",
        "what the prefix is on each store",
    ),
    (
        "crates/daemon/src/store_args.rs",
        "LEASEHOLD_REDIS_",
        "their deprecated variables",
    ),
    (
        "crates/daemon/src/store_settings.rs",
        "\"redis_setting_unsafe\"",
        "a metric dashboards and alerts use",
    ),
    (
        "crates/kube/src/conditions.rs",
        "= \"Redis",
        "conditions and reasons dashboards and alerts use",
    ),
    (
        "src/demo/server.rs",
        "",
        "the demo's own throwaway redis-server",
    ),
    (
        "src/demo/postgres.rs",
        "",
        "the demo's own throwaway PostgreSQL",
    ),
    (
        "src/demo/mod.rs",
        "mod postgres;",
        "the module of one of them",
    ),
    ("src/demo/mod.rs", "RedisServer", "one of them, by its type"),
    (
        "src/demo/mod.rs",
        "PostgresServer",
        "the other, by its type",
    ),
    (
        "src/demo/mod.rs",
        "(Local::",
        "the one started, held until the demo ends",
    ),
    (
        "src/demo/mod.rs",
        "\"postgres\"",
        "`--store`: which of them to start",
    ),
    ("src/demo/mod.rs", "\"started ", "which of them started"),
    ("src/demo/mod.rs", "redis-url", "the deprecated flag name"),
    (
        "src/demo/mod.rs",
        "(on PostgreSQL a schema",
        "what the prefix is on one store",
    ),
];

/// A finding: `path:line: what`.
type Finding = String;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The imports of `store::redis` or `store::postgres` in `source`, by line:
/// `store` `::` then `redis`/`postgres`, or a braced list that starts an
/// item with one of them.
fn store_imports(source: &str) -> Vec<(usize, String)> {
    fn walk(tokens: TokenStream, found: &mut Vec<(usize, String)>) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, token) in tokens.iter().enumerate() {
            if let TokenTree::Group(group) = token {
                walk(group.stream(), found);
            }
            let TokenTree::Ident(ident) = token else {
                continue;
            };
            let colons = matches!(
                (tokens.get(i + 1), tokens.get(i + 2)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':'
            );
            if ident != "store" || !colons {
                continue;
            }
            let named = match tokens.get(i + 3) {
                Some(TokenTree::Ident(next)) => vec![next.clone()],
                Some(TokenTree::Group(list)) if list.delimiter() == Delimiter::Brace => {
                    let items: Vec<TokenTree> = list.stream().into_iter().collect();
                    let starts = std::iter::once(0).chain(
                        (0..items.len())
                            .filter(
                                |&j| matches!(&items[j], TokenTree::Punct(p) if p.as_char() == ','),
                            )
                            .map(|j| j + 1),
                    );
                    starts
                        .filter_map(|j| match items.get(j) {
                            Some(TokenTree::Ident(first)) => Some(first.clone()),
                            _ => None,
                        })
                        .collect()
                }
                _ => Vec::new(),
            };
            for store in named.iter().filter(|n| *n == "redis" || *n == "postgres") {
                found.push((store.span().start().line, format!("imports store::{store}")));
            }
        }
    }
    let mut found = Vec::new();
    walk(
        TokenStream::from_str(source).expect("the source tokenizes"),
        &mut found,
    );
    found
}

/// The shipping part of a file: all of it but a trailing
/// `#[cfg(test)] mod tests` (what counts as shipping code elsewhere too).
fn shipping_lines(source: &str) -> Vec<&str> {
    let lines: Vec<&str> = source.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].starts_with("#[cfg(test)]")
                && lines.get(i + 1).is_some_and(|l| l.starts_with("mod tests"))
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// The findings under `root` (the workspace, or a planted copy), and the
/// allow-list entries that allowed nothing.
fn check(root: &Path) -> (Vec<Finding>, Vec<&'static str>) {
    let mut files = Vec::new();
    for dir in ABOVE {
        rust_files(&root.join(dir), &mut files);
    }
    let mut used = [false; ALLOWED.len()];
    let mut findings = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with(BELOW) || rel.ends_with("plan_tests.rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("a readable source");
        for (line, what) in store_imports(&source) {
            findings.push(format!("{rel}:{line}: {what}"));
        }
        for (i, line) in shipping_lines(&source).iter().enumerate() {
            let lower = line.to_lowercase();
            if !lower.contains("redis") && !lower.contains("postgres") {
                continue;
            }
            let allowed = ALLOWED.iter().position(|(prefix, fragment, _)| {
                rel.starts_with(prefix) && line.contains(fragment)
            });
            match allowed {
                Some(k) => used[k] = true,
                None => findings.push(format!("{rel}:{}: names a store: {}", i + 1, line.trim())),
            }
        }
    }
    let unused = ALLOWED
        .iter()
        .zip(used)
        .filter(|(_, used)| !used)
        .map(|((_, fragment, _), _)| *fragment)
        .collect();
    (findings, unused)
}

#[test]
fn nothing_above_the_store_names_redis_or_postgresql() {
    let (findings, unused) = check(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert!(
        findings.is_empty(),
        "above crates/engine/src/store/, name the store, not Redis or PostgreSQL, and take \
         errors and types from store/ (allowed lines: ALLOWED in tests/checks/boundary.rs):\n{}",
        findings.join("\n")
    );
    assert!(
        unused.is_empty(),
        "allow-list entries that allow nothing: {unused:?}"
    );
}

#[test]
fn the_check_sees_an_import_and_a_word() {
    // A copy of the layout with one of each defect, and a file below the
    // boundary that may name its store.
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("boundary-check");
    let _ = std::fs::remove_dir_all(&root);
    for dir in ABOVE.iter().chain([&BELOW]) {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let files = [
        (
            "crates/daemon/src/a.rs",
            "use leasehold_engine::store::{\n    bounded,\n    postgres::PgStartError,\n};\n",
        ),
        (
            "crates/kube/src/b.rs",
            "fn f() {\n    let s = leasehold_engine::store::redis::x();\n}\n",
        ),
        ("crates/agent/src/c.rs", "//! Talks to Redis.\n"),
        (
            "src/demo/mod.rs",
            "mod postgres;\n// A demo on Redis only.\n",
        ),
        ("src/demo/server.rs", "//! The demo's redis-server.\n"),
        ("src/demo/other.rs", "//! Talks to PostgreSQL.\n"),
        (
            "crates/engine/src/store/d.rs",
            "//! Redis and PostgreSQL.\nuse crate::store::redis;\n",
        ),
        (
            "crates/agent/src/e.rs",
            "fn f() {}\n#[cfg(test)]\nmod tests {\n    // redis://, in a test\n}\n",
        ),
    ];
    std::fs::create_dir_all(root.join("src/demo")).unwrap();
    for (path, text) in files {
        std::fs::write(root.join(path), text).unwrap();
    }
    let (mut findings, _) = check(&root);
    findings.sort();
    assert_eq!(
        findings,
        [
            "crates/agent/src/c.rs:1: names a store: //! Talks to Redis.",
            "crates/daemon/src/a.rs:3: imports store::postgres",
            "crates/daemon/src/a.rs:3: names a store: postgres::PgStartError,",
            "crates/kube/src/b.rs:2: imports store::redis",
            "crates/kube/src/b.rs:2: names a store: let s = leasehold_engine::store::redis::x();",
            "src/demo/mod.rs:2: names a store: // A demo on Redis only.",
            "src/demo/other.rs:1: names a store: //! Talks to PostgreSQL.",
        ]
    );
}
