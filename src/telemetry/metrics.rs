//! Process-wide counters in the Prometheus text format. Every engine event
//! passes through [`crate::events::EventBus::emit`], which counts it here, so
//! the metrics cannot disagree with the events. Labels come from fixed sets
//! (enum names, the loops' static names), never from ids or error texts.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::events::{Event, LostReason};

const REASONS: [LostReason; 5] = [
    LostReason::Shutdown,
    LostReason::StepDown,
    LostReason::Expired,
    LostReason::StoreError,
    LostReason::Replaced,
];

/// The loops that report store errors (`Event::StoreError::during`).
const DURING: [&str; 9] = [
    "register",
    "heartbeat",
    "sweep",
    "claim",
    "renew",
    "step-down release",
    "shutdown release",
    "inbox read",
    "other",
];

#[derive(Default)]
pub struct Metrics {
    elected: AtomicU64,
    lost: [AtomicU64; 5],
    swept_nodes: AtomicU64,
    registered: AtomicU64,
    recovered: AtomicU64,
    displaced: AtomicU64,
    lag_events: AtomicU64,
    dropped: AtomicU64,
    store_errors: [AtomicU64; 9],
}

static METRICS: std::sync::LazyLock<Metrics> = std::sync::LazyLock::new(Metrics::default);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

