//! What the election and registry calls of the store answer, whichever
//! store it is.

use crate::config::ElectionConfig;

/// A group's timings as a store holds them: all three present and valid,
/// or nothing (a half-written or invalid config is ignored, not
/// half-applied). Both stores read them through this.
pub(crate) fn adopted_timings(
    ttl_ms: Option<u64>,
    renew_interval_ms: Option<u64>,
    retry_interval_ms: Option<u64>,
) -> Option<ElectionConfig> {
    let config = ElectionConfig {
        ttl_ms: ttl_ms?,
        renew_interval_ms: renew_interval_ms?,
        retry_interval_ms: retry_interval_ms?,
    };
    config.validate().ok().map(|_| config)
}

/// Outcome of a claim attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This node holds the lease now. `fresh` is false when it kept a lease it
    /// already held (re-claim after a fail-safe demotion).
    Won {
        term: u64,
        fresh: bool,
        config: Option<ElectionConfig>,
    },
    /// Another node holds it for `pttl_ms` more (store clock). While the
    /// store is in its first ttl after it was born (again; see claim.lua
    /// for Redis) nobody holds it, `holder` is empty and `pttl_ms` is the time until leases
    /// are handed out.
    Lost {
        term: u64,
        pttl_ms: i64,
        holder: String,
        config: Option<ElectionConfig>,
        /// Set when the seat is free but this node must leave it to a
        /// better candidate for `pttl_ms` more (or, priority 0, always).
        deferred: Option<Deferral>,
    },
}

/// Why a candidate does not take a free seat (docs/behaviour.md P1-P4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    pub reason: DeferReason,
    /// The candidate the seat waits for (empty for [`DeferReason::NeverLeads`]).
    pub to: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeferReason {
    /// This candidate campaigns with priority 0: it follows, never leads.
    NeverLeads,
    /// A live candidate of higher priority.
    Priority,
    /// A live candidate of the same priority that the controller prefers
    /// (on the updated revision during a rollout).
    Preferred,
    /// The leader handed the seat to a named successor.
    Successor,
}

impl DeferReason {
    /// The name the store's scripts answer with, and the status shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NeverLeads => "neverLeads",
            Self::Priority => "priority",
            Self::Preferred => "preferred",
            Self::Successor => "successor",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        [
            Self::NeverLeads,
            Self::Priority,
            Self::Preferred,
            Self::Successor,
        ]
        .into_iter()
        .find(|r| r.as_str() == text)
    }
}

/// A deferral as a store's reply names it; any other reason is a reply
/// this build cannot read.
pub(crate) fn deferral(reason: &str, to: String) -> Result<Deferral, crate::store::StoreError> {
    let reason = DeferReason::parse(reason).ok_or_else(|| {
        crate::store::StoreError::Reply(format!("claim: unknown deferral {reason:?}"))
    })?;
    Ok(Deferral { reason, to })
}

/// The outcome of a handover to a named successor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Handover {
    /// Released; the other candidates leave the seat to the successor for
    /// the deference bound.
    Released,
    /// This incarnation does not hold the lease under that term: nothing
    /// was changed.
    NotHeld,
    /// The successor is not a live member of the group.
    NotMember,
    /// The successor campaigns with priority 0.
    NeverLeads,
}

impl Handover {
    /// The answer of handover.lua and of the SQL `hand_over`, which share
    /// these codes: 1 released, -1 not a member, -2 priority 0, else not
    /// this incarnation's lease.
    pub(crate) fn from_code(code: i64) -> Self {
        match code {
            1 => Self::Released,
            -1 => Self::NotMember,
            -2 => Self::NeverLeads,
            _ => Self::NotHeld,
        }
    }
}

/// Outcome of a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Renewed; `config` is the group's timings from the store, if set;
    /// `term` is the lease's term afterwards (higher than before if the
    /// counter was restored above it).
    Renewed {
        config: Option<ElectionConfig>,
        term: u64,
    },
    /// The lease expired before the renewal reached the store.
    Gone,
    /// Someone else holds it now (possibly this node id's newer incarnation).
    Replaced { holder: String, incarnation: String },
}

/// Outcome of a node heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heartbeat {
    Extended,
    /// The node's lease ran out (swept or not): it must register again.
    Expired,
    /// Another incarnation registered under this node id.
    Displaced {
        incarnation: String,
    },
}

/// Outcome of one sweep pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sweep {
    pub swept: Vec<String>,
    pub now_ms: u64,
    /// Earliest lease expiry among the remaining nodes, if any.
    pub next_expiry_ms: Option<u64>,
}

/// One Kubernetes cluster's timings for a group, as its controller last
/// wrote them (`Store::vote_spec`), for groups that span clusters sharing
/// the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecVote {
    /// The cluster's name (`--cluster`).
    pub cluster: String,
    /// Its LeaderGroup's timings; `None` for a record that cannot be read.
    pub config: Option<ElectionConfig>,
    /// How long ago it was written (ms, the store's clock).
    pub age_ms: u64,
}

/// A group's state in the store, read in one step so the parts agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    pub holder: Option<String>,
    pub term: u64,
    /// Remaining lease time in ms, when held.
    pub lease_pttl_ms: Option<u64>,
    /// Node ids with live candidacy and their candidacy expiry (ms, store clock).
    pub members: Vec<(String, u64)>,
    /// The priority of each live member (docs/behaviour.md P1).
    pub priorities: std::collections::BTreeMap<String, u32>,
    /// Why a live member's application is unhealthy, for those whose agent
    /// says so (they campaign with priority 0 meanwhile; P6).
    pub problems: std::collections::BTreeMap<String, String>,
    /// The members the controller prefers, as the store holds them
    /// ([`crate::Store::write_preferred`]).
    pub preferred: Option<Vec<String>>,
    pub now_ms: u64,
}
