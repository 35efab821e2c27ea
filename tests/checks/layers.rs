//! The crate layers of docs/architecture.md, checked on the manifests as
//! cargo reads them (`cargo metadata`, so no way of spelling a dependency
//! escapes the check): the
//! engine names no Kubernetes, command-line, HTTP, metrics or libc crate and
//! no other workspace crate; the agent and the Kubernetes crate never name
//! each other. (Cargo itself forbids cycles; this holds the rest.)

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde_json::Value;

/// One dependency of a workspace member, as cargo itself reads the
/// manifest (`cargo metadata`): whatever table spelled it, `[dependencies]`,
/// `[dependencies.kube]`, `[target.'cfg(unix)'.dependencies]`, a renamed
/// package. A reader of the text would see only the plain tables.
struct Dependency {
    /// The package's name, and the name it is renamed to, if any.
    names: Vec<String>,
    /// `dev`, `build`, or none (normal: what ships).
    kind: Option<String>,
    features: Vec<String>,
}

/// `cargo metadata --no-deps` of the workspace, read once (the map's
/// check reads the crates' directories from it too).
pub(crate) fn metadata() -> &'static Value {
    static METADATA: OnceLock<Value> = OnceLock::new();
    METADATA.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "cargo metadata: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON")
    })
}

/// The dependencies of the member whose manifest is `manifest` (a path
/// from the workspace root).
fn dependency_list(manifest: &str) -> Vec<Dependency> {
    let root = metadata()["workspace_root"]
        .as_str()
        .expect("workspace_root");
    let path = std::path::Path::new(root).join(manifest);
    let package = metadata()["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["manifest_path"].as_str().map(std::path::Path::new) == Some(path.as_path()))
        .unwrap_or_else(|| panic!("{manifest} is no member of the workspace"));
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    package["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .map(|d| Dependency {
            names: [&d["name"], &d["rename"]]
                .into_iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect(),
            kind: d["kind"].as_str().map(str::to_owned),
            features: strings(&d["features"]),
        })
        .collect()
}

/// The names of `deps`.
fn names<'a>(deps: impl Iterator<Item = &'a Dependency>) -> BTreeSet<String> {
    deps.flat_map(|d| d.names.iter().cloned()).collect()
}

/// The dependency names of a manifest: normal, target-specific, build and
/// dev dependencies alike.
fn dependencies(manifest: &str) -> BTreeSet<String> {
    names(dependency_list(manifest).iter())
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

/// The dependency names of a manifest's normal dependencies only (any
/// target): what ships.
fn normal_dependencies(manifest: &str) -> BTreeSet<String> {
    names(
        dependency_list(manifest)
            .iter()
            .filter(|d| d.kind.is_none()),
    )
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
        let hooks: Vec<String> = dependency_list(manifest)
            .into_iter()
            .filter(|d| d.kind.is_none() && d.features.iter().any(|f| f == "test-hooks"))
            .flat_map(|d| d.names)
            .collect();
        assert!(hooks.is_empty(), "{manifest} turns on {hooks:?}");
    }
}
