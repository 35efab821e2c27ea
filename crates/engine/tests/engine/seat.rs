//! Who takes a free seat, against real servers: priorities, priority 0,
//! the bound on deferring to a better candidate that does not claim, the
//! controller's preferred members, and the handover to a named member
//! (docs/behaviour.md P1-P5). Timings are `testkit::fast` (ttl 600 ms,
//! retry 100 ms, so the deference bound is 200 ms).

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use leasehold_engine::{
    DeferReason, Deferral, ElectionConfig, Error, Group, Node, Role, SuccessorRefusal,
};
use testkit::{eventually, fast, is_follower, node, one_leader, role, StoreFixture};

const GROUP: &str = "test/seat";

/// One member: its id, priority, and (while it runs) its node and group.
struct Member {
    id: String,
    priority: u32,
    running: Option<(Node, Group)>,
}

impl Member {
    fn group(&self) -> Option<&Group> {
        self.running.as_ref().map(|(_, g)| g)
    }
}

async fn start(server: &impl StoreFixture, m: &mut Member, cfg: ElectionConfig) {
    let n = node(server, &m.id).await;
    let g = n.join_with_priority(GROUP, cfg, m.priority).unwrap();
    m.running = Some((n, g));
}

/// Starts a member `id` of `priority` and adds it to `all`.
async fn add(
    server: &impl StoreFixture,
    all: &mut Vec<Member>,
    id: &str,
    priority: u32,
    cfg: ElectionConfig,
) {
    let mut m = Member {
        id: id.into(),
        priority,
        running: None,
    };
    start(server, &mut m, cfg).await;
    all.push(m);
}

async fn members(
    server: &impl StoreFixture,
    priorities: &[u32],
    cfg: ElectionConfig,
) -> Vec<Member> {
    let mut out = Vec::new();
    for (i, &priority) in priorities.iter().enumerate() {
        let mut m = Member {
            id: format!("test/m{i}"),
            priority,
            running: None,
        };
        start(server, &mut m, cfg).await;
        out.push(m);
    }
    out
}

/// Index of the one running member that leads, once exactly one does and
/// every other running member follows it (so every candidacy is stored).
async fn settled_leader(all: &[Member], limit: Duration) -> usize {
    let running: Vec<usize> = (0..all.len())
        .filter(|&i| all[i].running.is_some())
        .collect();
    let groups: Vec<&Group> = running.iter().map(|&i| all[i].group().unwrap()).collect();
    let leader = running[one_leader(&groups, limit).await];
    eventually(limit, "every other member follows", || {
        running
            .iter()
            .all(|&i| i == leader || is_follower(all[i].group().unwrap()))
    })
    .await;
    leader
}

