//! Wake-ups: the store's hints that a group's lease was released (or its
//! timings changed), so that followers need not poll. They are hints only,
//! and lost
//! while the listener is disconnected: after [`Wakeup::Listening`] everyone
//! concerned looks once, because what was announced meanwhile is gone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify};

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
}

/// The groups a process wants wake-ups for, shared with the listener, and
/// a nudge each time the set changes.
pub(crate) struct Interest {
    routes: Routes,
    changes: mpsc::UnboundedReceiver<()>,
}

/// Group name to the campaign to wake.
pub(crate) type Routes = Arc<Mutex<HashMap<String, Arc<Notify>>>>;

impl Interest {
    pub fn new(routes: Routes, changes: mpsc::UnboundedReceiver<()>) -> Self {
        Self { routes, changes }
    }

    /// The groups wanted now.
    pub fn groups(&self) -> HashSet<String> {
        crate::sync::locked(&self.routes).keys().cloned().collect()
    }

    /// Waits for a change of the set (many changes count as one); `None`
    /// once nobody can change it any more.
    pub async fn changed(&mut self) -> Option<()> {
        self.changes.recv().await?;
        while self.changes.try_recv().is_ok() {}
        Some(())
    }
}
