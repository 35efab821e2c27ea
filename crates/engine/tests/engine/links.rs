//! One node's own link to the store goes bad while the others keep theirs:
//! each of three nodes reaches the store through a proxy of its own. The
//! group must not stay without a leader because of the node that cannot
//! hear the store, and two nodes never lead at once (every node's view is
//! sampled every 5 ms for the whole test).
//!
//! The faults, as production has them: replies that stop coming back while
//! requests still land (a broken NAT or conntrack entry, or replies slower
//! than the call's bound), a partition both ways, 40 ms more latency, and a
//! follower cut off. The timings are the issue's: ttl 1000, renewals every
//! 300, retry 200 ms.

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use leasehold_engine::{ElectionConfig, Group, Node, NodeConfig, Store};
use testkit::proxy::Proxy;
use testkit::sentinel::Tally;
use testkit::store::StoreServer;

const GROUP: &str = "test/links";

const CFG: ElectionConfig = ElectionConfig {
    ttl_ms: 1000,
    renew_interval_ms: 300,
    retry_interval_ms: 200,
};

/// How long each fault lasts: 3 ttl.
const FAULT: Duration = Duration::from_millis(3 * CFG.ttl_ms);

struct Member {
    proxy: Proxy,
    node: Node,
    group: Group,
}

/// Three nodes, each through its own proxy; returns once one leads and the
/// other two follow it, with the leader first.
async fn three(server: &StoreServer, tally: &mut Tally) -> Vec<Member> {
    let mut members = Vec::new();
    for i in 0..3 {
        let proxy = Proxy::start(server.port()).await;
        let store = Store::connect(&server.url_at(proxy.port), "lh").expect("store url");
        // The registration's own lease as the agent has it (30 s): the
        // election alone must hand the seat on, not the sweep of a node
        // whose heartbeats stopped.
        let node = Node::start(store, &format!("test/n{i}"), NodeConfig::default())
            .await
            .expect("node");
        let group = node.join(GROUP, CFG).expect("join");
        members.push(Member { proxy, node, group });
    }
    let groups: Vec<&Group> = members.iter().map(|m| &m.group).collect();
    tally
        .until(
            &groups,
            Duration::from_secs(10),
            "one leads, two follow",
            || {
                groups.iter().filter(|g| g.is_leader()).count() == 1
                    && groups
                        .iter()
                        .filter(|g| {
                            matches!(testkit::role(g), leasehold_engine::Role::Follower { .. })
                        })
                        .count()
                        == 2
            },
        )
        .await;
    let leader = members
        .iter()
        .position(|m| m.group.is_leader())
        .expect("a leader");
    members.swap(0, leader);
    members
}

