//! Checks of the repository's files without servers: the chart, the CRD,
//! the examples, the crate and module layering, the map of the code, and
//! the error types. One test binary; a
//! module per subject.

mod architecture;
mod boundary;
mod chart;
mod crd;
mod errors;
mod examples;
mod layers;
mod modules;
mod monitoring;
mod replies;

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, at any depth: what the checks that read
/// the sources (module graph, error types) walk.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
}
