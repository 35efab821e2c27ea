//! The rules of the plan, one test each.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::*;
use crate::crd::{LeaderGroupSpec, DEFAULT_ROLE_LABEL};

const NS: &str = "shop";
const NOW: u64 = 1_700_000_000_000;

fn spec() -> LeaderGroupSpec {
    LeaderGroupSpec {
        selector: LabelSelector {
            match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
            match_expressions: None,
        },
        ttl_ms: 15_000,
        renew_interval_ms: 5_000,
        retry_interval_ms: 2_000,
        role_label: DEFAULT_ROLE_LABEL.into(),
        placement: Default::default(),
        service: None,
    }
}

fn group(name: &str, spec: LeaderGroupSpec, status: Option<LeaderGroupStatus>) -> LeaderGroup {
    let mut g = LeaderGroup::new(name, spec);
    g.metadata.namespace = Some(NS.into());
    g.metadata.generation = Some(3);
    g.status = status;
    g
}

fn pod(name: &str, role: Option<&str>) -> PodView {
    let mut labels: BTreeMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
    if let Some(r) = role {
        labels.insert(DEFAULT_ROLE_LABEL.into(), r.into());
    }
    PodView {
        name: name.into(),
        labels,
        ..Default::default()
    }
}

fn state(holder: Option<&str>, term: u64, members: &[&str]) -> StoreView {
    StoreView::Available(GroupState {
        holder: holder.map(|h| format!("{NS}/{h}")),
        term,
        lease_pttl_ms: holder.map(|_| 12_000),
        members: members
            .iter()
            .map(|m| (format!("{NS}/{m}"), NOW + 17_000))
            .collect(),
        priorities: Default::default(),
        problems: Default::default(),
        preferred: None,
        now_ms: NOW,
    })
}

fn run(g: &LeaderGroup, pods: &[PodView], store: &StoreView) -> Plan {
    run_among(g, pods, &[], store)
}

/// A plan for `g` beside other groups of the namespace.
fn run_among(g: &LeaderGroup, pods: &[PodView], others: &[OtherGroup], store: &StoreView) -> Plan {
    plan(&Observed {
        group: g,
        cluster: None,
        pods,
        others,
        store,
        swept: &[],
        local_now_ms: NOW,
        store_warnings: &[],
        votes: None,
        lease_seen_until_ms: Some(NOW),
        holder_gone_since_ms: Some(0),
    })
}

/// `p` as the reconcile sees the leader's pod: Ready, with an IP.
fn ready(mut p: PodView) -> PodView {
    p.ready = Some(true);
    p.ip = Some(format!("10.0.0.{}", p.name.len()));
    p
}

fn change(pod: &str, value: Option<&str>) -> LabelChange {
    LabelChange {
        pod: pod.into(),
        key: DEFAULT_ROLE_LABEL.into(),
        value: value.map(str::to_owned),
    }
}

fn cond<'a>(status: &'a LeaderGroupStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

#[test]
fn first_election_labels_the_leader_and_the_live_followers() {
    let g = group("web", spec(), None);
    let pods = [ready(pod("a", None)), pod("b", None), pod("c", None)];
    let p = run(&g, &pods, &state(Some("a"), 1, &["a", "b", "c"]));
    assert_eq!(
        p.labels,
        vec![
            change("b", Some(FOLLOWER)),
            change("c", Some(FOLLOWER)),
            change("a", Some(LEADER))
        ]
    );
    assert_eq!(p.status.leader.as_deref(), Some("a"));
    assert_eq!(p.status.holder.as_deref(), Some("shop/a"));
    assert_eq!(
        (p.status.term, p.status.live_members, p.status.transitions),
        (Some(1), 3, 1)
    );
    assert_eq!(
        serde_json::to_value(&p.status.leader_since).unwrap(),
        "2023-11-14T22:13:20Z"
    );
    assert_eq!(cond(&p.status, "LeaderElected").status, "True");
    assert_eq!(cond(&p.status, "Ready").status, "True");
    assert_eq!(p.status.observed_generation, Some(3));
    assert!(p.write_status);
    assert_eq!(p.events.len(), 1);
    assert_eq!(p.events[0].reason, "LeaderElected");
    assert!(p.events[0].note.contains("pod a") && p.events[0].note.contains("term 1"));
    assert_eq!(p.config, Some(ElectionConfig::default()));
}

#[test]
fn on_a_leader_change_the_old_label_goes_before_the_new_one_comes() {
    let prev = run(
        &group("web", spec(), None),
        &[pod("a", None), pod("b", None)],
        &state(Some("a"), 1, &["a", "b"]),
    )
    .status;
    let g = group("web", spec(), Some(prev));
    let pods = [pod("a", Some(LEADER)), pod("b", Some(FOLLOWER))];
    let p = run(&g, &pods, &state(Some("b"), 2, &["a", "b"]));
    assert_eq!(
        p.labels,
        vec![change("a", Some(FOLLOWER)), change("b", Some(LEADER))]
    );
    // One Event for the change, naming both.
    let reasons: Vec<&str> = p.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["LeaderElected"]);
    assert_eq!(
        p.events[0].note,
        "pod b leads under term 2, after node shop/a"
    );
    assert_eq!(p.status.transitions, 2);
    // The order holds whichever pod sorts first.
    let g = group("web", spec(), None);
    let pods = [pod("a", None), pod("z", Some(LEADER))];
    let p = run(&g, &pods, &state(Some("a"), 5, &["a"]));
    assert_eq!(p.labels, vec![change("z", None), change("a", Some(LEADER))]);
}

#[test]
fn a_crashed_leader_whose_lease_expired_loses_its_label_before_any_successor() {
    let prev = run(
        &group("web", spec(), None),
        &[pod("a", None), pod("b", None)],
        &state(Some("a"), 4, &["a", "b"]),
    )
    .status;
    let g = group("web", spec(), Some(prev));
    let pods = [pod("a", Some(LEADER)), pod("b", Some(FOLLOWER))];
    // Lease gone, a's candidacy lapsed too; b has not won yet.
    let p = run(&g, &pods, &state(None, 4, &["b"]));
    assert_eq!(p.labels, vec![change("a", None)]);
    assert_eq!(p.status.leader, None);
    assert_eq!(p.status.term, Some(4), "the last term stays visible");
    assert_eq!(cond(&p.status, "LeaderElected").status, "False");
    assert_eq!(cond(&p.status, "Ready").status, "False");
    assert_eq!(p.events[0].reason, "LeaderLost");
    assert!(p.events[0].warning && p.events[0].note.contains("nobody took over"));
    // Still a live member but no longer holder: it becomes a follower.
    let p = run(&g, &pods, &state(None, 4, &["a", "b"]));
    assert_eq!(p.labels, vec![change("a", Some(FOLLOWER))]);
}

#[test]
fn a_gone_holder_is_left_alone_for_a_moment_while_a_successor_is_expected() {
    let prev = run(
        &group("web", spec(), None),
        &[pod("a", None), pod("b", None)],
        &state(Some("a"), 4, &["a", "b"]),
    )
    .status;
    let g = group("web", spec(), Some(prev.clone()));
    let pods = [pod("a", Some(LEADER)), pod("b", Some(FOLLOWER))];
    let gone = state(None, 4, &["b"]);
    let StoreView::Available(st) = &gone else {
        unreachable!()
    };
    let now = st.now_ms;
    let at = |since: Option<u64>| {
        plan(&Observed {
            group: &g,
            cluster: None,
            pods: &pods,
            others: &[],
            store: &gone,
            swept: &[],
            local_now_ms: NOW,
            store_warnings: &[],
            votes: None,
            lease_seen_until_ms: Some(NOW),
            holder_gone_since_ms: since,
        })
    };
    // First seen now: nothing is written, look again after the grace.
    let p = at(None);
    assert_eq!(p.awaiting_successor, Some((now, SUCCESSOR_GRACE_MS)));
    assert!(p.labels.is_empty() && p.events.is_empty() && !p.write_status);
    assert_eq!(p.status, prev);
    // Seen 100 ms ago: the rest of the grace.
    let p = at(Some(now - 100));
    assert_eq!(
        p.awaiting_successor,
        Some((now - 100, SUCCESSOR_GRACE_MS - 100))
    );
    // The grace is over and nobody took over: leaderless, said once.
    let p = at(Some(now - SUCCESSOR_GRACE_MS));
    assert_eq!(p.awaiting_successor, None);
    assert_eq!(p.labels, vec![change("a", None)]);
    assert_eq!(p.events[0].reason, "LeaderLost");
    // No other live member: nobody to wait for.
    let alone = state(None, 4, &[]);
    let p = plan(&Observed {
        group: &g,
        cluster: None,
        pods: &pods,
        others: &[],
        store: &alone,
        swept: &[],
        local_now_ms: NOW,
        store_warnings: &[],
        votes: None,
        lease_seen_until_ms: Some(NOW),
        holder_gone_since_ms: None,
    });
    assert_eq!(p.awaiting_successor, None);
    assert_eq!(p.labels, vec![change("a", None), change("b", None)]);
}

