//! What a node is in one group, and its local view of the lease: the state
//! the campaign writes and every reader of leadership reads.

use tokio::time::Instant;

use crate::config::ElectionConfig;

/// A node's role in one group, as seen by that node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "role", rename_all = "camelCase")]
pub enum Role {
    /// Neither leading nor aware of a leader (just joined, or Redis is away).
    Candidate,
    /// Another node leads under `term`.
    Follower { leader: String, term: u64 },
    /// This node leads under `term` (a fencing token: it only increases).
    Leader { term: u64 },
    /// Stepped down: not claiming for one ttl.
    Abstaining,
}

/// The local view of a held lease, shared with [`Group::leader_term`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalLease {
    /// `(term, valid_until)` while this node leads.
    pub leading: Option<(u64, Instant)>,
    /// The term of a lease this node may still hold in Redis, leading or not
    /// (after a fail-safe demotion): what a shutdown must release.
    pub held: Option<u64>,
    /// The timings the campaign runs with now: those it joined with, or the
    /// group's own once adopted from Redis.
    pub timings: ElectionConfig,
}