/// Samples every node for `span`; returns the terms each led under.
async fn watch(tally: &mut Tally, members: &[Member], span: Duration) -> Vec<Vec<u64>> {
    let groups: Vec<&Group> = members.iter().map(|m| &m.group).collect();
    let mut led = vec![Vec::new(); members.len()];
    let start = Instant::now();
    while start.elapsed() < span {
        tally.sample(&groups);
        for (i, g) in groups.iter().enumerate() {
            if let Some(t) = g.leader_term() {
                if led[i].last() != Some(&t) {
                    led[i].push(t);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    led
}

async fn close(members: Vec<Member>) {
    for m in members {
        drop(m.proxy);
        let _ = m.node.close().await;
    }
}

on_both_stores! {
/// The leader's link turns one-way for 3 ttl: its requests land, no reply
/// comes back. It stops leading at its first unanswered renewal, and after
/// half a ttl without an answer it stops claiming too, so its lease (kept
/// standing by the claims that landed) runs out and another node leads
/// within 2 ttl + a retry interval of the cut. It guards against claims
/// that go on landing and keep its lease standing, with no leader for the
/// whole 3 s.
async fn a_leader_whose_replies_stop_coming_back_gives_the_seat_up(server) {
    let mut tally = Tally::default();
    let members = three(&server, &mut tally).await;
    let groups: Vec<&Group> = members.iter().map(|m| &m.group).collect();
    let term = members[0].group.leader_term().expect("leads");
    members[0].proxy.one_way();
    let cut = Instant::now();
    let stopped = tally
        .until(&groups, FAULT, "the old leader stops leading", || {
            !members[0].group.is_leader()
        })
        .await;
    let bound = Duration::from_millis(2 * CFG.ttl_ms + CFG.retry_interval_ms);
    tally
        .until(&groups, FAULT, "another node leads", || {
            members[1..].iter().any(|m| m.group.is_leader())
        })
        .await;
    let new_leader = cut.elapsed();
    eprintln!("one-way: old leader stopped {stopped:?} after the cut, another led after {new_leader:?}");
    assert!(new_leader <= bound, "a new leader {new_leader:?} after the cut (bound {bound:?})");
    let led = members[1..]
        .iter()
        .find_map(|m| m.group.leader_term())
        .expect("leads");
    assert!(led > term, "the new leader's term {led} after {term}");
    // The rest of the fault, then the link mended: still one leader, and
    // the old one leads at no point of it.
    let rest = FAULT.saturating_sub(cut.elapsed());
    let during = watch(&mut tally, &members, rest).await;
    assert!(during[0].is_empty(), "the cut-off node led under {:?}", during[0]);
    members[0].proxy.two_way();
    watch(&mut tally, &members, Duration::from_millis(2 * CFG.ttl_ms)).await;
    assert_eq!(groups.iter().filter(|g| g.is_leader()).count(), 1);
    tally.assert_clean();
    close(members).await;
}
}

on_both_stores! {
/// The leader cut off both ways for 3 ttl: it stops leading when its
/// renewal goes unanswered, and another node leads once its lease has run
/// out: within a ttl and a retry interval of the cut (a renewal that lands
/// at the cut, a follower that wakes on its retry tick), two retry
/// intervals to spare.
async fn a_leader_cut_off_both_ways_is_replaced_within_its_ttl(server) {
    let mut tally = Tally::default();
    let members = three(&server, &mut tally).await;
    let groups: Vec<&Group> = members.iter().map(|m| &m.group).collect();
    members[0].proxy.pause();
    let cut = Instant::now();
    let stopped = tally
        .until(&groups, FAULT, "the old leader stops leading", || {
            !members[0].group.is_leader()
        })
        .await;
    tally
        .until(&groups, FAULT, "another node leads", || {
            members[1..].iter().any(|m| m.group.is_leader())
        })
        .await;
    let new_leader = cut.elapsed();
    eprintln!("partition: old leader stopped {stopped:?} after the cut, another led after {new_leader:?}");
    let bound = Duration::from_millis(CFG.ttl_ms + 3 * CFG.retry_interval_ms);
    assert!(new_leader <= bound, "a new leader {new_leader:?} after the cut (bound {bound:?})");
    members[0].proxy.resume();
    watch(&mut tally, &members, Duration::from_millis(2 * CFG.ttl_ms)).await;
    assert_eq!(groups.iter().filter(|g| g.is_leader()).count(), 1);
    tally.assert_clean();
    close(members).await;
}
}

on_both_stores! {
/// 40 ms more each way on the leader's link for 3 ttl: its calls take
/// longer but are answered within the retry interval, so it leads on under
/// its term throughout.
async fn forty_ms_of_latency_moves_nothing(server) {
    let mut tally = Tally::default();
    let members = three(&server, &mut tally).await;
    let term = members[0].group.leader_term().expect("leads");
    members[0].proxy.delay(Duration::from_millis(40));
    let led = watch(&mut tally, &members, FAULT).await;
    members[0].proxy.delay(Duration::ZERO);
    assert_eq!(led[0], vec![term], "the leader's terms under latency");
    assert!(led[1..].iter().all(Vec::is_empty), "{led:?}");
    tally.assert_clean();
    close(members).await;
}
}

on_both_stores! {
/// A follower cut off (both ways, then one-way) for 3 ttl each: the leader
/// leads on under its term throughout, and the follower does not lead.
async fn a_follower_cut_off_moves_nothing(server) {
    let mut tally = Tally::default();
    let members = three(&server, &mut tally).await;
    let term = members[0].group.leader_term().expect("leads");
    members[1].proxy.pause();
    let paused = watch(&mut tally, &members, FAULT).await;
    members[1].proxy.resume();
    members[1].proxy.one_way();
    let one_way = watch(&mut tally, &members, FAULT).await;
    members[1].proxy.two_way();
    for led in [&paused, &one_way] {
        assert_eq!(led[0], vec![term], "the leader's terms: {led:?}");
        assert!(led[1..].iter().all(Vec::is_empty), "{led:?}");
    }
    tally.assert_clean();
    close(members).await;
}
}
