//! The daemon's views of a real Redis: the settings watch (a gauge per
//! unsafe setting, read again on a new primary behind Sentinel) and the
//! engine's events as metrics (inbox drops counted). These need the
//! engine running on real servers; they are the daemon's tests because
//! the engine's own depend on no application crate.

use std::time::Duration;

use leasehold_daemon::metrics::{new_registry, render, EngineMetrics};
use leasehold_daemon::store_settings::SettingsWatch;
use leasehold_engine::{Event, InboxConfig, Node, NodeOptions, Store};
use leasehold_testkit as testkit;
use testkit::sentinel::Deployment;
use testkit::{next_event, node, RedisServer};

/// Sentinels find a silent primary down after this, as in the engine's
/// Sentinel tests.
const DOWN_AFTER_MS: u64 = 2000;

/// The running watch exports each setting as a gauge and reads the server
/// again: a setting changed at runtime is reported at the next reading,
/// and cleared at the one after it is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_watch_exports_a_gauge_and_sees_changes() {
    let redis = RedisServer::start();
    let mut registry = new_registry();
    let watch =
        SettingsWatch::start_every(redis.store(), &mut registry, Duration::from_millis(200)).await;
    let gauge = || {
        render(&registry)
            .lines()
            .find(|l| l.starts_with("leasehold_redis_setting_unsafe{setting=\"maxmemory-policy\"}"))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    assert!(gauge().ends_with(" 0"), "{}", gauge());
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let mut current = watch.current();
    tokio::time::timeout(Duration::from_secs(3), current.wait_for(|w| !w.is_empty()))
        .await
        .expect("the change is seen within a few readings")
        .unwrap();
    assert!(gauge().ends_with(" 1"), "{}", gauge());
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    tokio::time::timeout(Duration::from_secs(3), current.wait_for(|w| w.is_empty()))
        .await
        .expect("the fix is seen within a few readings")
        .unwrap();
    assert!(gauge().ends_with(" 0"), "{}", gauge());
}

/// Every message published to a node that does not keep up is delivered,
/// still waiting, or counted as dropped: none is lost silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_loses_nothing_silently() {
    let redis = RedisServer::start();
    let mut registry = new_registry();
    let metrics = EngineMetrics::register(&mut registry);
    let options = NodeOptions {
        inbox: InboxConfig::with_max_length(50),
        observer: Some(metrics),
        ..Default::default()
    };
    let store = Store::connect(&redis.url(), "lh").unwrap();
    let a = Node::start_with(store, "test/slow", testkit::node_config(), options)
        .await
        .unwrap();
    a.subscribe("t").await.unwrap();
    let mut events = a.events();
    let mut rx = a.inbox().unwrap();
    let p = node(&redis, "test/pub").await;
    const N: u64 = 400;
    for i in 0..N {
        p.publish("t", &i.to_be_bytes()).await.unwrap();
    }
    let dropped = match next_event(&mut events, Duration::from_secs(3), |e| {
        matches!(e, Event::Dropped { .. })
    })
    .await
    {
        Event::Dropped { total, .. } => total,
        _ => unreachable!(),
    };
    assert!(dropped > 0);
    // Drain: delivered + dropped must account for every message.
    let mut delivered = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        delivered += 1;
    }
    let (backlog, dropped) = a.store().inbox_state("test/slow").await.unwrap();
    assert_eq!(backlog, 0);
    assert_eq!(
        delivered + dropped,
        N,
        "delivered {delivered}, dropped {dropped}"
    );
    // And the drops are in the metrics of the node's observer.
    let text = render(&registry);
    let counted: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("leasehold_inbox_dropped_total "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert_eq!(counted, dropped, "metric {counted} != dropped {dropped}");
    a.close().await.unwrap();
    p.close().await.unwrap();
}

/// A forced Sentinel failover: the new primary's settings are read as
/// soon as the route finds it (its eviction policy, unsafe for leases, is
/// reported), not at the next periodic reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_of_a_new_primary_are_read_when_it_is_found() {
    let d = Deployment::start(1, DOWN_AFTER_MS).await;
    d.servers[1].cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let store = Store::connect(&d.url(), "lh").unwrap();
    let mut registry = new_registry();
    // Read at start and on a new primary only, in this test.
    let watch =
        SettingsWatch::start_every(store.clone(), &mut registry, Duration::from_secs(3600)).await;
    // A node keeps calling the store, so its route notices the failover.
    let node = Node::start(store, "test/a", testkit::node_config())
        .await
        .expect("node");
    let evicting = || {
        watch
            .current()
            .borrow()
            .iter()
            .any(|w| w.setting == "maxmemory-policy")
    };
    assert!(!evicting(), "{:?}", watch.current().borrow());
    d.sentinels[0]
        .cli(&["SENTINEL", "FAILOVER", testkit::sentinel::MASTER])
        .unwrap();
    testkit::sentinel::slowly(
        Duration::from_secs(20),
        "the sentinels name the replica",
        || d.primary() == Some(1),
    )
    .await;
    // Read within a poll (1 s) of the primary being found, plus the read.
    testkit::eventually(
        Duration::from_secs(5),
        "the new primary's settings are read",
        evicting,
    )
    .await;
    node.close().await.unwrap();
}
