//! The node registry against a real redis-server: one test per node rule of
//! docs/behaviour.md N1-N10 (their inbox side is in crates/engine/tests/engine/messaging.rs), plus
//! incarnations and the Redis clock.

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use leasehold_engine::{ElectionConfig, Event, Node, NodeConfig, NodeOptions, Store};
use testkit::proxy::Proxy;
use testkit::{eventually, fast, next_event, node, node_config, RedisServer, StoreFixture};

fn registered(redis: &RedisServer, id: &str) -> bool {
    !redis.cli(&["ZSCORE", "lh:nodes", id]).is_empty()
}

fn redis_now_ms(redis: &RedisServer) -> u64 {
    let t = redis.cli(&["TIME"]);
    let mut parts = t.lines();
    let secs: u64 = parts.next().unwrap().parse().unwrap();
    let micros: u64 = parts.next().unwrap().parse().unwrap();
    secs * 1000 + micros / 1000
}

/// Registration writes the lease on the Redis clock and the metadata hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_writes_lease_and_metadata() {
    let redis = RedisServer::start();
    let options = NodeOptions {
        metadata: vec![
            ("namespace".into(), "test".into()),
            ("pod".into(), "a".into()),
        ],
        ..Default::default()
    };
    let n = Node::start_with(redis.store(), "test/a", node_config(), options)
        .await
        .unwrap();
    n.join("test/g", fast()).unwrap();
    let score: u64 = redis
        .cli(&["ZSCORE", "lh:nodes", "test/a"])
        .parse()
        .unwrap();
    let now = redis_now_ms(&redis);
    assert!(
        score > now && score <= now + 600,
        "expiry {score} vs redis now {now}"
    );
    assert_eq!(redis.cli(&["HGET", "lh:node:test/a", "pod"]), "a");
    assert_eq!(
        redis.cli(&["HGET", "lh:node:test/a", "incarnation"]),
        n.incarnation()
    );
    eventually(Duration::from_secs(1), "groups field", || {
        redis.cli(&["HGET", "lh:node:test/a", "groups"]) == "test/g"
    })
    .await;
    n.close().await.unwrap();
}