#[test]
fn the_role_label_key_comes_from_the_spec() {
    let mut s = spec();
    s.role_label = "example.com/singleton".into();
    let g = group("web", s, None);
    let p = run(&g, &[pod("a", None)], &state(Some("a"), 1, &["a"]));
    assert_eq!(
        p.labels,
        vec![LabelChange {
            pod: "a".into(),
            key: "example.com/singleton".into(),
            value: Some(LEADER.into())
        }]
    );
}

#[test]
fn members_without_a_selected_pod_are_reported_and_never_labelled() {
    let g = group("web", spec(), None);
    let mut outsider = pod("d", None);
    outsider.labels.insert("app".into(), "batch".into());
    let pods = [pod("a", None), outsider];
    let store = StoreView::Available(GroupState {
        holder: Some("shop/a".into()),
        term: 1,
        lease_pttl_ms: Some(10_000),
        members: ["shop/a", "shop/d", "shop/ghost", "other/x"]
            .iter()
            .map(|m| (m.to_string(), NOW + 1))
            .collect(),
        priorities: Default::default(),
        problems: Default::default(),
        preferred: None,
        now_ms: NOW,
    });
    let p = run(&g, &pods, &store);
    assert_eq!(p.labels, vec![change("a", Some(LEADER))]);
    let problems: BTreeMap<&str, Option<MemberProblem>> = p
        .status
        .members
        .iter()
        .map(|m| (m.node.as_str(), m.problem))
        .collect();
    assert_eq!(problems["shop/a"], None);
    assert_eq!(problems["shop/d"], Some(MemberProblem::NotSelected));
    assert_eq!(problems["shop/ghost"], Some(MemberProblem::PodNotFound));
    assert_eq!(problems["other/x"], Some(MemberProblem::OtherNamespace));
    assert_eq!(p.status.live_members, 4);
}

#[test]
fn a_leader_without_a_pod_holds_the_lease_but_labels_nothing() {
    let g = group("web", spec(), None);
    let p = run(
        &g,
        &[pod("b", None)],
        &state(Some("gone"), 2, &["gone", "b"]),
    );
    assert_eq!(p.labels, vec![change("b", Some(FOLLOWER))]);
    assert_eq!(p.status.leader, None);
    assert_eq!(p.status.holder.as_deref(), Some("shop/gone"));
    assert_eq!(
        cond(&p.status, "LeaderElected").reason,
        "LeaseHeldByNodeWithoutPod"
    );
}

#[test]
fn pods_that_stopped_being_live_members_lose_the_label() {
    let g = group("web", spec(), None);
    let mut moved = pod("e", Some(FOLLOWER));
    moved.labels.insert("app".into(), "other".into()); // no longer selected
    let pods = [
        pod("a", Some(LEADER)),
        pod("c", Some(FOLLOWER)),
        moved,
        pod("f", Some("something-else")),
    ];
    let p = run(&g, &pods, &state(Some("a"), 1, &["a"]));
    // c is selected but not a live member; e is not selected; f's value is not ours.
    assert_eq!(
        p.labels,
        vec![change("c", None), change("e", None), change("f", None)]
    );
}

#[test]
fn two_groups_writing_one_label_key_on_one_pod_get_a_condition_not_a_flap() {
    let others_of_beta = [OtherGroup {
        name: "alpha".into(),
        role_label: DEFAULT_ROLE_LABEL.into(),
        selector: spec().selector,
    }];
    let others_of_alpha = [OtherGroup {
        name: "beta".into(),
        role_label: DEFAULT_ROLE_LABEL.into(),
        selector: spec().selector,
    }];
    let pods = [pod("a", None)];
    let store = state(Some("a"), 1, &["a"]);
    let beta = group("beta", spec(), None);
    let p = run_among(&beta, &pods, &others_of_beta, &store);
    assert!(p.labels.is_empty(), "beta yields the pod to alpha");
    let c = cond(&p.status, "LabelConflict");
    assert_eq!(c.status, "True");
    assert!(
        c.message.contains("pod a is also selected by group alpha")
            && c.message.contains("roleLabel"),
        "{}",
        c.message
    );
    assert_eq!(cond(&p.status, "Ready").status, "False");
    assert_eq!(
        p.status.members[0].problem,
        Some(MemberProblem::LabelConflict)
    );
    let alpha = group("alpha", spec(), None);
    let p = run_among(&alpha, &pods, &others_of_alpha, &store);
    assert_eq!(p.labels, vec![change("a", Some(LEADER))]);
    assert_eq!(cond(&p.status, "LabelConflict").status, "True");
    // A different key is no conflict.
    let others = [OtherGroup {
        name: "alpha".into(),
        role_label: "x/role".into(),
        selector: spec().selector,
    }];
    let p = run_among(&beta, &pods, &others, &store);
    assert_eq!(p.labels, vec![change("a", Some(LEADER))]);
    assert_eq!(cond(&p.status, "LabelConflict").status, "False");
}

#[test]
fn an_unavailable_store_leaves_every_label_as_it_is() {
    let prev = run(
        &group("web", spec(), None),
        &[pod("a", None)],
        &state(Some("a"), 1, &["a"]),
    )
    .status;
    let g = group("web", spec(), Some(prev.clone()));
    let pods = [pod("a", Some(LEADER)), pod("b", Some(FOLLOWER))];
    let p = run(
        &g,
        &pods,
        &StoreView::Unavailable("connection refused".into()),
    );
    assert!(p.labels.is_empty());
    assert_eq!(p.status.leader, prev.leader);
    let c = cond(&p.status, "StoreAvailable");
    assert_eq!(
        (c.status.as_str(), c.message.as_str()),
        ("False", "connection refused")
    );
    assert_eq!(cond(&p.status, "Ready").status, "False");
    assert!(p.write_status);
    assert!(p.events.is_empty() && p.step_down.is_none());
}

#[test]
fn status_is_written_only_when_something_a_user_reads_changed() {
    let pods = [pod("a", Some(LEADER))];
    let first = run(
        &group("web", spec(), None),
        &pods,
        &state(Some("a"), 1, &["a"]),
    );
    assert!(first.write_status);
    let g = group("web", spec(), Some(first.status.clone()));
    // Same state, lease renewed: nothing to write.
    let mut renewed = match state(Some("a"), 1, &["a"]) {
        StoreView::Available(s) => s,
        _ => unreachable!(),
    };
    renewed.now_ms += 5_000;
    renewed.members[0].1 += 5_000;
    let p = run(&g, &pods, &StoreView::Available(renewed.clone()));
    assert!(p.labels.is_empty());
    assert!(!p.write_status, "only expiry times moved");
    assert_eq!(
        p.status.conditions, first.status.conditions,
        "transition times kept"
    );
    // At rest nothing a user reads moves: no write however long the
    // leader renews (a lease expiry in the status would cost one write
    // per group per resync).
    for later in [1_001, 60_000, 3_600_000] {
        renewed.now_ms = NOW + later;
        renewed.members[0].1 = renewed.now_ms + 5_000;
        let p = run(&g, &pods, &StoreView::Available(renewed.clone()));
        assert!(!p.write_status, "{later} ms later");
    }
    // A new generation is a change.
    let mut g2 = g.clone();
    g2.metadata.generation = Some(4);
    let p = run(&g2, &pods, &state(Some("a"), 1, &["a"]));
    assert!(p.write_status);
    assert_eq!(p.status.observed_generation, Some(4));
}

#[test]
fn a_term_lost_by_the_store_is_restored_from_the_status() {
    let prev = LeaderGroupStatus {
        term: Some(7),
        ..Default::default()
    };
    let g = group("web", spec(), Some(prev));
    let p = run(&g, &[pod("a", None)], &state(None, 0, &["a"]));
    assert_eq!(p.restore_term, Some(7));
    assert_eq!(p.status.term, Some(7), "status.term never goes backwards");
    let p = run(&g, &[pod("a", None)], &state(Some("a"), 8, &["a"]));
    assert_eq!(p.restore_term, None);
    assert_eq!(p.status.term, Some(8));
}

