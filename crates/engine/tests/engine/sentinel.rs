//! Behind Sentinel: nodes find the primary through three real sentinels
//! and follow it across failovers; a term never has two holders and two
//! nodes never lead at once, whatever the failover (forced, a primary
//! killed while its replica lags, a primary cut off with its leader).

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use leasehold_engine::{ElectionConfig, Group, Node, Role, Store};
use testkit::node_config;
use testkit::proxy::Proxy;
use testkit::sentinel::{Deployment, StaleSentinel, Tally};

const GROUP: &str = "test/group";

/// Sentinels find a silent primary down after this. At least two of the
/// engine's Sentinel rechecks (1 s), as docs/redis.md asks.
const DOWN_AFTER_MS: u64 = 2000;

/// A call timeout (the retry interval) of 300 ms, so a WAIT on a busy
/// machine is not mistaken for a lagging replica.
const CFG: ElectionConfig = ElectionConfig {
    ttl_ms: 1500,
    renew_interval_ms: 400,
    retry_interval_ms: 300,
};

/// `SENTINEL FAILOVER`, asked again until a sentinel takes it on (`OK`, or
/// `INPROG`: one is under way). A sentinel may refuse it, e.g. with
/// NOGOODSLAVE while its last look at the replica is too old on a loaded
/// machine; the test would then wait for a switch nobody started. The
/// groups are sampled meanwhile.
async fn force_failover(d: &Deployment, tally: &mut Tally, groups: &[&Group]) {
    let mut answer = String::new();
    for _ in 0..50 {
        answer = d.sentinels[0]
            .cli(&["SENTINEL", "FAILOVER", testkit::sentinel::MASTER])
            .unwrap();
        if answer == "OK" || answer.starts_with("INPROG") {
            return;
        }
        for _ in 0..40 {
            tally.sample(groups);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    panic!("SENTINEL FAILOVER refused 50 times; the last answer: {answer}");
}

async fn member(url: &str, id: &str) -> (Node, Group) {
    member_with(url, id, CFG).await
}

async fn member_with(url: &str, id: &str, cfg: ElectionConfig) -> (Node, Group) {
    member_of(Store::connect(url, "lh").expect("a sentinel URL"), id, cfg).await
}

async fn member_of(store: Store, id: &str, cfg: ElectionConfig) -> (Node, Group) {
    let node = Node::start(store, id, node_config()).await.expect("node");
    let group = node.join(GROUP, cfg).expect("join");
    (node, group)
}

/// `redis-cli` flags to act as user `a`, the one the old primary keeps.
const AS_A: [&str; 5] = ["--user", "a", "--pass", "pw", "--no-auth-warning"];

/// A user per node on every server (password `pw`), so a partition can shut
/// b out of the old primary and leave a in; the replica replicates as a.
fn users_a_and_b(d: &Deployment) {
    for server in &d.servers {
        for user in ["a", "b"] {
            server.cli(&["ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all"]);
        }
    }
    // The replica replicates as a, so that shutting b (and the sentinels)
    // out of the old primary leaves its replication link up: the
    // partition these tests make.
    d.servers[1].cli(&["CONFIG", "SET", "masteruser", "a"]);
    d.servers[1].cli(&["CONFIG", "SET", "masterauth", "pw"]);
}

/// Node a (asking the sentinels at `ports`) and node b (asking the real
/// ones directly), as users a and b; returns once a leads and b follows.
async fn a_leads_b_follows(
    d: &Deployment,
    ports: &[u16],
    tally: &mut Tally,
) -> ((Node, Group), (Node, Group)) {
    let as_user = |url: String, user: &str| url.replacen("://", &format!("://{user}:pw@"), 1);
    let (a, ga) = member(&as_user(d.url_via(ports), "a"), "test/a").await;
    tally
        .until(&[&ga], Duration::from_secs(5), "a leads", || ga.is_leader())
        .await;
    let (b, gb) = member(&as_user(d.url(), "b"), "test/b").await;
    tally
        .until(&[&ga, &gb], Duration::from_secs(2), "b follows a", || {
            matches!(testkit::role(&gb), Role::Follower { ref leader, .. } if leader == "test/a")
        })
        .await;
    ((a, ga), (b, gb))
}

/// The old primary's side of a partition: its replication link closed for
/// good (so it counts no replica), and every user but a shut out of it
/// (the sentinels, as `default`, and b). Returns the moment of the cut.
fn cut_off_old_primary(d: &mut Deployment) -> Instant {
    let link = d.links[1].take().expect("the replica's link");
    link.cut();
    drop(link);
    let old = &d.servers[0];
    for user in ["default", "b"] {
        old.cli(&[&AS_A[..], &["ACL", "SETUSER", user, "off"]].concat());
        old.cli(&[&AS_A[..], &["CLIENT", "KILL", "USER", user]].concat());
    }
    Instant::now()
}

/// A forced failover (`SENTINEL FAILOVER`): the replica has every
/// confirmed write, so the leader goes on leading under its term on the
/// new primary, and when it leaves, the next leader gets a higher term
/// there, one ttl after the new primary was first claimed on. The ttl is
/// longer here than elsewhere: writes stop for a moment in a failover
/// (between the promotion and the sentinels naming the new primary, about
/// a second), and a lease shorter than that would lapse, safely but
/// without showing that the leader is followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_follow_a_forced_failover() {
    const CFG: ElectionConfig = ElectionConfig {
        ttl_ms: 5000,
        renew_interval_ms: 1000,
        retry_interval_ms: 300,
    };
    let d = Deployment::start(1, DOWN_AFTER_MS).await;
    let mut tally = Tally::default();
    let store = Store::connect(&d.url(), "lh").unwrap();
    let (a, ga) = member_of(store, "test/a", CFG).await;
    tally
        .until(&[&ga], Duration::from_secs(5), "a leads", || ga.is_leader())
        .await;
    let (b, gb) = member_with(&d.url(), "test/b", CFG).await;
    let groups = [&ga, &gb];
    tally
        .until(&groups, Duration::from_secs(2), "b follows a", || {
            matches!(testkit::role(&gb), Role::Follower { ref leader, .. } if leader == "test/a")
        })
        .await;

    force_failover(&d, &mut tally, &groups).await;
    let mut new = None;
    tally
        .until(
            &groups,
            Duration::from_secs(20),
            "the sentinels name the replica",
            || {
                new = d.primary().filter(|p| *p == 1);
                new.is_some()
            },
        )
        .await;
    // a renews on the new primary (a's route asks the sentinels again at
    // least once a second): the lease there is refreshed.
    // A renewal there makes its time to live go up; a copy replicated
    // from the old primary only counts down.
    let mut last = i64::MAX;
    let renewed_there = || {
        let pttl = d.servers[1]
            .cli(&["PTTL", "lh:g:{test/group}:lease"])
            .parse::<i64>()
            .unwrap_or(-2);
        let rose = pttl > last;
        last = pttl;
        rose
    };
    tally
        .until(
            &groups,
            Duration::from_secs(5),
            "a renews on the new primary",
            renewed_there,
        )
        .await;
    assert_eq!(
        ga.leader_term(),
        Some(1),
        "a lost its lease in the failover"
    );

    a.close().await.unwrap();
    tally
        .until(
            &[&gb],
            Duration::from_millis(4 * CFG.ttl_ms),
            "b leads",
            || gb.is_leader(),
        )
        .await;
    assert!(gb.leader_term() > Some(1), "{:?}", gb.leader_term());
    let lease = d.servers[1].cli(&["GET", "lh:g:{test/group}:lease"]);
    assert!(
        lease.starts_with("test/b#"),
        "lease on the new primary: {lease}"
    );
    tally.assert_clean();
    b.close().await.unwrap();
}

/// The run (48), on Redis's own replication settings: three nodes
/// at ttl 1000 / renew 300 / retry 200 ms, one replica, `SENTINEL
/// FAILOVER`. The group leads again within the hold of the store born
/// again, the nodes' next look at the sentinels and a retry interval of
/// the switch, with two retry intervals to spare; and when the old primary
/// rejoins as a replica (Sentinel converts it some seconds later, then its
/// full sync waits 5 s, `repl-diskless-sync-delay`), the leader leads on
/// under its term. It guards against claims that wait for the old primary
/// in its full sync, each for the call's whole bound, which leaves the
/// group without a leader until that sync is over (15-20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_failover_on_redis_defaults_is_over_within_the_hold() {
    const CFG: ElectionConfig = ElectionConfig {
        ttl_ms: 1000,
        renew_interval_ms: 300,
        retry_interval_ms: 200,
    };
    let d = Deployment::start(1, DOWN_AFTER_MS).await;
    let mut tally = Tally::default();
    let mut members = Vec::new();
    for i in 0..3 {
        members.push(member_with(&d.url(), &format!("test/n{i}"), CFG).await);
    }
    let groups: Vec<&Group> = members.iter().map(|(_, g)| g).collect();
    tally
        .until(&groups, Duration::from_secs(10), "a first leader", || {
            groups.iter().any(|g| g.is_leader())
        })
        .await;
    force_failover(&d, &mut tally, &groups).await;
    tally
        .until(
            &groups,
            Duration::from_secs(20),
            "the sentinels name the replica",
            || d.primary() == Some(1),
        )
        .await;
    // From the switch (the sentinels name the new primary):
    let hold = Duration::from_millis(CFG.ttl_ms.max(leasehold_engine::TERM_EPOCH_HOLD_MS));
    let bound = hold
        + leasehold_engine::config::SENTINEL_RECHECK
        + leasehold_engine::config::SENTINEL_TIMEOUT
        + 3 * CFG.retry_interval();
    let led = tally
        .until(&groups, bound, "a leader after the switch", || {
            groups.iter().any(|g| g.is_leader())
        })
        .await;
    let term = groups
        .iter()
        .find_map(|g| g.leader_term())
        .expect("a leader");
    eprintln!("a leader {led:?} after the switch (bound {bound:?})");
    let mut steady = testkit::sentinel::Steady::new(term, 2 * CFG.retry_interval());
    // The old primary rejoins, in a full sync first: the leader leads on.
    let new_primary = &d.servers[1];
    let rejoined = tally
        .until(
            &groups,
            Duration::from_secs(60),
            "the old primary in sync with the new one",
            || {
                steady.sample(&groups, "while the old primary rejoined");
                new_primary
                    .cli(&["INFO", "replication"])
                    .contains("state=online")
            },
        )
        .await;
    eprintln!("the old primary in sync {rejoined:?} later");
    let since = Instant::now();
    tally
        .until(
            &groups,
            Duration::from_secs(5),
            "2 ttl with it in sync",
            || {
                steady.sample(&groups, "once it was in sync");
                since.elapsed() > Duration::from_millis(2 * CFG.ttl_ms)
            },
        )
        .await;
    eprintln!(
        "the longest moment without a leader after that: {:?}",
        steady.longest_gap
    );
    tally.assert_clean();
    for (node, _) in members {
        node.close().await.unwrap();
    }
}