/// Waits until `expected` leads, failing at once if any other member leads
/// meanwhile; returns how long it took.
async fn only_this_one_leads(all: &[Member], expected: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        for (i, m) in all.iter().enumerate() {
            if i != expected && m.group().is_some_and(Group::is_leader) {
                panic!("{} led, not {}", m.id, all[expected].id);
            }
        }
        if all[expected].group().unwrap().is_leader() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{} did not lead within {limit:?}",
            all[expected].id
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn crash(m: &mut Member) {
    // Dropping a node without closing it stops its loops as a crash does:
    // nothing is released.
    drop(m.running.take());
}

on_both_stores! {
/// docs/behaviour.md P1: whenever the seat frees (here the leader crashes),
/// the live candidate of highest priority takes it, without waiting for
/// the deference bound (it is live and claims at the lease's end), and no
/// other candidate leads in between; the crashed one comes back each time.
async fn the_live_candidate_of_highest_priority_wins_every_free_seat(server) {
    let cfg = fast();
    let mut all = members(&server, &[1, 3, 2], cfg).await;
    for _ in 0..4 {
        let leader = settled_leader(&all, Duration::from_secs(3)).await;
        let expected = (0..all.len())
            .filter(|&i| i != leader)
            .max_by_key(|&i| all[i].priority)
            .unwrap();
        crash(&mut all[leader]);
        let took = only_this_one_leads(&all, expected, cfg.ttl() * 3).await;
        assert!(
            took <= cfg.ttl() + cfg.retry_interval() * 2,
            "{} took {took:?} to lead, more than ttl + two retry intervals",
            all[expected].id
        );
        start(&server, &mut all[leader], cfg).await;
    }
}
}

on_both_stores! {
/// docs/behaviour.md P2: a member of priority 0 is a live member (in the
/// group's members, with its priority) that follows, and never leads, not
/// even alone.
async fn a_member_of_priority_0_follows_but_never_leads(server) {
    let cfg = fast();
    let mut all = members(&server, &[0], cfg).await;
    let store = server.store();
    tokio::time::sleep(cfg.ttl() * 3).await;
    let zero = all[0].group().unwrap().clone();
    assert!(!zero.is_leader());
    assert_eq!(role(&zero), Role::Candidate);
    assert_eq!(
        zero.deferral(),
        Some(Deferral {
            reason: DeferReason::NeverLeads,
            to: String::new()
        })
    );
    let state = store.group_state(GROUP).await.unwrap();
    assert!(state.members.iter().any(|(id, _)| id == "test/m0"), "{state:?}");
    assert_eq!(state.priorities.get("test/m0"), Some(&0), "{state:?}");

    add(&server, &mut all, "test/one", 1, cfg).await;
    assert_eq!(settled_leader(&all, Duration::from_secs(3)).await, 1);
    assert_eq!(zero.deferral(), None, "a follower does not defer");
    crash(&mut all[1]);
    let until = Instant::now() + cfg.ttl() * 3;
    while Instant::now() < until {
        assert!(!zero.is_leader(), "priority 0 led");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(zero.deferral().map(|d| d.reason), Some(DeferReason::NeverLeads));
}
}

on_both_stores! {
/// docs/behaviour.md P3: a candidate of higher priority whose candidacy is
/// live but that does not claim (it crashed just after a claim) keeps the
/// free seat empty for the deference bound, and no longer: the other
/// candidate says whom it waits for, then takes the seat.
async fn a_better_candidate_that_does_not_claim_delays_the_seat_by_the_deference_bound(server) {
    let cfg = fast();
    let mut all = members(&server, &[1], cfg).await;
    settled_leader(&all, Duration::from_secs(3)).await;
    for (id, priority) in [("test/b", 1), ("test/h", 4)] {
        add(&server, &mut all, id, priority, cfg).await;
    }
    assert_eq!(settled_leader(&all, Duration::from_secs(3)).await, 0);
    // The leader crashes first, so that its lease ends at most a ttl after
    // h's claim below: a renewal after that claim (a slow machine between
    // the claim and the crash) would outlast h's candidacy, and b would
    // find nobody to wait for.
    let (_, left) = all[0].group().unwrap().leader_lease().unwrap();
    let start = Instant::now();
    crash(&mut all[0]);
    // A fresh candidacy for h (a priority change claims at once): it lasts
    // ttl + 2 retry intervals from now, past the lease's end and the whole
    // deference.
    let store = server.store();
    all[2].group().unwrap().set_priority(5).unwrap();
    let mut fresh = false;
    for _ in 0..200 {
        let state = store.group_state(GROUP).await.unwrap();
        if state.priorities.get("test/h") == Some(&5) {
            fresh = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(fresh, "the new priority never reached the store");
    crash(&mut all[2]);
    assert!(
        start.elapsed() < left,
        "h was still running at the lease's end: the set-up took {:?}",
        start.elapsed()
    );
    let b = all[1].group().unwrap().clone();
    let mut deferred = None;
    let limit = left + cfg.deference() + cfg.retry_interval() * 3;
    while !b.is_leader() {
        if let Some(d) = b.deferral() {
            deferred = Some(d);
        }
        assert!(start.elapsed() < limit, "b did not lead within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = start.elapsed();
    assert_eq!(
        deferred,
        Some(Deferral {
            reason: DeferReason::Priority,
            to: "test/h".into()
        })
    );
    // It waited for h (the lease's end plus most of the bound), and no
    // longer than the bound and two retry intervals after the lease's end.
    let waited = took.saturating_sub(left);
    assert!(
        waited >= cfg.deference() - cfg.retry_interval() / 2,
        "b led {waited:?} after the lease's end: it did not wait for h"
    );
    assert!(
        waited <= cfg.deference() + cfg.retry_interval() * 2,
        "b led {waited:?} after the lease's end: longer than the bound allows"
    );
}
}

on_both_stores! {
/// docs/behaviour.md P4: among members of equal priority, a free seat goes
/// to one the controller prefers; priority still comes first.
async fn among_equals_a_free_seat_goes_to_a_preferred_member(server) {
    let cfg = fast();
    let store = server.store();
    let mut all = members(&server, &[1, 1, 1], cfg).await;
    let leader = settled_leader(&all, Duration::from_secs(3)).await;
    // The preferred one: the follower that comes last, so that a plain
    // race would not pick it by its order alone.
    let preferred = (0..all.len()).rev().find(|&i| i != leader).unwrap();
    store
        .write_preferred(GROUP, Some(&[all[preferred].id.clone()]))
        .await
        .unwrap();
    crash(&mut all[leader]);
    only_this_one_leads(&all, preferred, cfg.ttl() * 3).await;

    // A member of higher priority outside the list still comes first.
    let mut high = Member {
        id: "test/high".into(),
        priority: 2,
        running: None,
    };
    start(&server, &mut high, cfg).await;
    all.push(high);
    start(&server, &mut all[leader], cfg).await;
    assert_eq!(settled_leader(&all, Duration::from_secs(3)).await, preferred);
    let other = (0..3).find(|&i| i != preferred).unwrap();
    store
        .write_preferred(GROUP, Some(&[all[other].id.clone()]))
        .await
        .unwrap();
    crash(&mut all[preferred]);
    only_this_one_leads(&all, 3, cfg.ttl() * 3).await;
    store.write_preferred(GROUP, None).await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md P5: a leader hands the seat to the member it names,
/// even one of lower priority; no other member leads in between, and the
/// old leader abstains as after a step-down.
async fn a_leader_hands_the_seat_to_the_member_it_names(server) {
    let cfg = fast();
    // Three others race the named member for each seat: without the
    // handover's rule it would win all six in a row by chance once in 729.
    let all = members(&server, &[3, 2, 2, 1], cfg).await;
    for _ in 0..6 {
        let leader = settled_leader(&all, Duration::from_secs(3)).await;
        let target = (0..all.len())
            .filter(|&i| i != leader)
            .min_by_key(|&i| all[i].priority)
            .unwrap();
        let (node, group) = all[leader].running.as_ref().unwrap();
        let term = group.leader_term().unwrap();
        node.hand_over(GROUP, &all[target].id).await.unwrap();
        assert!(!group.is_leader());
        assert_eq!(role(group), Role::Abstaining);
        only_this_one_leads(&all, target, cfg.retry_interval() * 3).await;
        assert!(all[target].group().unwrap().leader_term().unwrap() > term);
        // The old leader's abstention ends before the next round.
        tokio::time::sleep(cfg.ttl()).await;
    }
}
}

on_both_stores! {
/// docs/behaviour.md P5: the member named may be one that stepped down
/// itself a moment ago and still abstains: named, it claims at once.
async fn a_handover_to_a_member_that_abstains_ends_its_abstention(server) {
    let cfg = fast();
    let all = members(&server, &[1, 1, 1], cfg).await;
    let first = settled_leader(&all, Duration::from_secs(3)).await;
    let second = (first + 1) % 3;
    let (node, _) = all[first].running.as_ref().unwrap();
    node.hand_over(GROUP, &all[second].id).await.unwrap();
    only_this_one_leads(&all, second, cfg.retry_interval() * 3).await;
    assert_eq!(role(all[first].group().unwrap()), Role::Abstaining);
    let (node, _) = all[second].running.as_ref().unwrap();
    node.hand_over(GROUP, &all[first].id).await.unwrap();
    let took = only_this_one_leads(&all, first, cfg.ttl()).await;
    assert!(
        took <= cfg.retry_interval() * 2,
        "the abstaining successor took {took:?} to lead"
    );
}
}

on_both_stores! {
/// docs/behaviour.md P5: a handover to a member that cannot lead (not a
/// member, priority 0, the leader itself) or asked of a follower is
/// refused with the reason, and the leader leads on under the same term.
async fn a_handover_to_a_member_that_cannot_lead_is_refused_and_the_leader_leads_on(server) {
    let cfg = fast();
    let all = members(&server, &[1, 0], cfg).await;
    assert_eq!(settled_leader(&all, Duration::from_secs(3)).await, 0);
    let (leader, group) = all[0].running.as_ref().unwrap();
    let (follower, _) = all[1].running.as_ref().unwrap();
    let term = group.leader_term().unwrap();
    let mut events = leader.events();
    let refusal = |result: Result<(), Error>| match result {
        Err(Error::Successor { reason, .. }) => reason,
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(
        refusal(leader.hand_over(GROUP, "test/ghost").await),
        SuccessorRefusal::NotMember
    );
    assert_eq!(
        refusal(leader.hand_over(GROUP, "test/m1").await),
        SuccessorRefusal::NeverLeads
    );
    assert_eq!(
        refusal(leader.hand_over(GROUP, "test/m0").await),
        SuccessorRefusal::Itself
    );
    assert_eq!(
        refusal(follower.hand_over(GROUP, "test/m0").await),
        SuccessorRefusal::NotLeader
    );
    assert!(matches!(
        leader.hand_over(GROUP, "no spaces allowed").await,
        Err(Error::Config(_))
    ));
    let message = leader
        .hand_over(GROUP, "test/ghost")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("test/ghost") && message.contains("not a live member"),
        "{message}"
    );
    assert_eq!(group.leader_term(), Some(term));
    assert_eq!(role(group), Role::Leader { term });
    // Still leading a renewal later, and it never reported losing the lease.
    tokio::time::sleep(cfg.renew_interval() * 2).await;
    assert_eq!(group.leader_term(), Some(term));
    assert!(
        !std::iter::from_fn(|| events.try_recv().ok())
            .any(|e| matches!(e, leasehold_engine::Event::Lost { .. })),
        "a refused handover reported a lost lease"
    );
}
}

on_both_stores! {
/// docs/behaviour.md P6: a member whose application is unhealthy
/// (`Group::set_problem`) campaigns with priority 0 and its reason: the
/// store shows both, it never takes a free seat, and once healthy again
/// it campaigns with its own priority.
async fn an_unhealthy_member_never_takes_a_free_seat_and_says_why(server) {
    let cfg = fast();
    let store = server.store();
    // The one of priority 1 leads first, alone: joined together, the one
    // of 5 could win the free seat.
    let mut all = members(&server, &[1], cfg).await;
    assert_eq!(settled_leader(&all, Duration::from_secs(3)).await, 0);
    add(&server, &mut all, "test/m1", 5, cfg).await;
    assert_eq!(settled_leader(&all, Duration::from_secs(3)).await, 0);
    all[1].group().unwrap().set_problem(Some("unhealthy: GET /ready answered 503"));
    let mut seen = None;
    for _ in 0..200 {
        let state = store.group_state(GROUP).await.unwrap();
        if state.problems.contains_key("test/m1") {
            seen = Some(state);
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let state = seen.expect("the store never showed the problem");
    assert_eq!(
        state.problems.get("test/m1").map(String::as_str),
        Some("unhealthy: GET /ready answered 503")
    );
    assert_eq!(state.priorities.get("test/m1"), Some(&0));
    // The leader crashes: the unhealthy member (priority 5 otherwise)
    // never takes the seat.
    crash(&mut all[0]);
    let until = Instant::now() + cfg.ttl() * 3;
    while Instant::now() < until {
        assert!(!all[1].group().unwrap().is_leader(), "an unhealthy member led");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        all[1].group().unwrap().deferral().map(|d| d.reason),
        Some(DeferReason::NeverLeads)
    );
    all[1].group().unwrap().set_problem(None);
    only_this_one_leads(&all, 1, cfg.retry_interval() * 3).await;
    let state = store.group_state(GROUP).await.unwrap();
    assert!(state.problems.is_empty(), "{state:?}");
    assert_eq!(state.priorities.get("test/m1"), Some(&5));
}
}
