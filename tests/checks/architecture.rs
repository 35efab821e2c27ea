//! docs/architecture.md is the map of the code: it names every source file,
//! and every file it names exists. A file added without a row, or a row
//! left behind by a file moved or removed, fails here with the file named.
//!
//! The files: every `.rs` under `src/`, `crates/*/src`, `crates/*/tests`
//! and `tests/`, the Lua scripts and SQL migrations under `crates/*/src`,
//! and everything under `scripts/` and `.ci/`.
//!
//! How the map names one (in backticks, the first word of the quote):
//! - in section 2, a row of a crate's table whose first cell names the
//!   file from the crate's `src` (`store/redis/mod.rs` under
//!   `### leasehold-engine`): the file must exist;
//! - anywhere, its path from the repository's root (`tests/chaos.rs`,
//!   `scripts/kubernetes/node.sh apiserver`): the file must exist;
//! - its name under a directory that its section's heading or its own
//!   paragraph names from the root (section 4's heading names
//!   `crates/engine/src/store/redis/scripts/`, its table `claim.lua`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const MAP: &str = "docs/architecture.md";
/// Where a path from the repository's root starts.
const ROOTS: [&str; 5] = ["src/", "crates/", "tests/", "scripts/", ".ci/"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every file the map must name, as a path from the repository's root.
fn sources() -> BTreeSet<String> {
    fn walk(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, keep, out);
            } else if keep(&path) {
                let rel = path.strip_prefix(root()).expect("under the root");
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    let with = |exts: &'static [&'static str]| {
        move |p: &Path| p.extension().is_some_and(|e| exts.iter().any(|x| e == *x))
    };
    let rust = with(&["rs"]);
    let crate_src = with(&["rs", "lua", "sql"]);
    let any = |_: &Path| true;
    let mut out = BTreeSet::new();
    walk(&root().join("src"), &rust, &mut out);
    walk(&root().join("tests"), &rust, &mut out);
    walk(&root().join("scripts"), &any, &mut out);
    walk(&root().join(".ci"), &any, &mut out);
    for krate in std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .flatten()
    {
        walk(&krate.path().join("src"), &crate_src, &mut out);
        walk(&krate.path().join("tests"), &rust, &mut out);
    }
    out
}

/// Each workspace crate's name and its `src` directory from the root, as
/// cargo reads the manifests.
fn crate_sources() -> BTreeMap<String, String> {
    let metadata = crate::layers::metadata();
    let workspace = Path::new(metadata["workspace_root"].as_str().expect("workspace_root"));
    metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| {
            let manifest = Path::new(package["manifest_path"].as_str().expect("manifest_path"));
            let dir = manifest
                .parent()
                .expect("a manifest's directory")
                .strip_prefix(workspace)
                .expect("a member under the workspace");
            let src = dir.join("src").to_string_lossy().into_owned();
            (package["name"].as_str().expect("name").to_owned(), src)
        })
        .collect()
}

/// What a map names, as paths from the root: `named`, every file it
/// names; `claimed`, those it names in a way that says the file is there
/// (a row of a crate's table, a path from the root).
#[derive(Debug, Default)]
struct Names {
    named: BTreeSet<String>,
    claimed: BTreeSet<String>,
}

/// The first word of every quote (`...`) of a line.
fn quotes(line: &str) -> Vec<&str> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|quote| quote.split_whitespace().next())
        .collect()
}

/// A quote that names a directory (`crates/engine/src/store/redis/scripts/`).
fn directory_in(line: &str) -> Option<String> {
    quotes(line)
        .into_iter()
        .find(|q| q.ends_with('/') && ROOTS.iter().any(|r| q.starts_with(r)))
        .map(str::to_owned)
}

