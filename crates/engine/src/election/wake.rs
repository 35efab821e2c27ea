//! Wake-ups for followers: the store's listener tells which group's lease
//! was released (or its timings changed), and this pokes that group's
//! campaign at once. A hint lost while the listener was down is followed by
//! [`Wakeup::Listening`], which pokes the groups concerned too.
//!
//! Because of this, a follower need not poll: while the listener is
//! confirmed ([`Wake::healthy`]) it sleeps until the lease it saw runs out,
//! about one claim per ttl. While it is not (at start, after a disconnection,
//! until the listener is back), followers fall back to claiming every retry
//! interval.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, Notify};

use crate::store::wakeup::{Interest, Routes, Wakeup};
use crate::store::Store;

pub(crate) struct Wake {
    routes: Routes,
    healthy: Arc<AtomicBool>,
    changes: mpsc::UnboundedSender<()>,
    _tasks: [crate::task::Task; 2],
}

impl Wake {
    pub fn start(store: &Store) -> Self {
        let routes: Routes = Arc::default();
        let (wake_tx, wake_rx) = mpsc::unbounded_channel();
        let (changes, changes_rx) = mpsc::unbounded_channel();
        let healthy = Arc::new(AtomicBool::new(false));
        let dispatcher = crate::task::spawn(dispatch(wake_rx, routes.clone(), healthy.clone()));
        let interest = Interest::new(routes.clone(), changes_rx);
        let store = store.clone();
        let listener = crate::task::spawn(async move { store.listen(interest, wake_tx).await });
        Self {
            routes,
            healthy,
            changes,
            _tasks: [dispatcher, listener],
        }
    }

    /// Routes the wake-ups of `group` to the returned `Notify`.
    pub fn add(&self, group: &str) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        crate::sync::locked(&self.routes).insert(group.to_owned(), notify.clone());
        let _ = self.changes.send(());
        notify
    }

    /// True while wake-ups are known to arrive: the listener is confirmed
    /// and no disconnection was seen since.
    pub fn healthy(&self) -> Arc<AtomicBool> {
        self.healthy.clone()
    }

    pub fn remove(&self, group: &str) {
        crate::sync::locked(&self.routes).remove(group);
        let _ = self.changes.send(());
    }
}

async fn dispatch(
    mut wakeups: mpsc::UnboundedReceiver<Wakeup>,
    routes: Routes,
    healthy: Arc<AtomicBool>,
) {
    while let Some(wakeup) = wakeups.recv().await {
        let group = match wakeup {
            // Hints may be missed from now until the listener is back.
            Wakeup::Lost => {
                healthy.store(false, Ordering::SeqCst);
                continue;
            }
            // Back: what was announced meanwhile is lost, so the groups
            // concerned look again now.
            Wakeup::Listening(group) => {
                healthy.store(true, Ordering::SeqCst);
                match group {
                    Some(group) => group,
                    None => {
                        for notify in crate::sync::locked(&routes).values() {
                            notify.notify_one();
                        }
                        continue;
                    }
                }
            }
            Wakeup::Group(group) => group,
        };
        if let Some(notify) = crate::sync::locked(&routes).get(&group) {
            notify.notify_one();
        }
    }
}
