//! In a Redis Cluster: three primaries and a replica, real `redis-server`
//! processes. Every key of a prefix lives in one slot (the prefix is the
//! hash tag), on the node serving it; nodes find that node from any seed
//! and follow it when a replica takes the slot over.

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use leasehold_engine::{ElectionConfig, Node, Store};
use testkit::cluster::{owner, Cluster};
use testkit::sentinel::slowly;
use testkit::{node_config, LocalRedis};

const GROUP: &str = "test/group";

/// Longer than the failover takes (writes to the slot stop for a moment
/// while the replica takes over): the leader keeps its lease through it.
const CFG: ElectionConfig = ElectionConfig {
    ttl_ms: 5000,
    renew_interval_ms: 1000,
    retry_interval_ms: 300,
};

fn cli(node: &LocalRedis, args: &[&str]) -> String {
    node.cli(args).expect("redis-cli")
}

/// A node of `id` on the cluster at `url`, in the test group.
async fn member(url: &str, id: &str, cfg: ElectionConfig) -> (Node, leasehold_engine::Group) {
    let store = Store::connect(url, "lh").expect("a cluster URL");
    let node = Node::start(store, id, node_config()).await.expect("node");
    let group = node.join(GROUP, cfg).expect("join");
    (node, group)
}

/// Three primaries and a fourth node replicating the slot of the prefix
/// `lh`, every node ok and the replica in sync (the testkit's
/// [`Cluster`]); returns the cluster and the index of the slot's owner.
async fn cluster_with_a_replica_of_the_slot() -> (Cluster, usize) {
    let cluster = Cluster::start("lh").await.expect("a cluster");
    let owner_at_start = cluster.owner(cluster.slot).expect("the slot's owner");
    (cluster, owner_at_start)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_the_store_lives_in_one_slot_and_follows_a_failover() {
    let (cluster, owner_at_start) = cluster_with_a_replica_of_the_slot().await;
    let (nodes, slot) = (&cluster.nodes, cluster.slot);
    // A seed that does not serve the slot is enough.
    let seed = (owner_at_start + 1) % 3;
    let url = cluster.url_with_seed(seed);
    let start = |id: &'static str| member(&url, id, CFG);
    let (a, ga) = start("test/a").await;
    // A fresh store on a Redis up for less than a ttl waits out the ttl.
    testkit::eventually(Duration::from_millis(3 * CFG.ttl_ms), "a leads", || {
        ga.is_leader()
    })
    .await;
    // A fresh store: its first history's epoch comes from the clock.
    let first = ga.leader_term().expect("a's term");
    let (b, gb) = start("test/b").await;
    let lease = cli(
        &nodes[owner_at_start],
        &["GET", "{lh}:g:{test/group}:lease"],
    );
    assert!(
        lease.starts_with("test/a#"),
        "the lease on the slot's owner: {lease:?}"
    );
    let keys = cli(
        &nodes[owner_at_start],
        &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
    );
    assert!(
        keys.parse::<u64>().unwrap() >= 5,
        "keys in the slot: {keys}"
    );
    for other in (0..3).filter(|i| *i != owner_at_start) {
        assert_eq!(
            cli(&nodes[other], &["DBSIZE"]),
            "0",
            "keys outside the slot's owner"
        );
    }

    // The replica takes the slot over.
    let failover = Instant::now();
    assert_eq!(cli(&nodes[3], &["CLUSTER", "FAILOVER"]), "OK");
    slowly(
        Duration::from_secs(20),
        "the replica serves the slot",
        || owner(nodes, slot) == Some(3),
    )
    .await;
    // The leader renews on the new owner and keeps its term.
    // A renewal there makes its time to live go up; a copy replicated from
    // the old owner only counts down.
    let mut last = i64::MAX;
    slowly(Duration::from_secs(10), "a renews on the new owner", || {
        let pttl = cli(&nodes[3], &["PTTL", "{lh}:g:{test/group}:lease"])
            .parse::<i64>()
            .unwrap_or(-2);
        let rose = pttl > last;
        last = pttl;
        rose
    })
    .await;
    assert_eq!(
        ga.leader_term(),
        Some(first),
        "a lost its lease in the failover"
    );
    assert!(!gb.is_leader());
    eprintln!(
        "a renewed on the new owner {:?} after the failover began",
        failover.elapsed()
    );

    a.close().await.unwrap();
    testkit::eventually(Duration::from_millis(3 * CFG.ttl_ms), "b leads", || {
        gb.is_leader()
    })
    .await;
    assert!(gb.leader_term() > Some(first), "{:?}", gb.leader_term());
    b.close().await.unwrap();
}

/// The lossy failover of a slot: the owner's replica link is cut, the
/// leader steps down so the next claim's term is written while the link is
/// down, the owner is SIGKILLed 150 ms later, its replica takes the slot
/// over (`CLUSTER FAILOVER TAKEOVER`, as an operator does for a dead
/// primary) and the killed node is restarted on its own directory, where it
/// rejoins as a replica. Every term any node leads under goes to a fenced
/// sink: none may come from two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_slot_failover_never_gives_a_term_two_holders() {
    const FAST: ElectionConfig = ElectionConfig {
        ttl_ms: 1000,
        renew_interval_ms: 300,
        retry_interval_ms: 200,
    };
    let (mut cluster, owner_at_start) = cluster_with_a_replica_of_the_slot().await;
    let seed = (owner_at_start + 1) % 3;
    let url = cluster.url_with_seed(seed);
    let slot = cluster.slot;
    let nodes = &mut cluster.nodes;
    let start = |id: &'static str| member(&url, id, FAST);
    let mut sink = testkit::fenced::FencedSink::default();
    let mut members = vec![start("test/a").await, start("test/b").await];
    let offer = |sink: &mut testkit::fenced::FencedSink,
                 members: &[(Node, leasehold_engine::Group)]| {
        for (n, g) in members {
            if let Some(term) = g.leader_term() {
                sink.write(n.id(), term);
            }
        }
    };
    let limit = Instant::now() + Duration::from_secs(10);
    while !members.iter().any(|(_, g)| g.is_leader()) {
        assert!(Instant::now() < limit, "no first leader");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    offer(&mut sink, &members);
    cli(
        &nodes[owner_at_start],
        &["CLIENT", "KILL", "TYPE", "replica"],
    );
    let leader = members
        .iter()
        .position(|(_, g)| g.is_leader())
        .expect("a leader");
    members[leader].0.step_down(GROUP).await.expect("step down");
    let cut = Instant::now();
    while cut.elapsed() < Duration::from_millis(150) {
        offer(&mut sink, &members);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    nodes[owner_at_start].kill();
    assert_eq!(cli(&nodes[3], &["CLUSTER", "FAILOVER", "TAKEOVER"]), "OK");
    // Sampled every 2 ms from here on, while the slot moves.
    let mut took_over = false;
    let moved = Instant::now();
    let mut restarted = false;
    members.push(start("test/c").await);
    let mut led_after = None;
    while moved.elapsed() < Duration::from_secs(20) {
        offer(&mut sink, &members);
        if !took_over && owner(&nodes[3..], slot) == Some(0) {
            took_over = true;
        }
        if took_over && !restarted && moved.elapsed() > Duration::from_millis(500) {
            nodes[owner_at_start]
                .restart_on_own_data(&[])
                .expect("the killed node restarts on its own directory");
            restarted = true;
        }
        if restarted && led_after.is_none() && members.iter().any(|(_, g)| g.is_leader()) {
            led_after = Some(moved.elapsed());
        }
        if led_after.is_some_and(|t| moved.elapsed() > t + Duration::from_secs(2)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(took_over, "the replica did not take the slot over");
    let led = led_after.expect("a leader after the failover");
    eprintln!("one leader {led:?} after the takeover; sink: {sink:?}");
    assert_eq!(sink.duplicates, 0, "a term had two holders: {sink:?}");
    assert_eq!(sink.stale, 0, "a term went back: {sink:?}");
    for (n, _) in members {
        n.close().await.unwrap();
    }
}

/// The slot's replica is down for 3 s (a pod's restart takes seconds)
/// while its primary takes more writes than its backlog holds (1 MB by
/// default), then restarts on its own directory, as a Redis pod does: it
/// cannot resume, so it rejoins in a full sync (Redis's defaults: 5 s of
/// `repl-diskless-sync-delay`, then the transfer). No lease write waits for
/// it while it syncs: the primary is believed without it once the
/// replica-loss grace is over (`REPLICA_LOSS_GRACE`, 5 s from the loss), so
/// the group leads again within that, the count's refresh and a retry
/// interval of the kill (two more to spare), and the leader leads on through the full sync and after it. Never
/// two leaders. It guards against counting the replica from its
/// reconnection, in its full sync, which leaves the slot without a leader
/// until the sync is over (about 8 s after the kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_rejoins_the_slot_in_a_full_sync_holds_no_lease_back() {
    const CFG: ElectionConfig = ElectionConfig {
        ttl_ms: 1000,
        renew_interval_ms: 300,
        retry_interval_ms: 200,
    };
    let (mut cluster, owner_at_start) = cluster_with_a_replica_of_the_slot().await;
    let url = cluster.url_with_seed(owner_at_start);
    let nodes = &mut cluster.nodes;
    let mut tally = testkit::sentinel::Tally::default();
    let (a, ga) = member(&url, "test/a", CFG).await;
    let (b, gb) = member(&url, "test/b", CFG).await;
    let groups = [&ga, &gb];
    tally
        .until(&groups, Duration::from_secs(10), "a leader", || {
            ga.is_leader() || gb.is_leader()
        })
        .await;
    let killed = Instant::now();
    nodes[3].kill();
    // 2 MB through the replication stream (a script's effects replicate
    // as its writes), past the 1 MB backlog.
    let filled = cli(
        &nodes[owner_at_start],
        &[
            "EVAL",
            "redis.call('SET', KEYS[1], string.rep('x', 2000000)) return 1",
            "1",
            "{lh}:test-filler",
        ],
    );
    assert_eq!(filled, "1");
    tally
        .until(&groups, Duration::from_secs(4), "3 s down", || {
            killed.elapsed() >= Duration::from_secs(3)
        })
        .await;
    nodes[3]
        .start_on_own_data(&[])
        .expect("the replica restarts on its directory");
    let owner_node = &nodes[owner_at_start];
    // The grace runs from the last count that saw the replica (at most a
    // refresh before the kill); the count that believes the loss comes at
    // the first refresh after it; then a claim, within a retry interval;
    // two more to spare.
    let bound = leasehold_engine::config::REPLICA_LOSS_GRACE
        + leasehold_engine::config::REPLICA_COUNT_REFRESH
        + 3 * CFG.retry_interval();
    let mut syncing_seen = false;
    let mut note = |info: &str| {
        syncing_seen |= info.contains("state=wait_bgsave") || info.contains("state=send_bulk");
    };
    // The leader stops leading when the loss is seen (its renewals wait for
    // the replica that left), and a leader comes back within the bound.
    tally
        .until(&groups, bound, "the leader stops", || {
            note(&cli(owner_node, &["INFO", "replication"]));
            !ga.is_leader() && !gb.is_leader()
        })
        .await;
    tally
        .until(
            &groups,
            bound.saturating_sub(killed.elapsed()),
            "a leader again",
            || {
                note(&cli(owner_node, &["INFO", "replication"]));
                ga.is_leader() || gb.is_leader()
            },
        )
        .await;
    let led = killed.elapsed();
    eprintln!("a leader again {led:?} after the replica's kill (bound {bound:?})");
    // The replica rejoins, in its full sync first: the leader leads on.
    let term = ga.leader_term().or(gb.leader_term()).expect("a leader");
    let mut steady = testkit::sentinel::Steady::new(term, 2 * CFG.retry_interval());
    tally
        .until(
            &groups,
            Duration::from_secs(60),
            "the replica in sync again",
            || {
                steady.sample(&groups, "while the replica rejoined");
                let info = cli(owner_node, &["INFO", "replication"]);
                note(&info);
                info.contains("state=online")
            },
        )
        .await;
    assert!(syncing_seen, "the replica's full sync was never seen");
    let since = Instant::now();
    tally
        .until(&groups, Duration::from_secs(5), "2 ttl in sync", || {
            steady.sample(&groups, "once the replica was back in sync");
            since.elapsed() > Duration::from_millis(2 * CFG.ttl_ms)
        })
        .await;
    eprintln!(
        "the longest moment without a leader after that: {:?}",
        steady.longest_gap
    );
    tally.assert_clean();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
