//! The README's first command: `leasehold demo` runs on its own (starting
//! its own redis-server, or PostgreSQL with `--store postgres`), prints the
//! takeover and handover, and exits 0.

use std::process::Command;

/// Runs `leasehold demo` with `args` to its end; its standard output, or
/// a panic with both streams when it failed or missed a scene.
fn demo(args: &[&str], expected: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("demo")
        .args(args)
        .env_remove("LEASEHOLD_REDIS_URL")
        .env_remove("LEASEHOLD_STORE_URL")
        .output()
        .expect("run leasehold demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    let scenes = [
        "1. demo/node-",
        "crashes",
        "took over after",
        "steps down",
        "summary: crash takeover",
    ];
    for expected in scenes.iter().chain(expected) {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    stdout
}

#[test]
fn demo_runs_without_a_cluster_and_reports_the_handovers() {
    demo(
        &[],
        &["started redis-server on 127.0.0.1:", "left in redis)"],
    );
}

#[test]
fn demo_refuses_bad_timings_naming_the_option() {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["demo", "--ttl-ms", "100", "--renew-interval-ms", "200"])
        .output()
        .expect("run leasehold demo");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("renew_interval_ms = 200") && stderr.contains("ttl_ms = 100"),
        "{stderr}"
    );
}

/// `leasehold demo --store postgres` starts its own PostgreSQL and shows
/// the same three scenes.
#[test]
fn demo_runs_on_its_own_postgres() {
    if let Some(why) = leasehold_testkit::postgres::missing() {
        leasehold_testkit::lacks(
            "demo_runs_on_its_own_postgres",
            leasehold_testkit::Part::Postgres,
            &why,
        );
        return;
    }
    demo(
        &["--store", "postgres"],
        &["started postgres on 127.0.0.1:", "left in postgres)"],
    );
}
