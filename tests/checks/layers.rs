//! The crate layers of docs/architecture.md, checked on the manifests: the
//! engine names no Kubernetes, command-line, HTTP, metrics or libc crate and
//! no other workspace crate; the agent and the Kubernetes crate never name
//! each other. (Cargo itself forbids cycles; this holds the rest.)

use std::collections::BTreeSet;

/// The dependency lines of the tables of a manifest whose header
/// `table` accepts, comments left out.
fn dependency_lines(manifest: &str, table: impl Fn(&str) -> bool) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap_or_else(|e| panic!("{manifest}: {e}"));
    let mut lines = Vec::new();
    let mut in_deps = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = table(line);
            continue;
        }
        if in_deps && line.contains('=') && !line.starts_with('#') {
            lines.push(line.to_owned());
        }
    }
    lines
}

/// The dependency names in `lines`.
fn names(lines: &[String]) -> BTreeSet<String> {
    lines
        .iter()
        .filter_map(|line| line.split_once('='))
        .map(|(name, _)| name.trim().trim_end_matches(".workspace").to_owned())
        .collect()
}

/// The dependency names of every `[dependencies]`-like table of a manifest
/// (normal, target-specific and dev dependencies alike).
fn dependencies(manifest: &str) -> BTreeSet<String> {
    names(&dependency_lines(manifest, |table| {
        table.ends_with("dependencies]")
    }))
}

fn assert_none_of(manifest: &str, forbidden: &[&str]) {
    let deps = dependencies(manifest);
    let found: Vec<&&str> = forbidden.iter().filter(|f| deps.contains(**f)).collect();
    assert!(found.is_empty(), "{manifest} depends on {found:?}");
}

#[test]
fn the_engine_depends_on_no_application_crate() {
    let deps = dependencies("crates/engine/Cargo.toml");
    assert!(deps.contains("redis"), "the parser read nothing: {deps:?}");
    assert_none_of(
        "crates/engine/Cargo.toml",
        &[
            "kube",
            "kube-runtime",
            "k8s-openapi",
            "schemars",
            "clap",
            "libc",
            "nix",
            "hyper",
            "hyper-util",
            "prometheus-client",
            "tracing-subscriber",
            "leasehold-daemon",
            "leasehold-kube",
            "leasehold-agent",
        ],
    );
}

#[test]
fn the_agent_and_the_controller_do_not_depend_on_each_other() {
    assert!(dependencies("crates/agent/Cargo.toml").contains("leasehold-engine"));
    assert_none_of(
        "crates/agent/Cargo.toml",
        &["leasehold-kube", "kube", "kube-runtime", "k8s-openapi"],
    );
    assert_none_of("crates/kube/Cargo.toml", &["leasehold-agent"]);
    assert_none_of(
        "crates/daemon/Cargo.toml",
        &["leasehold-kube", "leasehold-agent", "kube", "k8s-openapi"],
    );
}

/// The dependency names of a manifest's normal tables only (`[dependencies]`
/// and `[target.'...'.dependencies]`): what ships.
fn normal_dependencies(manifest: &str) -> BTreeSet<String> {
    names(&normal_lines(manifest))
}

/// The lines of a manifest's normal dependency tables.
fn normal_lines(manifest: &str) -> Vec<String> {
    // `[workspace.dependencies]` only pins versions for the members.
    dependency_lines(manifest, |table| {
        table.ends_with("dependencies]")
            && !table.ends_with("dev-dependencies]")
            && !table.starts_with("[workspace")
    })
}

/// `cargo tree -p leasehold -e normal` shows no fixture: the product's
/// crates name the testkit, the bench and tower-test as dev-dependencies
/// at most.
#[test]
fn the_product_depends_on_no_test_fixture() {
    let product = [
        "Cargo.toml",
        "crates/engine/Cargo.toml",
        "crates/daemon/Cargo.toml",
        "crates/kube/Cargo.toml",
        "crates/agent/Cargo.toml",
    ];
    assert!(normal_dependencies("Cargo.toml").contains("leasehold-agent"));
    assert!(
        !normal_dependencies("crates/engine/Cargo.toml").contains("leasehold-testkit")
            && dependencies("crates/engine/Cargo.toml").contains("leasehold-testkit"),
        "the check tells dev-dependencies apart"
    );
    for manifest in product {
        let deps = normal_dependencies(manifest);
        let found: Vec<&str> = ["leasehold-testkit", "leasehold-bench", "tower-test"]
            .into_iter()
            .filter(|f| deps.contains(*f))
            .collect();
        assert!(found.is_empty(), "{manifest} ships {found:?}");
    }
    // Nor the engine's test hooks: no normal dependency turns them on (the
    // bench's build would give them to the product's crates it builds).
    for manifest in product
        .iter()
        .chain(&["crates/testkit/Cargo.toml", "crates/bench/Cargo.toml"])
    {
        let hooks: Vec<String> = normal_lines(manifest)
            .into_iter()
            .filter(|line| line.contains("test-hooks"))
            .collect();
        assert!(hooks.is_empty(), "{manifest} turns on {hooks:?}");
    }
}