#[test]
fn a_step_down_annotation_is_acted_on_once_per_value() {
    let mut g = group("web", spec(), None);
    g.metadata.annotations = Some([(STEP_DOWN_ANNOTATION.to_owned(), "1".to_owned())].into());
    let p = run(&g, &[pod("a", None)], &state(Some("a"), 1, &["a"]));
    assert_eq!(p.step_down.as_deref(), Some("shop/a"));
    assert_eq!(p.status.handled_step_down.as_deref(), Some("1"));
    assert!(p.events.iter().any(|e| e.reason == "StepDownRequested"));
    g.status = Some(p.status);
    let p = run(&g, &[pod("a", Some(LEADER))], &state(Some("a"), 1, &["a"]));
    assert_eq!(p.step_down, None, "the same value is not applied twice");
    g.metadata.annotations = Some([(STEP_DOWN_ANNOTATION.to_owned(), "2".to_owned())].into());
    let p = run(&g, &[pod("a", Some(LEADER))], &state(Some("a"), 1, &["a"]));
    assert_eq!(p.step_down.as_deref(), Some("shop/a"));
}

#[test]
fn an_invalid_spec_is_a_condition_and_no_timings_are_written() {
    let mut s = spec();
    s.renew_interval_ms = s.ttl_ms;
    let g = group("web", s, None);
    let p = run(&g, &[pod("a", None)], &state(Some("a"), 1, &["a"]));
    let c = cond(&p.status, "SpecValid");
    assert_eq!(c.status, "False");
    assert!(
        c.message.contains("renewIntervalMs = 15000") && c.message.contains("ttlMs = 15000"),
        "{}",
        c.message
    );
    // A negative value (possible where the API server does not check bounds)
    // is named as given.
    let mut s = spec();
    s.retry_interval_ms = -5;
    let g = group("web", s, None);
    let p = run(&g, &[pod("a", None)], &state(Some("a"), 1, &["a"]));
    let c = cond(&p.status, "SpecValid");
    assert!(
        c.message
            .starts_with("retryIntervalMs = -5 is out of range")
            && c.message.contains("from 1 to 2147483647"),
        "{}",
        c.message
    );
    assert_eq!(p.config, None);
    assert_eq!(cond(&p.status, "Ready").status, "False");
}

/// A role label the API server would refuse, or one the selector matches
/// on (relabelling would orphan the pods from their own selector), is a
/// `SpecValid=False` condition with the reason, and no pod is labelled:
/// never a loop of refused patches.
#[test]
fn an_unusable_role_label_is_a_condition_and_nothing_is_labelled() {
    for (label, why) in [
        ("app", "is a key of the selector"),
        ("Bad Key", "is not a label key"),
        ("-x", "is not a label key"),
        ("UPPER.example/role", "is not a label key"),
        (&"x".repeat(64), "is not a label key"),
    ] {
        let mut s = spec();
        s.role_label = label.to_owned();
        let g = group("web", s, None);
        let p = run(
            &g,
            &[pod("a", None), pod("b", None)],
            &state(Some("a"), 1, &["a", "b"]),
        );
        let c = cond(&p.status, "SpecValid");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "InvalidRoleLabel"),
            "{label}"
        );
        assert!(c.message.contains(why), "{label}: {}", c.message);
        assert_eq!(p.labels, vec![], "{label}");
        assert_eq!(cond(&p.status, "Ready").status, "False", "{label}");
        assert!(p.config.is_some(), "the timings are fine and still written");
    }
    // A key of a match expression is refused too.
    let mut s = spec();
    s.selector.match_expressions = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
            key: "tier".into(),
            operator: "Exists".into(),
            values: None,
        },
    ]);
    s.role_label = "tier".into();
    let p = run(
        &group("web", s, None),
        &[pod("a", None)],
        &state(Some("a"), 1, &["a"]),
    );
    assert_eq!(cond(&p.status, "SpecValid").reason, "InvalidRoleLabel");
    // Valid keys, with and without a prefix, label as usual.
    for label in ["role", "leasehold.dev/role", "a.b-c/x_y.z"] {
        let mut s = spec();
        s.role_label = label.to_owned();
        let p = run(
            &group("web", s, None),
            &[pod("a", None)],
            &state(Some("a"), 1, &["a"]),
        );
        assert_eq!(cond(&p.status, "SpecValid").status, "True", "{label}");
        assert_eq!(p.labels.len(), 1, "{label}");
    }
}

#[test]
fn timestamps_are_rfc3339_to_the_second() {
    let text = |ms| serde_json::to_value(time_of(ms)).unwrap();
    assert_eq!(text(0), "1970-01-01T00:00:00Z");
    assert_eq!(text(NOW + 999), "2023-11-14T22:13:20Z");
    assert_eq!(text(951_782_400_000), "2000-02-29T00:00:00Z");
    assert_eq!(pod_of("shop/a", "shop"), Some("a"));
    assert_eq!(pod_of("other/a", "shop"), None);
    assert_eq!(pod_of("noslash", "shop"), None);
}

#[test]
fn a_sweep_of_former_members_is_reported_once() {
    let prev = run(
        &group("web", spec(), None),
        &[pod("a", None), pod("b", None)],
        &state(Some("a"), 1, &["a", "b"]),
    )
    .status;
    let g = group("web", spec(), Some(prev));
    let pods = [pod("a", Some(LEADER)), pod("b", Some(FOLLOWER))];
    let swept = [
        ("shop/b".to_owned(), NOW + 2_000),
        ("elsewhere/z".to_owned(), NOW + 2_000),
    ];
    let store = state(Some("a"), 1, &["a"]);
    let p = plan(&Observed {
        group: &g,
        cluster: None,
        pods: &pods,
        others: &[],
        store: &store,
        swept: &swept,
        local_now_ms: NOW,
        store_warnings: &[],
        votes: None,
        lease_seen_until_ms: Some(NOW),
        holder_gone_since_ms: Some(0),
    });
    let sweep = p.status.last_sweep.clone().expect("lastSweep");
    assert_eq!(sweep.nodes, ["shop/b"]);
    assert_eq!(sweep.time, time_of(NOW + 2_000));
    assert!(p
        .events
        .iter()
        .any(|e| e.reason == "NodesSwept" && e.note.contains("shop/b")));
    assert_eq!(p.labels, vec![change("b", None)]);
    // Reported once: with the sweep recorded, the same sweep is no news.
    let mut g2 = g.clone();
    g2.status = Some(p.status);
    let p = plan(&Observed {
        group: &g2,
        cluster: None,
        pods: &pods,
        others: &[],
        store: &store,
        swept: &swept,
        local_now_ms: NOW,
        store_warnings: &[],
        votes: None,
        lease_seen_until_ms: Some(NOW),
        holder_gone_since_ms: Some(0),
    });
    assert!(!p.events.iter().any(|e| e.reason == "NodesSwept"));
}

#[test]
fn a_deleted_group_takes_its_role_labels_off_leader_first() {
    let g = group("web", spec(), None);
    let mut other_app = pod("db-0", Some(LEADER));
    other_app.labels.insert("app".into(), "db".into());
    let mut custom = pod("c", None);
    custom
        .labels
        .insert(DEFAULT_ROLE_LABEL.into(), "canary".into());
    let pods = [
        pod("a", Some(FOLLOWER)),
        pod("b", Some(LEADER)),
        pod("unlabelled", None),
        custom,
        other_app,
    ];
    // db-0 is not selected by web: its label is not web's to remove.
    assert_eq!(
        role_labels_to_remove(&g, &pods, &[]),
        vec![change("b", None), change("a", None)],
        "the leader's label first; values that are not ours and unselected pods stay"
    );
    // A pod another group with the same key also selects keeps its label.
    let others = [OtherGroup {
        name: "web-too".into(),
        role_label: DEFAULT_ROLE_LABEL.into(),
        selector: spec().selector,
    }];
    assert!(role_labels_to_remove(&g, &pods, &others).is_empty());
}