/// The primary is killed while its replica lags (replication stalled):
/// the leader's renewals are no longer confirmed, so it stops leading; a
/// claim made on the old primary meanwhile is not confirmed either. The
/// sentinels promote the lagging replica, and the next leader there gets a
/// term above every term anyone led under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_while_its_replica_lags() {
    let mut d = Deployment::start(1, DOWN_AFTER_MS).await;
    let mut tally = Tally::default();
    let (a, ga) = member(&d.url(), "test/a").await;
    let (_b, gb) = member(&d.url(), "test/b").await;
    let groups = [&ga, &gb];
    tally
        .until(&groups, Duration::from_secs(5), "a leader", || {
            ga.is_leader() || gb.is_leader()
        })
        .await;
    let first = tally.highest;

    d.links[1].as_ref().unwrap().pause();
    let stalled = Instant::now();
    tally
        .until(
            &groups,
            Duration::from_millis(2 * CFG.ttl_ms),
            "nobody leads",
            || !ga.is_leader() && !gb.is_leader(),
        )
        .await;
    // Nobody leads while the replica lags: every claim is unconfirmed.
    tally
        .until(
            &groups,
            Duration::from_secs(5),
            "a second without a leader",
            || stalled.elapsed() > Duration::from_millis(2 * CFG.ttl_ms),
        )
        .await;
    assert_eq!(tally.highest, first, "someone led while the replica lagged");

    d.servers[0].kill();
    let new = d.failed_over_from(0, Duration::from_secs(30)).await;
    assert_eq!(new, 1);
    d.links[1].as_ref().unwrap().resume();
    let took = tally
        .until(
            &groups,
            Duration::from_secs(15),
            "a leader on the new primary",
            || ga.is_leader() || gb.is_leader(),
        )
        .await;
    assert!(tally.highest > first, "{tally:?}");
    tally.assert_clean();
    eprintln!("leader on the new primary {took:?} after the sentinels named it");
    a.close().await.unwrap();
}

