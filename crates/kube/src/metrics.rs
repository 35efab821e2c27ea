//! The controller's own figures, registered next to the engine's in the
//! registry its process owns: how long reconciles take (a histogram), why
//! they fail, the label patches they make, whether this replica is the
//! active one, and each group as its last reconcile saw it (whether it has
//! a leader, the term, live members, leader changes, since when, members
//! with problems by kind). Labels come from fixed sets (an error's static
//! kind, a problem's kind) or name a LeaderGroup, so the series grow with
//! the groups, never with pods or terms. Only the active replica exports
//! the groups: a standby clears them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use leasehold_daemon::metrics::Label;

pub struct ControllerMetrics {
    reconcile_duration: Histogram,
    reconcile_errors: Family<Label, Counter>,
    label_patches: Counter,
    endpoint_writes: Counter,
    groups: Gauge,
    groups_with_leader: Gauge,
    active: Gauge,
    per_group: GroupGauges,
    /// Whether this replica is active, and per group (`NAMESPACE/NAME`)
    /// what its last reconcile saw: under one lock, so that a reconcile
    /// that ends after the replica went standby cannot put a group's
    /// series back.
    seen: Mutex<Groups>,
}

#[derive(Default)]
struct Groups {
    active: bool,
    seen: BTreeMap<String, Seen>,
}

/// `namespace`, `group`.
type GroupLabels = [(&'static str, String); 2];
/// `namespace`, `group`, `kind`.
type ProblemLabels = [(&'static str, String); 3];
type Seconds = Gauge<f64, AtomicU64>;

#[derive(Default)]
struct GroupGauges {
    has_leader: Family<GroupLabels, Gauge>,
    term: Family<GroupLabels, Gauge>,
    members: Family<GroupLabels, Gauge>,
    changes: Family<GroupLabels, Counter>,
    since: Family<GroupLabels, Seconds>,
    takeover_bound: Family<GroupLabels, Seconds>,
    problems: Family<ProblemLabels, Gauge>,
}

/// What the metrics remember of a group between two reconciles.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Seen {
    has_leader: bool,
    has_leader_pod: bool,
    term: i64,
    transitions: i64,
    since_s: f64,
}

/// The kinds of member problem, as the `kind` label says them: why a pod is
/// not labelled (`status.members[].problem`), and `unhealthy` (its agent's
/// health check fails).
pub const PROBLEM_KINDS: [&str; 5] = [
    "pod_not_found",
    "not_selected",
    "other_namespace",
    "label_conflict",
    "unhealthy",
];

/// A group's figures from one reconcile's status.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupFigures {
    /// The lease is held.
    pub has_leader: bool,
    /// ... by a pod the controller found.
    pub has_leader_pod: bool,
    pub term: i64,
    pub live_members: i64,
    /// Leader changes the controller has counted (`status.transitions`).
    pub transitions: i64,
    /// When the current leader won the lease (Unix seconds).
    pub leader_since_s: Option<f64>,
    /// Without a (known) leader: since when, as the status's conditions
    /// say (Unix seconds).
    pub no_leader_since_s: Option<f64>,
    /// Per kind of [`PROBLEM_KINDS`], in that order.
    pub problems: [i64; 5],
    /// ttl + retry interval (s): how long a crash may leave the seat free.
    pub takeover_bound_s: f64,
}

impl GroupFigures {
    /// While the store cannot be read, the status is the last one read:
    /// the group then counts as without a leader (none is known), since
    /// the store went away.
    pub fn of(
        status: &crate::crd::LeaderGroupStatus,
        config: Option<&leasehold_engine::ElectionConfig>,
    ) -> Self {
        use crate::conditions::{types, FALSE};
        use crate::crd::MemberProblem;
        let false_since = |type_: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == type_ && c.status == FALSE)
                .map(|c| c.last_transition_time.0.as_millisecond() as f64 / 1000.0)
        };
        let store_gone_since = false_since(types::STORE_AVAILABLE);
        let mut problems = [0; 5];
        for m in &status.members {
            let kind = match m.problem {
                Some(MemberProblem::PodNotFound) => Some(0),
                Some(MemberProblem::NotSelected) => Some(1),
                Some(MemberProblem::OtherNamespace) => Some(2),
                Some(MemberProblem::LabelConflict) => Some(3),
                None => None,
            };
            if let Some(k) = kind {
                problems[k] += 1;
            }
            if m.unhealthy.is_some() {
                problems[4] += 1;
            }
        }
        let has_leader = status.holder.is_some() && store_gone_since.is_none();
        Self {
            has_leader,
            has_leader_pod: has_leader && status.leader.is_some(),
            term: status.term.unwrap_or(0),
            live_members: status.live_members,
            transitions: status.transitions,
            leader_since_s: status
                .leader_since
                .as_ref()
                .map(|t| t.0.as_millisecond() as f64 / 1000.0),
            no_leader_since_s: store_gone_since.or_else(|| false_since(types::LEADER_ELECTED)),
            problems,
            takeover_bound_s: config
                .map_or(0.0, |c| (c.ttl_ms + c.retry_interval_ms) as f64 / 1000.0),
        }
    }
}