#[test]
fn unsafe_store_settings_are_a_condition_of_every_group_but_not_unreadiness() {
    let g = group("web", spec(), None);
    let pods = [ready(pod("a", Some(LEADER)))];
    let store = state(Some("a"), 1, &["a"]);
    let safe = run(&g, &pods, &store);
    assert_eq!(cond(&safe.status, "RedisSettingsSafe").status, "True");
    let warnings = [leasehold_engine::SettingWarning {
        setting: "maxmemory-policy",
        message: "redis maxmemory-policy is allkeys-lru: set noeviction".into(),
    }];
    let p = plan(&Observed {
        group: &g,
        cluster: None,
        pods: &pods,
        others: &[],
        store: &store,
        swept: &[],
        local_now_ms: NOW,
        store_warnings: &warnings,
        votes: None,
        lease_seen_until_ms: Some(NOW),
        holder_gone_since_ms: Some(0),
    });
    let c = cond(&p.status, "RedisSettingsSafe");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "UnsafeSettings")
    );
    assert!(c.message.contains("allkeys-lru"), "{}", c.message);
    assert_eq!(cond(&p.status, "Ready").status, "True");
    // While the store cannot be read, the last report stands.
    let mut later = g.clone();
    later.status = Some(p.status.clone());
    let down = run(&later, &pods, &StoreView::Unavailable("down".into()));
    assert_eq!(cond(&down.status, "RedisSettingsSafe").status, "False");
}

/// The plan decides the same on the pods `PodsRead` keeps as on all of
/// the namespace's pods, over many mixes of selected and unselected pods,
/// role labels, groups sharing the label key, members and holders.
#[test]
fn a_plan_on_the_pods_it_reads_equals_one_on_all_pods() {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let apps = [Some("web"), Some("api"), None];
    let roles = [None, Some(LEADER), Some(FOLLOWER), Some("other")];
    let mut kept_fewer = 0;
    for case in 0..2_000 {
        let pods: Vec<PodView> = (0..6)
            .map(|i| {
                let mut labels = BTreeMap::new();
                if let Some(app) = apps[next(3) as usize] {
                    labels.insert("app".to_owned(), app.to_owned());
                }
                if let Some(role) = roles[next(4) as usize] {
                    labels.insert(DEFAULT_ROLE_LABEL.to_owned(), role.to_owned());
                }
                PodView {
                    name: format!("p{i}"),
                    labels,
                    ..Default::default()
                }
            })
            .collect();
        // matchLabels (filed under a label by the indexes), an expression
        // (not filed), and an empty selector (selects nothing).
        let selecting = |app: &str, kind: u64| match kind {
            0 => LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "app".into(),
                    operator: "In".into(),
                    values: Some(vec![app.to_owned()]),
                }]),
            },
            1 => LabelSelector::default(),
            _ => LabelSelector {
                match_labels: Some([("app".to_owned(), app.to_owned())].into()),
                match_expressions: None,
            },
        };
        let others: Vec<OtherGroup> = (0..next(3))
            .map(|i| OtherGroup {
                name: if next(2) == 0 {
                    format!("a{i}")
                } else {
                    format!("z{i}")
                },
                role_label: if next(4) == 0 {
                    "other.dev/role".into()
                } else {
                    DEFAULT_ROLE_LABEL.into()
                },
                selector: selecting(if next(2) == 0 { "web" } else { "api" }, next(5)),
            })
            .collect();
        // Members: pods that exist or not ("gone"), selected or not.
        let names = ["p0", "p1", "p2", "p3", "p4", "p5", "gone"];
        let members: Vec<&str> = names.iter().filter(|_| next(3) == 0).copied().collect();
        let holder = (next(3) != 0).then(|| names[next(7) as usize]);
        let store = if next(10) == 0 {
            StoreView::Unavailable("down".into())
        } else {
            state(holder, 1 + next(5), &members)
        };
        let previous = (next(2) == 0).then(|| LeaderGroupStatus {
            leader: Some("p1".into()),
            holder: Some(format!("{NS}/p1")),
            term: Some(1),
            ..Default::default()
        });
        let mut g = group("m", spec(), previous);
        if next(4) == 0 {
            // Its own selector an expression, or empty.
            g.spec.selector = selecting("web", next(2));
        }
        let read = PodsRead::new(&g, &others, &store, None);
        let kept: Vec<PodView> = pods
            .iter()
            .filter(|p| read.needs(&p.name, &p.labels))
            .cloned()
            .collect();
        if kept.len() < pods.len() {
            kept_fewer += 1;
        }
        let on = |pods: &[PodView], others: &[OtherGroup]| run_among(&g, pods, others, &store);
        let everything = on(&pods, &others);
        assert_eq!(
            on(&kept, &others),
            everything,
            "case {case}: {pods:?} {others:?} {store:?}"
        );
        // The namespace indexed once (neighbourhood.rs) gives the same
        // pods, and the plan on them and the few other groups that select
        // them decides the same; with the group itself in the cache or not
        // yet.
        let mut groups = others.clone();
        if next(4) != 0 {
            groups.push(OtherGroup {
                name: "m".into(),
                role_label: g.spec.role_label.clone(),
                selector: g.spec.selector.clone(),
            });
        }
        let around = crate::neighbourhood::Neighbourhood::new(groups, pods.clone());
        let read = around.pods_for(&g, &store, None);
        assert_eq!(read, kept, "case {case}: {pods:?} {others:?} {store:?}");
        assert_eq!(
            on(&read, &around.others_for(&g, &read)),
            everything,
            "case {case}: {pods:?} {others:?} {store:?}"
        );
    }
    assert!(
        kept_fewer > 1_000,
        "the filter kept every pod in {} of 2000 cases",
        2_000 - kept_fewer
    );
}

// ---- placement (placement.rs): who should lead ----

/// A member pod on `revision`, created at `created_ms`, with its readiness.
fn pod_on(name: &str, revision: &str, created_ms: u64, ready: Option<bool>) -> PodView {
    let mut p = pod(name, None);
    p.labels
        .insert("controller-revision-hash".into(), revision.into());
    p.revision = Some(revision.into());
    p.created_ms = created_ms;
    p.ready = ready;
    p
}

/// `state` with priorities for some members.
fn with_priorities(store: StoreView, priorities: &[(&str, u32)]) -> StoreView {
    let StoreView::Available(mut s) = store else {
        unreachable!()
    };
    for m in &s.members {
        s.priorities.insert(m.0.clone(), 1);
    }
    for (m, p) in priorities {
        s.priorities.insert(format!("{NS}/{m}"), *p);
    }
    StoreView::Available(s)
}

fn rollout_pods(ready: Option<bool>) -> [PodView; 3] {
    [
        pod_on("a", "v1", NOW - 30_000, Some(true)),
        pod_on("b", "v1", NOW - 20_000, Some(true)),
        pod_on("c", "v2", NOW - 10_000, ready),
    ]
}

#[test]
fn during_a_rollout_a_leader_on_an_old_revision_hands_over_once_to_a_ready_updated_member() {
    let g = group("web", spec(), None);
    let p = run(
        &g,
        &rollout_pods(Some(true)),
        &state(Some("a"), 4, &["a", "b", "c"]),
    );
    let h = p.hand_over.clone().expect("a handover");
    assert_eq!(
        (h.from.as_str(), h.to.as_str(), h.term),
        ("shop/a", "shop/c", 4)
    );
    assert_eq!(h.reason, placement::reasons::ROLLOUT);
    let rollout = p.status.rollout.clone().unwrap();
    assert_eq!(rollout.revision, "v2");
    assert_eq!(rollout.preferred, ["shop/c"]);
    assert_eq!(
        p.preferred_nodes,
        PreferredMembers::Write(vec!["shop/c".to_owned()])
    );
    assert_eq!(p.status.preferred.as_deref(), Some("c"));
    assert_eq!(p.status.handover.as_ref(), Some(&h));
    assert!(p
        .events
        .iter()
        .any(|e| e.reason == event_reasons::HANDOVER_REQUESTED && e.note.contains("revision v2")));
    assert!(p.write_status);
    // Asked once per term: the next reconcile in the same term asks nothing,
    // and writes no preferred members again (the store has them now).
    let g = group("web", spec(), Some(p.status.clone()));
    let StoreView::Available(mut written) = state(Some("a"), 4, &["a", "b", "c"]) else {
        unreachable!()
    };
    written.preferred = Some(vec!["shop/c".into()]);
    let again = run(
        &g,
        &rollout_pods(Some(true)),
        &StoreView::Available(written),
    );
    assert_eq!(again.hand_over, None);
    assert_eq!(again.preferred_nodes, PreferredMembers::Keep);
}