fn names(map: &str, crates: &BTreeMap<String, String>) -> Names {
    let mut names = Names::default();
    // The crate whose table a row of section 2 is in, and the directory a
    // heading or a paragraph names.
    let mut crate_src: Option<&String> = None;
    let mut heading_dir: Option<String> = None;
    let mut paragraph_dir: Option<String> = None;
    for line in map.lines() {
        if line.starts_with('#') {
            let title = line.trim_start_matches('#').trim();
            crate_src = title.split_whitespace().next().and_then(|w| crates.get(w));
            heading_dir = directory_in(line);
            paragraph_dir = None;
            continue;
        }
        if line.trim().is_empty() {
            paragraph_dir = None;
            continue;
        }
        let row = line.starts_with('|');
        if !row {
            if let Some(dir) = directory_in(line) {
                paragraph_dir = Some(dir);
            }
        }
        if let (true, Some(src)) = (row, crate_src) {
            let first_cell = line.trim_start_matches('|').split('|').next().unwrap_or("");
            for file in quotes(first_cell) {
                let path = format!("{src}/{file}");
                names.named.insert(path.clone());
                names.claimed.insert(path);
            }
        }
        for quote in quotes(line) {
            let from_root = ROOTS.iter().any(|r| quote.starts_with(r));
            if from_root && !quote.ends_with('/') && !quote.contains('*') {
                names.named.insert(quote.to_owned());
                names.claimed.insert(quote.to_owned());
            }
            for dir in [&paragraph_dir, &heading_dir].into_iter().flatten() {
                names.named.insert(format!("{dir}{quote}"));
            }
        }
    }
    names
}

/// The files the map does not name, and what it names as there that is
/// not (neither a file nor a directory).
fn differences(names: &Names, sources: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let unnamed = sources
        .iter()
        .filter(|file| !names.named.contains(*file))
        .cloned()
        .collect();
    let gone = names
        .claimed
        .iter()
        .filter(|path| !root().join(path).exists())
        .cloned()
        .collect();
    (unnamed, gone)
}

#[test]
fn the_map_names_every_source_file_and_only_files_that_exist() {
    let map = std::fs::read_to_string(root().join(MAP)).expect("read the map");
    let (unnamed, gone) = differences(&names(&map, &crate_sources()), &sources());
    let mut report = String::new();
    if !unnamed.is_empty() {
        report += &format!(
            "\nFiles it does not name (give each a row: section 2 for a crate's src, section 6 for a test):\n  {}",
            unnamed.join("\n  ")
        );
    }
    if !gone.is_empty() {
        report += &format!(
            "\nFiles it names that do not exist:\n  {}",
            gone.join("\n  ")
        );
    }
    assert!(report.is_empty(), "{MAP} is out of date.{report}");
}

/// The check sees a file without a row, a row without a file, and the
/// three ways of naming one.
#[test]
fn the_check_sees_a_file_the_map_leaves_out() {
    let crates = BTreeMap::from([(
        "leasehold-engine".to_owned(),
        "crates/engine/src".to_owned(),
    )]);
    let map = "\
### leasehold-engine
| Module | Owns |
|---|---|
| `lib.rs` | The root; `store/mod.rs` is named only in passing. |
| `gone.rs` | A row left behind. |

## Lua (`crates/engine/src/scripts/`)
`claim.lua` takes a lease.

The tests: `tests/chaos.rs` (and `tests/missing.rs`).
";
    let sources: BTreeSet<String> = [
        "crates/engine/src/lib.rs",
        "crates/engine/src/store/mod.rs",
        "crates/engine/src/scripts/claim.lua",
        "tests/chaos.rs",
    ]
    .map(str::to_owned)
    .into();
    let names = names(map, &crates);
    let (unnamed, _) = differences(&names, &sources);
    assert_eq!(unnamed, ["crates/engine/src/store/mod.rs"]);
    assert!(names.claimed.contains("crates/engine/src/gone.rs"));
    assert!(names.claimed.contains("tests/missing.rs"));
    assert!(!names
        .claimed
        .contains("crates/engine/src/scripts/claim.lua"));
}