impl ControllerMetrics {
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Arc::new(Self {
            // 1 ms to about 16 s.
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            reconcile_errors: Family::default(),
            label_patches: Counter::default(),
            endpoint_writes: Counter::default(),
            groups: Gauge::default(),
            groups_with_leader: Gauge::default(),
            active: Gauge::default(),
            per_group: GroupGauges::default(),
            seen: Mutex::new(Groups::default()),
        });
        registry.register(
            "reconcile_duration_seconds",
            "Time one reconcile of a LeaderGroup took",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by kind",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "label_patches",
            "Pod label patches applied",
            m.label_patches.clone(),
        );
        registry.register(
            "endpoint_writes",
            "Leader EndpointSlice writes applied (spec.service)",
            m.endpoint_writes.clone(),
        );
        registry.register(
            "groups",
            "LeaderGroups reconciled by this replica",
            m.groups.clone(),
        );
        registry.register(
            "groups_with_leader",
            "LeaderGroups whose leader pod is known",
            m.groups_with_leader.clone(),
        );
        registry.register(
            "controller_active",
            "1 if this replica is the active controller",
            m.active.clone(),
        );
        m.per_group.register(registry);
        m
    }

    pub fn observe_reconcile(&self, took: Duration) {
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// `kind` comes from a fixed set (the reconcile error's kind).
    pub fn reconcile_failed(&self, kind: &'static str) {
        self.reconcile_errors.get_or_create(&[("kind", kind)]).inc();
    }

    pub fn label_patched(&self) {
        self.label_patches.inc();
    }

    pub fn endpoint_written(&self) {
        self.endpoint_writes.inc();
    }

    /// Records what a reconcile of `namespace/name` saw, at `now_s` (Unix
    /// seconds).
    pub fn observe_group(&self, namespace: &str, name: &str, figures: &GroupFigures, now_s: f64) {
        let key = format!("{namespace}/{name}");
        let labels: GroupLabels = [
            ("namespace", namespace.to_owned()),
            ("group", name.to_owned()),
        ];
        let mut groups = leasehold_engine::sync::locked(&self.seen);
        if !groups.active {
            return;
        }
        let before = groups.seen.get(&key).copied();
        let next = next_seen(before, figures, now_s);
        groups.seen.insert(key, next);
        self.groups.set(groups.seen.len() as i64);
        self.groups_with_leader
            .set(groups.seen.values().filter(|s| s.has_leader_pod).count() as i64);
        // Set under the lock, so a standby's clearing comes before or after
        // all of it.
        let g = &self.per_group;
        g.has_leader
            .get_or_create(&labels)
            .set(i64::from(figures.has_leader));
        g.term.get_or_create(&labels).set(figures.term);
        g.members.get_or_create(&labels).set(figures.live_members);
        g.since.get_or_create(&labels).set(next.since_s);
        g.takeover_bound
            .get_or_create(&labels)
            .set(figures.takeover_bound_s);
        let counted = before.map_or(0, |b| b.transitions);
        // Created even with no change, so the series is there from the start.
        let changes = (next.transitions - counted).max(0) as u64;
        g.changes.get_or_create(&labels).inc_by(changes);
        for (kind, count) in PROBLEM_KINDS.iter().zip(figures.problems) {
            let [ns, group] = labels.clone();
            g.problems
                .get_or_create(&[ns, group, ("kind", (*kind).to_owned())])
                .set(count);
        }
        drop(groups);
    }

    /// Drops the series of the groups `present` does not keep
    /// (`NAMESPACE/NAME`).
    pub fn retain_groups(&self, present: impl Fn(&str) -> bool) {
        let mut groups = leasehold_engine::sync::locked(&self.seen);
        let gone: Vec<String> = groups
            .seen
            .keys()
            .filter(|k| !present(k))
            .cloned()
            .collect();
        let g = &self.per_group;
        for (namespace, name) in gone.iter().filter_map(|key| key.split_once('/')) {
            groups.seen.remove(&format!("{namespace}/{name}"));
            let labels: GroupLabels = [
                ("namespace", namespace.to_owned()),
                ("group", name.to_owned()),
            ];
            g.has_leader.remove(&labels);
            g.term.remove(&labels);
            g.members.remove(&labels);
            g.changes.remove(&labels);
            g.since.remove(&labels);
            g.takeover_bound.remove(&labels);
            for kind in PROBLEM_KINDS {
                let [ns, group] = labels.clone();
                g.problems.remove(&[ns, group, ("kind", kind.to_owned())]);
            }
        }
        self.groups.set(groups.seen.len() as i64);
        self.groups_with_leader
            .set(groups.seen.values().filter(|s| s.has_leader_pod).count() as i64);
        drop(groups);
    }

    /// A standby exports no groups: the active replica's figures are the
    /// only ones, and a replica that becomes active again counts afresh.
    pub fn set_active(&self, active: bool) {
        self.active.set(i64::from(active));
        let mut groups = leasehold_engine::sync::locked(&self.seen);
        groups.active = active;
        if !active {
            groups.seen.clear();
            self.groups.set(0);
            self.groups_with_leader.set(0);
            self.per_group.clear();
        }
    }
}

