//! Leader election against a real redis-server: one test per row of the
//! failover table in docs/behaviour.md (E2-E6), plus E7-E11 and X1-X7.
//! Timings are short (see `testkit::fast`); bounds carry a margin of at
//! least two retry intervals.

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use leasehold_engine::{ElectionConfig, Event, LostReason, Node, Role};
use testkit::{
    eventually, fast, followers_see_the_leader, is_follower, next_event, node, one_leader, role,
    RedisServer, StoreFixture,
};

const GROUP: &str = "test/group";

async fn three(
    redis: &impl StoreFixture,
    config: ElectionConfig,
) -> (Vec<Node>, Vec<leasehold_engine::Group>) {
    let mut nodes = Vec::new();
    let mut groups = Vec::new();
    for i in 0..3 {
        let n = node(redis, &format!("test/n{i}")).await;
        groups.push(n.join(GROUP, config).unwrap());
        nodes.push(n);
    }
    (nodes, groups)
}

fn refs(groups: &[leasehold_engine::Group]) -> Vec<&leasehold_engine::Group> {
    groups.iter().collect()
}

on_both_stores! {
/// docs/behaviour.md E2: graceful shutdown releases the lease; takeover <= retry.
async fn graceful_shutdown_hands_over_within_retry(server) {
    let cfg = fast();
    let (mut nodes, mut groups) = three(&server, cfg).await;
    let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
    let old_term = groups[leader].leader_term().unwrap();
    let mut events = nodes[leader].events();
    let node = nodes.remove(leader);
    groups.remove(leader);
    let start = Instant::now();
    node.shutdown().await;
    let lost = next_event(&mut events, Duration::from_secs(1), |e| {
        matches!(e, Event::Lost { .. })
    })
    .await;
    assert!(
        matches!(lost, Event::Lost { reason: LostReason::Shutdown, term, .. } if term == old_term),
        "{lost:?}"
    );
    let next = one_leader(&refs(&groups), cfg.retry_interval() * 3).await;
    let took = start.elapsed();
    assert!(took <= cfg.retry_interval() * 3, "takeover took {took:?}");
    assert!(groups[next].leader_term().unwrap() > old_term);
    node.close().await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md E3, E9: released at once, takeover <= retry, and the
/// stepping-down node does not win its own seat back for one ttl.
async fn step_down_releases_at_once_and_abstains_for_a_ttl(server) {
    let cfg = fast();
    let (nodes, groups) = three(&server, cfg).await;
    let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
    let start = Instant::now();
    assert!(
        nodes[leader].step_down(GROUP).await.unwrap(),
        "it was leading"
    );
    assert!(!groups[leader].is_leader());
    assert_eq!(role(&groups[leader]), Role::Abstaining);
    let next = one_leader(&refs(&groups), cfg.retry_interval() * 3).await;
    assert_ne!(next, leader);
    // The new leader steps down too, inside the first node's cooldown: the
    // seat must go to the third node, never back to the first.
    nodes[next].step_down(GROUP).await.unwrap();
    let third = one_leader(&refs(&groups), cfg.retry_interval() * 3).await;
    assert!(third != leader && third != next);
    // Until one ttl after its step-down (less a margin), the first node abstains.
    while start.elapsed() < cfg.ttl() - cfg.retry_interval() {
        assert_eq!(role(&groups[leader]), Role::Abstaining);
        assert!(!groups[leader].is_leader());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // After the cooldown it is a candidate again and follows the third node.
    eventually(
        cfg.ttl() + cfg.retry_interval() * 3,
        "first node follows again",
        || is_follower(&groups[leader]),
    )
    .await;
    for n in nodes {
        n.close().await.unwrap();
    }
}
}

on_both_stores! {
/// A lone node that steps down takes its seat back after the cooldown, not before.
async fn step_down_alone_retakes_after_one_ttl(server) {
    let cfg = fast();
    let n = node(&server, "test/alone").await;
    let g = n.join(GROUP, cfg).unwrap();
    eventually(Duration::from_secs(3), "leads", || g.is_leader()).await;
    let start = Instant::now();
    n.step_down(GROUP).await.unwrap();
    eventually(cfg.ttl() + cfg.retry_interval() * 3, "leads again", || {
        g.is_leader()
    })
    .await;
    let took = start.elapsed();
    assert!(
        took >= cfg.ttl() - Duration::from_millis(5),
        "re-took after {took:?}, inside its cooldown"
    );
    n.close().await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md E4: the lease expires on its own; takeover <= ttl + retry.
async fn crash_takeover_within_ttl_plus_retry(server) {
    let cfg = fast();
    let (mut nodes, mut groups) = three(&server, cfg).await;
    let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
    let start = Instant::now();
    drop(nodes.remove(leader)); // no release: a crash
    groups.remove(leader);
    one_leader(&refs(&groups), cfg.ttl() + cfg.retry_interval() * 3).await;
    let took = start.elapsed();
    assert!(
        took <= cfg.ttl() + cfg.retry_interval() * 3,
        "takeover took {took:?}"
    );
    assert!(
        took >= cfg.ttl() - cfg.renew_interval() - Duration::from_millis(20),
        "took over a live lease after {took:?}"
    );
}
}

on_both_stores! {
/// Beyond the seed: followers wake when the lease is due to expire, so a
/// crash costs ttl plus a few ms, not ttl plus up to a retry interval. The
/// retry interval here is far longer than the bound, so a retry-tick design
/// fails this test.
async fn crash_takeover_wakes_at_lease_expiry(server) {
    let cfg = ElectionConfig {
        ttl_ms: 600,
        renew_interval_ms: 200,
        retry_interval_ms: 5_000,
    };
    let (mut nodes, mut groups) = three(&server, cfg).await;
    let leader = one_leader(&refs(&groups), Duration::from_secs(12)).await;
    // Let the followers see the leader (their claim reads the PTTL).
    followers_see_the_leader(&groups, Duration::from_secs(12)).await;
    let start = Instant::now();
    drop(nodes.remove(leader));
    groups.remove(leader);
    one_leader(&refs(&groups), cfg.ttl() + Duration::from_millis(400)).await;
    let took = start.elapsed();
    assert!(
        took <= cfg.ttl() + Duration::from_millis(400),
        "takeover took {took:?}"
    );
}
}

on_both_stores! {
/// Beyond the seed: a release is announced on pub/sub, so followers take
/// over at once rather than on their retry tick (5 s here).
async fn followers_wake_on_release_not_on_their_retry_tick(server) {
    let cfg = ElectionConfig {
        ttl_ms: 10_000,
        renew_interval_ms: 1_000,
        retry_interval_ms: 5_000,
    };
    let (nodes, groups) = three(&server, cfg).await;
    let leader = one_leader(&refs(&groups), Duration::from_secs(12)).await;
    followers_see_the_leader(&groups, Duration::from_secs(12)).await;
    let start = Instant::now();
    nodes[leader].step_down(GROUP).await.unwrap();
    one_leader(&refs(&groups), Duration::from_millis(500)).await;
    assert!(start.elapsed() <= Duration::from_millis(500));
    for n in nodes {
        n.close().await.unwrap();
    }
}
}

on_both_stores! {
/// docs/behaviour.md E5, X5: the stale own lease is
/// re-claimed at once, under a new term, while the others still wait.
async fn unclean_restart_with_stable_id_reclaims_at_boot(server) {
    let cfg = ElectionConfig {
        ttl_ms: 3_000,
        renew_interval_ms: 500,
        retry_interval_ms: 100,
    };
    let a = node(&server, "test/stable").await;
    let ga = a.join(GROUP, cfg).unwrap();
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let b = node(&server, "test/other").await;
    let gb = b.join(GROUP, cfg).unwrap();
    eventually(Duration::from_secs(3), "b follows", || is_follower(&gb)).await;
    let old_term = ga.leader_term().unwrap();
    drop(a); // crash, lease left behind
    drop(ga);
    let start = Instant::now();
    let restarted = node(&server, "test/stable").await;
    let gr = restarted.join(GROUP, cfg).unwrap();
    eventually(cfg.retry_interval() * 3, "the restarted node leads", || {
        gr.is_leader()
    })
    .await;
    assert!(
        start.elapsed() < cfg.ttl() / 2,
        "waited for the ttl instead"
    );
    assert!(
        gr.leader_term().unwrap() > old_term,
        "a restart is a new acquisition"
    );
    assert!(!gb.is_leader());
    restarted.close().await.unwrap();
    b.close().await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md E6: the leader demotes on its first failed
/// renewal, then re-claims its still-held lease when Redis is back.
async fn redis_briefly_unavailable_demotes_then_reclaims(server: own) {
    let cfg = ElectionConfig {
        ttl_ms: 3_000,
        renew_interval_ms: 200,
        retry_interval_ms: 100,
    };
    let (nodes, groups) = three(&server, cfg).await;
    let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
    let term = groups[leader].leader_term().unwrap();
    let mut events = nodes[leader].events();
    server.pause();
    let paused = Instant::now();
    // The next renewal is due within renew_interval and is bounded by retry.
    let lost = next_event(
        &mut events,
        cfg.renew_interval() + cfg.retry_interval() * 3,
        |e| matches!(e, Event::Lost { .. }),
    )
    .await;
    assert!(
        matches!(
            lost,
            Event::Lost {
                reason: LostReason::StoreError,
                ..
            }
        ),
        "{lost:?}"
    );
    assert!(
        groups.iter().all(|g| !g.is_leader()),
        "nobody leads while Redis is away"
    );
    let demoted_after = paused.elapsed();
    assert!(
        demoted_after < cfg.ttl() / 2,
        "demoted only after {demoted_after:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    let back = Instant::now();
    let again = one_leader(&refs(&groups), cfg.retry_interval() * 3).await;
    assert!(back.elapsed() <= cfg.retry_interval() * 3);
    assert_eq!(
        again, leader,
        "the lease was still held, so its holder re-claims it"
    );
    assert_eq!(
        groups[again].leader_term(),
        Some(term),
        "an unbroken lease keeps its term"
    );
    for n in nodes {
        n.close().await.unwrap();
    }
}
}

on_both_stores! {
/// `Group::leadership` gives the term with the instant the local view ends
/// (within a ttl of now), its watch moves at every confirmed renewal, and
/// once renewals stop the view ends at that instant and the watch says so.
async fn leadership_ends_at_its_instant_and_moves_with_each_renewal(server: own) {
    let cfg = fast();
    let n = node(&server, "test/lead").await;
    let g = n.join(GROUP, cfg).unwrap();
    eventually(Duration::from_secs(3), "leads", || g.is_leader()).await;
    let first = g.leadership().expect("leads");
    let now = tokio::time::Instant::now();
    assert!(first.until > now && first.until <= now + cfg.ttl(), "{first:?}");
    assert_eq!(g.leader_term(), Some(first.term));
    let mut renewals = g.leadership_changes();
    renewals.mark_unchanged();
    tokio::time::timeout(cfg.renew_interval() + 2 * cfg.retry_interval(), renewals.changed())
        .await
        .expect("a renewal within a renew interval")
        .unwrap();
    let renewed = (*renewals.borrow_and_update()).expect("still leads");
    assert_eq!(renewed.term, first.term);
    assert!(renewed.until > first.until, "{renewed:?} after {first:?}");
    server.pause();
    // A renewal answered just before the pause may still be on its way in:
    // let it land before reading the last instant.
    tokio::time::sleep(cfg.retry_interval()).await;
    let last = g.leadership().expect("still leads a moment after the pause");
    tokio::time::sleep_until(last.until + Duration::from_millis(1)).await;
    assert_eq!(g.leadership(), None, "the view outlived its instant");
    assert_eq!(last.remaining(), Duration::ZERO);
    eventually(2 * cfg.retry_interval(), "the watch says the view ended", || {
        renewals.borrow_and_update().is_none()
    })
    .await;
    server.resume();
    drop(n);
}
}

on_both_stores! {
/// A leader counts as leader only while its local view of the lease is valid:
/// with renewals hanging (Redis paused) and a retry interval longer than the
/// ttl, it stops leading when its local lease runs out, before Redis's expiry.
async fn leader_stops_leading_when_its_local_lease_runs_out(server: own) {
    let cfg = ElectionConfig {
        ttl_ms: 500,
        renew_interval_ms: 100,
        retry_interval_ms: 5_000,
    };
    let n = node(&server, "test/local").await;
    let g = n.join(GROUP, cfg).unwrap();
    eventually(Duration::from_secs(3), "leads", || g.is_leader()).await;
    // Let it renew a few times, then pause: the local view, from its last
    // renewal, has at most ttl left.
    tokio::time::sleep(cfg.renew_interval() * 3).await;
    assert!(g.is_leader());
    let mut role_rx = g.role();
    server.pause();
    let paused = Instant::now();
    // Checked at an instant rather than polled, so no polling delay blurs it:
    // one ttl after the pause (or later, if the test oversleeps) it must not lead.
    tokio::time::sleep_until((paused + cfg.ttl()).into()).await;
    assert!(
        !g.is_leader(),
        "still leading a ttl after the pause ({:?})",
        paused.elapsed()
    );
    eventually(Duration::from_millis(200), "role follows", || {
        !matches!(*role_rx.borrow_and_update(), Role::Leader { .. })
    })
    .await;
    assert!(paused.elapsed() < cfg.ttl() + Duration::from_millis(200));
    server.resume();
    drop(n);
}
}

on_both_stores! {
/// Shutdown with a hung connection (Redis paused) still returns within about
/// three retry intervals, whatever the number of groups.
async fn shutdown_with_hung_connection_is_bounded(server: own) {
    let cfg = ElectionConfig {
        ttl_ms: 5_000,
        renew_interval_ms: 1_000,
        retry_interval_ms: 200,
    };
    let n = node(&server, "test/hung").await;
    let groups: Vec<_> = (0..5)
        .map(|i| n.join(&format!("test/g{i}"), cfg).unwrap())
        .collect();
    eventually(Duration::from_secs(3), "leads all", || {
        groups.iter().all(|g| g.is_leader())
    })
    .await;
    server.pause();
    let start = Instant::now();
    n.shutdown().await;
    let took = start.elapsed();
    assert!(took <= cfg.retry_interval() * 5, "shutdown took {took:?}");
    assert!(groups.iter().all(|g| !g.is_leader()));
    server.resume();
}
}

/// Shutdown also clears a lease still held after a fail-safe demotion, so
/// the group is not blocked for the rest of its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_clears_a_lease_left_by_fail_safe_demotion() {
    let redis = RedisServer::start();
    let cfg = ElectionConfig {
        ttl_ms: 8_000,
        renew_interval_ms: 200,
        retry_interval_ms: 1_000,
    };
    let a = node(&redis, "test/a").await;
    let ga = a.join(GROUP, cfg).unwrap();
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let b = node(&redis, "test/b").await;
    let gb = b.join(GROUP, cfg).unwrap();
    let mut events = a.events();
    redis.pause();
    next_event(&mut events, Duration::from_secs(3), |e| {
        matches!(
            e,
            Event::Lost {
                reason: LostReason::StoreError,
                ..
            }
        )
    })
    .await;
    redis.resume();
    // Before a's next claim (one retry interval after the demotion) the lease
    // is still a's in Redis; shut a down now.
    let lease_key = "lh:g:{test/group}:lease";
    assert!(
        redis.cli(&["GET", lease_key]).starts_with("test/a#"),
        "a's lease is still in redis"
    );
    a.shutdown().await;
    // Cleared: free, or already b's (the release wakes b at once).
    let after = redis.cli(&["GET", lease_key]);
    assert!(
        after.is_empty() || after.starts_with("test/b#"),
        "lease after shutdown: {after}"
    );
    let start = Instant::now();
    eventually(cfg.retry_interval() * 3, "b leads", || gb.is_leader()).await;
    assert!(start.elapsed() < cfg.ttl() / 2);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

on_both_stores! {
/// Terms increase on every new acquisition and come with `Elected`.
async fn every_new_acquisition_increases_the_term(server) {
    let cfg = fast();
    let (nodes, groups) = three(&server, cfg).await;
    let mut events: Vec<_> = nodes.iter().map(|n| n.events()).collect();
    let mut elected: Vec<_> = nodes.iter().map(|n| n.events()).collect();
    let mut last = 0;
    let mut terms = Vec::new();
    for _ in 0..4 {
        let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
        let term = groups[leader].leader_term().unwrap();
        assert!(term > last, "term {term} after {last}");
        last = term;
        terms.push(term);
        nodes[leader].step_down(GROUP).await.unwrap();
        let elected = next_event(&mut events[leader], Duration::from_secs(1), |e| {
            matches!(e, Event::Lost { .. })
        })
        .await;
        assert!(matches!(elected, Event::Lost { term: t, .. } if t == term));
    }
    let mut seen = Vec::new();
    for rx in elected.iter_mut() {
        while let Ok(e) = rx.try_recv() {
            if let Event::Elected { term, .. } = e {
                seen.push(term);
            }
        }
    }
    // The first election happened before the test subscribed.
    for term in &terms[1..] {
        assert!(seen.contains(term), "Elected carries term {term}: {seen:?}");
    }
    for n in nodes {
        n.close().await.unwrap();
    }
}
}

on_both_stores! {
/// docs/behaviour.md X1: a follower does not poll. Once its wake-up
/// listener is confirmed it sleeps until the lease it saw runs out; on
/// Redis its leader's renewals tell it (every other renewal here) how far
/// the lease now stands, so at rest it claims only to keep its candidacy,
/// once per ttl + retry interval; on PostgreSQL, where renewals do not
/// hint, about once per ttl − renew/2. Either way it stays a live member of
/// the group the whole time (with the first hints it did not: on Redis its
/// candidacy lapsed and it dropped out of the members), and never polls
/// (every retry interval would be 200 claims here).
async fn a_follower_at_rest_claims_about_once_per_ttl_and_stays_a_member(server) {
    let cfg = ElectionConfig {
        ttl_ms: 1000,
        renew_interval_ms: 300,
        retry_interval_ms: 20,
    };
    // Long node leases: the nodes' heartbeats stay out of the way.
    let quiet = leasehold_engine::NodeConfig::with_lease(60_000);
    let a = Node::start(server.store(), "test/a", quiet).await.unwrap();
    let ga = a.join(GROUP, cfg).unwrap();
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let b = Node::start(server.store(), "test/b", quiet).await.unwrap();
    let gb = b.join(GROUP, cfg).unwrap();
    eventually(Duration::from_secs(3), "b follows", || is_follower(&gb)).await;
    // Past b's first claims: its listener is confirmed once it stops
    // claiming every retry interval (20 ms), i.e. no claim for 300 ms.
    let mut last = leasehold_engine::test_hooks::claims_sent(&b);
    let mut since = Instant::now();
    eventually(Duration::from_secs(5), "b stops polling", || {
        let now = leasehold_engine::test_hooks::claims_sent(&b);
        if now != last {
            (last, since) = (now, Instant::now());
        }
        since.elapsed() >= Duration::from_millis(300)
    })
    .await;
    let term = ga.leader_term();
    let before = leasehold_engine::test_hooks::claims_sent(&b);
    let window = Duration::from_secs(4);
    let end = Instant::now() + window;
    // Its candidacy lasts ttl + 2 × retry = 1040 ms from each claim: looked
    // at every 100 ms, it must never have lapsed.
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let state = b.store().group_state(GROUP).await.unwrap();
        assert!(
            state.members.iter().any(|(node, _)| node == "test/b"),
            "the follower at rest dropped out of the members: {:?}",
            state.members
        );
    }
    let claims = leasehold_engine::test_hooks::claims_sent(&b) - before;
    // Claims come at least ttl − renew = 700 ms apart without hints (and
    // about ttl apart with them): at most 6 in 4 s (4 or 5 seen); 8 allows
    // for a busy machine.
    assert!(
        claims <= 8,
        "{claims} claims in {window:?} by a follower at rest"
    );
    assert!(ga.leader_term() == term && term.is_some() && is_follower(&gb));
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

/// Redis restarting empty loses the lease, but the leader may still lead by
/// its local view until its next renewal. A claimant that never saw the
/// group (it cannot know a term) must not start leading meanwhile: no lease
/// is handed out for one ttl after the store is born again (nor before the
/// new term epoch's hold has passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_loses_its_data_no_second_leader_starts_while_the_first_may_lead() {
    let mut redis = RedisServer::start();
    let cfg = fast();
    let (mut nodes, mut groups) = three(&redis, cfg).await;
    let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
    let before = groups[leader].leader_term().unwrap();
    followers_see_the_leader(&groups, Duration::from_secs(2)).await;
    redis.restart();
    let restarted = Instant::now();
    // A node that never saw the group joins at once.
    let fresh = node(&redis, "test/fresh").await;
    groups.push(fresh.join(GROUP, cfg).unwrap());
    nodes.push(fresh);
    // One ttl for the lease that may still stand, or the hold of the new
    // history's term epoch (see the engine's term.rs), whichever is longer.
    let hold = cfg.ttl_ms.max(leasehold_engine::TERM_EPOCH_HOLD_MS);
    let bound = Duration::from_millis(hold + 3 * cfg.retry_interval_ms);
    let mut new_term = None;
    while restarted.elapsed() < bound + Duration::from_millis(500) {
        let leading: Vec<(usize, u64)> = groups
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.leader_term().map(|t| (i, t)))
            .collect();
        assert!(leading.len() <= 1, "two leaders at once: {leading:?}");
        if let [(_, t)] = leading[..] {
            if t != before {
                new_term = Some((t, restarted.elapsed()));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (term, took) = new_term.expect("a new leader after the restart");
    assert!(term > before, "terms went back: {term} after {before}");
    assert!(
        took <= bound,
        "the new leader came after {took:?}, bound {bound:?}"
    );
    for n in nodes {
        n.close().await.unwrap();
    }
}

/// Terms never go backwards, also when Redis restarts empty: the nodes
/// remember the highest term they saw and claim above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terms_survive_redis_restarting_empty() {
    let mut redis = RedisServer::start();
    let cfg = fast();
    let (nodes, groups) = three(&redis, cfg).await;
    for _ in 0..3 {
        let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
        nodes[leader].step_down(GROUP).await.unwrap();
    }
    let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
    let before = groups[leader].leader_term().unwrap();
    // Every node must have seen the current term before the data goes.
    eventually(Duration::from_secs(2), "followers saw the term", || {
        groups.iter().all(|g| match role(g) {
            Role::Leader { term } | Role::Follower { term, .. } => term == before,
            _ => false,
        })
    })
    .await;
    redis.restart();
    assert_eq!(redis.cli(&["EXISTS", "lh:g:{test/group}:term"]), "0");
    // The old leader may lead by its local view until its next renewal fails;
    // the next acquisition must carry a larger term, never a smaller one.
    let mut after = 0;
    eventually(Duration::from_secs(5), "a new acquisition", || {
        let terms: Vec<u64> = groups.iter().filter_map(|g| g.leader_term()).collect();
        assert!(
            terms.iter().all(|&t| t >= before),
            "term went backwards: {terms:?} after {before}"
        );
        after = terms.into_iter().max().unwrap_or(0);
        after > before
    })
    .await;
    let stored: u64 = redis
        .cli(&["GET", "lh:g:{test/group}:term"])
        .parse()
        .unwrap();
    assert_eq!(
        stored, after,
        "the counter in the new redis carries on from {before}"
    );
    for n in nodes {
        n.close().await.unwrap();
    }
}

on_both_stores! {
/// Groups can be joined and left at run time; leaving releases the lease.
async fn groups_join_and_leave_at_run_time(server) {
    let cfg = fast();
    let a = node(&server, "test/a").await;
    let b = node(&server, "test/b").await;
    let ga = a.join("test/x", cfg).unwrap();
    eventually(Duration::from_secs(3), "a leads x", || ga.is_leader()).await;
    let gb = b.join("test/x", cfg).unwrap();
    let gy = b.join("test/y", cfg).unwrap();
    eventually(Duration::from_secs(3), "b leads y", || gy.is_leader()).await;
    assert!(matches!(
        a.join("test/x", cfg),
        Err(leasehold_engine::Error::AlreadyJoined(_))
    ));
    assert_eq!(a.groups(), vec!["test/x".to_owned()]);
    let start = Instant::now();
    a.leave("test/x").await.unwrap();
    eventually(cfg.retry_interval() * 3, "b leads x", || gb.is_leader()).await;
    assert!(start.elapsed() <= cfg.retry_interval() * 3);
    assert!(matches!(
        a.step_down("test/x").await,
        Err(leasehold_engine::Error::NotJoined(_))
    ));
    assert!(a.groups().is_empty());
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

/// Bad group names and timings are refused with the option named, and
/// nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_join_arguments_are_refused_without_side_effects() {
    let redis = RedisServer::start();
    let n = node(&redis, "test/a").await;
    let err = n.join("bad name", fast()).unwrap_err().to_string();
    assert!(
        err.contains("group name") && err.contains("\"bad name\""),
        "{err}"
    );
    let cfg = ElectionConfig {
        ttl_ms: 100,
        renew_interval_ms: 100,
        retry_interval_ms: 10,
    };
    let err = n.join(GROUP, cfg).unwrap_err().to_string();
    assert!(
        err.contains("renew_interval_ms = 100") && err.contains("ttl_ms = 100"),
        "{err}"
    );
    let cfg = ElectionConfig {
        retry_interval_ms: 0,
        ..fast()
    };
    let err = n.join(GROUP, cfg).unwrap_err().to_string();
    assert!(
        err.contains("retry_interval_ms = 0") && err.contains("from 1 to 2147483647"),
        "{err}"
    );
    assert!(n.groups().is_empty());
    assert_eq!(redis.cli(&["KEYS", "lh:g:*"]), "");
    n.close().await.unwrap();
}

/// Every transition is also published as JSON on `P:events`, for a
/// controller in another process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transitions_are_published_as_json_on_the_events_channel() {
    let redis = RedisServer::start();
    let events = redis.subscribe("lh:events");
    let limit = Duration::from_secs(3);
    let n = node(&redis, "test/a").await;
    events.next_line_containing(r#"{"type":"registered","node":"test/a"}"#, limit);
    let g = n.join(GROUP, fast()).unwrap();
    eventually(limit, "leads", || g.is_leader()).await;
    let term = g.leader_term().unwrap();
    let elected =
        format!(r#"{{"type":"elected","node":"test/a","group":"test/group","term":{term}}}"#);
    events.next_line_containing(&elected, limit);
    // A node that joins behind a leader says so once, at its first claim.
    let b = node(&redis, "test/b").await;
    let _gb = b.join(GROUP, fast()).unwrap();
    let following = format!(
        r#"{{"type":"following","node":"test/b","group":"test/group","leader":"test/a","term":{term}}}"#
    );
    events.next_line_containing(&following, limit);
    n.step_down(GROUP).await.unwrap();
    let lost = format!(
        r#"{{"type":"lost","node":"test/a","group":"test/group","term":{term},"reason":"stepDown"}}"#
    );
    events.next_line_containing(&lost, limit);
    n.close().await.unwrap();
    b.close().await.unwrap();
}

/// The controller writes a group's timings into Redis from its LeaderGroup;
/// nodes adopt them at their next claim or renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timings_written_to_redis_are_adopted_by_leader_and_followers() {
    let redis = RedisServer::start();
    let slow = ElectionConfig {
        ttl_ms: 20_000,
        renew_interval_ms: 300,
        retry_interval_ms: 300,
    };
    let (mut nodes, mut groups) = three(&redis, slow).await;
    let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
    let store = redis.store();
    store.write_group_config(GROUP, &fast()).await.unwrap();
    // The leader's next renewal asks for the new ttl.
    eventually(
        Duration::from_secs(2),
        "leader renews with the new ttl",
        || {
            let pttl: i64 = redis
                .cli(&["PTTL", "lh:g:{test/group}:lease"])
                .parse()
                .unwrap_or(-1);
            (0..=600).contains(&pttl)
        },
    )
    .await;
    // Followers adopted it too: after a crash, takeover takes the new ttl, not 20 s.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let start = Instant::now();
    drop(nodes.remove(leader));
    groups.remove(leader);
    one_leader(&refs(&groups), fast().ttl() + fast().retry_interval() * 3).await;
    assert!(start.elapsed() < fast().ttl() + fast().retry_interval() * 3);
    // An invalid config is ignored rather than half-applied.
    redis.cli(&[
        "HSET",
        "lh:g:{test/group}:config",
        "renewIntervalMs",
        "999999",
    ]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(groups.iter().filter(|g| g.is_leader()).count(), 1);
    for n in nodes {
        n.close().await.unwrap();
    }
}

on_both_stores! {
/// Each cluster's timings for a group (docs/clusters.md): written when
/// they change or grow old, every cluster's read back with its age.
async fn every_clusters_spec_vote_is_kept_and_read_back(server) {
    let store = server.store();
    let east = fast();
    let west = ElectionConfig {
        ttl_ms: 2_000,
        ..fast()
    };
    let votes = store.vote_spec(GROUP, "east", &east, 60_000).await.unwrap();
    assert_eq!(votes.len(), 1);
    assert_eq!((votes[0].cluster.as_str(), votes[0].config), ("east", Some(east)));
    let votes = store.vote_spec(GROUP, "west", &west, 60_000).await.unwrap();
    let mut seen: Vec<_> = votes.iter().map(|v| (v.cluster.as_str(), v.config)).collect();
    seen.sort_by_key(|(c, _)| *c);
    assert_eq!(seen, [("east", Some(east)), ("west", Some(west))]);
    // The same timings again are not written: the record ages...
    tokio::time::sleep(Duration::from_millis(300)).await;
    let votes = store.vote_spec(GROUP, "east", &east, 60_000).await.unwrap();
    let age = |votes: &[leasehold_engine::store::SpecVote], c: &str| {
        votes.iter().find(|v| v.cluster == c).map(|v| v.age_ms).unwrap()
    };
    assert!(age(&votes, "east") >= 250, "{votes:?}");
    // ...until it is as old as the refresh asks, or changes.
    let votes = store.vote_spec(GROUP, "east", &east, 100).await.unwrap();
    assert!(age(&votes, "east") < 250, "{votes:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let votes = store.vote_spec(GROUP, "east", &west, 60_000).await.unwrap();
    assert!(age(&votes, "east") < 250, "{votes:?}");
    assert!(votes.iter().all(|v| v.config == Some(west)), "{votes:?}");
    // Other groups are not concerned.
    let other = store.vote_spec("test/other", "east", &east, 60_000).await.unwrap();
    assert_eq!(other.len(), 1);
    // A cluster whose LeaderGroup is deleted withdraws its record, and only
    // its own (twice is no error).
    store.withdraw_spec(GROUP, "west").await.unwrap();
    store.withdraw_spec(GROUP, "west").await.unwrap();
    let votes = store.vote_spec(GROUP, "east", &west, 60_000).await.unwrap();
    let left: Vec<_> = votes.iter().map(|v| v.cluster.as_str()).collect();
    assert_eq!(left, ["east"]);
    let other = store.vote_spec("test/other", "west", &east, 60_000).await.unwrap();
    assert_eq!(other.len(), 2, "{other:?}");
}
}

on_both_stores! {
/// A term lost by Redis can be put back, and never lowered.
async fn a_restored_term_raises_the_counter_but_never_lowers_it(server) {
    let store = server.store();
    assert!(store.restore_term(GROUP, 7).await.unwrap());
    assert_eq!(server.stored_term(GROUP), 7);
    assert!(!store.restore_term(GROUP, 3).await.unwrap());
    assert_eq!(server.stored_term(GROUP), 7);
    let n = node(&server, "test/a").await;
    let g = n.join(GROUP, fast()).unwrap();
    eventually(Duration::from_secs(2), "leads", || g.is_leader()).await;
    assert_eq!(
        g.leader_term(),
        Some(8),
        "the next acquisition carries on from the restored term"
    );
    n.close().await.unwrap();
}
}

on_both_stores! {
/// A step-down command sent to the leader's inbox (as the controller does
/// for the `leasehold.dev/step-down` annotation) makes it step down, and the
/// application's inbox never sees the command.
async fn a_step_down_command_through_the_inbox_steps_the_leader_down(server) {
    let cfg = fast();
    let (nodes, groups) = three(&server, cfg).await;
    let mut inboxes: Vec<_> = nodes.iter().map(|n| n.inbox().unwrap()).collect();
    let leader = one_leader(&refs(&groups), Duration::from_secs(3)).await;
    let controller = node(&server, "test/controller").await;
    let start = Instant::now();
    controller
        .ask_to_step_down(nodes[leader].id(), GROUP)
        .await
        .unwrap();
    eventually(cfg.retry_interval() * 3, "the leader stepped down", || {
        role(&groups[leader]) == Role::Abstaining
    })
    .await;
    let next = one_leader(&refs(&groups), cfg.retry_interval() * 3).await;
    assert_ne!(next, leader);
    assert!(start.elapsed() <= cfg.retry_interval() * 6);
    let got = tokio::time::timeout(Duration::from_millis(200), inboxes[leader].recv()).await;
    assert!(got.is_err(), "the application saw {got:?}");
    let err = controller
        .ask_to_step_down("test/nobody", GROUP)
        .await
        .unwrap_err();
    assert!(matches!(err, leasehold_engine::Error::NodeNotRegistered(_)));
    for n in nodes {
        n.close().await.unwrap();
    }
    controller.close().await.unwrap();
}
}

on_both_stores! {
/// Redis lost its data and every node restarted: the first claim starts low.
/// Once the controller restores the term from the LeaderGroup's status, the
/// leader's next renewal moves its lease above it, so no observer sees the
/// term go backwards for long.
async fn a_restored_term_lifts_the_current_lease_at_its_next_renewal(server) {
    let n = node(&server, "test/a").await;
    let g = n.join(GROUP, fast()).unwrap();
    eventually(Duration::from_secs(2), "leads", || g.is_leader()).await;
    assert_eq!(g.leader_term(), Some(1));
    let mut events = n.events();
    server.store().restore_term(GROUP, 41).await.unwrap();
    // (The first election's own event may still arrive: skip term 1.)
    let elected = next_event(
        &mut events,
        fast().renew_interval() * 3,
        |e| matches!(e, Event::Elected { term, .. } if *term > 1),
    )
    .await;
    assert!(
        matches!(elected, Event::Elected { term: 42, .. }),
        "{elected:?}"
    );
    assert_eq!(g.leader_term(), Some(42));
    if let Some(redis) = server.redis() {
        assert!(redis
            .cli(&["GET", "lh:g:{test/group}:lease"])
            .ends_with("#42"));
    }
    // Still the same leader, renewing normally.
    tokio::time::sleep(fast().renew_interval() * 2).await;
    assert_eq!(g.leader_term(), Some(42));
    n.close().await.unwrap();
}
}

/// A store first used on a Redis that has been up for longer than a ttl (a
/// fresh install against a running Redis) does not wait one ttl for its
/// first lease: the birth that holds leases back for one ttl is Redis's own
/// start, which is what a restart that lost the data resets. It waits only
/// for its term epoch's hold (`TERM_EPOCH_HOLD_MS`, 1.1 s), since the store
/// cannot tell a first use from a flushed data set (crates/engine/tests/engine/histories.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_store_on_a_running_redis_does_not_wait_a_ttl() {
    let redis = RedisServer::start();
    let cfg = ElectionConfig {
        ttl_ms: 3000,
        renew_interval_ms: 300,
        retry_interval_ms: 100,
    };
    // Redis up for at least one ttl, and a second more: its uptime counts
    // whole seconds, so the start it allows is up to a second late.
    eventually(Duration::from_secs(6), "redis up for four seconds", || {
        redis
            .cli(&["INFO", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|up| up * 1000 >= cfg.ttl_ms + 1000)
    })
    .await;
    // Not the test preset: a store never used under this prefix.
    redis.cli(&["DEL", "lh:born", "lh:epoch"]);
    let n = node(&redis, "test/first").await;
    let joined = Instant::now();
    let g = n.join(GROUP, cfg).unwrap();
    // Within the epoch's hold, not a ttl (3000 ms) after this first claim.
    eventually(
        Duration::from_millis(leasehold_engine::TERM_EPOCH_HOLD_MS + 3 * cfg.retry_interval_ms),
        "the first lease is handed out after the epoch's hold, not a ttl",
        || g.is_leader(),
    )
    .await;
    eprintln!("first lease after {:?}", joined.elapsed());
    n.close().await.unwrap();
}

/// A Redis user that may not run INFO (it is in the `@dangerous` ACL
/// category) still elects on a fresh store: the birth is then the first
/// claim, one ttl (or the epoch's hold) of waiting, instead of every claim
/// failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_user_without_info_still_elects_on_a_fresh_store() {
    let redis = RedisServer::start();
    redis.cli(&["DEL", "lh:born", "lh:epoch"]);
    redis.cli(&[
        "ACL", "SETUSER", "lh", "on", ">secret", "~*", "&*", "+@all", "-info",
    ]);
    let url = redis.url().replacen("redis://", "redis://lh:secret@", 1);
    let store = leasehold_engine::Store::connect(&url, "lh").unwrap();
    let cfg = fast();
    let n = Node::start(store, "test/limited", testkit::node_config())
        .await
        .unwrap();
    let g = n.join(GROUP, cfg).unwrap();
    eventually(
        Duration::from_millis(
            cfg.ttl_ms.max(leasehold_engine::TERM_EPOCH_HOLD_MS) + 3 * cfg.retry_interval_ms,
        ),
        "leads after one ttl or the epoch's hold",
        || g.is_leader(),
    )
    .await;
    n.close().await.unwrap();
}