#[test]
fn a_rollout_prefers_an_updated_member_from_its_arrival_and_hands_over_only_to_a_ready_one() {
    for ready in [Some(false), None] {
        let g = group("web", spec(), None);
        let p = run(
            &g,
            &rollout_pods(ready),
            &state(Some("a"), 4, &["a", "b", "c"]),
        );
        assert_eq!(p.hand_over, None, "ready {ready:?}");
        // Preferred in the store already, so that a free seat (the next old
        // pod deleted the moment this one turns ready) goes to it.
        assert_eq!(p.status.rollout.as_ref().unwrap().preferred, ["shop/c"]);
        assert_eq!(
            p.preferred_nodes,
            PreferredMembers::Write(vec!["shop/c".to_owned()])
        );
        // Placement's choice is a ready pod: the leader stays it.
        assert_eq!(p.status.preferred.as_deref(), Some("a"), "ready {ready:?}");
    }
    // Unready for longer than its first minute (a stalled rollout): no
    // longer preferred over the ready old pods.
    let mut pods = rollout_pods(Some(false));
    pods[0].created_ms = NOW - 300_000;
    pods[1].created_ms = NOW - 200_000;
    pods[2].created_ms = NOW - crate::placement::UNREADY_PREFERRED_MS;
    let p = run(
        &group("web", spec(), None),
        &pods,
        &state(Some("a"), 4, &["a", "b", "c"]),
    );
    assert_eq!(
        p.status.rollout.as_ref().unwrap().preferred,
        Vec::<String>::new()
    );
    assert_eq!(p.preferred_nodes, PreferredMembers::Keep);
    let mut s = spec();
    s.placement.prefer_updated = false;
    let g = group("web", s, None);
    let p = run(
        &g,
        &rollout_pods(Some(true)),
        &state(Some("a"), 4, &["a", "b", "c"]),
    );
    assert_eq!(p.hand_over, None);
    assert_eq!(p.preferred_nodes, PreferredMembers::Keep);
    // A leader already on the updated revision stays.
    let g = group("web", spec(), None);
    let p = run(
        &g,
        &rollout_pods(Some(true)),
        &state(Some("c"), 4, &["a", "b", "c"]),
    );
    assert_eq!(p.hand_over, None);
}

#[test]
fn an_old_revision_pod_replaced_during_a_rollout_does_not_make_its_revision_the_updated_one() {
    // web-b (v1) was evicted and replaced after web-c (v2) started.
    let pods = [
        pod_on("a", "v1", 1_000, Some(true)),
        pod_on("b", "v1", 5_000, Some(true)),
        pod_on("c", "v2", 3_000, Some(true)),
    ];
    let g = group("web", spec(), None);
    let p = run(&g, &pods, &state(Some("a"), 4, &["a", "b", "c"]));
    assert_eq!(p.status.rollout.as_ref().unwrap().revision, "v2");
    assert_eq!(p.hand_over.map(|h| h.to), Some("shop/c".to_owned()));
}

#[test]
fn a_step_down_and_a_step_down_to_together_leave_the_handover_for_the_next_leader() {
    let store = state(Some("a"), 2, &["a", "b", "c"]);
    let pods = [pod("a", None), pod("b", None), pod("c", None)];
    let mut g = group("web", spec(), None);
    g.metadata.annotations = Some(
        [
            (STEP_DOWN_ANNOTATION.to_owned(), "1".to_owned()),
            (
                crate::crd::STEP_DOWN_TO_ANNOTATION.to_owned(),
                "b".to_owned(),
            ),
        ]
        .into(),
    );
    let p = run(&g, &pods, &store);
    assert_eq!(p.step_down.as_deref(), Some("shop/a"));
    assert_eq!(p.hand_over, None);
    assert_eq!(p.status.handled_step_down_to, None, "not handled yet");
    assert!(p
        .status
        .conditions
        .iter()
        .all(|c| c.type_ != types::HANDOVER));
}

#[test]
fn the_preferred_members_are_written_when_the_store_holds_other_ones() {
    let g = group("web", spec(), None);
    let StoreView::Available(mut s) = state(Some("a"), 4, &["a", "b", "c"]) else {
        unreachable!()
    };
    // The store holds the list already: nothing to write.
    s.preferred = Some(vec!["shop/c".into()]);
    let p = run(
        &g,
        &rollout_pods(Some(true)),
        &StoreView::Available(s.clone()),
    );
    assert_eq!(p.preferred_nodes, PreferredMembers::Keep);
    // A list left over from a rollout that ended: removed.
    let done = [
        pod_on("a", "v2", 4_000, None),
        pod_on("b", "v2", 5_000, None),
        pod_on("c", "v2", 3_000, None),
    ];
    let p = run(&g, &done, &StoreView::Available(s));
    assert_eq!(p.preferred_nodes, PreferredMembers::Remove);
}

#[test]
fn a_rollout_never_hands_over_to_a_member_of_lower_priority() {
    let g = group("web", spec(), None);
    let store = with_priorities(state(Some("a"), 4, &["a", "b", "c"]), &[("a", 5), ("c", 2)]);
    let p = run(&g, &rollout_pods(Some(true)), &store);
    assert_eq!(p.hand_over, None);
    // Placement still prefers the leader: it has the highest priority.
    assert_eq!(p.status.preferred.as_deref(), Some("a"));
}

#[test]
fn the_end_of_a_rollout_removes_the_preferred_members_from_the_store() {
    let previous = LeaderGroupStatus {
        rollout: Some(crate::crd::Rollout {
            revision: "v2".into(),
            preferred: vec!["shop/c".into()],
        }),
        ..Default::default()
    };
    let g = group("web", spec(), Some(previous));
    let pods = [
        pod_on("a", "v2", 4_000, None),
        pod_on("b", "v2", 5_000, None),
        pod_on("c", "v2", 3_000, None),
    ];
    let StoreView::Available(mut s) = state(Some("c"), 5, &["a", "b", "c"]) else {
        unreachable!()
    };
    s.preferred = Some(vec!["shop/c".into()]);
    let p = run(&g, &pods, &StoreView::Available(s));
    assert_eq!(p.status.rollout, None);
    assert_eq!(p.preferred_nodes, PreferredMembers::Remove);
}

#[test]
fn failback_after_stable_hands_over_to_a_member_of_higher_priority_live_long_enough() {
    let store = with_priorities(state(Some("a"), 7, &["a", "b"]), &[("b", 3)]);
    let pods = [pod("a", None), pod("b", None)];
    let live_since = |b_ms: u64| LeaderGroupStatus {
        holder: Some("shop/a".into()),
        leader_since: Some(time_of(NOW - 120_000)),
        members: run(&group("web", spec(), None), &pods, &store)
            .status
            .members
            .into_iter()
            .map(|mut m| {
                m.live_since = Some(time_of(if m.node == "shop/b" { b_ms } else { 0 }));
                m
            })
            .collect(),
        ..Default::default()
    };
    let mut s = spec();
    s.placement.failback = crate::crd::Failback::AfterStable;
    // Live for 61 s: handed over.
    let p = run(
        &group("web", s.clone(), Some(live_since(NOW - 62_000))),
        &pods,
        &store,
    );
    let h = p.hand_over.expect("a failback");
    assert_eq!(
        (h.to.as_str(), h.reason.as_str()),
        ("shop/b", placement::reasons::FAILBACK)
    );
    // Live for 30 s: not yet; the controller looks again when the window
    // ends (a second later: statuses keep whole seconds).
    let p = run(
        &group("web", s, Some(live_since(NOW - 30_000))),
        &pods,
        &store,
    );
    assert_eq!(p.hand_over, None);
    assert_eq!(p.look_again_ms, Some(31_000));
    // A leader that has led for less than the window keeps its seat.
    let mut fresh = live_since(NOW - 62_000);
    fresh.leader_since = Some(time_of(NOW - 10_000));
    let mut s2 = spec();
    s2.placement.failback = crate::crd::Failback::AfterStable;
    let p = run(&group("web", s2, Some(fresh)), &pods, &store);
    assert_eq!(p.hand_over, None);
    // Never (the default): the leader keeps its seat.
    let p = run(
        &group("web", spec(), Some(live_since(NOW - 62_000))),
        &pods,
        &store,
    );
    assert_eq!(p.hand_over, None);
    assert_eq!(p.status.preferred.as_deref(), Some("b"));
}

