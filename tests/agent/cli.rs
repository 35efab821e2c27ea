//! The operator's commands (`leasehold nodes`, `groups`, `publish`,
//! `subscribe`, `step-down`) as processes against a real redis-server and
//! a real PostgreSQL (each test on both), with library nodes in this test
//! as the workload.

use leasehold_testkit as testkit;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_engine::{Group, Node};
use serde_json::Value;
use testkit::{fast, node, one_leader, StoreFixture};

fn leasehold(redis: &impl StoreFixture, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(args)
        .args(["--store-url", &redis.url(), "--prefix", "lh"])
        .env_remove("LEASEHOLD_REDIS_URL")
        .env_remove("LEASEHOLD_STORE_URL");
    command
}

/// Runs to the end; stdout, or a panic with stderr.
fn run(redis: &impl StoreFixture, args: &[&str]) -> String {
    let out = leasehold(redis, args).output().expect("run leasehold");
    assert!(
        out.status.success(),
        "leasehold {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(redis: &impl StoreFixture, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&run(redis, &all)).expect("JSON output")
}

/// Nodes `ns/a` and `ns/b` in group `ns/web`, and which of them leads.
async fn two_members_of_web(redis: &impl StoreFixture) -> (Vec<(Node, Group)>, usize) {
    let mut members = Vec::new();
    for id in ["ns/a", "ns/b"] {
        let n = node(redis, id).await;
        let g = n.join("ns/web", fast()).unwrap();
        members.push((n, g));
    }
    let leader = one_leader(&[&members[0].1, &members[1].1], Duration::from_secs(3)).await;
    (members, leader)
}

on_both_stores! {
async fn nodes_and_groups_list_the_registry_and_the_leases(server) {
    let (_members, leader) = two_members_of_web(&server).await;
    let leader_id = ["ns/a", "ns/b"][leader];

    let nodes = json(&server, &["nodes"]);
    let listed: Vec<&str> = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 2, "{nodes}");
    for n in nodes["nodes"].as_array().unwrap() {
        assert_eq!(n["live"], true);
        assert_eq!(n["groups"], serde_json::json!(["ns/web"]));
        assert!(n["leaseLeftMs"].as_u64().unwrap() <= 600, "{n}");
        assert_eq!(n["backlog"], 0);
    }
    let table = run(&server, &["nodes"]);
    assert!(table.starts_with("NODE "), "{table}");
    assert!(
        table.contains("LEASE LEFT") && table.contains("ns/a") && table.contains("ns/b"),
        "{table}"
    );

    let groups = json(&server, &["groups"]);
    let web = &groups["groups"][0];
    assert_eq!(
        (web["group"].as_str(), web["leader"].as_str()),
        (Some("ns/web"), Some(leader_id)),
        "{groups}"
    );
    assert!(web["term"].as_u64().unwrap() >= 1);
    assert_eq!(web["members"].as_array().unwrap().len(), 2);
    let table = run(&server, &["groups"]);
    assert!(
        table.starts_with("GROUP ") && table.contains(leader_id),
        "{table}"
    );
}
}

on_both_stores! {
async fn publish_sends_an_argument_or_standard_input_to_subscribers(server) {
    let listener = node(&server, "ns/listener").await;
    listener.subscribe("alerts.*").await.unwrap();
    let mut inbox = listener.inbox().unwrap();
    let answer = json(&server, &["publish", "alerts.disk", "disk full"]);
    assert_eq!(answer["reached"], 1, "{answer}");
    let mut child = leasehold(&server, &["publish", "alerts.cpu", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&[0xff, 0x01])
        .unwrap();
    assert!(child.wait().unwrap().success());
    let first = tokio::time::timeout(Duration::from_secs(2), inbox.next_message())
        .await
        .unwrap()
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(2), inbox.next_message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.topic.as_deref(), first.payload.as_slice()),
        (Some("alerts.disk"), &b"disk full"[..])
    );
    assert_eq!(
        (second.topic.as_deref(), second.payload.as_slice()),
        (Some("alerts.cpu"), &[0xff, 0x01][..])
    );
    // The command's own node is gone once it ended.
    let nodes = server.store().list_nodes().await.unwrap();
    assert!(nodes.iter().all(|n| !n.id.starts_with("cli/")), "{nodes:?}");
    // Bad input names what is wrong.
    let out = leasehold(&server, &["publish", "a..b", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("a..b"));
    let too_long = (leasehold_engine::config::MAX_RETAIN_MS + 1).to_string();
    let out = leasehold(
        &server,
        &[
            "publish",
            "a",
            "x",
            "--retain",
            "--retain-ttl-ms",
            &too_long,
        ],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--retain-ttl-ms")
            && stderr.contains(&format!(
                "from 1 to {}",
                leasehold_engine::config::MAX_RETAIN_MS
            )),
        "{stderr}"
    );
}
}

