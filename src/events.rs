//! What the engine tells the world: a typed [`Event`] on an in-process
//! broadcast stream, and the same event as JSON on the `P:events` channel so
//! that a controller in another process can follow every transition.
//!
//! Publishing to Redis is best effort and never blocks an engine loop: events
//! queue for a single publisher task, which keeps their order and drops (and
//! logs) what it cannot send while Redis is away. The controller's periodic
//! resync covers anything lost that way.

use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use crate::store::{bounded, Store};

/// Why a node stopped being leader of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LostReason {
    /// The node shut down and released the lease.
    Shutdown,
    /// `step_down` released the lease; the node abstains for one ttl.
    StepDown,
    /// The lease ran out, in Redis or in the node's local view of it.
    Expired,
    /// A renewal failed with a store error: demoted to be safe.
    StoreError,
    /// Another node (or a newer incarnation of this id) holds the lease.
    Replaced,
}

impl LostReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shutdown => "shutdown",
            Self::StepDown => "stepDown",
            Self::Expired => "expired",
            Self::StoreError => "storeError",
            Self::Replaced => "replaced",
        }
    }
}

/// One engine transition. `node` is the node that observed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Event {
    /// The node registered for the first time in this process run.
    Registered { node: String },
    /// The node found its lease expired, registered again, and carries on.
    Recovered { node: String },
    /// This node won a group's lease under `term`.
    Elected {
        node: String,
        group: String,
        term: u64,
    },
    /// This node stopped leading a group.
    Lost {
        node: String,
        group: String,
        term: u64,
        reason: LostReason,
    },
    /// This node's sweeper removed expired nodes.
    Swept { node: String, nodes: Vec<String> },
    /// Another live process registered with this node's id; this one stops.
    Displaced {
        node: String,
        by_incarnation: String,
    },
    /// The node's inbox backlog passed its lag threshold: its consumer is
    /// not keeping up.
    Lag { node: String, backlog: u64 },
    /// The node's inbox was full and `count` of its oldest unread messages
    /// were dropped (`total` since it registered).
    Dropped {
        node: String,
        count: u64,
        total: u64,
    },
    /// A Redis call failed; the loop named by `during` retries.
    StoreError {
        node: String,
        during: &'static str,
        message: String,
    },
}

/// Fans events out to in-process subscribers and to Redis.
#[derive(Clone)]
pub struct EventBus {
    local: broadcast::Sender<Event>,
    remote: mpsc::UnboundedSender<Event>,
}

/// How many events a slow in-process subscriber may fall behind before it
/// sees `RecvError::Lagged`.
const LOCAL_CAPACITY: usize = 1024;

impl EventBus {
    /// Starts the publisher task (on the current Tokio runtime).
    pub fn start(store: Store) -> Self {
        let (local, _) = broadcast::channel(LOCAL_CAPACITY);
        let (remote, mut queue) = mpsc::unbounded_channel::<Event>();
        let channel = store.keys().events();
        tokio::spawn(async move {
            while let Some(event) = queue.recv().await {
                let Ok(json) = serde_json::to_string(&event) else {
                    continue;
                };
                let sent = bounded(
                    crate::config::CONNECT_TIMEOUT,
                    store.publish_raw(&channel, &json),
                )
                .await;
                if let Err(e) = sent {
                    tracing::debug!(error = %e, "event not published to redis");
                }
            }
        });
        Self { local, remote }
    }

    pub fn emit(&self, event: Event) {
        tracing::debug!(?event, "engine event");
        crate::telemetry::metrics::metrics().record(&event);
        let _ = self.remote.send(event.clone());
        let _ = self.local.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.local.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialize_as_tagged_json() {
        let e = Event::Lost {
            node: "ns/a".into(),
            group: "ns/g".into(),
            term: 3,
            reason: LostReason::StepDown,
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"lost","node":"ns/a","group":"ns/g","term":3,"reason":"stepDown"}"#
        );
        let e = Event::Elected {
            node: "n".into(),
            group: "g".into(),
            term: 1,
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"elected","node":"n","group":"g","term":1}"#
        );
    }
}