/// The old primary is cut off together with the old leader: the leader can
/// still write to it, but reaches no sentinel; the sentinels, the other
/// node and the replica no longer reach the primary (their users are
/// switched off there, and the replication link is closed). The sentinels
/// promote the replica. The old primary, with no replica left, confirms
/// every write at once, so only the sentinels' word can stop the old
/// leader: its route has no sentinel majority behind it, so it makes no
/// write; it stops leading within its ttl, before the new primary hands out
/// a lease, and the new leader's term is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_with_the_old_primary_stops_leading() {
    let mut d = Deployment::start(1, DOWN_AFTER_MS).await;
    users_a_and_b(&d);
    // a reaches the sentinels through proxies, which the partition cuts.
    let mut fronts = Vec::new();
    for s in &d.sentinels {
        fronts.push(Proxy::start(s.port).await);
    }
    let ports: Vec<u16> = fronts.iter().map(|p| p.port).collect();
    let mut tally = Tally::default();
    let ((a, ga), (b, gb)) = a_leads_b_follows(&d, &ports, &mut tally).await;
    let groups = [&ga, &gb];

    // The partition.
    for front in &fronts {
        front.pause();
        front.cut();
    }
    let cut = cut_off_old_primary(&mut d);
    let old = &d.servers[0];

    let stopped = tally
        .until(
            &groups,
            Duration::from_millis(CFG.ttl_ms + 2 * CFG.retry_interval_ms + 1000),
            "a stops leading",
            || !ga.is_leader(),
        )
        .await;
    eprintln!("a stopped leading {stopped:?} after the cut");
    d.failed_over_from(0, Duration::from_secs(30)).await;
    tally
        .until(
            &groups,
            Duration::from_secs(15),
            "b leads on the new primary",
            || gb.is_leader(),
        )
        .await;
    assert!(gb.leader_term() > Some(1), "{:?}", gb.leader_term());
    eprintln!("b leads {:?} after the cut", cut.elapsed());
    // a does not lead again while it cannot reach the sentinels, though the
    // old primary still takes its writes.
    tally
        .until(&groups, Duration::from_secs(10), "two more ttls", || {
            cut.elapsed() > stopped + Duration::from_millis(4 * CFG.ttl_ms)
        })
        .await;
    let role = old.cli(&[&AS_A[..], &["ROLE"]].concat());
    assert_eq!(
        role.lines().next(),
        Some("master"),
        "the old primary must still take writes, or the test proves nothing"
    );
    let info = old.cli(&[&AS_A[..], &["INFO", "replication"]].concat());
    assert!(info.contains("connected_slaves:0"), "{info}");
    tally.assert_clean();
    drop(a);
    b.close().await.unwrap();
}

