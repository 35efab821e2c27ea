//! A primary with a replica, both started by the test; the replica follows
//! the primary through a proxy, so the test can stall replication (the
//! replica lags) and then promote it, as a failover does. Lease writes count
//! only once the replica has them: `WAIT` on Redis, a synchronous standby
//! and `synchronous_commit = remote_apply` on PostgreSQL. The tests that
//! hold for both stores run on both; the last one is about how a Redis
//! primary counts its replicas (a PostgreSQL primary is told its standbys by
//! `synchronous_standby_names` and never stops waiting for them).

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use leasehold_engine::ElectionConfig;
use leasehold_engine::{Group, Node, Store};
use testkit::proxy::Proxy;
use testkit::store::StoreServer;
use testkit::{eventually, node_config, RedisServer, StoreFixture};

const GROUP: &str = "test/group";

/// A call timeout (the retry interval) of 300 ms, so a WAIT on a busy
/// machine is not mistaken for a lagging replica.
const CFG: ElectionConfig = ElectionConfig {
    ttl_ms: 1500,
    renew_interval_ms: 400,
    retry_interval_ms: 300,
};

async fn leader(server: &impl StoreFixture, id: &str) -> (Node, Group) {
    let n = Node::start(server.store(), id, node_config())
        .await
        .expect("node");
    let g = n.join(GROUP, CFG).expect("join");
    (n, g)
}

/// A store at `url` that never waits for replicas.
fn unconfirmed(url: &str) -> Store {
    use leasehold_engine::ReplicaAcks;
    Store::connect(url, "lh")
        .unwrap()
        .with_replica_acks(ReplicaAcks::Off, Duration::from_millis(250))
}

