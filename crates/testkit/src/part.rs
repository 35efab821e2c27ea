//! The parts of a machine a test may need beyond Redis (PostgreSQL, helm,
//! the Kubernetes binaries, root, ...), and what a test does without one:
//! it fails, naming the part and the variable that leaves the part out on
//! purpose; with that variable set it is skipped, said out loud and listed
//! by scripts/test. So a plain `cargo test` on a machine that lacks a part
//! never passes a test that did not run. scripts/setup.sh notes every part
//! it could not provide (`LEASEHOLD_SETUP_MISSING`, one `part: why` a
//! line), and scripts/test sets the variables of exactly those parts.

use std::fmt;

/// One part a test may lack, with one variable each (`LEASEHOLD_SKIP_` and
/// the part's name): few names, each saying what it leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Debian's PostgreSQL (`initdb`, `postgres`), and under root the
    /// `postgres` user to run it as.
    Postgres,
    /// Debian's PgBouncer.
    Pgbouncer,
    /// helm, for the chart's checks and the user guide.
    Helm,
    /// promtool, for the alerting rules' tests.
    Promtool,
    /// etcd, kube-apiserver and kubectl (`scripts/kubernetes/build.sh apiserver`).
    Kubernetes,
    /// The one-node cluster of the user guide: root and the binaries of
    /// `scripts/kubernetes/build.sh cluster`.
    Cluster,
    /// Root, for a PID namespace.
    Root,
    /// A cgroup with the cpu controller, as root, for a CPU quota.
    Cgroup,
    /// A real cluster's kubeconfig in `LEASEHOLD_E2E_KUBECONFIG`.
    E2e,
}

impl Part {
    /// The part's name in scripts/setup.sh's notes.
    pub fn name(self) -> &'static str {
        match self {
            Part::Postgres => "postgres",
            Part::Pgbouncer => "pgbouncer",
            Part::Helm => "helm",
            Part::Promtool => "promtool",
            Part::Kubernetes => "kubernetes",
            Part::Cluster => "cluster",
            Part::Root => "root",
            Part::Cgroup => "cgroup",
            Part::E2e => "e2e",
        }
    }

    /// The variable that leaves the part out on purpose.
    pub fn variable(self) -> String {
        format!("LEASEHOLD_SKIP_{}", self.name().to_uppercase())
    }

    /// Whether the part is left out on purpose (its variable set, to
    /// anything but empty).
    pub fn left_out(self) -> bool {
        std::env::var_os(self.variable()).is_some_and(|v| !v.is_empty())
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Says that `test` lacks `part`, and returns so the test can return
/// early: a skip when the part is left out on purpose, a failure
/// otherwise, naming the part and its variable.
pub fn lacks(test: &str, part: Part, why: &str) {
    assert!(
        part.left_out(),
        "{test} needs {part}: {why}. To leave {part} out on purpose, set {}=1 \
         (scripts/test sets it when scripts/setup.sh could not provide {part})",
        part.variable()
    );
    skipped(
        test,
        &format!("{part} left out ({}): {why}", part.variable()),
    );
}

/// Says that `test` did not run, and why: on stderr (which cargo shows only
/// for a failure) and in the file scripts/test names in
/// `LEASEHOLD_SKIP_LOG`, whose lines close the run, so a skip never reads
/// as a pass.
pub fn skipped(what: &str, why: &str) {
    use std::io::Write;
    // libtest names each test's thread after the test.
    // `what` is the test's own name, or a part of it ("lint", for one of
    // several skips in one test), said after it.
    let test = match std::thread::current().name() {
        Some(name) if name == what || name.ends_with(&format!("::{what}")) => name.to_owned(),
        Some(name) if name != "main" => format!("{name} ({what})"),
        _ => what.to_owned(),
    };
    // The test binary's name, without cargo's hash.
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| {
            stem.rsplit_once('-')
                .map_or(stem.clone(), |(name, _)| name.to_owned())
        })
        .unwrap_or_default();
    let test = format!("{binary}::{test}");
    eprintln!("SKIPPED {test}: {why}");
    if let Some(path) = std::env::var_os("LEASEHOLD_SKIP_LOG") {
        // One short append per line: the test binaries run one after
        // another, and the tests in one binary write whole lines.
        let line = format!("{test}: {why}\n");
        if let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(path) {
            let _ = file.write_all(line.as_bytes());
        }
    }
}