/// Rule: the state's start moves when the group gains or loses its leader
/// or the term changes; a leader's start is when it won the lease, a
/// leaderless state's when the status's conditions turned (so a replica
/// that becomes active keeps the start), else when the controller saw it
/// first. The count of changes never goes back: after a status that lost
/// its count, changes are counted again only past the highest count seen.
fn next_seen(before: Option<Seen>, f: &GroupFigures, now_s: f64) -> Seen {
    let changed = before.is_none_or(|b| b.has_leader != f.has_leader || b.term != f.term);
    let since_s = match (changed, f.has_leader) {
        (false, _) => before.map_or(now_s, |b| b.since_s),
        (true, true) => f.leader_since_s.unwrap_or(now_s),
        (true, false) => f.no_leader_since_s.unwrap_or(now_s),
    };
    Seen {
        has_leader: f.has_leader,
        has_leader_pod: f.has_leader_pod,
        term: f.term,
        transitions: before.map_or(f.transitions, |b| b.transitions.max(f.transitions)),
        since_s,
    }
}

impl GroupGauges {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "group_has_leader",
            "1 while the group's lease is held, 0 while no one leads",
            self.has_leader.clone(),
        );
        registry.register(
            "group_term",
            "The group's fencing term (current or last)",
            self.term.clone(),
        );
        registry.register(
            "group_live_members",
            "Live members campaigning in the group",
            self.members.clone(),
        );
        registry.register(
            "group_leader_changes",
            "Leader changes the controller has counted (status.transitions)",
            self.changes.clone(),
        );
        registry.register(
            "group_state_since_timestamp_seconds",
            "Since when the group has had its current leader, or no leader (Unix time)",
            self.since.clone(),
        );
        registry.register(
            "group_takeover_bound_seconds",
            "ttl + retry interval: how long a crashed leader may leave the seat free",
            self.takeover_bound.clone(),
        );
        registry.register(
            "group_member_problems",
            "Members with a problem, by kind (a pod not labelled, or an unhealthy application)",
            self.problems.clone(),
        );
    }

    fn clear(&self) {
        self.has_leader.clear();
        self.term.clear();
        self.members.clear();
        self.changes.clear();
        self.since.clear();
        self.takeover_bound.clear();
        self.problems.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(
        has_leader: bool,
        term: i64,
        transitions: i64,
        since_s: Option<f64>,
    ) -> GroupFigures {
        GroupFigures {
            has_leader,
            has_leader_pod: has_leader,
            term,
            live_members: 3,
            transitions,
            leader_since_s: since_s,
            no_leader_since_s: None,
            problems: [0, 1, 0, 0, 2],
            takeover_bound_s: 1.2,
        }
    }

    fn line<'t>(text: &'t str, name: &str) -> Option<&'t str> {
        let prefix = format!("leasehold_{name}{{namespace=\"shop\",group=\"web\"");
        text.lines().find(|l| l.starts_with(&prefix))
    }

    #[test]
    fn group_series_follow_leader_changes_and_go_with_the_group() {
        let mut registry = leasehold_daemon::metrics::new_registry();
        let m = ControllerMetrics::register(&mut registry);
        m.set_active(true);
        let text = || leasehold_daemon::metrics::render(&registry);
        m.observe_group("shop", "web", &figures(true, 3, 2, Some(100.0)), 150.0);
        let t = text();
        assert_eq!(
            line(&t, "group_has_leader"),
            Some("leasehold_group_has_leader{namespace=\"shop\",group=\"web\"} 1")
        );
        assert_eq!(
            line(&t, "group_term"),
            Some("leasehold_group_term{namespace=\"shop\",group=\"web\"} 3")
        );
        assert_eq!(
            line(&t, "group_leader_changes_total"),
            Some("leasehold_group_leader_changes_total{namespace=\"shop\",group=\"web\"} 2")
        );
        assert_eq!(line(&t, "group_state_since_timestamp_seconds"), Some("leasehold_group_state_since_timestamp_seconds{namespace=\"shop\",group=\"web\"} 100.0"));
        assert_eq!(
            line(&t, "group_takeover_bound_seconds"),
            Some("leasehold_group_takeover_bound_seconds{namespace=\"shop\",group=\"web\"} 1.2")
        );
        assert!(t.contains("leasehold_group_member_problems{namespace=\"shop\",group=\"web\",kind=\"unhealthy\"} 2\n"), "{t}");
        assert!(t.contains("leasehold_group_member_problems{namespace=\"shop\",group=\"web\",kind=\"label_conflict\"} 0\n"), "{t}");
        assert!(t.contains("leasehold_groups_with_leader 1\n"), "{t}");

        // The leader is gone: no leader since the controller saw it so.
        m.observe_group("shop", "web", &figures(false, 3, 2, None), 160.0);
        let t = text();
        assert_eq!(
            line(&t, "group_has_leader"),
            Some("leasehold_group_has_leader{namespace=\"shop\",group=\"web\"} 0")
        );
        assert_eq!(line(&t, "group_state_since_timestamp_seconds"), Some("leasehold_group_state_since_timestamp_seconds{namespace=\"shop\",group=\"web\"} 160.0"));
        // Still none a reconcile later: the start stays.
        m.observe_group("shop", "web", &figures(false, 3, 2, None), 165.0);
        assert!(text().contains(
            "group_state_since_timestamp_seconds{namespace=\"shop\",group=\"web\"} 160.0"
        ));

        // A new leader: one more change, counted once.
        m.observe_group("shop", "web", &figures(true, 4, 3, Some(170.0)), 171.0);
        m.observe_group("shop", "web", &figures(true, 4, 3, Some(170.0)), 172.0);
        let t = text();
        assert_eq!(
            line(&t, "group_leader_changes_total"),
            Some("leasehold_group_leader_changes_total{namespace=\"shop\",group=\"web\"} 3")
        );
        assert_eq!(line(&t, "group_state_since_timestamp_seconds"), Some("leasehold_group_state_since_timestamp_seconds{namespace=\"shop\",group=\"web\"} 170.0"));
        // A status that lost its count does not take the counter back.
        m.observe_group("shop", "web", &figures(true, 4, 0, Some(170.0)), 173.0);
        assert!(text().contains("group_leader_changes_total{namespace=\"shop\",group=\"web\"} 3\n"));

        m.retain_groups(|group| group != "shop/web");
        let t = text();
        assert!(!t.contains("group=\"web\""), "{t}");
        assert!(t.contains("leasehold_groups 0\n"), "{t}");
    }

    /// Every metric the controller process exports (its own and the
    /// engine's) is in docs/monitoring.md's tables, as Prometheus names it.
    #[test]
    fn every_exported_metric_is_documented() {
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/monitoring.md"
        ))
        .expect("docs/monitoring.md");
        let mut registry = leasehold_daemon::metrics::new_registry();
        let m = ControllerMetrics::register(&mut registry);
        leasehold_daemon::metrics::EngineMetrics::register(&mut registry);
        m.set_active(true);
        m.observe_group("shop", "web", &figures(true, 3, 2, Some(100.0)), 150.0);
        let text = leasehold_daemon::metrics::render(&registry);
        let families = leasehold_daemon::metrics::families(&text);
        for (name, kind) in &families {
            let name = name.strip_prefix("leasehold_").unwrap_or(name);
            assert!(
                docs.contains(&format!("| `{name}` | {kind} |")),
                "docs/monitoring.md does not list {name} ({kind})"
            );
        }
        let names = families.len();
        assert!(names >= 20, "{text}");
    }

    /// While the store cannot be read, the status is the last one read: no
    /// leader is known from when the store went away; with the store, a
    /// leaderless group's start is when its LeaderElected condition turned.
    #[test]
    fn figures_know_no_leader_while_the_store_is_away() {
        use crate::conditions::{condition, reasons, types};
        let at = |s: i64| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(s).unwrap(),
            )
        };
        let mut status = crate::crd::LeaderGroupStatus {
            holder: Some("shop/web-0".into()),
            leader: Some("web-0".into()),
            term: Some(4),
            ..Default::default()
        };
        let mut away = condition(
            types::STORE_AVAILABLE,
            false,
            reasons::STORE_UNAVAILABLE,
            "x",
        );
        away.last_transition_time = at(500);
        status.conditions = vec![away];
        let f = GroupFigures::of(&status, None);
        assert!(!f.has_leader && !f.has_leader_pod);
        assert_eq!(f.no_leader_since_s, Some(500.0));

        let mut none = condition(types::LEADER_ELECTED, false, reasons::NO_LEADER, "x");
        none.last_transition_time = at(600);
        status.holder = None;
        status.leader = None;
        status.conditions = vec![none];
        let f = GroupFigures::of(&status, None);
        assert!(!f.has_leader);
        assert_eq!(f.no_leader_since_s, Some(600.0));
        // A replica that becomes active takes that start, not its own now.
        assert_eq!(next_seen(None, &f, 900.0).since_s, 600.0);
    }

    #[test]
    fn a_standby_exports_no_groups() {
        let mut registry = leasehold_daemon::metrics::new_registry();
        let m = ControllerMetrics::register(&mut registry);
        m.set_active(true);
        m.observe_group("shop", "web", &figures(true, 3, 2, Some(100.0)), 150.0);
        assert!(leasehold_daemon::metrics::render(&registry).contains("group=\"web\""));
        m.set_active(false);
        let t = leasehold_daemon::metrics::render(&registry);
        assert!(!t.contains("group=\"web\""), "{t}");
        assert!(t.contains("leasehold_controller_active 0\n"), "{t}");
        // A reconcile that ends after the replica went standby puts
        // nothing back.
        m.observe_group("shop", "web", &figures(true, 3, 2, Some(100.0)), 151.0);
        let t = leasehold_daemon::metrics::render(&registry);
        assert!(!t.contains("group=\"web\""), "{t}");
    }

    #[test]
    fn groups_no_longer_in_the_cache_lose_their_series() {
        let mut registry = leasehold_daemon::metrics::new_registry();
        let m = ControllerMetrics::register(&mut registry);
        m.set_active(true);
        m.observe_group("shop", "web", &figures(true, 3, 2, Some(100.0)), 150.0);
        m.observe_group("shop", "db", &figures(true, 3, 2, Some(100.0)), 150.0);
        m.retain_groups(|key| key == "shop/db");
        let t = leasehold_daemon::metrics::render(&registry);
        assert!(!t.contains("group=\"web\""), "{t}");
        assert!(t.contains("group=\"db\""), "{t}");
        assert!(t.contains("leasehold_groups 1\n"), "{t}");
    }
}