#[test]
fn the_step_down_to_annotation_asks_a_handover_to_a_live_member_or_is_refused_once() {
    let store = with_priorities(state(Some("a"), 2, &["a", "b", "z"]), &[("z", 0)]);
    let pods = [pod("a", None), pod("b", None), pod("z", None)];
    let annotated = |value: &str, status: Option<LeaderGroupStatus>| {
        let mut g = group("web", spec(), status);
        g.metadata.annotations = Some(
            [(
                crate::crd::STEP_DOWN_TO_ANNOTATION.to_owned(),
                value.to_owned(),
            )]
            .into(),
        );
        g
    };
    let p = run(&annotated("b", None), &pods, &store);
    let h = p.hand_over.clone().expect("a handover");
    assert_eq!(
        (h.to.as_str(), h.reason.as_str()),
        ("shop/b", placement::reasons::REQUESTED)
    );
    assert_eq!(p.status.handled_step_down_to.as_deref(), Some("b"));
    assert_eq!(cond(&p.status, types::HANDOVER).status, "True");
    for (pod, words) in [
        ("z", "priority 0"),
        ("ghost", "not a live member"),
        ("a", "already leads"),
    ] {
        let p = run(&annotated(pod, None), &pods, &store);
        assert_eq!(p.hand_over, None, "{pod}");
        let c = cond(&p.status, types::HANDOVER);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::SUCCESSOR_REFUSED)
        );
        assert!(c.message.contains(words), "{pod}: {}", c.message);
        let e = p
            .events
            .iter()
            .find(|e| e.reason == event_reasons::HANDOVER_REFUSED)
            .unwrap();
        assert!(e.warning && e.note.contains(words), "{e:?}");
        // The same value again: handled, nothing more, the condition kept.
        let again = run(&annotated(pod, Some(p.status.clone())), &pods, &store);
        assert!(again.events.is_empty() && again.hand_over.is_none());
        assert_eq!(cond(&again.status, types::HANDOVER).status, "False");
    }
    // Removed, the value is forgotten: the same pod can be asked again.
    let handled = run(&annotated("b", None), &pods, &store).status;
    let removed = run(&group("web", spec(), Some(handled)), &pods, &store);
    assert_eq!(removed.status.handled_step_down_to, None);
    let again = run(&annotated("b", Some(removed.status)), &pods, &store);
    assert!(again.hand_over.is_some());
}

#[test]
fn a_member_turning_unhealthy_is_reported_once_and_cannot_be_named_successor() {
    let StoreView::Available(mut s) = state(Some("a"), 2, &["a", "b"]) else {
        unreachable!()
    };
    s.problems.insert(
        format!("{NS}/b"),
        "unhealthy: GET /ready answered 503".into(),
    );
    let store = StoreView::Available(s);
    let pods = [pod("a", None), pod("b", None)];
    let p = run(&group("web", spec(), None), &pods, &store);
    let b = p
        .status
        .members
        .iter()
        .find(|m| m.node == "shop/b")
        .unwrap();
    assert_eq!(
        b.unhealthy.as_deref(),
        Some("unhealthy: GET /ready answered 503")
    );
    let e = p
        .events
        .iter()
        .find(|e| e.reason == event_reasons::MEMBER_UNHEALTHY)
        .expect("a MemberUnhealthy event");
    assert!(
        e.warning
            && e.note
                .contains("pod b does not take the lead: unhealthy: GET"),
        "{e:?}"
    );
    // Still a labelled follower.
    assert!(p.labels.contains(&change("b", Some(FOLLOWER))));
    // Once: the next plan reports nothing new.
    let again = run(&group("web", spec(), Some(p.status.clone())), &pods, &store);
    assert!(again.events.is_empty(), "{:?}", again.events);
    // And it cannot be named successor.
    let mut g = group("web", spec(), Some(p.status));
    g.metadata.annotations = Some(
        [(
            crate::crd::STEP_DOWN_TO_ANNOTATION.to_owned(),
            "b".to_owned(),
        )]
        .into(),
    );
    let refused = run(&g, &pods, &store);
    assert_eq!(refused.hand_over, None);
    assert!(cond(&refused.status, types::HANDOVER)
        .message
        .contains("unhealthy"));
}

#[test]
fn ready_needs_the_leader_pod_ready_and_says_which_pod_is_not() {
    let g = group("web", spec(), None);
    let store = state(Some("a"), 1, &["a", "b"]);
    let p = run(&g, &[ready(pod("a", None)), pod("b", None)], &store);
    let c = cond(&p.status, "Ready");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Ready"));

    let mut unready = ready(pod("a", None));
    unready.ready = Some(false);
    let p = run(&g, &[unready, pod("b", None)], &store);
    let c = cond(&p.status, "Ready");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "LeaderPodNotReady")
    );
    assert!(
        c.message.contains("leader pod a is not Ready"),
        "{}",
        c.message
    );

    // Unknown (its pod could not be read) is not Ready either.
    let p = run(&g, &[pod("a", None), pod("b", None)], &store);
    let c = cond(&p.status, "Ready");
    assert_eq!(c.reason, "LeaderPodNotReady");
    assert!(c.message.contains("could not be read"), "{}", c.message);

    // No leader: not ready, for the reason the other conditions give.
    let p = run(&g, &[ready(pod("a", None))], &state(None, 1, &["a"]));
    assert_eq!(cond(&p.status, "Ready").reason, "NotReady");
}

fn with_service() -> LeaderGroupSpec {
    let mut s = spec();
    s.service = Some(crate::crd::LeaderService {
        name: "web-leader".into(),
        ports: vec![crate::crd::LeaderServicePort {
            name: None,
            port: 80,
            target_port: Some(8080),
            protocol: Default::default(),
        }],
    });
    s
}

#[test]
fn the_leader_endpoint_holds_the_holder_s_address_at_its_term_or_none() {
    let g = group("web", with_service(), None);
    let pods = [ready(pod("a", None)), ready(pod("bb", None))];
    let p = run(&g, &pods, &state(Some("bb"), 7, &["a", "bb"]));
    let e = p.endpoint.clone().expect("an endpoint to write");
    assert_eq!(e.term, 7);
    let leader = e.leader.expect("the holder's address");
    assert_eq!(
        (leader.pod.as_str(), leader.ip.as_str()),
        ("bb", "10.0.0.2")
    );
    assert!(leader.ready);
    assert_eq!(
        p.status.endpoint,
        Some(crate::crd::EndpointStatus {
            service: "web-leader".into(),
            address: Some("10.0.0.2".into()),
            term: 7
        })
    );
    let c = cond(&p.status, "LeaderEndpoint");
    assert_eq!(c.status, "True");
    assert!(
        c.message.contains("bb (10.0.0.2) at term 7"),
        "{}",
        c.message
    );
    assert_eq!(p.retire_service, None);
    // No event would tell of a lease that runs out unclaimed: look again
    // just after its end (without spec.service, only at the resync).
    assert_eq!(p.look_again_ms, Some(12_000 + LAPSE_MARGIN_MS));
    let labels_only = run(
        &group("web", spec(), None),
        &pods,
        &state(Some("bb"), 7, &["a", "bb"]),
    );
    assert_eq!(labels_only.look_again_ms, None);

    // No one leads: an empty slice at the last term.
    let mut later = g.clone();
    later.status = Some(p.status.clone());
    let p = run(&later, &pods, &state(None, 7, &[]));
    assert_eq!(p.look_again_ms, None);
    let e = p.endpoint.expect("an endpoint to write");
    assert_eq!((e.term, e.leader), (7, None));
    assert_eq!(p.status.endpoint.unwrap().address, None);
}

#[test]
fn an_unknown_leader_address_writes_nothing_and_keeps_what_the_status_recorded() {
    let recorded = crate::crd::EndpointStatus {
        service: "web-leader".into(),
        address: Some("10.0.0.1".into()),
        term: 6,
    };
    let status = LeaderGroupStatus {
        endpoint: Some(recorded.clone()),
        ..Default::default()
    };
    let g = group("web", with_service(), Some(status));
    // b's pod could not be read: no IP known.
    let p = run(
        &g,
        &[ready(pod("a", None)), pod("b", None)],
        &state(Some("b"), 7, &["a", "b"]),
    );
    assert_eq!(p.endpoint, None);
    assert_eq!(p.status.endpoint, Some(recorded.clone()));
    // Nor while its pod is not in the cache (yet): vacating the term
    // would rank above its leader for the rest of the term.
    let p = run(
        &g,
        &[ready(pod("a", None))],
        &state(Some("b"), 7, &["a", "b"]),
    );
    assert_eq!(p.endpoint, None);
    assert_eq!(p.status.endpoint, Some(recorded.clone()));
    // A holder that is no pod of this namespace: no address.
    let elsewhere = StoreView::Available(GroupState {
        holder: Some("other/x".into()),
        ..match state(Some("a"), 7, &["a"]) {
            StoreView::Available(s) => s,
            StoreView::Unavailable(_) => unreachable!(),
        }
    });
    let p = run(&g, &[ready(pod("a", None))], &elsewhere);
    assert_eq!(p.endpoint.map(|e| e.leader), Some(None));
    // While the store cannot be read, the condition stays with the status.
    let mut written = g.clone();
    written.status = Some(run(&g, &[ready(pod("b", None))], &state(Some("b"), 7, &["b"])).status);
    let down = run(&written, &[], &StoreView::Unavailable("down".into()));
    assert_eq!(cond(&down.status, "LeaderEndpoint").status, "True");
}

