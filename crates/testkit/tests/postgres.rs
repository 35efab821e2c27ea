//! The throwaway PostgreSQL server breaks the way the PostgreSQL tests
//! need it to: it runs unprivileged even when the tests run as root, keeps
//! what was committed across a SIGKILL, starts again from an older copy of
//! its data, and answers nothing while paused.

use std::process::Command;
use std::time::{Duration, Instant};

use leasehold_testkit as testkit;
use testkit::postgres::LocalPostgres;

fn server(test: &str) -> Option<LocalPostgres> {
    if let Some(why) = testkit::postgres::missing() {
        testkit::lacks(test, testkit::Part::Postgres, &why);
        return None;
    }
    Some(LocalPostgres::start().expect("postgres starts"))
}

#[test]
fn it_runs_unprivileged_and_keeps_commits_across_a_crash() {
    let Some(mut pg) = server("it_runs_unprivileged_and_keeps_commits_across_a_crash") else {
        return;
    };
    assert_eq!(pg.psql("SELECT current_user").unwrap(), "postgres");
    // The server process is never root, whoever runs the tests.
    let postmaster = pg.postmaster().expect("a postmaster pid");
    let uid = procfs::process::Process::new(postmaster as i32)
        .and_then(|p| p.uid())
        .unwrap();
    assert_ne!(uid, 0, "postgres runs as root");
    pg.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
        .unwrap();
    let old = pg.copy_data().unwrap();
    pg.psql("INSERT INTO t VALUES (2)").unwrap();
    pg.restart_on_own_data().unwrap();
    assert_eq!(pg.psql("SELECT count(*) FROM t").unwrap(), "2");
    // An older copy of the data directory: the second row never happened.
    pg.start_on_copy(&old).unwrap();
    assert_eq!(pg.psql("SELECT count(*) FROM t").unwrap(), "1");
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    let Some(mut pg) = server("a_paused_server_answers_nothing_until_resumed") else {
        return;
    };
    pg.pause().unwrap();
    let bin = testkit::postgres::bin_dir().unwrap();
    let started = Instant::now();
    let status = Command::new(bin.join("psql"))
        .args(["-X", "-h", "127.0.0.1", "-p", &pg.port.to_string()])
        .args(["-U", "postgres", "-c", "SELECT 1"])
        .env("PGCONNECT_TIMEOUT", "2")
        .output()
        .unwrap()
        .status;
    assert!(!status.success(), "a paused server answered");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    pg.resume();
    assert_eq!(pg.psql("SELECT 1").unwrap(), "1");
}

/// Two tests' databases in the shared server are apart, the second made
/// without another initdb, and each is gone when its test ends; a fault on
/// the shared server is refused, since other tests run on it.
#[test]
fn shared_databases_are_apart_and_dropped_at_the_end() {
    use testkit::postgres::PgDatabase;
    if let Some(why) = testkit::postgres::missing() {
        testkit::lacks(
            "shared_databases_are_apart_and_dropped_at_the_end",
            testkit::Part::Postgres,
            &why,
        );
        return;
    }
    let a = PgDatabase::in_shared().unwrap();
    let made = Instant::now();
    let mut b = PgDatabase::in_shared().unwrap();
    // (initdb alone takes a second and more on two cores.)
    assert!(
        made.elapsed() < Duration::from_secs(1),
        "{:?}",
        made.elapsed()
    );
    assert_eq!(a.port(), b.port(), "one server");
    assert_ne!(a.url(), b.url());
    a.psql("CREATE TABLE only_in_a (v int)").unwrap();
    assert_eq!(
        b.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'")
            .unwrap(),
        "0"
    );
    let name = a.name.clone();
    drop(a);
    let left = b
        .server()
        .psql(&format!(
            "SELECT count(*) FROM pg_database WHERE datname = '{name}'"
        ))
        .unwrap();
    assert_eq!(left, "0", "{name} outlived its test");
    let fault = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        b.own_server();
    }));
    assert!(
        fault.is_err(),
        "a fault on the shared server was let through"
    );
}
