//! The agent's gauges, next to the engine's counters in the registry the
//! agent owns: whether this pod leads each of its groups and under which
//! term. They are set from the groups' local lease views when scraped, so
//! they say what `/v1/status` says. Group names come from the agent's own
//! flags, a small fixed set, so they are safe as label values.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use leasehold_engine::Group;

type GroupLabel = [(&'static str, String); 1];

#[derive(Default)]
pub(crate) struct AgentMetrics {
    leader: Family<GroupLabel, Gauge>,
    term: Family<GroupLabel, Gauge>,
    /// With a health check: whether the last one passed, and checks by
    /// result.
    healthy: Gauge,
    health_checks: Family<[(&'static str, &'static str); 1], Counter>,
}

impl AgentMetrics {
    pub fn register(registry: &mut Registry) -> std::sync::Arc<Self> {
        let m = std::sync::Arc::new(Self::default());
        registry.register(
            "agent_leader",
            "Whether this pod leads the group (1) or not (0)",
            m.leader.clone(),
        );
        registry.register(
            "agent_term",
            "The term under which this pod leads the group (0 when it does not)",
            m.term.clone(),
        );
        registry.register(
            "agent_healthy",
            "Whether the application passed its last health check (1) or not (0); 1 without a health check",
            m.healthy.clone(),
        );
        m.healthy.set(1);
        registry.register(
            "agent_health_checks",
            "Health checks of the application, by result (passed, failed)",
            m.health_checks.clone(),
        );
        m
    }

    /// Counts a health check and sets `agent_healthy`.
    pub fn health_checked(&self, passed: bool) {
        self.healthy.set(i64::from(passed));
        let result = if passed { "passed" } else { "failed" };
        self.health_checks
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// Sets the gauges from each `(LeaderGroup name, group)`.
    pub fn update(&self, groups: &[(String, Group)]) {
        for (name, group) in groups {
            let label = [("group", name.clone())];
            let term = group.leader_term();
            self.leader
                .get_or_create(&label)
                .set(i64::from(term.is_some()));
            self.term
                .get_or_create(&label)
                .set(term.map_or(0, |t| t as i64));
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every metric of the agent's own is in docs/monitoring.md's agent
    /// table, as Prometheus names it.
    #[test]
    fn every_agent_metric_is_documented() {
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/monitoring.md"
        ))
        .expect("docs/monitoring.md");
        let mut registry = leasehold_daemon::metrics::new_registry();
        let m = super::AgentMetrics::register(&mut registry);
        // A family shows in the text once it has a series.
        let web = [("group", "web".to_owned())];
        m.leader.get_or_create(&web).set(1);
        m.term.get_or_create(&web).set(3);
        m.health_checks.get_or_create(&[("result", "passed")]).inc();
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
        assert_eq!(names, 4, "{text}");
    }
}
