//! Wake-ups for followers: the store's listener tells which group's lease
//! was released (or its timings changed) or renewed, and this hands that
//! to the group's campaign at once. A hint lost while the listener was down
//! is followed by [`Wakeup::Listening`], which has the groups concerned look
//! again.
//!
//! Because of this, a follower need not poll: while the listener is
//! confirmed ([`Wake::healthy`]) it sleeps until the lease it saw runs out,
//! and each renewal's hint (where the store sends them: every other renewal
//! or so, `rules.rs`) moves that moment on, so at rest it claims only to keep its
//! candidacy, once per ttl + retry interval.
//! While the listener is not confirmed (at start, after a disconnection,
//! until it is back), followers fall back to claiming every retry interval.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::store::wakeup::{Interest, Wakeup};
use crate::store::Store;

/// What a campaign is told between two of its own calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hint {
    /// Look now: the lease was released, the timings changed, or the
    /// listener is back after hints may have been lost.
    Look,
    /// The leader handed the seat to this node by name: claim now, even
    /// while abstaining (a look for any other node).
    Successor,
    /// The leader renewed the lease under `term` for `ttl`, as of `at`
    /// (when the listener read the hint).
    Renewed {
        term: u64,
        ttl: Duration,
        at: Instant,
    },
}

/// The one hint waiting for a group's campaign. Hints that come while the
/// campaign is busy merge into it: being named successor stays (it is also
/// a look), a look stays a look (what it may have missed is found by
/// claiming), a later renewal replaces an earlier one.
#[derive(Default)]
pub(crate) struct HintSlot {
    notify: Notify,
    pending: Mutex<Option<Hint>>,
}

impl HintSlot {
    fn push(&self, hint: Hint) {
        {
            let mut pending = crate::sync::locked(&self.pending);
            let keep = match (*pending, hint) {
                (Some(Hint::Successor), _) => true,
                (Some(Hint::Look), Hint::Successor) => false,
                (Some(Hint::Look), _) => true,
                _ => false,
            };
            if !keep {
                *pending = Some(hint);
            }
        }
        self.notify.notify_one();
    }

    /// Has the campaign claim now, as a release would (when it neither
    /// leads nor abstains): its priority changed, and the store must learn
    /// it before a free seat is decided without it.
    pub fn look(&self) {
        self.push(Hint::Look);
    }

    /// Forgets a hint not yet taken: a node that steps down must not find
    /// an old naming as successor that would end its abstention at once.
    pub fn clear(&self) {
        crate::sync::locked(&self.pending).take();
    }

    /// Waits for a hint and takes it; a wake-up whose hint an earlier
    /// call took reads as a look.
    pub async fn next(&self) -> Hint {
        self.notify.notified().await;
        crate::sync::locked(&self.pending)
            .take()
            .unwrap_or(Hint::Look)
    }
}

/// Group name to its campaign's hint slot.
type Routes = Arc<Mutex<HashMap<String, Arc<HintSlot>>>>;

pub(crate) struct Wake {
    routes: Routes,
    healthy: Arc<AtomicBool>,
    changes: mpsc::UnboundedSender<()>,
    _tasks: [crate::task::Task; 2],
}

impl Wake {
    /// `me` is this node's id: a handover that names it is its own.
    pub fn start(store: &Store, me: &str) -> Self {
        let routes: Routes = Arc::default();
        let (wake_tx, wake_rx) = mpsc::unbounded_channel();
        let (changes, changes_rx) = mpsc::unbounded_channel();
        let healthy = Arc::new(AtomicBool::new(false));
        let dispatcher = crate::task::spawn(dispatch(
            wake_rx,
            routes.clone(),
            healthy.clone(),
            me.to_owned(),
        ));
        let wanted = routes.clone();
        let interest = Interest::new(
            move || -> HashSet<String> { crate::sync::locked(&wanted).keys().cloned().collect() },
            changes_rx,
        );
        let store = store.clone();
        let listener = crate::task::spawn(async move { store.listen(interest, wake_tx).await });
        Self {
            routes,
            healthy,
            changes,
            _tasks: [dispatcher, listener],
        }
    }

    /// Routes the wake-ups of `group` to the returned slot.
    pub fn add(&self, group: &str) -> Arc<HintSlot> {
        let slot = Arc::new(HintSlot::default());
        crate::sync::locked(&self.routes).insert(group.to_owned(), slot.clone());
        let _ = self.changes.send(());
        slot
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
    me: String,
) {
    while let Some(wakeup) = wakeups.recv().await {
        let (group, hint) = match wakeup {
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
                    Some(group) => (group, Hint::Look),
                    None => {
                        for slot in crate::sync::locked(&routes).values() {
                            slot.push(Hint::Look);
                        }
                        continue;
                    }
                }
            }
            Wakeup::Group(group) => (group, Hint::Look),
            Wakeup::HandedTo { group, to } => {
                let hint = if to == me {
                    Hint::Successor
                } else {
                    Hint::Look
                };
                (group, hint)
            }
            Wakeup::Renewed {
                group,
                term,
                ttl_ms,
                received,
            } => (
                group,
                Hint::Renewed {
                    term,
                    ttl: Duration::from_millis(ttl_ms),
                    at: received,
                },
            ),
        };
        if let Some(slot) = crate::sync::locked(&routes).get(&group) {
            slot.push(hint);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn renewed(term: u64) -> Hint {
        Hint::Renewed {
            term,
            ttl: Duration::from_millis(1000),
            at: Instant::now(),
        }
    }

    #[tokio::test]
    async fn a_look_is_never_replaced_by_a_renewal_that_came_after_it() {
        let slot = HintSlot::default();
        slot.push(Hint::Look);
        slot.push(renewed(3));
        assert_eq!(slot.next().await, Hint::Look);
    }

    #[tokio::test]
    async fn being_named_successor_outlasts_every_other_hint_and_replaces_a_look() {
        let slot = HintSlot::default();
        slot.push(Hint::Look);
        slot.push(Hint::Successor);
        slot.push(Hint::Look);
        slot.push(renewed(3));
        assert_eq!(slot.next().await, Hint::Successor);
    }

    #[tokio::test]
    async fn a_cleared_slot_forgets_an_old_naming_as_successor() {
        let slot = HintSlot::default();
        slot.push(Hint::Successor);
        slot.clear();
        let hint = renewed(3);
        slot.push(hint);
        assert_eq!(slot.next().await, hint);
    }

    #[tokio::test]
    async fn the_latest_renewal_replaces_an_earlier_one() {
        let slot = HintSlot::default();
        slot.push(renewed(3));
        let latest = renewed(4);
        slot.push(latest);
        assert_eq!(slot.next().await, latest);
    }
}