#[test]
fn a_renamed_or_removed_service_is_retired_and_a_bad_one_is_reported_not_written() {
    let status = LeaderGroupStatus {
        endpoint: Some(crate::crd::EndpointStatus {
            service: "old-leader".into(),
            address: None,
            term: 1,
        }),
        ..Default::default()
    };
    let pods = [ready(pod("a", None))];
    let store = state(Some("a"), 2, &["a"]);
    let renamed = run(
        &group("web", with_service(), Some(status.clone())),
        &pods,
        &store,
    );
    assert_eq!(renamed.retire_service.as_deref(), Some("old-leader"));
    assert_eq!(renamed.status.endpoint.unwrap().service, "web-leader");
    let removed = run(&group("web", spec(), Some(status)), &pods, &store);
    assert_eq!(removed.retire_service.as_deref(), Some("old-leader"));
    assert_eq!(removed.status.endpoint, None);
    assert!(removed
        .status
        .conditions
        .iter()
        .all(|c| c.type_ != "LeaderEndpoint"));

    let mut bad = with_service();
    bad.service.as_mut().unwrap().ports[0].port = 70_000;
    let p = run(&group("web", bad, None), &pods, &store);
    assert_eq!(p.endpoint, None);
    let c = cond(&p.status, "SpecValid");
    assert_eq!(c.reason, "InvalidService");
    assert!(
        c.message
            .contains("service.ports[0].port is 70000; 1 to 65535"),
        "{}",
        c.message
    );
    assert_eq!(cond(&p.status, "Ready").status, "False");
}

/// A state whose node ids are given whole (`east/shop/a`).
fn state_of(holder: Option<&str>, term: u64, members: &[&str]) -> StoreView {
    StoreView::Available(GroupState {
        holder: holder.map(str::to_owned),
        term,
        lease_pttl_ms: holder.map(|_| 12_000),
        members: (members.iter())
            .map(|m| ((*m).to_owned(), NOW + 17_000))
            .collect(),
        priorities: Default::default(),
        problems: Default::default(),
        preferred: None,
        now_ms: NOW,
    })
}

/// A plan of the controller of cluster `cluster`, to which the lease it
/// last read runs out at `lease_seen_until_ms`, the only cluster with a
/// record of its timings.
fn run_in(
    cluster: &str,
    g: &LeaderGroup,
    pods: &[PodView],
    store: &StoreView,
    lease_seen_until_ms: u64,
) -> Plan {
    run_voted(cluster, g, pods, store, lease_seen_until_ms, Some(&[]))
}

/// [`run_in`] with these records of the clusters' timings (`None`: they
/// could not be read).
fn run_voted(
    cluster: &str,
    g: &LeaderGroup,
    pods: &[PodView],
    store: &StoreView,
    lease_seen_until_ms: u64,
    votes: Option<&[SpecVote]>,
) -> Plan {
    plan(&Observed {
        group: g,
        cluster: Some(cluster),
        pods,
        others: &[],
        store,
        swept: &[],
        local_now_ms: NOW,
        store_warnings: &[],
        votes,
        lease_seen_until_ms: Some(lease_seen_until_ms),
        holder_gone_since_ms: Some(0),
    })
}

#[test]
fn across_clusters_each_controller_labels_its_own_pods_and_shows_the_others() {
    // Both clusters run the StatefulSet web: the same pod names.
    let g = group("web", spec(), None);
    let store = state_of(
        Some("west/shop/web-0"),
        7,
        &["east/shop/web-0", "east/shop/web-1", "west/shop/web-0"],
    );
    let pods = [ready(pod("web-0", None)), pod("web-1", None)];
    let p = run_in("east", &g, &pods, &store, NOW);
    assert_eq!(
        p.labels,
        vec![
            change("web-0", Some(FOLLOWER)),
            change("web-1", Some(FOLLOWER))
        ]
    );
    assert_eq!(p.status.leader.as_deref(), Some("west/web-0"));
    assert_eq!(p.status.holder.as_deref(), Some("west/shop/web-0"));
    let shown: Vec<_> = (p.status.members.iter())
        .map(|m| (m.cluster.as_deref(), m.pod.as_deref(), m.role, m.problem))
        .collect();
    assert_eq!(
        shown,
        [
            (Some("east"), Some("web-0"), MemberRole::Follower, None),
            (Some("east"), Some("web-1"), MemberRole::Follower, None),
            (Some("west"), Some("web-0"), MemberRole::Leader, None),
        ]
    );
    let elected = cond(&p.status, "LeaderElected");
    assert_eq!(
        (elected.status.as_str(), elected.reason.as_str()),
        ("True", "LeaseHeldInOtherCluster")
    );
    let ready_here = cond(&p.status, "Ready");
    assert_eq!(
        (ready_here.status.as_str(), ready_here.reason.as_str()),
        ("False", "LeaderInOtherCluster")
    );
    assert!(
        ready_here.message.contains("pod web-0 of cluster west"),
        "{}",
        ready_here.message
    );
    assert_eq!(p.events[0].note, "pod west/web-0 leads under term 7");
    // The other cluster's controller, on the same state: its pod leads.
    let p = run_in("west", &g, &[ready(pod("web-0", None))], &store, NOW);
    assert_eq!(p.labels, vec![change("web-0", Some(LEADER))]);
    assert_eq!(p.status.leader.as_deref(), Some("west/web-0"));
    assert_eq!(cond(&p.status, "Ready").status, "True");
}

#[test]
fn across_clusters_a_leader_label_here_goes_when_the_lease_moves_to_another_cluster() {
    let g = group("web", spec(), None);
    let pods = [pod("web-0", Some(LEADER)), pod("web-1", Some(FOLLOWER))];
    // west's web-1 leads: not this cluster's web-1.
    let store = state_of(
        Some("west/shop/web-1"),
        8,
        &["east/shop/web-0", "east/shop/web-1", "west/shop/web-1"],
    );
    let p = run_in("east", &g, &pods, &store, NOW);
    assert_eq!(p.labels, vec![change("web-0", Some(FOLLOWER))]);
    // A slice here holds no address: the leader is not a pod of this cluster.
    let mut with_service = spec();
    with_service.service = Some(
        serde_json::from_value(serde_json::json!({"name": "web-leader", "ports": [{"port": 80}]}))
            .unwrap(),
    );
    let p = run_in(
        "east",
        &group("web", with_service, None),
        &pods,
        &store,
        NOW,
    );
    let endpoint = p.endpoint.expect("the slice is written");
    assert_eq!((endpoint.term, endpoint.leader), (8, None));
}

#[test]
fn across_clusters_only_the_leaders_cluster_moves_the_seat() {
    let g = group("web", spec(), None);
    let mut store = state_of(
        Some("west/shop/web-1"),
        3,
        &["east/shop/web-0", "west/shop/web-1"],
    );
    if let StoreView::Available(s) = &mut store {
        // Preferred members left by a rollout that is over.
        s.preferred = Some(vec!["west/shop/web-1".into()]);
    }
    let east = run_in("east", &g, &[pod("web-0", None)], &store, NOW);
    assert_eq!(east.preferred_nodes, PreferredMembers::Keep);
    let west = run_in("west", &g, &[ready(pod("web-1", None))], &store, NOW);
    assert_eq!(west.preferred_nodes, PreferredMembers::Remove);
    // A group led here is read twice a lease; one led elsewhere at the resync.
    assert_eq!(west.look_again_ms, Some(7_500));
    assert_eq!(east.look_again_ms, None);
    // A user's request is heard in either cluster, naming a pod of
    // another as CLUSTER/POD, or one of its own by name alone.
    let asking = |value: &str| {
        let mut g = group("web", spec(), None);
        g.metadata.annotations =
            Some([(STEP_DOWN_TO_ANNOTATION.to_owned(), value.to_owned())].into());
        g
    };
    let p = run_in(
        "east",
        &asking("east/web-0"),
        &[pod("web-0", None)],
        &store,
        NOW,
    );
    let h = p.hand_over.expect("a handover");
    assert_eq!(
        (h.from.as_str(), h.to.as_str()),
        ("west/shop/web-1", "east/shop/web-0")
    );
    let p = run_in("east", &asking("web-0"), &[pod("web-0", None)], &store, NOW);
    assert_eq!(p.hand_over.expect("a handover").to, "east/shop/web-0");
}