/// A node that still reaches one sentinel, cut off together with the old
/// primary, while the other two fail over: that sentinel goes on naming
/// the old primary, which still takes the node's writes. One sentinel is
/// not a majority, so the node makes no write and stops leading; a node
/// that trusted any one sentinel (as the redis crate's Sentinel client
/// does) would lead on the old primary next to the new leader. The
/// minority sentinel is a stand-in (`StaleSentinel`): see there why. The
/// test watches for longer than the replica-loss grace, after which the
/// old primary, with no replica left, would confirm that node's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_in_the_minority_is_not_believed() {
    let mut d = Deployment::start(1, DOWN_AFTER_MS).await;
    users_a_and_b(&d);
    // a asks the stand-in and, through proxies, two real sentinels.
    let minority = StaleSentinel::start(d.servers[0].port).await;
    let mut fronts = Vec::new();
    for s in &d.sentinels[1..] {
        fronts.push(Proxy::start(s.port).await);
    }
    let ports = [minority.port, fronts[0].port, fronts[1].port];
    let mut tally = Tally::default();
    let ((a, ga), (b, gb)) = a_leads_b_follows(&d, &ports, &mut tally).await;
    let groups = [&ga, &gb];

    // The partition: the old primary, the stand-in and a on one side; the
    // replica, the real sentinels and b on the other.
    for front in &fronts {
        front.pause();
        front.cut();
    }
    let cut = cut_off_old_primary(&mut d);
    let old = &d.servers[0];

    let stopped = tally
        .until(
            &groups,
            Duration::from_millis(CFG.ttl_ms + 2 * CFG.retry_interval_ms + 1000),
            "a stops leading",
            || !ga.is_leader(),
        )
        .await;
    eprintln!("a stopped leading {stopped:?} after the cut");
    tally
        .until(
            &groups,
            Duration::from_secs(20),
            "b leads on the new primary",
            || gb.is_leader(),
        )
        .await;
    assert!(gb.leader_term() > Some(1), "{:?}", gb.leader_term());
    // Past the replica-loss grace (5 s), a does not lead again.
    tally
        .until(
            &groups,
            Duration::from_secs(15),
            "the grace and two ttls",
            || {
                cut.elapsed()
                    > Duration::from_secs(5) + stopped + Duration::from_millis(2 * CFG.ttl_ms)
            },
        )
        .await;
    let role = old.cli(&[&AS_A[..], &["ROLE"]].concat());
    assert_eq!(
        role.lines().next(),
        Some("master"),
        "the old primary must still take writes"
    );
    tally.assert_clean();
    drop(a);
    b.close().await.unwrap();
}

