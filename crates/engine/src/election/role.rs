//! What a node is in one group, and its local view of the lease: the state
//! the campaign writes and every reader of leadership reads.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use tokio::time::Instant;

use crate::config::ElectionConfig;
use crate::store::Deferral;

/// A node's role in one group, as seen by that node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "role", rename_all = "camelCase")]
pub enum Role {
    /// Neither leading nor aware of a leader (just joined, or the store is away).
    Candidate,
    /// Another node leads under `term`.
    Follower { leader: String, term: u64 },
    /// This node leads under `term` (a fencing token: it only increases).
    Leader { term: u64 },
    /// Stepped down: not claiming for one ttl.
    Abstaining,
}

/// This node's leadership of a group by its local view of the lease: the
/// term, and the instant that view ends. Only a confirmed claim or renewal
/// moves `until`, to that call's send time plus the ttl it asked for; the
/// store started the lease no earlier than the send, so it cannot end there
/// before `until`. Work that must not outlive the lease ends by `until`
/// (exec mode's guard enforces it on a command from outside the agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leadership {
    /// The fencing token: it only increases.
    pub term: u64,
    /// When the local view of the lease ends, on the monotonic clock.
    pub until: Instant,
}

impl Leadership {
    /// How long the local view still holds: zero once it ended.
    pub fn remaining(&self) -> std::time::Duration {
        self.until.saturating_duration_since(Instant::now())
    }
}

/// The local view of a held lease, shared with [`Group::leader_term`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalLease {
    /// `(term, valid_until)` while this node leads.
    pub leading: Option<(u64, Instant)>,
    /// The term of a lease this node may still hold in the store, leading or not
    /// (after a fail-safe demotion): what a shutdown must release.
    pub held: Option<u64>,
    /// The timings the campaign runs with now: those it joined with, or the
    /// group's own once adopted from the store.
    pub timings: ElectionConfig,
}

/// What this node brings to a group's free seat, shared by the campaign and
/// [`Group`](super::Group): the priority it campaigns with (changed at run
/// time, sent with its next claim or renewal), and why it leaves a free
/// seat to another candidate right now.
#[derive(Debug)]
pub(crate) struct Bid {
    priority: AtomicU32,
    deferral: Mutex<Option<Deferral>>,
    /// Why the application is unhealthy, while it is: the node then
    /// campaigns with priority 0.
    problem: Mutex<Option<String>>,
}

impl Bid {
    pub fn new(priority: u32) -> Self {
        Self {
            priority: AtomicU32::new(priority),
            deferral: Mutex::new(None),
            problem: Mutex::new(None),
        }
    }
    pub fn priority(&self) -> u32 {
        self.priority.load(Ordering::SeqCst)
    }
    /// Whether the priority changed.
    pub fn set_priority(&self, priority: u32) -> bool {
        self.priority.swap(priority, Ordering::SeqCst) != priority
    }
    /// The priority a claim sends: 0 while the application is unhealthy.
    pub fn effective_priority(&self) -> u32 {
        if self.problem().is_some() {
            0
        } else {
            self.priority()
        }
    }
    pub fn problem(&self) -> Option<String> {
        crate::sync::locked(&self.problem).clone()
    }
    /// Whether it changed.
    pub fn set_problem(&self, problem: Option<String>) -> bool {
        let mut current = crate::sync::locked(&self.problem);
        let changed = *current != problem;
        *current = problem;
        changed
    }
    pub fn deferral(&self) -> Option<Deferral> {
        crate::sync::locked(&self.deferral).clone()
    }
    pub fn set_deferral(&self, deferral: Option<Deferral>) {
        *crate::sync::locked(&self.deferral) = deferral;
    }
}
