//! Keeping a node registered: the first registration, heartbeats, and
//! registering again (restoring subscriptions and groups) after the node
//! finds its lease expired; plus the writer of the `groups` field.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{self, NodeConfig};
use crate::events::{Event, Operation};
use crate::incarnation::Incarnation;
use crate::store::{bounded, Heartbeat};
use crate::sync::locked;

pub(super) type Subscriptions = Arc<Mutex<BTreeSet<String>>>;

/// Writes the latest `groups` value to the registration, retrying until
/// the store has answered. Only while this incarnation's registration stands:
/// a swept node's hash is not recreated (a stray without a lease that no
/// sweep would ever find), and a registration made later carries the
/// latest value itself.
pub(super) async fn write_groups(shared: Arc<Incarnation>, mut groups: watch::Receiver<String>) {
    while groups.changed().await.is_ok() {
        loop {
            let value = groups.borrow_and_update().clone();
            let written = bounded(
                config::CONNECT_TIMEOUT,
                shared
                    .store
                    .set_node_field(&shared.id, &shared.nonce, "groups", &value),
            )
            .await;
            if written.is_ok() || groups.has_changed().unwrap_or(true) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

pub(super) struct Registration {
    pub shared: Arc<Incarnation>,
    pub config: NodeConfig,
    pub metadata: Vec<(String, String)>,
    pub subscriptions: Subscriptions,
    pub groups: watch::Receiver<String>,
}

impl Registration {
    fn limit(&self) -> Duration {
        self.config.lease()
    }

    /// One registration attempt; `again` marks a re-registration after the
    /// lease ran out. Returns whether it succeeded.
    pub async fn register(&self, again: bool) -> bool {
        let s = &self.shared;
        let subscriptions: Vec<String> = locked(&self.subscriptions).iter().cloned().collect();
        let mut metadata = self.metadata.clone();
        metadata.push(("groups".into(), self.groups.borrow().clone()));
        // Engine commands for this node go to its command stream (publish.lua);
        // a node of an older version, without this field, gets them in its inbox.
        metadata.push(("commands".into(), "stream".into()));
        // Its inbox entries may be packed in one field (publish.lua).
        metadata.push(("inbox".into(), "packed".into()));
        if !again {
            // Drops are counted per incarnation.
            metadata.push(("dropped".into(), "0".into()));
        }
        let result = bounded(
            self.limit().min(config::CONNECT_TIMEOUT),
            s.store.register(
                &s.id,
                &s.nonce,
                self.config.lease_duration_ms,
                again,
                &subscriptions,
                &metadata,
            ),
        )
        .await;
        match result {
            Ok(previous) => {
                if let Some(previous) = previous {
                    tracing::info!(%previous, "took over the registration of an earlier incarnation of this id");
                }
                let node = s.id.clone();
                s.events.emit(if again {
                    Event::Recovered { node }
                } else {
                    Event::Registered { node }
                });
                true
            }
            Err(e) => {
                s.events.emit(Event::StoreError {
                    node: s.id.clone(),
                    during: Operation::Register,
                    message: e.to_string(),
                });
                false
            }
        }
    }

    pub async fn heartbeat_loop(self, mut registered: bool) {
        let s = self.shared.clone();
        let mut ever_registered = registered;
        loop {
            tokio::time::sleep(self.config.heartbeat_interval()).await;
            if !registered {
                registered = self.register(ever_registered).await;
                ever_registered |= registered;
                continue;
            }
            let beat = bounded(
                self.limit(),
                s.store
                    .heartbeat(&s.id, &s.nonce, self.config.lease_duration_ms),
            )
            .await;
            match beat {
                Ok(Heartbeat::Extended) => {}
                Ok(Heartbeat::Expired) => {
                    tracing::warn!("own lease expired: registering again");
                    registered = self.register(true).await;
                }
                Ok(Heartbeat::Displaced { incarnation }) => {
                    s.mark_displaced(incarnation);
                    return;
                }
                Err(e) => s.events.emit(Event::StoreError {
                    node: s.id.clone(),
                    during: Operation::Heartbeat,
                    message: e.to_string(),
                }),
            }
        }
    }
}