on_both_stores! {
/// A leads and releases under term 1 (replicated); replication stalls; B
/// claims on the primary; the replica is promoted without B's claim, and C
/// claims on it. It guards against B and C both leading under term 2: B's
/// claim is never confirmed, so B never leads, and term 2 has one holder (and C's term, of a new history, is above it).
/// On PostgreSQL B's commit waits for the standby and never returns.
async fn a_promoted_lagging_replica_never_hands_out_a_term_twice(primary: own) {
    let (replica, link) = primary.replica().await;
    let (a, ga) = leader(&primary, "test/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    assert_eq!(ga.leader_term(), Some(1));
    a.close().await.unwrap();
    eventually(Duration::from_secs(3), "term 1 replicated", || {
        replica.stored_term(GROUP) == 1
    })
    .await;

    // Replication stalls: the replica gets nothing more.
    link.pause();
    let (b, gb) = leader(&primary, "test/b").await;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_millis(1500) {
        assert_eq!(
            gb.leader_term(),
            None,
            "b leads on a claim its replica never got"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }

    // Failover: the replica is promoted without b's claim.
    replica.promote();
    let (c, gc) = leader(&replica, "test/c").await;
    eventually(Duration::from_secs(3), "c leads on the new primary", || {
        gc.is_leader()
    })
    .await;
    // The promoted replica is a new history: its first term opens a new
    // epoch, above every term of the old one (term.rs).
    let term = gc.leader_term().expect("c's term");
    assert!(
        term > 2 && leasehold_engine::term::count(term) == 1,
        "c's term {term} is not the first of a new epoch"
    );
    assert_eq!(gb.leader_term(), None, "b leads too");
    c.close().await.unwrap();
    drop(b);
    link.resume();
}
}

on_both_stores! {
/// With a healthy replica, claims and renewals are confirmed: a leader
/// keeps leading through many renewals. When replication stalls, its next
/// renewal is unconfirmed and it stops leading, as on any store error.
async fn a_renewal_the_replica_does_not_confirm_demotes_the_leader(primary: own) {
    let (_replica, link) = primary.replica().await;
    let cfg = CFG;
    let (a, ga) = leader(&primary, "test/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_millis(4 * cfg.ttl_ms) {
        assert_eq!(
            ga.leader_term(),
            Some(1),
            "a confirmed leader lost its lease"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    link.pause();
    // The next renewal (one renew interval) fails its WAIT, bounded by the
    // call timeout; two retry intervals of margin.
    eventually(
        Duration::from_millis(cfg.renew_interval_ms + 3 * cfg.retry_interval_ms),
        "a stopped leading",
        || !ga.is_leader(),
    )
    .await;
    link.resume();
    // Replication back: a leads again.
    eventually(Duration::from_secs(3), "a leads again", || ga.is_leader()).await;
    a.close().await.unwrap();
}
}

on_both_stores! {
/// A store's history: a promoted replica has a new replication id, so the
/// store counts as born again there. Here replicas are not waited for, so
/// b leads under term 2 on a claim the replica never got; after the
/// failover b's connection follows the new primary (as a Sentinel client's
/// would). It guards against c getting term 2 there at once, a second
/// holder of term 2: no lease is handed out for one ttl, b's claims meanwhile lift the
/// counter to the term it remembers, and the next leader's term is above 2.
/// (On PostgreSQL the promotion starts a new timeline.)
async fn a_promoted_replica_is_a_store_born_again(primary: own) {
    let (replica, link) = primary.replica().await;
    let (a, ga) = leader(&primary, "test/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    a.close().await.unwrap();
    // (The claim that made term 1 also recorded the primary's replication
    // id; a script's writes replicate together.)
    eventually(Duration::from_secs(3), "term 1 replicated", || {
        replica.stored_term(GROUP) == 1
    })
    .await;

    link.pause();
    let b_route = Proxy::start(primary.port()).await;
    let b = Node::start(unconfirmed(&primary.url_at(b_route.port)), "test/b", node_config())
        .await
        .unwrap();
    let gb = b.join(GROUP, CFG).unwrap();
    eventually(Duration::from_secs(3), "b leads on the old primary", || {
        gb.leader_term() == Some(2)
    })
    .await;

    // Failover: the replica is promoted; b's connection moves to it.
    replica.promote();
    let promoted = Instant::now();
    b_route.retarget(replica.port());
    b_route.cut();
    let c = Node::start(unconfirmed(&replica.url()), "test/c", node_config())
        .await
        .unwrap();
    let gc = c.join(GROUP, CFG).unwrap();
    // Nobody leads under a new lease for one ttl after the promotion was
    // seen; then someone does, above term 2.
    let mut new_term = None;
    while promoted.elapsed() < Duration::from_millis(3 * CFG.ttl_ms) {
        for g in [&gb, &gc] {
            if let Some(term) = g.leader_term().filter(|t| *t != 2) {
                new_term.get_or_insert((term, promoted.elapsed()));
            }
        }
        assert_ne!(gc.leader_term(), Some(2), "c leads under b's term 2");
        if new_term.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (term, after) = new_term.expect("a leader on the new primary");
    assert!(term > 2, "term {term} after the failover");
    assert!(
        after >= Duration::from_millis(CFG.ttl_ms - 2 * CFG.retry_interval_ms),
        "a lease {after:?} after the promotion, within its ttl"
    );
    drop(b);
    c.close().await.unwrap();
}
}

/// A primary that loses its replica (here the replica is promoted, as in a
/// failover the node has not followed yet) is believed only after the
/// replica-loss grace (5 s): until then the leader's renewals wait for the
/// replica that left, are not confirmed, and it stops leading. It guards
/// against the primary's "no replica" confirming every write at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_lost_its_replica_is_believed_only_after_a_grace() {
    let mut primary = StoreServer::Redis(RedisServer::start());
    let (replica, _link) = primary.replica().await;
    let (primary, replica) = (primary.redis().unwrap(), replica.redis().unwrap());
    let (a, ga) = leader(primary, "test/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let lost = Instant::now();
    eventually(
        Duration::from_secs(3),
        "the primary counts no replica",
        || {
            primary
                .cli(&["INFO", "replication"])
                .contains("connected_slaves:0")
        },
    )
    .await;
    // The count is re-read once a second, so the replica was last seen at
    // most 1 s before it left: no confirmation for 4 s at least; 500 ms of
    // margin.
    eventually(
        Duration::from_millis(CFG.renew_interval_ms + 1000 + 3 * CFG.retry_interval_ms),
        "a stops leading",
        || !ga.is_leader(),
    )
    .await;
    while lost.elapsed() < Duration::from_millis(3500) {
        assert!(
            !ga.is_leader(),
            "a led again {:?} after the replica left",
            lost.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Then the loss is believed, and a leads again on its lone primary.
    eventually(Duration::from_secs(5), "a leads again", || ga.is_leader()).await;
    a.close().await.unwrap();
}

/// A replica in its full sync holds no lease write back, but its loss is
/// believed only after the grace, as a replica in sync's is: Sentinel may
/// promote a replica while it syncs, and the primary it leaves behind must
/// not confirm leases alone meanwhile. A leads on a lone primary; a new,
/// empty replica attaches (its full sync waits 5 s, Redis's
/// `repl-diskless-sync-delay`) and a leads on; the replica is promoted in
/// the middle of its sync: a stops leading and stays so for the grace.
/// It guards against both ways to get this wrong: counting a syncing
/// replica at once (a stops leading as soon as it attaches), and counting
/// only replicas in sync with no grace (a leads on after the promotion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_in_its_full_sync_holds_nothing_back_but_its_loss_counts() {
    let primary = RedisServer::start();
    let (a, ga) = leader(&primary, "test/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let replica = RedisServer::start();
    replica.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    eventually(Duration::from_secs(3), "the replica syncing", || {
        primary
            .cli(&["INFO", "replication"])
            .contains("state=wait_bgsave")
    })
    .await;
    // Two count refreshes with it attached in its sync: a leads on.
    let attached = Instant::now();
    while attached.elapsed() < Duration::from_millis(2000) {
        assert!(ga.is_leader(), "a stopped leading while the replica synced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        primary
            .cli(&["INFO", "replication"])
            .contains("state=wait_bgsave"),
        "the replica's sync is over too soon for this test"
    );
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let lost = Instant::now();
    // The count is re-read once a second; a's next renewal then waits for
    // a replica that is gone. Two retry intervals of margin.
    eventually(
        Duration::from_millis(CFG.renew_interval_ms + 1000 + 3 * CFG.retry_interval_ms),
        "a stops leading",
        || !ga.is_leader(),
    )
    .await;
    // The grace runs from the last count that saw the replica, at most a
    // refresh before it left.
    let grace = leasehold_engine::config::REPLICA_LOSS_GRACE - Duration::from_millis(1000);
    while lost.elapsed() < grace {
        assert!(
            !ga.is_leader(),
            "a led again {:?} after the syncing replica left",
            lost.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eventually(Duration::from_secs(5), "a leads again", || ga.is_leader()).await;
    a.close().await.unwrap();
}

on_both_stores! {
/// A failover that leaves the old primary a primary (never demoted, as a
/// Sentinel that has not yet converted it leaves it), and a later one that
/// goes back to it: its data is a branch the history left behind, and
/// nothing on that server changed, so it cannot tell. b leads on the
/// promoted replica and dies with it; c then claims on the old primary.
/// It guards against both leading under term 2 (the old primary's counter
/// is 1): b's term opens a new epoch on the promoted replica, so c's term, of the old
/// branch, is below it: a fenced resource refuses c as stale (and a
/// claimant that saw b's term lifts the branch above it) but never sees
/// one term from two holders. Replicas are not waited for here: this is
/// the store's own defence. (On PostgreSQL the old primary takes writes
/// as well: a URL that names both servers reaches whichever answers first.)
async fn a_primary_left_behind_by_a_failover_never_repeats_a_term_when_found_again(old: own) {
    let (promoted, link) = old.replica().await;
    let route = Proxy::start(old.port()).await;
    let member = |id: &'static str| {
        let store = unconfirmed(&old.url_at(route.port));
        async move {
            let n = Node::start(store, id, node_config()).await.unwrap();
            let g = n.join(GROUP, CFG).unwrap();
            (n, g)
        }
    };
    let mut sink = testkit::fenced::FencedSink::default();
    let (a, ga) = member("test/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    assert!(sink.write("a", ga.leader_term().unwrap()));
    a.close().await.unwrap();
    eventually(Duration::from_secs(3), "term 1 replicated", || {
        promoted.stored_term(GROUP) == 1
    })
    .await;

    // Failover: the replica is promoted, the old primary stays a primary.
    link.pause();
    promoted.promote();
    route.retarget(promoted.port());
    route.cut();
    let (b, gb) = member("test/b").await;
    eventually(
        Duration::from_millis(CFG.ttl_ms.max(leasehold_engine::TERM_EPOCH_HOLD_MS) + 2000),
        "b leads on the promoted replica",
        || gb.is_leader(),
    )
    .await;
    let lost = gb.leader_term().unwrap();
    assert!(sink.write("b", lost));
    // b dies with the promoted replica; the route goes back to the old one.
    drop(gb);
    drop(b);
    route.retarget(old.port());
    route.cut();
    let (c, gc) = member("test/c").await;
    eventually(Duration::from_secs(5), "c leads on the old primary", || {
        gc.is_leader()
    })
    .await;
    let term = gc.leader_term().unwrap();
    sink.write("c", term);
    assert_eq!(
        sink.duplicates,
        0,
        "c led under term {term}, first used by {:?}",
        sink.holder(term)
    );
    c.close().await.unwrap();
    link.resume();
}
}

/// PostgreSQL's side of a replica that rejoins: the synchronous standby is SIGKILLed,
/// the primary writes 2 million rows meanwhile (with `synchronous_commit =
/// local`, so that this write does not wait), and the standby restarts on
/// its own data: it reconnects, catches up (`catchup` in
/// `pg_stat_replication`), then streams. PostgreSQL takes only a streaming
/// standby as the synchronous one, so until then every commit waits on the
/// server, lease writes too: the leader's renewal is not answered within
/// its bound, it stops leading, and nobody leads until the standby streams
/// again. leasehold does not take that wait away (docs/postgres.md says
/// why: nothing in front of PostgreSQL keeps a deposed primary from
/// confirming leases alone); it bounds its own: the group leads again
/// within a ttl and two retry intervals of the standby streaming (one more
/// to spare), and never two leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_that_catches_up_holds_lease_writes_until_it_streams() {
    let Some(mut primary) =
        StoreServer::start_own_or_skip(testkit::store::Kind::Postgres, "postgres")
    else {
        return;
    };
    let (mut standby, _link) = primary.replica().await;
    // The walsenders' states, as the primary lists them.
    let state = |primary: &mut StoreServer| {
        primary
            .postgres()
            .expect("postgres")
            .psql("SELECT coalesce(string_agg(state, ','), 'none') FROM pg_stat_replication")
            .unwrap_or_default()
    };
    let mut tally = testkit::sentinel::Tally::default();
    let (a, ga) = leader(&primary, "test/a").await;
    let (b, gb) = leader(&primary, "test/b").await;
    let groups = [&ga, &gb];
    tally
        .until(&groups, Duration::from_secs(5), "a leader", || {
            ga.is_leader() || gb.is_leader()
        })
        .await;
    let killed = Instant::now();
    standby.postgres().expect("a standby").kill();
    primary
        .postgres()
        .expect("postgres")
        .psql(
            "SET synchronous_commit = local; \
             CREATE TABLE filler AS SELECT g FROM generate_series(1, 2000000) g",
        )
        .expect("the filler");
    tally
        .until(&groups, Duration::from_secs(10), "the leader stops", || {
            !ga.is_leader() && !gb.is_leader()
        })
        .await;
    standby
        .postgres()
        .expect("a standby")
        .restart_on_own_data()
        .expect("the standby restarts");
    let mut seen = Vec::new();
    tally
        .until(
            &groups,
            Duration::from_secs(60),
            "the standby streams again",
            || {
                // Who leads, read before the state: a leader then, and a state
                // read after it that is not streaming, is a lease confirmed
                // while no standby could confirm it.
                let led = ga.is_leader() || gb.is_leader();
                let now = state(&mut primary);
                if seen.last() != Some(&now) {
                    seen.push(now.clone());
                }
                assert!(
                    now == "streaming" || !led,
                    "a leader while no standby streams: {seen:?}"
                );
                now == "streaming"
            },
        )
        .await;
    let streaming_at = Instant::now();
    let bound = Duration::from_millis(CFG.ttl_ms + 3 * CFG.retry_interval_ms);
    let led_after = tally
        .until(&groups, bound, "a leader once the standby streams", || {
            ga.is_leader() || gb.is_leader()
        })
        .await;
    eprintln!(
        "the standby's states {seen:?}; streaming again {:?} after the kill; a leader {led_after:?} after that",
        streaming_at.duration_since(killed)
    );
    tally.assert_clean();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
