//! Wake-ups: the store's hints that a group's lease was released (or its
//! timings changed) or renewed, so that followers need not poll. They are
//! hints only, and lost while the listener is disconnected: after
//! [`Wakeup::Listening`] everyone concerned looks once, because what was
//! announced meanwhile is gone.

use std::collections::HashSet;

use tokio::sync::mpsc;

/// One hint from the store's listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wakeup {
    /// Hints may be missed from now on: the listener lost its connection.
    Lost,
    /// Hints arrive again, for this group (`Some`, a store that listens per
    /// group) or for every group (`None`): each looks once now.
    Listening(Option<String>),
    /// Something changed for this group: its followers look now.
    Group(String),
    /// The group's leader handed the seat to the member `to`: its
    /// followers look now, and `to` claims even while it abstains.
    HandedTo { group: String, to: String },
    /// The group's leader renewed its lease under `term` for `ttl_ms`
    /// (Redis only: see the PostgreSQL store's `renew`). `received` is when
    /// the listener read it, as early as it can be taken: the lease ends no
    /// later than `received + ttl_ms`, less late the earlier it is read.
    Renewed {
        group: String,
        term: u64,
        ttl_ms: u64,
        received: tokio::time::Instant,
    },
}

/// The groups a process wants wake-ups for, read from whoever routes
/// them, and a nudge each time the set changes.
pub(crate) struct Interest {
    groups: Box<dyn Fn() -> HashSet<String> + Send + Sync>,
    changes: mpsc::UnboundedReceiver<()>,
}

impl Interest {
    pub fn new(
        groups: impl Fn() -> HashSet<String> + Send + Sync + 'static,
        changes: mpsc::UnboundedReceiver<()>,
    ) -> Self {
        Self {
            groups: Box::new(groups),
            changes,
        }
    }

    /// The groups wanted now.
    pub fn groups(&self) -> HashSet<String> {
        (self.groups)()
    }

    /// Waits for a change of the set (many changes count as one); `None`
    /// once nobody can change it any more.
    pub async fn changed(&mut self) -> Option<()> {
        self.changes.recv().await?;
        while self.changes.try_recv().is_ok() {}
        Some(())
    }
}