on_both_stores! {
/// Heartbeats keep a live node registered across many leases.
async fn heartbeats_keep_a_live_node_registered(server) {
    let a = node(&server, "test/a").await;
    let b = node(&server, "test/b").await;
    let mut events = b.events();
    tokio::time::sleep(Duration::from_millis(600 * 4)).await;
    assert!(server.registered("test/a") && server.registered("test/b"));
    while let Ok(e) = events.try_recv() {
        assert!(
            !matches!(e, Event::Swept { .. } | Event::Recovered { .. }),
            "{e:?}"
        );
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md N5: swept once its lease expires. X8: the sweeper sleeps until that expiry (the sweep interval here is
/// 10 s), so the node goes within its lease plus a small margin.
async fn crashed_node_is_swept_when_its_lease_expires(server) {
    let config = NodeConfig {
        sweep_interval_ms: 10_000,
        ..node_config()
    };
    let a = Node::start(server.store(), "test/a", config).await.unwrap();
    let b = Node::start(server.store(), "test/b", config).await.unwrap();
    let store = server.store();
    leasehold_engine::test_hooks::subscribe_node(&store, "test/a", "orders", 100)
        .await
        .unwrap();
    let mut events = b.events();
    let crashed = Instant::now();
    drop(a);
    let swept = next_event(&mut events, Duration::from_millis(600 + 250), |e| {
        matches!(e, Event::Swept { .. })
    })
    .await;
    let after = crashed.elapsed();
    assert_eq!(
        swept,
        Event::Swept {
            node: "test/b".into(),
            nodes: vec!["test/a".into()]
        }
    );
    assert!(
        after <= Duration::from_millis(600 + 250),
        "swept after {after:?}"
    );
    assert!(!server.registered("test/a"));
    assert!(
        !server.keeps_anything_of("test/a"),
        "registration, subscriptions and queues removed"
    );
    b.close().await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md N6: close() removes the node at once.
async fn close_removes_the_node_at_once(server) {
    let a = node(&server, "test/a").await;
    a.join("test/g", fast()).unwrap();
    eventually(Duration::from_secs(1), "member", || {
        server.is_member("test/g", "test/a")
    })
    .await;
    let store = server.store();
    leasehold_engine::test_hooks::subscribe_node(&store, "test/a", "orders", 100)
        .await
        .unwrap();
    a.close().await.unwrap();
    assert!(!server.registered("test/a"));
    assert!(!server.keeps_anything_of("test/a"));
    assert!(!server.is_member("test/g", "test/a"));
}
}

on_both_stores! {
/// docs/behaviour.md N3: a disconnection shorter than the lease loses nothing,
/// the node is neither swept nor recovered.
async fn short_disconnect_keeps_the_registration(server) {
    let proxy = Proxy::start(server.port()).await;
    let config = NodeConfig {
        lease_duration_ms: 1_500,
        heartbeat_interval_ms: 200,
        sweep_interval_ms: 1_500,
    };
    let a = Node::start(
        Store::connect(&server.url_at(proxy.port), "lh").unwrap(),
        "test/a",
        config,
    )
    .await
    .unwrap();
    let b = Node::start(server.store(), "test/b", config).await.unwrap();
    let mut a_events = a.events();
    let mut b_events = b.events();
    proxy.pause();
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.resume();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(server.registered("test/a"));
    for rx in [&mut a_events, &mut b_events] {
        while let Ok(e) = rx.try_recv() {
            assert!(
                !matches!(e, Event::Swept { .. } | Event::Recovered { .. }),
                "{e:?}"
            );
        }
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md N4, N9: the node is swept, then notices on its next heartbeat,
/// registers again and emits Recovered.
async fn paused_longer_than_lease_is_swept_then_recovers(server) {
    let proxy = Proxy::start(server.port()).await;
    let a = Node::start(
        Store::connect(&server.url_at(proxy.port), "lh").unwrap(),
        "test/a",
        node_config(),
    )
    .await
    .unwrap();
    let b = node(&server, "test/b").await;
    let mut a_events = a.events();
    let mut b_events = b.events();
    proxy.pause();
    let swept = next_event(&mut b_events, Duration::from_millis(600 + 400), |e| {
        matches!(e, Event::Swept { .. })
    })
    .await;
    assert_eq!(
        swept,
        Event::Swept {
            node: "test/b".into(),
            nodes: vec!["test/a".into()]
        }
    );
    assert!(!server.registered("test/a"));
    proxy.resume();
    next_event(&mut a_events, Duration::from_millis(600 + 400), |e| {
        matches!(e, Event::Recovered { .. })
    })
    .await;
    assert!(server.registered("test/a"));
    assert_eq!(server.node_field("test/a", "incarnation"), a.incarnation());
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

on_both_stores! {
/// A node whose lease expired notices it on its next heartbeat, swept or not
/// (here its own sweeper may get there first; no other node runs).
async fn expired_but_unswept_node_recovers_on_next_heartbeat(server: own) {
    let a = node(&server, "test/a").await;
    let mut events = a.events();
    // Pausing Redis stops every clock-driven action but Redis's own clock.
    server.pause();
    tokio::time::sleep(Duration::from_millis(900)).await;
    server.resume();
    next_event(&mut events, Duration::from_millis(1_000), |e| {
        matches!(e, Event::Recovered { .. })
    })
    .await;
    assert!(server.registered("test/a"));
    a.close().await.unwrap();
}
}

/// docs/behaviour.md N8: heartbeats fail, are retried and
/// reported as errors; once Redis is back (empty here) the node registers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_is_reported_and_retried() {
    let mut redis = RedisServer::start();
    let a = node(&redis, "test/a").await;
    let mut events = a.events();
    redis.kill();
    let err = next_event(&mut events, Duration::from_secs(2), |e| {
        matches!(
            e,
            Event::StoreError {
                during: leasehold_engine::events::Operation::Heartbeat,
                ..
            }
        )
    })
    .await;
    assert!(matches!(err, Event::StoreError { .. }));
    redis.restart();
    next_event(&mut events, Duration::from_secs(5), |e| {
        matches!(e, Event::Recovered { .. })
    })
    .await;
    assert!(registered(&redis, "test/a"));
    a.close().await.unwrap();
}

on_both_stores! {
/// docs/behaviour.md N10: at most 100 expired nodes per pass.
async fn a_sweep_removes_at_most_100_nodes_per_pass(server) {
    let store = server.store();
    for i in 0..250 {
        leasehold_engine::test_hooks::register_node(&store, &format!("dead/{i}"), "x", 1, &[])
            .await
            .unwrap();
    }
    // Every lease of 1 ms has run out.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let first = leasehold_engine::test_hooks::sweep(&store, leasehold_engine::config::SWEEP_BATCH)
        .await
        .unwrap();
    assert_eq!(first.len(), 100);
    assert_eq!(server.registered_count(), 150);
    // A node's sweeper goes on at once after a full batch. Its sweeps are
    // counted by an observer, which sees every event from the node's start
    // (a subscription made after start could miss the first sweep).
    let sizes: std::sync::Arc<std::sync::Mutex<Vec<usize>>> = Default::default();
    let seen = sizes.clone();
    let observer = move |e: &Event| {
        if let Event::Swept { nodes, .. } = e {
            seen.lock().unwrap().push(nodes.len());
        }
    };
    let options = NodeOptions {
        observer: Some(std::sync::Arc::new(observer)),
        ..Default::default()
    };
    let b = Node::start_with(server.store(), "test/b", node_config(), options)
        .await
        .unwrap();
    eventually(Duration::from_secs(2), "150 nodes swept", || {
        sizes.lock().unwrap().iter().sum::<usize>() >= 150
    })
    .await;
    let sizes = sizes.lock().unwrap().clone();
    assert!(sizes.iter().all(|n| *n <= 100), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), 150, "{sizes:?}");
    assert_eq!(server.registered_count(), 1);
    assert!(!server.keeps_anything_of("dead/0") && !server.keeps_anything_of("dead/249"));
    b.close().await.unwrap();
}
}

/// Each claim and renewal reaches the observer with its duration, and the
/// inbox reader tells it the backlog: locally, never as an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_renewals_and_the_backlog_reach_the_observer() {
    #[derive(Default)]
    struct Calls {
        seen: std::sync::Mutex<Vec<(leasehold_engine::Operation, Duration, bool)>>,
        backlog: std::sync::Mutex<Vec<u64>>,
    }
    impl leasehold_engine::Observer for Calls {
        fn observe(&self, _: &Event) {}
        fn observe_call(&self, operation: leasehold_engine::Operation, took: Duration, ok: bool) {
            // Kept, not asserted here: this runs in the engine's task.
            self.seen.lock().unwrap().push((operation, took, ok));
        }
        fn observe_backlog(&self, backlog: u64) {
            self.backlog.lock().unwrap().push(backlog);
        }
    }
    let redis = RedisServer::start();
    let calls = std::sync::Arc::new(Calls::default());
    let options = NodeOptions {
        observer: Some(calls.clone()),
        ..Default::default()
    };
    let a = Node::start_with(redis.store(), "test/a", node_config(), options)
        .await
        .unwrap();
    let config = leasehold_engine::ElectionConfig {
        ttl_ms: 600,
        renew_interval_ms: 100,
        retry_interval_ms: 100,
    };
    let _group = a.join("g", config).unwrap();
    eventually(Duration::from_secs(3), "a claim and two renewals", || {
        let seen = calls.seen.lock().unwrap();
        let renewals = seen
            .iter()
            .filter(|(o, _, ok)| *o == leasehold_engine::Operation::Renew && *ok)
            .count();
        seen.iter()
            .any(|(o, _, ok)| *o == leasehold_engine::Operation::Claim && *ok)
            && renewals >= 2
    })
    .await;
    assert!(
        calls
            .seen
            .lock()
            .unwrap()
            .iter()
            .all(|(_, took, _)| *took < Duration::from_secs(2)),
        "{:?}",
        calls.seen.lock().unwrap()
    );
    let b = Node::start(redis.store(), "test/b", node_config())
        .await
        .unwrap();
    for i in 0..3 {
        b.send("test/a", format!("m{i}").as_bytes()).await.unwrap();
    }
    eventually(Duration::from_secs(3), "a backlog of three", || {
        calls.backlog.lock().unwrap().iter().any(|n| *n >= 3)
    })
    .await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Expiry uses the Redis clock: nodes whose local clocks are an hour apart
/// still write leases on the Redis clock, neither sweeps the other while both
/// live, and a dead one goes after its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_uses_the_redis_clock_not_the_local_one() {
    let redis = RedisServer::start();
    let hour = 3_600_000;
    let ahead = NodeOptions {
        wall_clock_skew_ms: hour,
        ..Default::default()
    };
    let behind = NodeOptions {
        wall_clock_skew_ms: -hour,
        ..Default::default()
    };
    let a = Node::start_with(redis.store(), "test/ahead", node_config(), ahead)
        .await
        .unwrap();
    let b = Node::start_with(redis.store(), "test/behind", node_config(), behind)
        .await
        .unwrap();
    let local_a: i64 = redis
        .cli(&["HGET", "lh:node:test/ahead", "local_started_at"])
        .parse()
        .unwrap();
    let local_b: i64 = redis
        .cli(&["HGET", "lh:node:test/behind", "local_started_at"])
        .parse()
        .unwrap();
    assert!(local_a - local_b > hour, "the skew is in effect");
    let mut events = b.events();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let now = redis_now_ms(&redis);
    for id in ["test/ahead", "test/behind"] {
        let score: u64 = redis.cli(&["ZSCORE", "lh:nodes", id]).parse().unwrap();
        assert!(
            score > now && score <= now + 600,
            "{id}: expiry {score}, redis now {now}"
        );
    }
    while let Ok(e) = events.try_recv() {
        assert!(!matches!(e, Event::Swept { .. }), "{e:?}");
    }
    drop(a);
    let swept = next_event(&mut events, Duration::from_millis(600 + 250), |e| {
        matches!(e, Event::Swept { .. })
    })
    .await;
    assert!(matches!(swept, Event::Swept { nodes, .. } if nodes == ["test/ahead"]));
    b.close().await.unwrap();
}

on_both_stores! {
/// An older incarnation never takes the lease from a newer live one: the
/// older process claims while the newer one leads (it stepped down before
/// the newer one started, and its long heartbeat has not told it yet); its
/// claims lose, and the newer one keeps leading, undisturbed.
async fn an_older_incarnation_never_takes_the_lease_from_a_newer_one(server) {
    // Heartbeats every 10 s: the older node learns of the newer one only
    // through its claim.
    let slow = NodeConfig::with_lease(30_000);
    // The newer one must keep leading throughout, so no renewal may miss
    // its call timeout: fast()'s 100 ms is one slow fsync on a busy
    // machine (a renewal that does not answer in time demotes, E6). Here
    // it is 500 ms; the abstention the older one sits out is one ttl.
    let timings = ElectionConfig {
        ttl_ms: 1_500,
        renew_interval_ms: 300,
        retry_interval_ms: 500,
    };
    let older = Node::start(server.store(), "test/same", slow).await.unwrap();
    let g_old = older.join("test/g", timings).unwrap();
    eventually(Duration::from_secs(2), "older leads", || g_old.is_leader()).await;
    older.step_down("test/g").await.unwrap();
    let newer = Node::start(server.store(), "test/same", slow).await.unwrap();
    let mut newer_events = newer.events();
    let g_new = newer.join("test/g", timings).unwrap();
    eventually(Duration::from_secs(2), "newer leads", || g_new.is_leader()).await;
    // The older one's abstention (one ttl) ends and it claims: it must
    // come out of it a follower, never the leader.
    eventually(Duration::from_secs(6), "the older one claimed", || {
        g_old.is_leader() || testkit::is_follower(&g_old)
    })
    .await;
    // Over more than two of the older one's retries.
    for _ in 0..150 {
        assert!(!g_old.is_leader(), "the older incarnation took the lease");
        if !g_new.is_leader() {
            // Say why: a store error is the machine, a Replaced the engine.
            let seen: Vec<Event> = std::iter::from_fn(|| newer_events.try_recv().ok()).collect();
            panic!("the newer incarnation lost the lease; its events: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!newer.displaced());
    while let Ok(e) = newer_events.try_recv() {
        assert!(
            !matches!(e, Event::Displaced { .. } | Event::Lost { .. }),
            "the newer node saw {e:?}"
        );
    }
    older.close().await.unwrap();
    newer.close().await.unwrap();
}
}

on_both_stores! {
/// Two live processes with one node id: the newer takes over (a restart must
/// not wait), the older is told on its next heartbeat, emits Displaced and
/// stops campaigning instead of sharing the lease.
async fn a_second_live_process_with_the_same_id_is_detected(server) {
    let older = node(&server, "test/same").await;
    let g_old = older.join("test/g", fast()).unwrap();
    eventually(Duration::from_secs(2), "older leads", || g_old.is_leader()).await;
    let mut events = older.events();
    let newer = node(&server, "test/same").await;
    let g_new = newer.join("test/g", fast()).unwrap();
    let displaced = next_event(&mut events, Duration::from_millis(600), |e| {
        matches!(e, Event::Displaced { .. })
    })
    .await;
    assert_eq!(
        displaced,
        Event::Displaced {
            node: "test/same".into(),
            by_incarnation: newer.incarnation().into()
        }
    );
    assert!(older.displaced());
    eventually(Duration::from_secs(1), "older stopped leading", || {
        !g_old.is_leader()
    })
    .await;
    eventually(Duration::from_secs(1), "newer leads", || g_new.is_leader()).await;
    assert!(matches!(
        older.join("test/h", fast()),
        Err(leasehold_engine::Error::Displaced)
    ));
    // The older one stays out: over several ttls it never leads again.
    for _ in 0..100 {
        assert!(!(g_old.is_leader() && g_new.is_leader()));
        assert!(!g_old.is_leader());
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    assert_eq!(
        server.node_field("test/same", "incarnation"),
        newer.incarnation()
    );
    // Closing the older one leaves the newer one's registration alone.
    older.close().await.unwrap();
    assert!(server.registered("test/same"));
    newer.close().await.unwrap();
}
}

/// Bad node ids and timings are refused with the option named; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_node_arguments_are_refused_without_side_effects() {
    let redis = RedisServer::start();
    let err = Node::start(redis.store(), "has space", node_config())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("node id \"has space\""), "{err}");
    let cfg = NodeConfig {
        heartbeat_interval_ms: 0,
        ..node_config()
    };
    let err = Node::start(redis.store(), "test/a", cfg)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("heartbeat_interval_ms = 0") && err.contains("from 1 to 2147483647"),
        "{err}"
    );
    let cfg = NodeConfig {
        lease_duration_ms: 2_147_483_648,
        ..node_config()
    };
    let err = Node::start(redis.store(), "test/a", cfg)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("lease_duration_ms = 2147483648"), "{err}");
    // Only the store's birth and epoch, which the test set up, are there.
    let keys = redis.keys();
    assert_eq!(keys, ["lh:born", "lh:epoch"]);
}

/// A password in the URL authenticates; a wrong one is reported, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_in_the_url_authenticates() {
    let redis = RedisServer::start_with_password("s3cret");
    let store = Store::connect(&redis.url(), "lh").unwrap();
    store.ping().await.unwrap();
    let a = Node::start(store, "test/a", node_config()).await.unwrap();
    assert!(registered(&redis, "test/a"));
    a.close().await.unwrap();
    let wrong = Store::connect(&format!("redis://:wrong@127.0.0.1:{}", redis.port), "lh").unwrap();
    let err = wrong.ping().await.unwrap_err().to_string();
    assert!(
        err.to_lowercase().contains("auth") || err.contains("WRONGPASS"),
        "{err}"
    );
}

/// A node whose registration was swept (its hash gone) does not bring a
/// partial hash back when its groups change: the `groups` field is written
/// only while this incarnation's registration stands. A plain HSET would
/// recreate `P:node:ID` with that one field: no lease, no incarnation, a
/// stray that no sweep removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swept_node_does_not_recreate_its_hash_when_its_groups_change() {
    let redis = RedisServer::start();
    // A long node lease: no heartbeat re-registers it during the test.
    let n = Node::start(redis.store(), "test/a", NodeConfig::with_lease(30_000))
        .await
        .unwrap();
    assert_eq!(redis.cli(&["EXISTS", "lh:node:test/a"]), "1");
    // What a sweep leaves.
    redis.cli(&["DEL", "lh:node:test/a"]);
    redis.cli(&["ZREM", "lh:nodes", "test/a"]);
    let _g = n.join("test/group", fast()).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        let fields = redis.cli(&["HKEYS", "lh:node:test/a"]);
        assert!(
            fields.is_empty() || fields.lines().any(|f| f == "incarnation"),
            "a partial registration appeared: {fields:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    n.close().await.unwrap();
}

/// The tests' "Redis restarts empty" is empty even when a snapshot was
/// written meanwhile (a `SAVE`, or a replica's full sync): each server has
/// a directory of its own, cleared at every start. A snapshot left in a
/// shared directory would be loaded by every later start, and the chaos
/// suite's data-loss faults would restore stale leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_test_redis_is_empty_even_after_a_snapshot() {
    let mut redis = RedisServer::start();
    redis.cli(&["SET", "lh:left-behind", "1"]);
    redis.cli(&["SAVE"]);
    redis.restart();
    assert_eq!(redis.cli(&["EXISTS", "lh:left-behind"]), "0");
    assert!(
        !std::path::Path::new("dump.rdb").exists(),
        "a snapshot landed in the working directory"
    );
}

/// A Redis that may evict keys is reported: the agent and the controller
/// log it at start. `noeviction` (the default) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_reported() {
    let redis = RedisServer::start();
    let store = redis.store();
    assert_eq!(store.setting_warnings().await.unwrap(), Vec::new());
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
    let warnings = store.setting_warnings().await.unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].setting, "maxmemory-policy");
    assert!(
        warnings[0].message.contains("volatile-lru") && warnings[0].message.contains("noeviction"),
        "{warnings:?}"
    );
}

/// A primary with a replica and neither min-replicas-to-write nor any
/// persistence is reported twice; setting both clears the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_primary_without_guards_is_reported() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    replica.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    eventually(Duration::from_secs(10), "the replica connects", || {
        primary
            .cli(&["INFO", "replication"])
            .contains("connected_slaves:1")
    })
    .await;
    let store = primary.store();
    let settings = |w: Vec<leasehold_engine::SettingWarning>| {
        w.into_iter().map(|w| w.setting).collect::<Vec<_>>()
    };
    assert_eq!(
        settings(store.setting_warnings().await.unwrap()),
        ["min-replicas-to-write", "persistence"]
    );
    // The settings this test is about, away from Redis's defaults.
    primary.cli(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    primary.cli(&["CONFIG", "SET", "appendonly", "yes"]);
    assert_eq!(
        settings(store.setting_warnings().await.unwrap()),
        Vec::<&str>::new()
    );
}
