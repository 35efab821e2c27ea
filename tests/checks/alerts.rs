//! The alerting rules of charts/leasehold/files/alerts.yaml: `promtool`
//! checks them and runs their unit tests (tests/monitoring/alerts_test.yaml:
//! for each alert, series that fire it and series that must not), and each
//! alert has its runbook in docs/monitoring.md and a test.
//!
//! `promtool` comes from Debian's prometheus package (scripts/setup.sh);
//! under `CI` a missing one fails, elsewhere the test says it was skipped.

use leasehold_testkit as testkit;

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const RULES: &str = "charts/leasehold/files/alerts.yaml";
const TESTS: &str = "tests/monitoring/alerts_test.yaml";

fn alerts() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(RULES)).expect("alerts.yaml");
    let rules: serde_yaml::Value = serde_yaml::from_str(&text).expect("alerts.yaml parses");
    rules["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter())
        .map(|r| r["alert"].as_str().expect("an alert").to_owned())
        .collect()
}

#[test]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    let promtool = Command::new("promtool").arg("--version").output();
    if promtool.is_err() {
        testkit::lacks(
            "the_alerting_rules_pass_promtool_and_their_unit_tests",
            "no promtool (scripts/setup.sh installs Debian's prometheus package)",
        );
        return;
    }
    for args in [["check", "rules", RULES], ["test", "rules", TESTS]] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(ROOT)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_alert_has_a_runbook_and_a_unit_test() {
    let runbooks = std::fs::read_to_string(Path::new(ROOT).join("docs/monitoring.md"))
        .expect("docs/monitoring.md");
    let tests = std::fs::read_to_string(Path::new(ROOT).join(TESTS)).expect("alerts_test.yaml");
    let names = alerts();
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        assert!(
            runbooks.contains(&format!("### {name}\n")),
            "docs/monitoring.md has no runbook section for {name}"
        );
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "{TESTS} does not test {name}"
        );
    }
}