on_both_stores! {
async fn subscribe_prints_messages_until_interrupted_and_unregisters(server) {
    let publisher = node(&server, "ns/publisher").await;
    let mut child = leasehold(&server, &["subscribe", "orders.>", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let nodes = server.store().list_nodes().await.unwrap();
        if nodes.iter().any(|n| n.id.starts_with("cli/")) {
            break;
        }
        assert!(Instant::now() < deadline, "the subscriber never registered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Registered; its subscription follows right after.
    tokio::time::sleep(Duration::from_millis(200)).await;
    publisher.publish("orders.eu.new", b"one").await.unwrap();
    publisher.publish("orders.us.new", b"two").await.unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let reader = tokio::task::spawn_blocking(move || {
        let first = lines.next().unwrap().unwrap();
        let second = lines.next().unwrap().unwrap();
        (first, second)
    });
    let (first, second) = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .unwrap()
        .unwrap();
    let first: Value = serde_json::from_str(&first).unwrap();
    let second: Value = serde_json::from_str(&second).unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["payload"].as_str(),
            first["from"].as_str()
        ),
        (Some("message"), Some("one"), Some("ns/publisher"))
    );
    assert_eq!(second["topic"], "orders.us.new");
    assert!(testkit::send_signal(child.id(), testkit::Signal::SIGINT));
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let nodes = server.store().list_nodes().await.unwrap();
    assert!(
        nodes.iter().all(|n| !n.id.starts_with("cli/")),
        "the subscriber's node is still registered: {nodes:?}"
    );
}
}

on_both_stores! {
/// docs/behaviour.md P5 from the command line: `step-down --to` hands the
/// group to the pod named, and refuses (exit 1, the leader leads on) a pod
/// that is no live member or has priority 0; `groups` shows priorities.
async fn step_down_to_a_named_member_and_its_refusals(server) {
    let mut members = Vec::new();
    for (id, priority) in [("ns/a", 1), ("ns/b", 2), ("ns/z", 0)] {
        let n = node(&server, id).await;
        let g = n.join_with_priority("ns/web", fast(), priority).unwrap();
        members.push((n, g));
    }
    let groups: Vec<&Group> = members.iter().map(|(_, g)| g).collect();
    let leader = one_leader(&groups, Duration::from_secs(3)).await;
    testkit::eventually(Duration::from_secs(3), "the others follow", || {
        (0..3).all(|i| i == leader || testkit::is_follower(groups[i]))
    })
    .await;
    let target = ["b", "a"][leader];
    let answer = json(&server, &["step-down", "ns/web", "--to", target]);
    assert_eq!(answer["leader"], format!("ns/{target}"), "{answer}");
    let term = answer["newTerm"].as_u64().unwrap();
    for (to, words) in [
        ("z", "priority 0, so it never leads"),
        ("ghost", "not a live member of the group"),
        (target, "already leads"),
    ] {
        let out = leasehold(&server, &["step-down", "ns/web", "--to", to])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--to {to} was not refused");
        assert!(stderr.contains(words), "--to {to}: {stderr}");
    }
    let state = json(&server, &["groups"]);
    let web = &state["groups"][0];
    assert_eq!(web["leader"], format!("ns/{target}"), "{state}");
    assert_eq!(web["term"].as_u64(), Some(term), "{state}");
    assert_eq!(web["priorities"]["ns/z"], 0, "{state}");
    assert_eq!(web["priorities"]["ns/b"], 2, "{state}");
    assert!(run(&server, &["groups"]).contains("ns/b=2,ns/z=0"));
}
}

on_both_stores! {
async fn step_down_hands_the_lease_to_another_member(server) {
    let (_members, leader) = two_members_of_web(&server).await;
    let (was, next) = [("ns/a", "ns/b"), ("ns/b", "ns/a")][leader];
    let answer = json(&server, &["step-down", "ns/web"]);
    assert_eq!(answer["asked"], was, "{answer}");
    assert_eq!(answer["leader"], next, "{answer}");
    assert!(
        answer["newTerm"].as_u64().unwrap() > answer["term"].as_u64().unwrap(),
        "{answer}"
    );
    let out = leasehold(&server, &["step-down", "ns/nobody"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has no leader"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
}

/// The store flags' older names and variables still work, in clap's order
/// (a command line over the environment, whichever name either uses; a new
/// variable over its older name), two values for one flag are refused, and
/// `--help` marks the old names deprecated.
#[tokio::test]
async fn the_deprecated_store_names_still_work_and_say_so() {
    let redis = testkit::RedisServer::start();
    let _n = node(&redis, "ns/a").await;
    let nodes = |args: &[&str], envs: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(["nodes", "--prefix", "lh", "-o", "json"])
            .args(args);
        command
            .env_remove("LEASEHOLD_REDIS_URL")
            .env_remove("LEASEHOLD_STORE_URL");
        let out = command
            .envs(envs.iter().copied())
            .output()
            .expect("run leasehold");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let url = redis.url();
    // Each `nowhere` names no server: a run that reads it fails.
    let nowhere = "redis://127.0.0.1:1";
    for (args, envs) in [
        (vec!["--redis-url", url.as_str()], vec![]),
        (vec![], vec![("LEASEHOLD_REDIS_URL", url.as_str())]),
        (
            vec!["--store-url", url.as_str()],
            vec![("LEASEHOLD_REDIS_URL", nowhere)],
        ),
        // A chart sets the old variable; an old flag in its extraArgs wins.
        (
            vec!["--redis-url", url.as_str()],
            vec![("LEASEHOLD_REDIS_URL", nowhere)],
        ),
        (
            vec!["--redis-url", url.as_str()],
            vec![("LEASEHOLD_STORE_URL", nowhere)],
        ),
        (
            vec![],
            vec![
                ("LEASEHOLD_STORE_URL", url.as_str()),
                ("LEASEHOLD_REDIS_URL", url.as_str()),
            ],
        ),
        // A bad value in an old variable loses to a flag by either name.
        (
            vec!["--store-url", url.as_str(), "--redis-replica-acks", "all"],
            vec![("LEASEHOLD_REDIS_REPLICA_ACKS", "many")],
        ),
    ] {
        let (ok, out, err) = nodes(&args, &envs);
        assert!(ok && out.contains("ns/a"), "{args:?} {envs:?}: {out} {err}");
    }
    // Two stores, by the two names of a flag or of a variable: refused.
    let (ok, _, err) = nodes(&["--store-url", url.as_str(), "--redis-url", nowhere], &[]);
    assert!(
        !ok && err.contains("the argument '--store-url <STORE_URL>' cannot be used multiple times"),
        "{err}"
    );
    let (ok, _, err) = nodes(
        &[],
        &[
            ("LEASEHOLD_STORE_URL", url.as_str()),
            ("LEASEHOLD_REDIS_URL", nowhere),
        ],
    );
    assert!(
        !ok && err.contains(
            "LEASEHOLD_STORE_URL and LEASEHOLD_REDIS_URL (its deprecated name) are set to \
             different values: set LEASEHOLD_STORE_URL only"
        ),
        "{err}"
    );

    // An old variable reaches its flag when nothing else sets it.
    let (ok, _, err) = nodes(
        &["--store-url", url.as_str()],
        &[("LEASEHOLD_REDIS_REPLICA_ACKS", "many")],
    );
    assert!(
        !ok && err.contains("invalid value 'many' for '--store-replica-acks"),
        "{err}"
    );

    let help = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["agent", "--help"])
        .output()
        .expect("run leasehold");
    let help = String::from_utf8_lossy(&help.stdout);
    let lines: Vec<&str> = help.lines().collect();
    // Each new flag's entry, up to the next flag's, names its old names.
    let indent = |l: &str| l.len() - l.trim_start().len();
    for name in [
        "url",
        "password-file",
        "sentinel-password-file",
        "ca-file",
        "replica-acks",
        "replica-wait-ms",
    ] {
        let flag = format!("--store-{name} <");
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with(&flag))
            .unwrap_or_else(|| panic!("no {flag} in --help: {help}"));
        let end = lines[at + 1..]
            .iter()
            .position(|l| l.trim_start().starts_with('-') && indent(l) <= indent(lines[at]))
            .map_or(lines.len(), |n| at + 1 + n);
        let entry = lines[at..end].join("\n");
        let variable = format!("LEASEHOLD_REDIS_{}", name.to_uppercase().replace('-', "_"));
        assert!(
            entry.contains(&format!("Deprecated names: --redis-{name}, {variable}")),
            "{entry}"
        );
    }
    assert!(
        help.lines()
            .next()
            .is_some_and(|l| !l.to_lowercase().contains("redis")),
        "{help}"
    );
}
