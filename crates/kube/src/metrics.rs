//! The controller's own figures, registered next to the engine's in the
//! registry its process owns: how long reconciles take (a histogram), why
//! they fail, the label patches they make, and whether this replica is the
//! active one. Labels come from fixed sets (an error's static kind).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use leasehold_daemon::metrics::Label;

pub struct ControllerMetrics {
    reconcile_duration: Histogram,
    reconcile_errors: Family<Label, Counter>,
    label_patches: Counter,
    groups: Gauge,
    groups_with_leader: Gauge,
    active: Gauge,
    /// Per group, whether its leader pod is known (the two gauges above).
    leaders: Mutex<BTreeMap<String, bool>>,
}

impl ControllerMetrics {
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Arc::new(Self {
            // 1 ms to about 16 s.
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            reconcile_errors: Family::default(),
            label_patches: Counter::default(),
            groups: Gauge::default(),
            groups_with_leader: Gauge::default(),
            active: Gauge::default(),
            leaders: Mutex::new(BTreeMap::new()),
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

    /// Records whether `group` has a leader pod.
    pub fn set_leader(&self, group: String, has_leader: bool) {
        let mut known = leasehold_engine::sync::locked(&self.leaders);
        known.insert(group, has_leader);
        self.groups.set(known.len() as i64);
        self.groups_with_leader
            .set(known.values().filter(|v| **v).count() as i64);
    }

    pub fn set_active(&self, active: bool) {
        self.active.set(i64::from(active));
    }
}
