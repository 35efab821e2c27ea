//! One process run of a node: its id, the random nonce that tells this run
//! from another process using the same id, and what every loop of the node
//! shares (the store, the event bus, the displaced flag, the command
//! channel). The registry, the campaigns and the inbox all hold one; it
//! depends on none of them, so they do not depend on each other through it.

use tokio::sync::{mpsc, watch};

use crate::events::{Event, EventBus};
use crate::store::Store;

pub(crate) struct Incarnation {
    pub store: Store,
    pub id: String,
    /// Random per process run, stored next to the id: tells this run
    /// from another process using the same id.
    pub nonce: String,
    pub events: EventBus,
    /// Set once another live incarnation of this id shows up.
    pub displaced: watch::Sender<Option<String>>,
    /// Engine commands from the inbox (sender, payload), see the inbox's `command` module.
    pub commands: mpsc::UnboundedSender<(String, Vec<u8>)>,
    /// Claims sent in all groups (for the tests' count of a follower's
    /// calls at rest, through `test_hooks`).
    pub claims_sent: std::sync::atomic::AtomicU64,
}

impl Incarnation {
    pub fn count_claim(&self) {
        self.claims_sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn mark_displaced(&self, by: String) {
        let first = self.displaced.send_if_modified(|d| {
            if d.is_none() {
                *d = Some(by.clone());
                true
            } else {
                false
            }
        });
        if first {
            tracing::error!(node = %self.id, %by, "another live process uses this node id; this one stops");
            self.events.emit(Event::Displaced {
                node: self.id.clone(),
                by_incarnation: by,
            });
        }
    }
}