#[test]
fn across_clusters_a_controller_cut_off_from_the_store_unlabels_its_leader_once_the_lease_it_read_runs_out(
) {
    let store = state_of(
        Some("east/shop/web-0"),
        4,
        &["east/shop/web-0", "east/shop/web-1"],
    );
    let pods = [ready(pod("web-0", None)), pod("web-1", None)];
    let prev = run_in("east", &group("web", spec(), None), &pods, &store, NOW).status;
    assert_eq!(prev.leader.as_deref(), Some("east/web-0"));
    let g = group("web", spec(), Some(prev.clone()));
    let labelled = [pod("web-0", Some(LEADER)), pod("web-1", Some(FOLLOWER))];
    let down = StoreView::Unavailable("connection refused".into());
    let ttl = spec().ttl_ms as u64;
    // Before the lease last seen runs out: the labels stay, and the
    // controller looks again when it must have run out.
    let p = run_in("east", &g, &labelled, &down, NOW + 300);
    assert!(p.labels.is_empty() && p.events.is_empty());
    assert_eq!(p.status.leader.as_deref(), Some("east/web-0"));
    assert_eq!(p.look_again_ms, Some(300));
    // Once it has: the leader label comes off, once, said in an Event
    // and in Ready.
    let p = run_in("east", &g, &labelled, &down, NOW);
    assert_eq!(p.labels, vec![change("web-0", Some(FOLLOWER))]);
    assert_eq!(p.events.len(), 1);
    assert_eq!(p.events[0].reason, "LeaderUnconfirmed");
    assert!(p.events[0].warning);
    assert_eq!(p.status.leader, None);
    assert_eq!(
        p.status.holder, prev.holder,
        "the holder last seen stays shown"
    );
    let r = cond(&p.status, "Ready");
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("False", "LeaderUnconfirmed")
    );
    assert_eq!(p.look_again_ms, Some(ttl));
    // Once the store answers, the leader is labelled again.
    let g = group("web", spec(), Some(p.status));
    let unlabelled = [pod("web-0", Some(FOLLOWER)), pod("web-1", Some(FOLLOWER))];
    let p = run_in("east", &g, &unlabelled, &store, NOW);
    assert_eq!(p.labels, vec![change("web-0", Some(LEADER))]);
    assert_eq!(p.status.leader.as_deref(), Some("east/web-0"));
    // In one cluster, the labels stay however long the store is away.
    let p = plan(&Observed {
        group: &group("web", spec(), Some(prev)),
        cluster: None,
        pods: &labelled,
        others: &[],
        store: &down,
        swept: &[],
        local_now_ms: NOW,
        store_warnings: &[],
        votes: None,
        lease_seen_until_ms: Some(NOW - 10 * ttl),
        holder_gone_since_ms: Some(0),
    });
    assert!(p.labels.is_empty());
}

#[test]
fn across_clusters_a_cut_off_cluster_s_slice_loses_its_address_at_its_term_and_gets_it_back() {
    let store = state_of(Some("east/shop/web-0"), 4, &["east/shop/web-0"]);
    let pods = [ready(pod("web-0", None))];
    let prev = run_in(
        "east",
        &group("web", with_service(), None),
        &pods,
        &store,
        NOW,
    )
    .status;
    let recorded = prev.endpoint.clone().expect("the slice's record");
    assert!(recorded.address.is_some());
    let g = group("web", with_service(), Some(prev.clone()));
    let labelled = [ready(pod("web-0", Some(LEADER)))];
    let down = StoreView::Unavailable("connection refused".into());
    // Before the lease last seen runs out: the slice is not written.
    let p = run_in("east", &g, &labelled, &down, NOW + 300);
    assert_eq!(p.endpoint, None);
    assert_eq!(p.status.endpoint, prev.endpoint);
    // Once it has: no address, at the term written, of that term's
    // leader's rank; the status and the condition say so.
    let p = run_in("east", &g, &labelled, &down, NOW);
    let e = p.endpoint.clone().expect("the slice is emptied");
    assert_eq!((e.term, &e.leader, e.unconfirmed), (4, &None, true));
    let shown = p.status.endpoint.clone().expect("the slice's record");
    assert_eq!((shown.address, shown.term), (None, 4));
    let c = cond(&p.status, "LeaderEndpoint");
    assert!(c.message.contains("cannot be confirmed"), "{}", c.message);
    assert_eq!(p.labels, vec![change("web-0", Some(FOLLOWER))]);
    // Looked at again while the store stays away: nothing more to write.
    let after = group("web", with_service(), Some(p.status.clone()));
    let unlabelled = [ready(pod("web-0", Some(FOLLOWER)))];
    let again = run_in("east", &after, &unlabelled, &down, NOW);
    assert_eq!((again.endpoint, again.labels.len()), (None, 0));
    // The store answers with the same leader: its address again, at
    // the same term.
    let back = run_in("east", &after, &unlabelled, &store, NOW);
    let e = back.endpoint.expect("the slice is written");
    assert_eq!((e.term, e.unconfirmed), (4, false));
    assert_eq!(e.leader.map(|a| a.pod).as_deref(), Some("web-0"));
    // A slice that held no address (the leader ran elsewhere) is left.
    let elsewhere = state_of(Some("west/shop/web-0"), 5, &["west/shop/web-0"]);
    let prev = run_in(
        "east",
        &group("web", with_service(), None),
        &pods,
        &elsewhere,
        NOW,
    );
    let g = group("web", with_service(), Some(prev.status));
    assert_eq!(run_in("east", &g, &pods, &down, NOW).endpoint, None);
}

#[test]
fn across_clusters_timings_that_differ_are_written_by_no_one_and_reported_in_each() {
    let store = state_of(
        Some("east/shop/web-0"),
        2,
        &["east/shop/web-0", "west/shop/web-0"],
    );
    let vote = |cluster: &str, ttl_ms: u64, age_ms: u64| SpecVote {
        cluster: cluster.into(),
        config: Some(ElectionConfig {
            ttl_ms,
            ..ElectionConfig::default()
        }),
        age_ms,
    };
    let g = group("web", spec(), None);
    let pods = [ready(pod("web-0", None))];
    // Alone, or with a cluster that agrees: the timings are written.
    for votes in [
        vec![vote("east", 15_000, 0)],
        vec![vote("east", 15_000, 0), vote("west", 15_000, 9)],
    ] {
        let p = run_voted("east", &g, &pods, &store, NOW, Some(&votes));
        assert_eq!(p.config, Some(ElectionConfig::default()));
        let c = cond(&p.status, "SpecConflict");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "TimingsAgree")
        );
    }
    // West's LeaderGroup has a 20 s ttl: east writes nothing, and says why.
    let votes = [vote("east", 15_000, 0), vote("west", 20_000, 9)];
    let p = run_voted("east", &g, &pods, &store, NOW, Some(&votes));
    assert_eq!(p.config, None);
    let c = cond(&p.status, "SpecConflict");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "TimingsDiffer")
    );
    assert!(
        c.message.starts_with("cluster west has ttlMs 20000, renewIntervalMs 5000, retryIntervalMs 2000, this cluster ttlMs 15000"),
        "{}",
        c.message
    );
    // Nor does west, on the same records.
    let mut west_spec = spec();
    west_spec.ttl_ms = 20_000;
    let p = run_voted(
        "west",
        &group("web", west_spec, None),
        &[],
        &store,
        NOW,
        Some(&votes),
    );
    assert_eq!(p.config, None);
    assert_eq!(cond(&p.status, "SpecConflict").status, "True");
    // A record as old as SPEC_VOTE_STALE_MS no longer counts: its cluster is gone.
    let votes = [
        vote("east", 15_000, 0),
        vote("west", 20_000, SPEC_VOTE_STALE_MS),
    ];
    let p = run_voted("east", &g, &pods, &store, NOW, Some(&votes));
    assert_eq!(p.config, Some(ElectionConfig::default()));
    // Records that could not be read: nothing is written, the condition
    // stays as it was; in one cluster there is no such condition.
    let prev = run_voted(
        "east",
        &g,
        &pods,
        &store,
        NOW,
        Some(&[vote("west", 20_000, 0)]),
    )
    .status;
    let p = run_voted(
        "east",
        &group("web", spec(), Some(prev)),
        &pods,
        &store,
        NOW,
        None,
    );
    assert_eq!(p.config, None);
    assert_eq!(cond(&p.status, "SpecConflict").status, "True");
    let p = run(&g, &[pod("a", None)], &state(Some("a"), 1, &["a"]));
    assert!(p
        .status
        .conditions
        .iter()
        .all(|c| c.type_ != "SpecConflict"));
    assert!(p.config.is_some());
}
