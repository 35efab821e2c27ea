//! What the engine tells the world: a typed [`Event`] on an in-process
//! broadcast stream, and the same event as JSON on the `P:events` channel so
//! that a controller in another process can follow every transition.
//!
//! Publishing to the store is best effort and never blocks an engine loop: events
//! queue for a single publisher task, which keeps their order and drops (and
//! logs) what it cannot send while the store is away. The controller's periodic
//! resync covers anything lost that way.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};

use crate::store::{bounded, Store};

/// Why a node stopped being leader of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LostReason {
    /// The node shut down and released the lease.
    Shutdown,
    /// `step_down` released the lease; the node abstains for one ttl.
    StepDown,
    /// The lease ran out, in the store or in the node's local view of it.
    Expired,
    /// A renewal failed with a store error: demoted to be safe.
    StoreError,
    /// Another node (or a newer incarnation of this id) holds the lease.
    Replaced,
}

impl LostReason {
    /// Every reason, for metrics that list each one from the start. Written
    /// out rather than derived: the engine names no metrics crate (its
    /// labels are made in the daemon), and a derive (strum) would repeat
    /// each name beside serde's.
    pub const ALL: [Self; 5] = [
        Self::Shutdown,
        Self::StepDown,
        Self::Expired,
        Self::StoreError,
        Self::Replaced,
    ];

    /// The name used in JSON, logs and metric labels.
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

/// The engine loop whose store call failed ([`Event::StoreError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Operation {
    #[serde(rename = "register")]
    Register,
    #[serde(rename = "heartbeat")]
    Heartbeat,
    #[serde(rename = "sweep")]
    Sweep,
    #[serde(rename = "claim")]
    Claim,
    #[serde(rename = "renew")]
    Renew,
    #[serde(rename = "step-down release")]
    StepDownRelease,
    #[serde(rename = "shutdown release")]
    ShutdownRelease,
    #[serde(rename = "inbox read")]
    InboxRead,
}

impl Operation {
    /// Every operation, for metrics that list each one from the start.
    pub const ALL: [Self; 8] = [
        Self::Register,
        Self::Heartbeat,
        Self::Sweep,
        Self::Claim,
        Self::Renew,
        Self::StepDownRelease,
        Self::ShutdownRelease,
        Self::InboxRead,
    ];

    /// The name used in JSON, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Register => "register",
            Self::Heartbeat => "heartbeat",
            Self::Sweep => "sweep",
            Self::Claim => "claim",
            Self::Renew => "renew",
            Self::StepDownRelease => "step-down release",
            Self::ShutdownRelease => "shutdown release",
            Self::InboxRead => "inbox read",
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One engine transition. `node` is the node that observed it. The same
/// value travels as JSON on `P:events` and back through
/// [`crate::Store::follow_events`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// This node follows the leader of a group: its first claim after
    /// joining (or after being a candidate, e.g. while the store was away) found
    /// another node holding the lease. Lets a watcher (the controller) see
    /// a new member without polling.
    Following {
        node: String,
        group: String,
        leader: String,
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
    /// A store call failed; the loop named by `during` retries.
    StoreError {
        node: String,
        during: Operation,
        message: String,
    },
}

impl Event {
    /// The group the event is about, if it is about one.
    pub fn group(&self) -> Option<&str> {
        match self {
            Self::Elected { group, .. }
            | Self::Following { group, .. }
            | Self::Lost { group, .. } => Some(group),
            _ => None,
        }
    }
}

/// Sees every event of a node as it is emitted, in the emitting task: the
/// application's hook for metrics (the engine keeps no global registry).
/// It must not block; count, don't wait.
pub trait Observer: Send + Sync + 'static {
    fn observe(&self, event: &Event);

    /// How long one call to the store took, answered or not (`ok`: it was
    /// answered). Local only, never published: it comes with every
    /// renewal. Claims and renewals are timed.
    fn observe_call(&self, _operation: Operation, _took: std::time::Duration, _ok: bool) {}

    /// The node's unread inbox backlog in the store (messages read but not
    /// yet taken by the application count too), each time the inbox reader
    /// learns it. Local only, like [`Observer::observe_call`].
    fn observe_backlog(&self, _backlog: u64) {}
}

impl<F: Fn(&Event) + Send + Sync + 'static> Observer for F {
    fn observe(&self, event: &Event) {
        self(event)
    }
}

/// Fans events out to the observer, in-process subscribers and the store.
#[derive(Clone)]
pub(crate) struct EventBus {
    local: broadcast::Sender<Event>,
    remote: mpsc::UnboundedSender<Event>,
    observer: Option<Arc<dyn Observer>>,
}

/// How many events a slow in-process subscriber may fall behind before it
/// sees `RecvError::Lagged`.
const LOCAL_CAPACITY: usize = 1024;

impl EventBus {
    /// Starts the publisher task (on the current Tokio runtime). It sends
    /// what is queued and ends once every clone of the bus is dropped, so the
    /// last events of a closing node still reach the store.
    pub fn start(store: Store, observer: Option<Arc<dyn Observer>>) -> Self {
        let (local, _) = broadcast::channel(LOCAL_CAPACITY);
        let (remote, mut queue) = mpsc::unbounded_channel::<Event>();
        tokio::spawn(async move {
            while let Some(event) = queue.recv().await {
                let Ok(json) = serde_json::to_string(&event) else {
                    continue;
                };
                let sent = bounded(crate::config::CONNECT_TIMEOUT, store.emit_event(&json)).await;
                if let Err(e) = sent {
                    tracing::debug!(error = %e, "event not published to the store");
                }
            }
        });
        Self {
            local,
            remote,
            observer,
        }
    }

    pub fn emit(&self, event: Event) {
        tracing::debug!(?event, "engine event");
        if let Some(observer) = &self.observer {
            observer.observe(&event);
        }
        let _ = self.remote.send(event.clone());
        let _ = self.local.send(event);
    }

    /// Tells the observer how long a store call took (see
    /// [`Observer::observe_call`]).
    pub fn observe_call(&self, operation: Operation, took: std::time::Duration, ok: bool) {
        if let Some(observer) = &self.observer {
            observer.observe_call(operation, took, ok);
        }
    }

    /// Tells the observer the inbox backlog (see
    /// [`Observer::observe_backlog`]).
    pub fn observe_backlog(&self, backlog: u64) {
        if let Some(observer) = &self.observer {
            observer.observe_backlog(backlog);
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.local.subscribe()
    }
}

impl Store {
    /// Follows the engine events every node announces. An event this
    /// version cannot read (from a newer node) is skipped. The subscription
    /// is kept (and renewed after reconnects) until the receiver is
    /// dropped; events announced while it is down are missed, so a follower
    /// that must not miss a change also re-reads the state now and then.
    pub fn follow_events(&self) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut payloads = self.follow_event_payloads();
        tokio::spawn(async move {
            loop {
                let payload = tokio::select! {
                    _ = tx.closed() => return,
                    payload = payloads.recv() => match payload {
                        Some(payload) => payload,
                        None => return,
                    },
                };
                match serde_json::from_slice::<Event>(&payload) {
                    Ok(event) => {
                        if tx.send(event).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "skipped an event this version cannot read")
                    }
                }
            }
        });
        rx
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
