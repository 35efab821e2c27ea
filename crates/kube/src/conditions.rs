//! The conditions of a LeaderGroup's status, in the standard Kubernetes
//! shape (k8s-openapi's `Condition`): their types and reasons in one place,
//! and the rule that a condition keeps its transition time while its status
//! stays the same.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types.
pub mod types {
    /// The timings are within their bounds.
    pub const SPEC_VALID: &str = "SpecValid";
    /// The group's state in the store could be read.
    pub const STORE_AVAILABLE: &str = "StoreAvailable";
    /// Some node holds the lease.
    pub const LEADER_ELECTED: &str = "LeaderElected";
    /// Another group writes the same label key on some of these pods.
    pub const LABEL_CONFLICT: &str = "LabelConflict";
    /// The store server's settings keep the guarantees; False names what to
    /// change. Not part of Ready: the group works, with a weaker guarantee.
    /// Its name, as two reasons' below, stays for either store: alerts match it.
    pub const STORE_SETTINGS_SAFE: &str = "RedisSettingsSafe";
    /// The last `leasehold.dev/step-down-to` request: True when the leader
    /// was asked to hand over, False (with the reason) when it was
    /// refused. Absent until the first request.
    pub const HANDOVER: &str = "Handover";
    /// The leader Service's EndpointSlice holds what the group's state
    /// says (only with `spec.service`); False names what stopped the write.
    pub const LEADER_ENDPOINT: &str = "LeaderEndpoint";
    /// Across clusters (`--cluster`): the clusters' LeaderGroups disagree
    /// on the timings, and none of them writes them into the store until
    /// they agree. Absent in one cluster.
    pub const SPEC_CONFLICT: &str = "SpecConflict";
    /// A leader is elected and labelled, its pod is Ready, and nothing
    /// above is wrong (the `READY` column).
    pub const READY: &str = "Ready";
}

/// Condition reasons.
pub mod reasons {
    pub const VALID: &str = "Valid";
    pub const INVALID_TIMINGS: &str = "InvalidTimings";
    pub const INVALID_ROLE_LABEL: &str = "InvalidRoleLabel";
    pub const STORE_REACHABLE: &str = "RedisReachable";
    pub const STORE_UNAVAILABLE: &str = "RedisUnavailable";
    pub const LEASE_HELD: &str = "LeaseHeld";
    pub const LEASE_HELD_BY_NODE_WITHOUT_POD: &str = "LeaseHeldByNodeWithoutPod";
    pub const LEASE_HELD_IN_OTHER_CLUSTER: &str = "LeaseHeldInOtherCluster";
    pub const LEADER_IN_OTHER_CLUSTER: &str = "LeaderInOtherCluster";
    pub const LEADER_UNCONFIRMED: &str = "LeaderUnconfirmed";
    pub const TIMINGS_AGREE: &str = "TimingsAgree";
    pub const TIMINGS_DIFFER: &str = "TimingsDiffer";
    pub const NO_LEADER: &str = "NoLeader";
    pub const NO_CONFLICT: &str = "NoConflict";
    pub const SAME_ROLE_LABEL: &str = "SameRoleLabel";
    pub const READY: &str = "Ready";
    pub const SAFE_SETTINGS: &str = "SafeSettings";
    pub const UNSAFE_SETTINGS: &str = "UnsafeSettings";
    pub const NOT_READY: &str = "NotReady";
    pub const LEADER_POD_NOT_READY: &str = "LeaderPodNotReady";
    pub const INVALID_SERVICE: &str = "InvalidService";
    pub const ENDPOINT_WRITTEN: &str = "EndpointWritten";
    pub const ENDPOINT_NOT_WRITTEN: &str = "EndpointNotWritten";
    pub const HANDOVER_REQUESTED: &str = "HandoverRequested";
    pub const SUCCESSOR_REFUSED: &str = "SuccessorRefused";
}

pub const TRUE: &str = "True";
pub const FALSE: &str = "False";

/// A condition whose transition time [`merge`] fills in.
pub fn condition(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { TRUE } else { FALSE }.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// `next` with each condition's transition time kept from `previous` while
/// its status did not change (set to `now` otherwise), the generation they
/// were computed for, and sorted by type.
pub fn merge(
    previous: &[Condition],
    next: Vec<Condition>,
    now: &Time,
    generation: Option<i64>,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = next
        .into_iter()
        .map(|mut c| {
            let before = previous.iter().find(|p| p.type_ == c.type_);
            c.last_transition_time = match before {
                Some(p) if p.status == c.status => p.last_transition_time.clone(),
                _ => now.clone(),
            };
            c.observed_generation = generation;
            c
        })
        .collect();
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// `conditions` (already merged) with `next` in place of its type, its
/// transition time kept from `previous` as [`merge`] keeps it.
pub fn replace(
    conditions: &mut Vec<Condition>,
    previous: &[Condition],
    next: Condition,
    now: &Time,
    generation: Option<i64>,
) {
    conditions.retain(|c| c.type_ != next.type_);
    conditions.extend(merge(previous, vec![next], now, generation));
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}