/// A promoted replica has no replica in sync at first: the others, and the
/// old primary, attach to it later, or not at all. It confirms a lease on
/// its own word, once the hold of a store born again is over (its new
/// replication id): what it confirms alone and then loses with it is met
/// by the next promotion as a store born again too (no lease for one ttl,
/// a new term epoch; `replication::a_promoted_replica_is_a_store_born_again`
/// shows that holding with no replica waited for at all). It guards
/// against claims on it that wait for the old primary's count of replicas
/// for 5 s (`REPLICA_LOSS_GRACE`), then for the old primary's full sync
/// once it rejoins: 15-20 s without a leader after each failover on
/// Redis's default `repl-diskless-sync-delay`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_primary_with_no_replica_in_sync_confirms_alone_after_the_hold() {
    let d = Deployment::start(1, DOWN_AFTER_MS).await;
    users_a_and_b(&d);
    let mut tally = Tally::default();
    let ((a, ga), (b, gb)) = a_leads_b_follows(
        &d,
        &d.sentinels.iter().map(|s| s.port).collect::<Vec<_>>(),
        &mut tally,
    )
    .await;
    let groups = [&ga, &gb];
    let before = ga.leader_term().expect("a leads");
    // The primary stalls: it takes no write and will not attach to the new
    // one. The sentinels promote the replica, which then has no replica.
    d.servers[0].pause();
    // The copy of a's lease on the replica runs out first: a claim that
    // finds its own confirmed lease standing is, by design, confirmed as
    // a renewal is (by the new primary's own count).
    let paused = Instant::now();
    tally
        .until(
            &groups,
            Duration::from_secs(5),
            "a's lease runs out",
            || paused.elapsed() > Duration::from_millis(CFG.ttl_ms + 2 * CFG.retry_interval_ms),
        )
        .await;
    force_failover(&d, &mut tally, &groups).await;
    let mut named = None;
    tally
        .until(
            &groups,
            Duration::from_secs(20),
            "the sentinels name the replica",
            || {
                named = d.primary().filter(|p| *p == 1);
                named.is_some()
            },
        )
        .await;
    let switched = Instant::now();
    assert_eq!(
        d.servers[1]
            .cli(&["INFO", "replication"])
            .lines()
            .find(|l| l.starts_with("connected_slaves")),
        Some("connected_slaves:0")
    );
    // Nobody leads in the hold of the store born again (one ttl from the
    // first claim on it, which comes after it was named); then one of them
    // does, within the hold, the nodes' next look at the sentinels
    // (`SENTINEL_RECHECK` and its timeout) and a retry interval, with two
    // retry intervals to spare.
    let hold = Duration::from_millis(CFG.ttl_ms.max(leasehold_engine::TERM_EPOCH_HOLD_MS));
    let bound = hold
        + leasehold_engine::config::SENTINEL_RECHECK
        + leasehold_engine::config::SENTINEL_TIMEOUT
        + 3 * CFG.retry_interval();
    let quiet = Duration::from_millis(CFG.ttl_ms) - 2 * CFG.retry_interval();
    let mut led = None;
    while switched.elapsed() < bound {
        tally.sample(&groups);
        if let Some(t) = ga.leader_term().or(gb.leader_term()) {
            led = Some((t, switched.elapsed()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (term, after) = led.unwrap_or_else(|| panic!("no leader within {bound:?} of the switch"));
    eprintln!("a leader under term {term} {after:?} after the switch");
    assert!(
        after >= quiet,
        "a lease {after:?} after the switch, in the hold"
    );
    // A new history: its first term opens a new epoch.
    let epoch = leasehold_engine::term::epoch;
    assert!(
        epoch(term) > epoch(before),
        "term {term} after the failover, {before} before: not a new epoch"
    );
    tally.assert_clean();
    d.servers[0].resume();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
