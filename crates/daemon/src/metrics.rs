//! The engine's figures as Prometheus metrics, in a prometheus-client
//! [`Registry`] that the application owns (nothing global). A node started
//! with [`EngineMetrics`] as its observer counts every event it emits, so
//! the metrics cannot disagree with the events. Labels come from fixed sets
//! (the engine's enums), never from ids or error texts.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use leasehold_engine::{Event, LostReason, Observer, Operation};

/// Every metric name starts with this.
pub const PREFIX: &str = "leasehold";

/// What `/metrics` answers with: the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A label set of one fixed name and a value from a fixed set.
pub type Label = [(&'static str, &'static str); 1];

/// Counters fed by a node's events, and the durations of its claims and
/// renewals.
pub struct EngineMetrics {
    elected: Counter,
    lost: Family<Label, Counter>,
    registered: Counter,
    recovered: Counter,
    displaced: Counter,
    swept_nodes: Counter,
    inbox_lag: Counter,
    inbox_dropped: Counter,
    store_errors: Family<Label, Counter>,
    store_calls: Family<Label, Histogram, fn() -> Histogram>,
    inbox_backlog: Gauge,
}

/// Buckets of the store calls' durations: 250 µs to about 4 s, doubling.
fn call_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 15))
}

impl EngineMetrics {
    /// Registers the counters in `registry` (made with [`new_registry`]);
    /// pass the result to every node as its observer.
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Arc::new(Self {
            elected: Counter::default(),
            lost: Family::default(),
            registered: Counter::default(),
            recovered: Counter::default(),
            displaced: Counter::default(),
            swept_nodes: Counter::default(),
            inbox_lag: Counter::default(),
            inbox_dropped: Counter::default(),
            store_errors: Family::default(),
            store_calls: Family::new_with_constructor(call_buckets),
            inbox_backlog: Gauge::default(),
        });
        // Every label value from the start, so a rate() sees the first event.
        for reason in LostReason::ALL {
            let _ = m.lost.get_or_create(&[("reason", reason.as_str())]);
        }
        for operation in Operation::ALL {
            let _ = m
                .store_errors
                .get_or_create(&[("during", operation.as_str())]);
        }
        let counters: [(&str, &str, &Counter); 7] = [
            ("elected", "Leases this process won", &m.elected),
            ("registered", "Node registrations", &m.registered),
            (
                "recovered",
                "Re-registrations after a node's lease expired",
                &m.recovered,
            ),
            (
                "displaced",
                "Node ids taken over by another live process",
                &m.displaced,
            ),
            (
                "swept_nodes",
                "Expired nodes removed by this process's sweeper",
                &m.swept_nodes,
            ),
            (
                "inbox_lag",
                "Times an inbox backlog passed its lag threshold",
                &m.inbox_lag,
            ),
            (
                "inbox_dropped",
                "Messages dropped from this process's full inboxes",
                &m.inbox_dropped,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "lost",
            "Leaderships this process lost, by reason",
            m.lost.clone(),
        );
        registry.register(
            "store_errors",
            "Failed store calls, by the engine loop that made them",
            m.store_errors.clone(),
        );
        for operation in [Operation::Claim, Operation::Renew] {
            let _ = m
                .store_calls
                .get_or_create(&[("operation", operation.as_str())]);
        }
        registry.register(
            "inbox_backlog",
            "Unread messages of this process's inbox, as of its last read",
            m.inbox_backlog.clone(),
        );
        registry.register(
            "store_call_duration_seconds",
            "Time a claim or a renewal took, answered or not (the renew latency)",
            m.store_calls.clone(),
        );
        m
    }
}

impl Observer for EngineMetrics {
    fn observe(&self, event: &Event) {
        match event {
            Event::Registered { .. } => self.registered.inc(),
            Event::Recovered { .. } => self.recovered.inc(),
            Event::Elected { .. } => self.elected.inc(),
            Event::Following { .. } => return, // not counted: the group gauges tell roles
            Event::Lost { reason, .. } => self
                .lost
                .get_or_create(&[("reason", reason.as_str())])
                .inc(),
            Event::Swept { nodes, .. } => self.swept_nodes.inc_by(nodes.len() as u64),
            Event::Displaced { .. } => self.displaced.inc(),
            Event::Lag { .. } => self.inbox_lag.inc(),
            Event::Dropped { count, .. } => self.inbox_dropped.inc_by(*count),
            Event::StoreError { during, .. } => self
                .store_errors
                .get_or_create(&[("during", during.as_str())])
                .inc(),
        };
    }

    fn observe_backlog(&self, backlog: u64) {
        self.inbox_backlog
            .set(i64::try_from(backlog).unwrap_or(i64::MAX));
    }

    fn observe_call(&self, operation: Operation, took: std::time::Duration, _ok: bool) {
        self.store_calls
            .get_or_create(&[("operation", operation.as_str())])
            .observe(took.as_secs_f64());
    }
}

/// A registry whose metric names start with [`PREFIX`].
pub fn new_registry() -> Registry {
    Registry::with_prefix(PREFIX)
}

/// The text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Each metric family of a `render`ed text, as Prometheus names its
/// series (a counter with `_total`), with its type: what the docs' metric
/// tables list.
pub fn families(text: &str) -> Vec<(String, &str)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| match kind {
            "counter" => (format!("{name}_total"), kind),
            _ => (name.to_owned(), kind),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_counted_under_fixed_labels() {
        let mut registry = new_registry();
        let m = EngineMetrics::register(&mut registry);
        m.observe(&Event::Dropped {
            node: "n".into(),
            count: 5,
            total: 5,
        });
        m.observe(&Event::Dropped {
            node: "n".into(),
            count: 2,
            total: 7,
        });
        m.observe(&Event::Lost {
            node: "n".into(),
            group: "g".into(),
            term: 1,
            reason: LostReason::StepDown,
        });
        m.observe(&Event::StoreError {
            node: "n".into(),
            during: Operation::Renew,
            message: "x".into(),
        });
        let text = render(&registry);
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
            text.contains("leasehold_store_errors_total{during=\"sweep\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE leasehold_elected counter"), "{text}");
    }

    #[test]
    fn call_durations_and_the_backlog_are_recorded() {
        let mut registry = new_registry();
        let m = EngineMetrics::register(&mut registry);
        let text = render(&registry);
        // Both operations from the start, at zero.
        assert!(
            text.contains("leasehold_store_call_duration_seconds_count{operation=\"claim\"} 0\n"),
            "{text}"
        );
        m.observe_call(
            Operation::Renew,
            std::time::Duration::from_micros(1_500),
            true,
        );
        m.observe_call(
            Operation::Renew,
            std::time::Duration::from_millis(900),
            false,
        );
        m.observe_backlog(7);
        let text = render(&registry);
        assert!(
            text.contains("leasehold_store_call_duration_seconds_count{operation=\"renew\"} 2\n"),
            "{text}"
        );
        // 1.5 ms is above the 1 ms bucket and within the 2 ms one.
        assert!(
            text.contains(
                "leasehold_store_call_duration_seconds_bucket{le=\"0.001\",operation=\"renew\"} 0\n"
            ) && text.contains(
                "leasehold_store_call_duration_seconds_bucket{le=\"0.002\",operation=\"renew\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("leasehold_inbox_backlog 7\n"), "{text}");
    }
}
