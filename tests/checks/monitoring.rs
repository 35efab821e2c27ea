//! What the chart gives Prometheus and Grafana: the alerting rules of
//! charts/leasehold/files/alerts.yaml (`promtool` checks them and runs
//! their unit tests, tests/monitoring/alerts_test.yaml: for each alert,
//! series that fire it and series that must not; each has a runbook in
//! docs/monitoring.md), and the dashboard of files/dashboard.json. Every
//! metric either queries is in docs/monitoring.md's tables; the
//! controller's and the agent's unit tests check that every metric they
//! register is listed there.
//!
//! `promtool` comes from Debian's prometheus package (scripts/setup.sh);
//! a missing one fails the tests that need it, unless promtool is left out
//! on purpose (`LEASEHOLD_SKIP_PROMTOOL`: then they say they were skipped).

use leasehold_testkit as testkit;

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const RULES: &str = "charts/leasehold/files/alerts.yaml";
const TESTS: &str = "tests/monitoring/alerts_test.yaml";
const DASHBOARD: &str = "charts/leasehold/files/dashboard.json";

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `leasehold_*` metric names in a query, as docs/monitoring.md names
/// them (a histogram's series by the histogram's name).
fn metrics_in(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("leasehold_") {
        let tail = &rest[at + "leasehold_".len()..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.push(name.to_owned());
        rest = &tail[end..];
    }
    names
}

/// Whether promtool runs here; if not, a failure, or a skip when promtool
/// is left out on purpose (`testkit::lacks`).
fn promtool_or_skip(test: &str) -> bool {
    let found = Command::new("promtool").arg("--version").output().is_ok();
    if !found {
        testkit::lacks(
            test,
            testkit::Part::Promtool,
            "no promtool (scripts/setup.sh installs Debian's prometheus package)",
        );
    }
    found
}

/// (alert, expression) of every rule.
fn alerts() -> Vec<(String, String)> {
    let rules: serde_yaml::Value = serde_yaml::from_str(&read(RULES)).expect("alerts.yaml parses");
    rules["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter())
        .map(|r| {
            (
                r["alert"].as_str().expect("an alert").to_owned(),
                r["expr"].as_str().expect("an expr").to_owned(),
            )
        })
        .collect()
}

/// Every query of the dashboard: its panels' targets and its variables.
fn dashboard_queries() -> Vec<String> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(DASHBOARD)).expect("dashboard.json parses");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            queries.push(target["expr"].as_str().expect("an expr").to_owned());
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(q) = var["query"]["query"].as_str() {
            queries.push(q.to_owned());
        }
    }
    queries
}

#[test]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    if !promtool_or_skip("the_alerting_rules_pass_promtool_and_their_unit_tests") {
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
    let runbooks = read("docs/monitoring.md");
    let tests = read(TESTS);
    let names = alerts();
    assert!(names.len() >= 7, "{names:?}");
    for (name, _) in names {
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

#[test]
fn every_metric_the_alerts_and_the_dashboard_query_is_exported() {
    let docs = read("docs/monitoring.md");
    let queries: Vec<(String, String)> = alerts()
        .into_iter()
        .chain(
            dashboard_queries()
                .into_iter()
                .map(|q| ("the dashboard".to_owned(), q)),
        )
        .collect();
    let mut seen = 0;
    for (what, query) in &queries {
        for name in metrics_in(query) {
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "{what} queries leasehold_{name}, which docs/monitoring.md does not list: {query}"
            );
            seen += 1;
        }
    }
    assert!(seen > 20, "{queries:?}");
}

#[test]
fn the_dashboards_queries_parse() {
    if !promtool_or_skip("the_dashboards_queries_parse") {
        return;
    }
    // promtool parses a query as a recording rule's expression; Grafana's
    // variables become what they stand for. (JSON is YAML to promtool.)
    let rules: Vec<serde_json::Value> = dashboard_queries()
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let expr = q
                .replace("$__rate_interval", "5m")
                .replace("$namespace", ".*")
                .replace("$group", ".*");
            // A variable's label_values(SELECTOR, LABEL): the selector.
            let expr = match expr.strip_prefix("label_values(") {
                Some(rest) => rest[..rest.rfind(',').unwrap()].to_owned(),
                None => expr,
            };
            serde_json::json!({ "record": format!("dashboard:query_{i}"), "expr": expr })
        })
        .collect();
    let file =
        std::env::temp_dir().join(format!("leasehold-dashboard-{}.yaml", std::process::id()));
    let groups = serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] });
    std::fs::write(&file, groups.to_string()).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("run promtool");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "a dashboard query does not parse:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