fn inc(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl Metrics {
    pub fn record(&self, event: &Event) {
        match event {
            Event::Registered { .. } => inc(&self.registered, 1),
            Event::Recovered { .. } => inc(&self.recovered, 1),
            Event::Elected { .. } => inc(&self.elected, 1),
            Event::Lost { reason, .. } => {
                let i = REASONS.iter().position(|r| r == reason).unwrap_or(0);
                inc(&self.lost[i], 1);
            }
            Event::Swept { nodes, .. } => inc(&self.swept_nodes, nodes.len() as u64),
            Event::Displaced { .. } => inc(&self.displaced, 1),
            Event::Lag { .. } => inc(&self.lag_events, 1),
            Event::Dropped { count, .. } => inc(&self.dropped, *count),
            Event::StoreError { during, .. } => {
                let i = DURING
                    .iter()
                    .position(|d| d == during)
                    .unwrap_or(DURING.len() - 1);
                inc(&self.store_errors[i], 1);
            }
        }
    }

    /// The Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut counter = |name: &str, help: &str, rows: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in rows {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        counter(
            "leasehold_elected_total",
            "Leases this process won.",
            &[(String::new(), get(&self.elected))],
        );
        let lost: Vec<(String, u64)> = REASONS
            .iter()
            .zip(&self.lost)
            .map(|(r, c)| (format!("{{reason=\"{}\"}}", r.as_str()), get(c)))
            .collect();
        counter(
            "leasehold_lost_total",
            "Leaderships this process lost, by reason.",
            &lost,
        );
        counter(
            "leasehold_registered_total",
            "Node registrations.",
            &[(String::new(), get(&self.registered))],
        );
        counter(
            "leasehold_recovered_total",
            "Re-registrations after a node's lease expired.",
            &[(String::new(), get(&self.recovered))],
        );
        counter(
            "leasehold_displaced_total",
            "Node ids taken over by another live process.",
            &[(String::new(), get(&self.displaced))],
        );
        counter(
            "leasehold_swept_nodes_total",
            "Expired nodes removed by this process's sweeper.",
            &[(String::new(), get(&self.swept_nodes))],
        );
        counter(
            "leasehold_inbox_lag_total",
            "Times an inbox backlog passed its lag threshold.",
            &[(String::new(), get(&self.lag_events))],
        );
        counter(
            "leasehold_inbox_dropped_total",
            "Messages dropped from this process's full inboxes.",
            &[(String::new(), get(&self.dropped))],
        );
        let errors: Vec<(String, u64)> = DURING
            .iter()
            .zip(&self.store_errors)
            .map(|(d, c)| (format!("{{during=\"{d}\"}}"), get(c)))
            .collect();
        counter(
            "leasehold_store_errors_total",
            "Failed Redis calls, by the loop that made them.",
            &errors,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_counted_under_fixed_labels() {
        let m = Metrics::default();
        m.record(&Event::Dropped {
            node: "n".into(),
            count: 5,
            total: 5,
        });
        m.record(&Event::Dropped {
            node: "n".into(),
            count: 2,
            total: 7,
        });
        m.record(&Event::Lost {
            node: "n".into(),
            group: "g".into(),
            term: 1,
            reason: LostReason::StepDown,
        });
        m.record(&Event::StoreError {
            node: "n".into(),
            during: "renew",
            message: "x".into(),
        });
        m.record(&Event::StoreError {
            node: "n".into(),
            during: "something new",
            message: "x".into(),
        });
        let text = m.render();
        assert!(text.contains("leasehold_inbox_dropped_total 7\n"), "{text}");
        assert!(
            text.contains("leasehold_lost_total{reason=\"stepDown\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("leasehold_lost_total{reason=\"expired\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("leasehold_store_errors_total{during=\"renew\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("leasehold_store_errors_total{during=\"other\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE leasehold_elected_total counter"),
            "{text}"
        );
    }
}

/// The controller's own figures (reconciles, label patches, leaders).
#[derive(Default)]
pub struct ControllerMetrics {
    reconciles: AtomicU64,
    reconcile_micros: AtomicU64,
    errors: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    label_patches: AtomicU64,
    leaders: std::sync::Mutex<std::collections::BTreeMap<String, bool>>,
    active: AtomicU64,
}

static CONTROLLER: std::sync::LazyLock<ControllerMetrics> =
    std::sync::LazyLock::new(ControllerMetrics::default);

pub fn controller_metrics() -> &'static ControllerMetrics {
    &CONTROLLER
}

impl ControllerMetrics {
    pub fn observe_reconcile(&self, took: std::time::Duration) {
        inc(&self.reconciles, 1);
        inc(&self.reconcile_micros, took.as_micros() as u64);
    }

    /// `kind` comes from a fixed set (the reconcile error's kind).
    pub fn reconcile_failed(&self, kind: &'static str) {
        if let Ok(mut errors) = self.errors.lock() {
            *errors.entry(kind).or_default() += 1;
        }
    }

    pub fn label_patched(&self) {
        inc(&self.label_patches, 1);
    }

    /// Records, per group, whether it has a leader pod.
    pub fn set_leaders(&self, leaders: std::collections::BTreeMap<String, Option<String>>) {
        if let Ok(mut known) = self.leaders.lock() {
            for (group, leader) in leaders {
                known.insert(group, leader.is_some());
            }
        }
    }

    pub fn set_active(&self, active: bool) {
        self.active.store(u64::from(active), Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::new();
        let _ = writeln!(out, "# HELP leasehold_reconciles_total Reconciles run.\n# TYPE leasehold_reconciles_total counter\nleasehold_reconciles_total {}", get(&self.reconciles));
        let _ = writeln!(
            out,
            "# HELP leasehold_reconcile_seconds_total Time spent reconciling.\n# TYPE leasehold_reconcile_seconds_total counter\nleasehold_reconcile_seconds_total {:.6}",
            get(&self.reconcile_micros) as f64 / 1e6
        );
        let _ = writeln!(out, "# HELP leasehold_reconcile_errors_total Failed reconciles, by kind.\n# TYPE leasehold_reconcile_errors_total counter");
        if let Ok(errors) = self.errors.lock() {
            for (kind, n) in errors.iter() {
                let _ = writeln!(
                    out,
                    "leasehold_reconcile_errors_total{{kind=\"{kind}\"}} {n}"
                );
            }
        }
        let _ = writeln!(out, "# HELP leasehold_label_patches_total Pod label patches applied.\n# TYPE leasehold_label_patches_total counter\nleasehold_label_patches_total {}", get(&self.label_patches));
        let (groups, with_leader) = self
            .leaders
            .lock()
            .map(|l| (l.len(), l.values().filter(|v| **v).count()))
            .unwrap_or_default();
        let _ = writeln!(out, "# HELP leasehold_groups LeaderGroups reconciled by this replica.\n# TYPE leasehold_groups gauge\nleasehold_groups {groups}");
        let _ = writeln!(out, "# HELP leasehold_groups_with_leader LeaderGroups whose leader pod is known.\n# TYPE leasehold_groups_with_leader gauge\nleasehold_groups_with_leader {with_leader}");
        let _ = writeln!(out, "# HELP leasehold_controller_active 1 if this replica is the active controller.\n# TYPE leasehold_controller_active gauge\nleasehold_controller_active {}", get(&self.active));
        out
    }
}

/// The agent's gauges, computed at scrape time from its groups: whether this
/// pod leads each one and under which term. Group names come from the
/// agent's own flags, a small fixed set, so they are safe as label values.
pub fn agent_gauges(groups: &[(&str, Option<u64>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# HELP leasehold_agent_leader Whether this pod leads the group (1) or not (0).\n# TYPE leasehold_agent_leader gauge");
    for (group, term) in groups {
        let _ = writeln!(
            out,
            "leasehold_agent_leader{{group=\"{group}\"}} {}",
            u8::from(term.is_some())
        );
    }
    let _ = writeln!(out, "# HELP leasehold_agent_term The term under which this pod leads the group (0 when it does not).\n# TYPE leasehold_agent_term gauge");
    for (group, term) in groups {
        let _ = writeln!(
            out,
            "leasehold_agent_term{{group=\"{group}\"}} {}",
            term.unwrap_or(0)
        );
    }
    out
}
