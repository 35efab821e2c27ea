//! The agent's gauges, next to the engine's counters in the registry the
//! agent owns: whether this pod leads each of its groups and under which
//! term. They are set from the groups' local lease views when scraped, so
//! they say what `/v1/status` says. Group names come from the agent's own
//! flags, a small fixed set, so they are safe as label values.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use leasehold_engine::Group;

type GroupLabel = [(&'static str, String); 1];

#[derive(Default)]
pub(crate) struct AgentMetrics {
    leader: Family<GroupLabel, Gauge>,
    term: Family<GroupLabel, Gauge>,
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
        m
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
