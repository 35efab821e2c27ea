//! The controller's rules, as one pure function: what was observed (the
//! LeaderGroup, the namespace's pods and other groups, the group's state in
//! the store) goes in; the label changes in the order they must be applied, the
//! status, the events and the commands come out. Reconcile is the I/O around
//! it, so every rule here is tested without a cluster or a store.
//!
//! [`plan`] reads as the list of rules; each rule is a function named for
//! what it decides, and `plan_tests.rs` has a test per rule.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};

use crate::conditions::{self, condition, reasons, types};
use crate::crd::{
    EndpointStatus, Handover, LastSweep, LeaderGroup, LeaderGroupSpec, LeaderGroupStatus,
    LeaderService, Member, MemberProblem, MemberRole, STEP_DOWN_ANNOTATION,
    STEP_DOWN_TO_ANNOTATION,
};
use crate::endpoint::{Address, LeaderEndpoint};
use crate::placement::{self, Seat};
pub use crate::pods::{pod_of, time_of, Locality, Place, PodView};
use crate::selector::{PodSelector, SelectorIndex};
use leasehold_engine::config::ElectionConfig;
use leasehold_engine::store::{GroupState, SpecVote};
use leasehold_engine::SettingWarning;

/// The role label's values.
pub const LEADER: &str = "leader";
pub const FOLLOWER: &str = "follower";

/// Reasons of the Kubernetes Events the controller records.
pub mod event_reasons {
    pub const LEADER_ELECTED: &str = "LeaderElected";
    pub const LEADER_UNCONFIRMED: &str = "LeaderUnconfirmed";
    pub const LEADER_LOST: &str = "LeaderLost";
    pub const NODES_SWEPT: &str = "NodesSwept";
    pub const STEP_DOWN_REQUESTED: &str = "StepDownRequested";
    pub const HANDOVER_REQUESTED: &str = "HandoverRequested";
    pub const HANDOVER_REFUSED: &str = "HandoverRefused";
    pub const MEMBER_UNHEALTHY: &str = "MemberUnhealthy";
}

/// Another LeaderGroup of the namespace, to detect two groups that would
/// write the same label key on one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct OtherGroup {
    pub name: String,
    pub role_label: String,
    pub selector: LabelSelector,
}

/// The group's state in the store, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreView {
    Available(GroupState),
    Unavailable(String),
}

pub struct Observed<'a> {
    pub group: &'a LeaderGroup,
    /// This controller's cluster (`--cluster`), when groups span clusters:
    /// it labels only this cluster's pods.
    pub cluster: Option<&'a str>,
    pub pods: &'a [PodView],
    pub others: &'a [OtherGroup],
    pub store: &'a StoreView,
    /// Nodes the controller's sweeper removed recently, with the time (ms).
    pub swept: &'a [(String, u64)],
    /// The local wall clock in ms, used only when the store's is not at hand.
    pub local_now_ms: u64,
    /// What is wrong with the store server's settings, as last read.
    pub store_warnings: &'a [SettingWarning],
    /// Across clusters, every cluster's timings for the group as the store
    /// holds them, this one's included (`None`: not read).
    pub votes: Option<&'a [SpecVote]>,
    /// Across clusters: when (ms, the local clock) the lease last read from
    /// the store must have run out: the read's time (taken before it was
    /// asked) and the lease's time left then, or a ttl when no one held
    /// it; a ttl after the first read that failed, when none answered (see
    /// [`while_store_is_unavailable`]).
    pub lease_seen_until_ms: Option<u64>,
    /// When (ms, the store's clock) this controller first found the group without
    /// the holder its status names, if it has (see [`awaiting_successor`]).
    pub holder_gone_since_ms: Option<u64>,
}

/// How long a group whose holder is gone, while other members are live,
/// is left as it is before it is reported leaderless. A successor claims
/// within milliseconds (at once on the wake-up after a release, at the
/// expiry for a crashed holder), so waiting this long turns most leader
/// changes into one set of writes (two label patches, one status, one
/// Event) instead of two; a group nobody takes over is reported this
/// much later.
pub const SUCCESSOR_GRACE_MS: u64 = 250;

/// How often a cluster's record of its timings (`Store::vote_spec`) is
/// written again while they do not change (ms): it is read at every look
/// at the group, so it stays well within [`SPEC_VOTE_STALE_MS`].
pub const SPEC_VOTE_REFRESH_MS: u64 = 60_000;

/// A cluster's record of its timings older than this (ms) no longer counts:
/// that cluster's controller, or its LeaderGroup, is gone.
pub const SPEC_VOTE_STALE_MS: u64 = 600_000;

/// How long after a lease's end a group with a leader endpoint is looked
/// at again (ms): the lease is renewed well before its end, so by then it
/// is renewed or gone.
pub const LAPSE_MARGIN_MS: u64 = 50;

/// One label to set (`Some`) or remove (`None`) on one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelChange {
    pub pod: String,
    pub key: String,
    pub value: Option<String>,
}

/// A Kubernetes Event to record on the LeaderGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    pub reason: &'static str,
    pub note: String,
    pub warning: bool,
}

/// What the plan asks of the preferred members the store holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PreferredMembers {
    /// The store holds the right ones: nothing to write.
    #[default]
    Keep,
    /// No rollout any more: the store's list is removed.
    Remove,
    /// A rollout prefers these nodes.
    Write(Vec<String>),
}

/// What a reconcile writes; the default writes nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Applied in this order, stopping at the first failure: every change
    /// that takes `leader` away comes before the one that gives it, so no
    /// selector ever matches two pods.
    pub labels: Vec<LabelChange>,
    pub status: LeaderGroupStatus,
    /// Whether the status differs from the stored one: at rest (renewals
    /// only) it does not.
    pub write_status: bool,
    pub events: Vec<PlannedEvent>,
    /// Node to send a step-down command to.
    pub step_down: Option<String>,
    /// A handover to ask of the leader ([`Handover::from`] to
    /// [`Handover::to`]).
    pub hand_over: Option<Handover>,
    pub preferred_nodes: PreferredMembers,
    /// Look again this soon (ms), before the resync: a failback waits for
    /// its stability window.
    pub look_again_ms: Option<u64>,
    /// Term to put back into the store, which lost (part of) its data.
    pub restore_term: Option<u64>,
    /// Timings to write into the group's config in the store, when valid.
    pub config: Option<ElectionConfig>,
    /// Nothing to write yet: the holder is gone and a successor is
    /// expected. `(since_ms, remaining_ms)`: since when (the store's clock) and
    /// how much longer to wait before looking again.
    pub awaiting_successor: Option<(u64, u64)>,
    /// What the leader Service's slice should hold (`spec.service`), when
    /// it is known: written before the labels.
    pub endpoint: Option<LeaderEndpoint>,
    /// A Service the group had under another name, to remove.
    pub retire_service: Option<String>,
}

// One piece on purpose: the rules run in this order, each a named step
// (the rule functions above hold their logic), read top to bottom.
#[allow(clippy::too_many_lines)]
pub fn plan(observed: &Observed<'_>) -> Plan {
    let group = observed.group;
    let namespace = group.metadata.namespace.as_deref().unwrap_or_default();
    let here = Locality {
        cluster: observed.cluster,
        namespace,
    };
    let previous = group.status.clone().unwrap_or_default();
    let role_label_ok = group.spec.role_label_error().is_none();
    let (spec_valid, config) = spec_validity(&group.spec);
    let state = match observed.store {
        StoreView::Available(state) => state,
        StoreView::Unavailable(reason) => {
            return while_store_is_unavailable(observed, &previous, spec_valid, config, reason)
        }
    };
    let now = time_of(state.now_ms);
    let pods = PodsOfGroup::sort(observed);
    let (term, restore_term) = the_term_never_goes_back(&previous, state);
    let holder = live_holder(state);
    if let Some(wait) = awaiting_successor(&previous, holder, state, observed.holder_gone_since_ms)
    {
        return Plan {
            status: previous,
            awaiting_successor: Some(wait),
            ..Plan::default()
        };
    }
    let holder_pod = holder.and_then(|h| here.pod(h));
    let leader_elsewhere = holder.and_then(|h| match here.place(h) {
        Place::Elsewhere { cluster, pod } => Some((cluster, pod)),
        _ => None,
    });
    let members = members(state, holder, &here, &pods, observed.pods, &previous);
    // An unusable role label is reported (SpecValid) and nothing is labelled:
    // the API server would refuse every patch.
    let labels = if role_label_ok {
        label_changes(observed, &pods, &members)
    } else {
        Vec::new()
    };
    let shown_holder = holder.and_then(|h| here.shown(h));
    let mut events = leader_change_events(&previous, holder, shown_holder.as_deref(), term);
    report_unhealthy(&previous, &members, &mut events);
    let last_sweep = report_sweeps(&previous, observed.swept, &mut events);
    let (step_down, handled_step_down) =
        step_down_on_annotation(group, &previous, holder, &mut events);
    let listed: Vec<Member> = members.iter().map(|m| m.member.clone()).collect();
    let seat = Seat {
        placement: &group.spec.placement,
        locality: here,
        holder,
        term,
        members: &listed,
        pods: observed.pods,
        previous: previous.handover.as_ref(),
        leader_since_ms: previous
            .leader_since
            .as_ref()
            .filter(|_| holder.is_some() && previous.holder.as_deref() == holder)
            .map(|t| t.0.as_millisecond().max(0) as u64),
        now_ms: state.now_ms,
    };
    let placed = placement::place(&seat);
    // A step-down asked in the same reconcile goes first; a step-down-to
    // is then handled at the next one, of whoever leads then.
    let (requested, handled_step_down_to, handover_condition) = if step_down.is_none() {
        step_down_to_on_annotation(group, &previous, &seat, &mut events)
    } else {
        let kept = previous.condition(types::HANDOVER);
        (None, previous.handled_step_down_to.clone(), kept)
    };
    // Across clusters, placement's own moves are made by the controller of
    // the leader's cluster alone, so two controllers never take turns
    // writing the preferred members or asking for handovers.
    let seat_is_ours = observed.cluster.is_none() || holder_pod.is_some();
    let hand_over = requested
        .or(placed.hand_over.filter(|_| seat_is_ours))
        .filter(|_| step_down.is_none());
    if let Some(h) = &hand_over {
        events.push(handover_event(h, placed.rollout.as_ref()));
    }
    let preferred_nodes = if seat_is_ours {
        preferred_nodes_to_write(state, placed.rollout.as_ref())
    } else {
        PreferredMembers::Keep
    };

    let leader_pod = holder_pod
        .filter(|p| observed.pods.iter().any(|pod| pod.name == *p))
        .map(str::to_owned);
    let elected = holder.is_some();
    let conflicts = pods.conflicts();
    let service_error = group.spec.service.as_ref().and_then(LeaderService::error);
    let endpoint = group
        .spec
        .service
        .as_ref()
        .filter(|_| service_error.is_none())
        .and_then(|service| leader_endpoint(service, holder, holder_pod, observed.pods, term));
    // No event comes when a lease runs out with no one to claim it: a
    // group whose slice names a leader looks again just after the lease's
    // end, so the slice is emptied then rather than at the resync.
    let lapse_check = endpoint
        .as_ref()
        .and(state.lease_pttl_ms.filter(|_| holder.is_some()))
        .map(|pttl| pttl + LAPSE_MARGIN_MS);
    let leader_pod_ready = leader_pod
        .as_deref()
        .and_then(|p| observed.pods.iter().find(|pod| pod.name == p))
        .and_then(|p| p.ready);
    let labelled = elected && config.is_some() && pods.yielded.is_empty() && role_label_ok;
    let mut next_conditions = vec![
        spec_valid,
        condition(
            types::STORE_AVAILABLE,
            true,
            reasons::STORE_REACHABLE,
            "the group's state was read from the store",
        ),
        leader_elected(holder, leader_pod.as_deref(), leader_elsewhere, term),
        label_conflict(&conflicts),
        store_settings(observed.store_warnings),
        readiness(
            labelled && service_error.is_none(),
            leader_pod.as_deref(),
            leader_pod_ready,
            leader_elsewhere,
        ),
    ];
    let (spec_conflict, timings_agreed) =
        spec_conflict(config, observed.cluster, observed.votes, &previous);
    next_conditions.extend(spec_conflict);
    next_conditions.extend(handover_condition);
    next_conditions.extend(endpoint_condition(group, endpoint.as_ref(), &previous));
    let status = LeaderGroupStatus {
        // `CLUSTER/POD` once clusters are named, wherever it runs.
        leader: shown_holder.filter(|_| leader_pod.is_some() || leader_elsewhere.is_some()),
        holder: holder.map(str::to_owned),
        term: (term > 0).then_some(term as i64),
        leader_since: match (holder, &previous.leader_since) {
            (Some(h), Some(since)) if previous.holder.as_deref() == Some(h) => Some(since.clone()),
            (Some(_), _) => Some(now.clone()),
            (None, _) => None,
        },
        live_members: members.len() as i64,
        members: members.into_iter().map(|m| m.member).collect(),
        transitions: previous.transitions
            + i64::from(elected && holder != previous.holder.as_deref()),
        last_sweep,
        conditions: conditions::merge(
            &previous.conditions,
            next_conditions,
            &now,
            group.metadata.generation,
        ),
        observed_generation: group.metadata.generation,
        handled_step_down,
        handled_step_down_to,
        preferred: placed.preferred,
        rollout: placed.rollout,
        handover: hand_over.clone().or(previous.handover.clone()),
        endpoint: endpoint_status(group, endpoint.as_ref(), &previous),
    };
    let write_status = status_changed(&status, &previous);
    // Across clusters, a group led here is read at least twice a lease, so
    // that a cut from the store is known within the lease (see
    // `while_store_is_unavailable`).
    let watch_lease = config
        .filter(|_| observed.cluster.is_some() && holder_pod.is_some())
        .map(|c| c.ttl_ms / 2);
    Plan {
        labels,
        status,
        write_status,
        events,
        step_down,
        hand_over,
        preferred_nodes,
        look_again_ms: [placed.look_again_ms, lapse_check, watch_lease]
            .into_iter()
            .flatten()
            .min(),
        restore_term,
        config: config.filter(|_| timings_agreed),
        awaiting_successor: None,
        endpoint,
        retire_service: retired_service(group, &previous),
    }
}

/// Rule: the Ready condition (the `READY` column) is True when a leader
/// is elected and labelled, nothing in the spec is wrong, and the leader's
/// pod is Ready: what a client of the leader needs. A leader in another
/// cluster is no leader a client here reaches through a label or slice of
/// this cluster's: not Ready, and the reason says where it leads.
fn readiness(
    labelled: bool,
    leader_pod: Option<&str>,
    pod_ready: Option<bool>,
    elsewhere: Option<(&str, &str)>,
) -> Condition {
    if let Some((cluster, pod)) = elsewhere {
        return condition(
            types::READY,
            false,
            reasons::LEADER_IN_OTHER_CLUSTER,
            format!("the leader is pod {pod} of cluster {cluster}: no pod of this cluster is labelled leader"),
        );
    }
    match (labelled, leader_pod, pod_ready) {
        (true, Some(_), Some(true)) => condition(
            types::READY,
            true,
            reasons::READY,
            "a leader is elected and labelled, and its pod is Ready",
        ),
        (true, Some(pod), Some(false)) => condition(
            types::READY,
            false,
            reasons::LEADER_POD_NOT_READY,
            format!("the leader pod {pod} is not Ready"),
        ),
        (true, Some(pod), None) => condition(
            types::READY,
            false,
            reasons::LEADER_POD_NOT_READY,
            format!("the leader pod {pod}'s readiness could not be read"),
        ),
        _ => condition(
            types::READY,
            false,
            reasons::NOT_READY,
            "see the other conditions",
        ),
    }
}

/// Rule: the leader Service's slice holds the holder's pod address at the
/// term, or no address when no one holds the lease (or the holder is no
/// pod of this namespace and cluster). While the holder's pod is not in the cache or
/// has no known IP (it could not be read), nothing is written: the slice
/// keeps what it has.
fn leader_endpoint(
    service: &LeaderService,
    holder: Option<&str>,
    holder_pod: Option<&str>,
    pods: &[PodView],
    term: u64,
) -> Option<LeaderEndpoint> {
    let leader = match (holder, holder_pod) {
        (Some(_), Some(name)) => {
            // A pod the cache does not show (yet) is not known to be gone:
            // vacating the term now would rank above its leader, and the
            // slice could not name it for the rest of the term.
            let pod = pods.iter().find(|p| p.name == name)?;
            Some(Address {
                pod: pod.name.clone(),
                ip: pod.ip.clone()?,
                ready: pod.ready == Some(true),
            })
        }
        // No holder, or one that is no pod of this namespace.
        _ => None,
    };
    Some(LeaderEndpoint {
        service: service.clone(),
        term,
        leader,
        unconfirmed: false,
    })
}

/// Rule: across clusters, a slice that holds this cluster's leader loses
/// its address with the leader label, at the term it was written for and
/// marked unconfirmed: of that term's leader's rank, so that the address
/// is written back in the same term if the store answers with the same
/// leader. A slice that holds no address, by the status's record of it,
/// has nothing to lose.
fn unconfirmed_endpoint(
    group: &LeaderGroup,
    previous: &LeaderGroupStatus,
) -> Option<LeaderEndpoint> {
    let service = group.spec.service.as_ref()?;
    if service.error().is_some() {
        return None;
    }
    let recorded = previous.endpoint.as_ref()?;
    (recorded.service == service.name && recorded.address.is_some()).then(|| LeaderEndpoint {
        service: service.clone(),
        term: recorded.term as u64,
        leader: None,
        unconfirmed: true,
    })
}

/// The status's record of the slice: what is planned, or what was
/// recorded while nothing new is known of the same Service.
fn endpoint_status(
    group: &LeaderGroup,
    planned: Option<&LeaderEndpoint>,
    previous: &LeaderGroupStatus,
) -> Option<EndpointStatus> {
    let service = group.spec.service.as_ref()?;
    match planned {
        Some(e) => Some(EndpointStatus {
            service: e.service.name.clone(),
            address: e.leader.as_ref().map(|a| a.ip.clone()),
            term: e.term as i64,
        }),
        None => previous
            .endpoint
            .clone()
            .filter(|e| e.service == service.name),
    }
}

/// Rule: with `spec.service`, the `LeaderEndpoint` condition says what the
/// slice holds once the planned write is made (reconcile turns it False
/// when the write fails); while nothing new is known, it stays as it was.
fn endpoint_condition(
    group: &LeaderGroup,
    planned: Option<&LeaderEndpoint>,
    previous: &LeaderGroupStatus,
) -> Option<Condition> {
    group.spec.service.as_ref()?;
    let Some(e) = planned else {
        return previous.condition(types::LEADER_ENDPOINT);
    };
    let holds = match &e.leader {
        Some(a) => format!("{} ({})", a.pod, a.ip),
        None if e.unconfirmed => "no address (its leader cannot be confirmed)".to_owned(),
        None => "no address (no one leads)".to_owned(),
    };
    Some(condition(
        types::LEADER_ENDPOINT,
        true,
        reasons::ENDPOINT_WRITTEN,
        format!(
            "EndpointSlice {} of Service {} holds {holds} at term {}",
            e.slice_name(),
            e.service.name,
            e.term
        ),
    ))
}

/// Rule: a Service the status records under another name than the spec's
/// (renamed, or `spec.service` removed) is removed, with its slice.
fn retired_service(group: &LeaderGroup, previous: &LeaderGroupStatus) -> Option<String> {
    let recorded = &previous.endpoint.as_ref()?.service;
    let wanted = group.spec.service.as_ref().map(|s| &s.name);
    (wanted != Some(recorded)).then(|| recorded.clone())
}

/// Rule: when the holder the status names is gone and another member is
/// live, nothing is written for [`SUCCESSOR_GRACE_MS`] from when this was
/// first seen (`gone_since`, or now): the successor's claim usually comes
/// within it, and the change is then written once. Returns `(since,
/// remaining)` in ms while waiting.
fn awaiting_successor(
    previous: &LeaderGroupStatus,
    holder: Option<&str>,
    state: &GroupState,
    gone_since: Option<u64>,
) -> Option<(u64, u64)> {
    let old = previous.holder.as_deref()?;
    if holder.is_some() || !state.members.iter().any(|(node, _)| node != old) {
        return None;
    }
    let since = gone_since.unwrap_or(state.now_ms);
    let waited = state.now_ms.saturating_sub(since);
    (waited < SUCCESSOR_GRACE_MS).then(|| (since, SUCCESSOR_GRACE_MS - waited))
}

/// Rule: the spec is checked by the schema's rules (for API servers
/// without CEL); invalid timings are a `SpecValid=False` condition and no
/// timings are written to the store; an unusable role label is one too, and no
/// pod is labelled; so is an unusable `spec.service`, and no endpoint is
/// written.
fn spec_validity(spec: &LeaderGroupSpec) -> (Condition, Option<ElectionConfig>) {
    let invalid = |reason, why| condition(types::SPEC_VALID, false, reason, why);
    let config = match spec.election_config() {
        Ok(config) => config,
        Err(e) => {
            let why = crate::crd::spec_error_message(&e);
            return (invalid(reasons::INVALID_TIMINGS, why), None);
        }
    };
    let service_error = spec.service.as_ref().and_then(LeaderService::error);
    let valid = match (spec.role_label_error(), service_error) {
        (None, None) => condition(
            types::SPEC_VALID,
            true,
            reasons::VALID,
            "the timings are within their bounds",
        ),
        (Some(why), _) => invalid(reasons::INVALID_ROLE_LABEL, why),
        (None, Some(why)) => invalid(reasons::INVALID_SERVICE, why),
    };
    (valid, Some(config))
}

/// Rule: across clusters, the clusters' LeaderGroups agree on the timings
/// before any controller writes them. Each records its own
/// (`Store::vote_spec`) and compares the others' fresh records: while one
/// differs, `SpecConflict` is True in every cluster that sees it, and the
/// store keeps the timings it has, so two clusters never take turns
/// writing theirs. Returns the condition (none in one cluster; the last
/// one while nothing new is known) and whether the timings may be written.
fn spec_conflict(
    config: Option<ElectionConfig>,
    cluster: Option<&str>,
    votes: Option<&[SpecVote]>,
    previous: &LeaderGroupStatus,
) -> (Option<Condition>, bool) {
    let Some(cluster) = cluster else {
        return (None, true);
    };
    let (Some(config), Some(votes)) = (config, votes) else {
        return (previous.condition(types::SPEC_CONFLICT), false);
    };
    let timings = |c: Option<ElectionConfig>| match c {
        Some(c) => format!(
            "ttlMs {}, renewIntervalMs {}, retryIntervalMs {}",
            c.ttl_ms, c.renew_interval_ms, c.retry_interval_ms
        ),
        None => "timings that cannot be read".to_owned(),
    };
    let differ: Vec<String> = votes
        .iter()
        .filter(|v| v.cluster != cluster && v.age_ms < SPEC_VOTE_STALE_MS)
        .filter(|v| v.config != Some(config))
        .map(|v| format!("cluster {} has {}", v.cluster, timings(v.config)))
        .collect();
    if differ.is_empty() {
        let agree = condition(
            types::SPEC_CONFLICT,
            false,
            reasons::TIMINGS_AGREE,
            "every cluster's LeaderGroup has these timings",
        );
        return (Some(agree), true);
    }
    let message = format!(
        "{}, this cluster {}: the store keeps the timings it has until the clusters' LeaderGroups agree",
        differ.join("; "),
        timings(Some(config))
    );
    let conflict = condition(types::SPEC_CONFLICT, true, reasons::TIMINGS_DIFFER, message);
    (Some(conflict), false)
}

/// Rule: the store server's unsafe settings are reported on every group,
/// one sentence each, without making any group unready.
fn store_settings(warnings: &[SettingWarning]) -> Condition {
    if warnings.is_empty() {
        return condition(
            types::STORE_SETTINGS_SAFE,
            true,
            reasons::SAFE_SETTINGS,
            "nothing in the store server's settings weakens a guarantee",
        );
    }
    let message = warnings
        .iter()
        .map(|w| w.message.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    condition(
        types::STORE_SETTINGS_SAFE,
        false,
        reasons::UNSAFE_SETTINGS,
        message,
    )
}

/// Rule: while the store cannot be read, every label stays as it is (a guess
/// could label two pods); only the conditions say so. Across clusters
/// (`--cluster`), once the lease this controller last saw must have run
/// out (its time left at the last read of the store), the leader label comes
/// off this cluster's pods (and the address off its leader Service's slice,
/// see [`unconfirmed_endpoint`]), once, with a `LeaderUnconfirmed` warning: a
/// cluster that shares the store may have elected a leader meanwhile, and
/// a client here must not be sent to a leader nobody can confirm. In one
/// cluster the label stays: no leader can be elected that this controller
/// would not see once the store answers, and a leader whose lease still
/// runs (the controller alone cut off) keeps serving.
fn while_store_is_unavailable(
    observed: &Observed<'_>,
    previous: &LeaderGroupStatus,
    spec_valid: Condition,
    config: Option<ElectionConfig>,
    reason: &str,
) -> Plan {
    let group = observed.group;
    let now_ms = observed.local_now_ms;
    // When the lease last seen must have run out, across clusters.
    let runs_out_at = observed.cluster.and(observed.lease_seen_until_ms);
    let unconfirmed = runs_out_at.is_some_and(|at| now_ms >= at);
    let ready = if unconfirmed {
        condition(
            types::READY,
            false,
            reasons::LEADER_UNCONFIRMED,
            "the store has not answered since the lease it last showed ran out: no pod of this cluster is labelled leader until it answers",
        )
    } else {
        condition(
            types::READY,
            false,
            reasons::STORE_UNAVAILABLE,
            "the group's state cannot be read",
        )
    };
    let mut next = vec![
        spec_valid,
        condition(
            types::STORE_AVAILABLE,
            false,
            reasons::STORE_UNAVAILABLE,
            reason,
        ),
        ready,
    ];
    let kept = [
        types::LEADER_ELECTED,
        types::STORE_SETTINGS_SAFE,
        types::SPEC_CONFLICT,
    ];
    next.extend(
        (previous.conditions.iter())
            .filter(|c| kept.contains(&c.type_.as_str()))
            .cloned(),
    );
    // As it was, unless the slice's address is taken off.
    let endpoint = unconfirmed
        .then(|| unconfirmed_endpoint(group, previous))
        .flatten();
    next.extend(endpoint_condition(group, endpoint.as_ref(), previous));
    let now = time_of(now_ms);
    let mut status = previous.clone();
    status.conditions =
        conditions::merge(&previous.conditions, next, &now, group.metadata.generation);
    status.observed_generation = group.metadata.generation;
    let (labels, events) = if unconfirmed {
        status.leader = None;
        leader_labels_off(observed)
    } else {
        (Vec::new(), Vec::new())
    };
    if endpoint.is_some() {
        status.endpoint = endpoint_status(group, endpoint.as_ref(), previous);
    }
    let write_status = status != *previous;
    Plan {
        labels,
        status,
        write_status,
        events,
        endpoint,
        // Across clusters, written only once the clusters' records are read
        // (see `spec_conflict`).
        config: config.filter(|_| observed.cluster.is_none()),
        // Looked at again when the lease seen last must have run out, and
        // after it as often as a lease lasts, to relabel once the store
        // answers.
        look_again_ms: runs_out_at.map(|at| {
            if unconfirmed {
                config.unwrap_or_default().ttl_ms
            } else {
                at - now_ms
            }
        }),
        ..Plan::default()
    }
}

/// The changes that take this cluster's leader labels of the group off
/// (to `follower`), with the Event that says so.
fn leader_labels_off(observed: &Observed<'_>) -> (Vec<LabelChange>, Vec<PlannedEvent>) {
    let sorted = PodsOfGroup::sort(observed);
    let key = &observed.group.spec.role_label;
    let labels: Vec<LabelChange> = (observed.pods.iter())
        .filter(|p| sorted.labellable(&p.name))
        .filter(|p| p.labels.get(key).map(String::as_str) == Some(LEADER))
        .map(|p| LabelChange {
            pod: p.name.clone(),
            key: key.clone(),
            value: Some(FOLLOWER.to_owned()),
        })
        .collect();
    if labels.is_empty() {
        return (labels, Vec::new());
    }
    let pods: Vec<&str> = labels.iter().map(|c| c.pod.as_str()).collect();
    let event = PlannedEvent {
        reason: event_reasons::LEADER_UNCONFIRMED,
        note: format!(
            "the store has not answered for a lease's length: leader label taken off pod {} (another cluster may elect a leader meanwhile)",
            pods.join(", ")
        ),
        warning: true,
    };
    (labels, vec![event])
}

/// The namespace's pods as this group sees them.
struct PodsOfGroup<'a> {
    /// Pods its selector picks.
    selected: BTreeSet<&'a str>,
    /// Selected pods it leaves to another group with the same label key
    /// whose name sorts first.
    yielded: BTreeSet<&'a str>,
    /// Pods another group with the same label key also selects, with that
    /// group's name.
    shared: Vec<(&'a str, &'a str)>,
    /// The selectors of the other groups with the same label key.
    same_key: SelectorIndex,
}

impl<'a> PodsOfGroup<'a> {
    /// Rule: two groups that write one label key on one pod get a
    /// `LabelConflict` condition; the group whose name sorts first labels
    /// the pod, so the label never flaps between them.
    fn sort(observed: &Observed<'a>) -> Self {
        let group = observed.group;
        let name = group.metadata.name.as_deref().unwrap_or_default();
        let own = PodSelector::new(&group.spec.selector);
        let mine: Vec<&PodView> = observed
            .pods
            .iter()
            .filter(|p| own.matches(&p.labels))
            .collect();
        let selected: BTreeSet<&str> = mine.iter().map(|p| p.name.as_str()).collect();
        let mut yielded = BTreeSet::new();
        let mut shared = Vec::new();
        let same_key_groups: Vec<&OtherGroup> = same_key(group, observed.others).collect();
        let same_key = SelectorIndex::new(same_key_groups.iter().map(|o| &o.selector));
        // Which group shares a pod is worked out only for the pods the
        // index says are shared: nearly always none.
        let contested: Vec<&&PodView> = mine
            .iter()
            .filter(|p| same_key.any_matches(&p.labels))
            .collect();
        if !contested.is_empty() {
            for other in &same_key_groups {
                let theirs = PodSelector::new(&other.selector);
                for pod in contested.iter().filter(|p| theirs.matches(&p.labels)) {
                    shared.push((pod.name.as_str(), other.name.as_str()));
                    if other.name.as_str() < name {
                        yielded.insert(pod.name.as_str());
                    }
                }
            }
        }
        Self {
            selected,
            yielded,
            shared,
            same_key,
        }
    }

    /// Whether another group with the same label key selects `pod`.
    fn claimed_by_another(&self, pod: &PodView) -> bool {
        self.same_key.any_matches(&pod.labels)
    }

    fn labellable(&self, pod: &str) -> bool {
        self.selected.contains(pod) && !self.yielded.contains(pod)
    }

    fn conflicts(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .shared
            .iter()
            .map(|(pod, other)| format!("pod {pod} is also selected by group {other}"))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Rule: the term never goes backwards. If the store lost the counter
/// (restarted empty), the status remembers it and it is restored.
fn the_term_never_goes_back(
    previous: &LeaderGroupStatus,
    state: &GroupState,
) -> (u64, Option<u64>) {
    let previous_term = previous.term.unwrap_or(0).max(0) as u64;
    let restore = (state.term < previous_term).then_some(previous_term);
    (state.term.max(previous_term), restore)
}

/// The lease holder, if its lease is still running.
/// (Public for reconcile, which reads the holder's pod status.)
pub fn live_holder(state: &GroupState) -> Option<&str> {
    state
        .holder
        .as_deref()
        .filter(|_| state.lease_pttl_ms.is_some())
}

/// A member and the label its pod should carry, if it may be labelled.
struct PlannedMember<'a> {
    member: Member,
    labelled_pod: Option<&'a str>,
}

/// Rule: the members are the live candidacies, the holder always among
/// them; a member whose pod cannot be labelled is reported with the reason
/// and never labelled.
fn members<'a>(
    state: &'a GroupState,
    holder: Option<&str>,
    here: &Locality<'_>,
    sorted: &PodsOfGroup<'_>,
    pods: &[PodView],
    previous: &LeaderGroupStatus,
) -> Vec<PlannedMember<'a>> {
    let mut list: Vec<(&str, u64)> = state
        .members
        .iter()
        .map(|(n, e)| (n.as_str(), *e))
        .collect();
    if let Some(h) = state.holder.as_deref().filter(|_| holder.is_some()) {
        if !list.iter().any(|(n, _)| *n == h) {
            list.push((h, state.now_ms + state.lease_pttl_ms.unwrap_or(0)));
        }
    }
    list.sort();
    list.into_iter()
        .map(|(node, _)| {
            let place = here.place(node);
            // A member of another cluster is that cluster's to label.
            let (pod, cluster) = match place {
                Place::Here(pod) => (Some(pod), here.cluster),
                Place::Elsewhere { cluster, pod } => (Some(pod), Some(cluster)),
                Place::Nowhere => (None, None),
            };
            let problem = match place {
                Place::Nowhere => Some(MemberProblem::OtherNamespace),
                Place::Elsewhere { .. } => None,
                Place::Here(p) if !pods.iter().any(|pod| pod.name == p) => {
                    Some(MemberProblem::PodNotFound)
                }
                Place::Here(p) if !sorted.selected.contains(p) => Some(MemberProblem::NotSelected),
                Place::Here(p) if sorted.yielded.contains(p) => Some(MemberProblem::LabelConflict),
                Place::Here(_) => None,
            };
            let local_pod = here.pod(node);
            let role = if holder == Some(node) {
                MemberRole::Leader
            } else {
                MemberRole::Follower
            };
            let seen = previous.members.iter().find(|m| m.node == node);
            PlannedMember {
                member: Member {
                    node: node.to_owned(),
                    cluster: cluster.map(str::to_owned),
                    pod: pod.map(str::to_owned),
                    role,
                    problem,
                    priority: i64::from(
                        state
                            .priorities
                            .get(node)
                            .copied()
                            .unwrap_or(leasehold_engine::DEFAULT_PRIORITY),
                    ),
                    live_since: Some(
                        seen.and_then(|m| m.live_since.clone())
                            .unwrap_or_else(|| time_of(state.now_ms)),
                    ),
                    revision: local_pod
                        .and_then(|p| pods.iter().find(|v| v.name == p))
                        .and_then(|v| v.revision.clone()),
                    unhealthy: state.problems.get(node).cloned(),
                },
                labelled_pod: local_pod.filter(|_| problem.is_none()),
            }
        })
        .collect()
}

/// Rules: the leader pod is labelled `leader` and the other labellable
/// members `follower`; pods that stopped being live members lose the label
/// (unless another group with the same key selects them); and the changes
/// come in three waves, taking `leader` away before giving it, so a
/// selector never matches two pods.
fn label_changes(
    observed: &Observed<'_>,
    sorted: &PodsOfGroup<'_>,
    members: &[PlannedMember<'_>],
) -> Vec<LabelChange> {
    let key = &observed.group.spec.role_label;
    let desired: BTreeMap<&str, &str> = members
        .iter()
        .filter_map(|m| m.labelled_pod.map(|p| (p, m.member.role.label_value())))
        .collect();
    let (mut take_leader, mut between, mut give_leader) = (Vec::new(), Vec::new(), Vec::new());
    for pod in observed.pods {
        let current = pod.labels.get(key).map(String::as_str);
        let wanted = if sorted.labellable(&pod.name) {
            desired.get(pod.name.as_str()).copied()
        } else {
            // Not ours to label: clean up our key only where no other group
            // with the same key selects the pod.
            if !carries_a_role(current) || sorted.claimed_by_another(pod) {
                continue;
            }
            None
        };
        if current == wanted {
            continue;
        }
        let change = LabelChange {
            pod: pod.name.clone(),
            key: key.clone(),
            value: wanted.map(str::to_owned),
        };
        if current == Some(LEADER) {
            take_leader.push(change);
        } else if wanted == Some(LEADER) {
            give_leader.push(change);
        } else {
            between.push(change);
        }
    }
    take_leader
        .into_iter()
        .chain(between)
        .chain(give_leader)
        .collect()
}

/// Rule: a deleted group takes its role label off every pod it selects that
/// carries it as `leader` or `follower`, except where another group of the
/// namespace with the same label key selects the pod (that group's label,
/// now). Pods it does not select are not its own to touch, whatever they
/// carry. The leader's label goes first, so a leader Service stops routing
/// at once.
pub fn role_labels_to_remove(
    group: &LeaderGroup,
    pods: &[PodView],
    others: &[OtherGroup],
) -> Vec<LabelChange> {
    let key = &group.spec.role_label;
    let same_key = SelectorIndex::new(same_key(group, others).map(|o| &o.selector));
    let own = PodSelector::new(&group.spec.selector);
    let mut changes: Vec<LabelChange> = pods
        .iter()
        .filter(|pod| own.matches(&pod.labels))
        .filter(|pod| carries_a_role(pod.labels.get(key).map(String::as_str)))
        .filter(|pod| !same_key.any_matches(&pod.labels))
        .map(|pod| LabelChange {
            pod: pod.name.clone(),
            key: key.clone(),
            value: None,
        })
        .collect();
    changes.sort_by_key(|c| {
        let leader = pods
            .iter()
            .any(|p| p.name == c.pod && p.labels.get(key).map(String::as_str) == Some(LEADER));
        !leader
    });
    changes
}

/// Rule: a change of holder is one Event: `LeaderElected` naming the new
/// leader (and the node it took over from), or a `LeaderLost` warning when
/// nobody took over.
fn leader_change_events(
    previous: &LeaderGroupStatus,
    holder: Option<&str>,
    shown_holder: Option<&str>,
    term: u64,
) -> Vec<PlannedEvent> {
    if holder == previous.holder.as_deref() {
        return Vec::new();
    }
    let event = match (holder, &previous.holder) {
        (Some(new), old) => {
            let who = shown_holder.map_or_else(|| format!("node {new}"), |p| format!("pod {p}"));
            let after = old
                .as_ref()
                .map_or_else(String::new, |old| format!(", after node {old}"));
            PlannedEvent {
                reason: event_reasons::LEADER_ELECTED,
                note: format!("{who} leads under term {term}{after}"),
                warning: false,
            }
        }
        (None, Some(old)) => PlannedEvent {
            reason: event_reasons::LEADER_LOST,
            note: format!("node {old} lost the lease and nobody took over"),
            warning: true,
        },
        (None, None) => return Vec::new(),
    };
    vec![event]
}

/// Rule: a member whose application turns unhealthy (its agent's health
/// check) is reported once, with the reason, as a `MemberUnhealthy`
/// warning; it stays a member (labelled `follower`) that does not lead.
fn report_unhealthy(
    previous: &LeaderGroupStatus,
    members: &[PlannedMember<'_>],
    events: &mut Vec<PlannedEvent>,
) {
    for m in members {
        let Some(reason) = &m.member.unhealthy else {
            continue;
        };
        let was = previous
            .members
            .iter()
            .find(|p| p.node == m.member.node)
            .and_then(|p| p.unhealthy.as_ref());
        if was.is_some() {
            continue;
        }
        let who = m
            .member
            .pod
            .as_ref()
            .map_or_else(|| format!("node {}", m.member.node), |p| format!("pod {p}"));
        events.push(PlannedEvent {
            reason: event_reasons::MEMBER_UNHEALTHY,
            note: format!("{who} does not take the lead: {reason}"),
            warning: true,
        });
    }
}

/// Rule: a sweep that removed nodes this group last listed as members is
/// reported once (`lastSweep` and a `NodesSwept` event).
fn report_sweeps(
    previous: &LeaderGroupStatus,
    swept: &[(String, u64)],
    events: &mut Vec<PlannedEvent>,
) -> Option<LastSweep> {
    let reported = previous.last_sweep.as_ref().map(|s| &s.time);
    let news: Vec<&(String, u64)> = swept
        .iter()
        .filter(|(node, at)| {
            reported.is_none_or(|t| time_of(*at) > *t)
                && previous.members.iter().any(|m| &m.node == node)
        })
        .collect();
    let Some(latest) = news.iter().map(|(_, at)| *at).max() else {
        return previous.last_sweep.clone();
    };
    let nodes: Vec<String> = news.iter().map(|(n, _)| n.clone()).collect();
    events.push(PlannedEvent {
        reason: event_reasons::NODES_SWEPT,
        note: format!("expired nodes removed: {}", nodes.join(", ")),
        warning: false,
    });
    Some(LastSweep {
        time: time_of(latest),
        nodes,
    })
}

/// The value of `group`'s annotation `key`, if set.
fn annotation(group: &LeaderGroup, key: &str) -> Option<String> {
    group.metadata.annotations.as_ref()?.get(key).cloned()
}

/// Rule: each new value of the step-down annotation asks the holder to
/// step down, once; the value handled is kept in the status.
fn step_down_on_annotation(
    group: &LeaderGroup,
    previous: &LeaderGroupStatus,
    holder: Option<&str>,
    events: &mut Vec<PlannedEvent>,
) -> (Option<String>, Option<String>) {
    let annotation = annotation(group, STEP_DOWN_ANNOTATION);
    if annotation.is_none() || annotation == previous.handled_step_down {
        return (None, previous.handled_step_down.clone());
    }
    let note = match holder {
        Some(h) => format!("asked node {h} to step down"),
        None => "no leader to step down".to_owned(),
    };
    events.push(PlannedEvent {
        reason: event_reasons::STEP_DOWN_REQUESTED,
        note,
        warning: false,
    });
    (holder.map(str::to_owned), annotation)
}

/// Rule: each new value of the step-down-to annotation asks the holder to
/// hand over to that pod once (placement decides whether it may); a
/// refusal is a warning Event and a `Handover=False` condition, and the
/// leader leads on. The value handled is kept in the status until the
/// annotation is removed; the condition stays until the next request.
fn step_down_to_on_annotation(
    group: &LeaderGroup,
    previous: &LeaderGroupStatus,
    seat: &Seat<'_>,
    events: &mut Vec<PlannedEvent>,
) -> (Option<Handover>, Option<String>, Option<Condition>) {
    let kept = previous.condition(types::HANDOVER);
    let annotation = annotation(group, STEP_DOWN_TO_ANNOTATION);
    // Removing the annotation forgets the value handled, so the same pod
    // can be asked for again.
    if annotation.is_none() || annotation == previous.handled_step_down_to {
        return (None, annotation, kept);
    }
    let pod = annotation.as_deref().unwrap_or_default().trim();
    match placement::requested(seat, pod) {
        Ok(handover) => {
            let message = format!("asked node {} to hand over to pod {pod}", handover.from);
            let condition = condition(types::HANDOVER, true, reasons::HANDOVER_REQUESTED, message);
            (Some(handover), annotation, Some(condition))
        }
        Err(why) => {
            events.push(PlannedEvent {
                reason: event_reasons::HANDOVER_REFUSED,
                note: format!(
                    "{STEP_DOWN_TO_ANNOTATION}={pod} refused: {why}; the leader leads on"
                ),
                warning: true,
            });
            let condition = condition(
                types::HANDOVER,
                false,
                reasons::SUCCESSOR_REFUSED,
                why.to_string(),
            );
            (None, annotation, Some(condition))
        }
    }
}

/// The Event of a handover asked for.
fn handover_event(h: &Handover, rollout: Option<&crate::crd::Rollout>) -> PlannedEvent {
    let why = match (h.reason.as_str(), rollout) {
        (placement::reasons::ROLLOUT, Some(r)) => format!("rollout to revision {}", r.revision),
        (placement::reasons::FAILBACK, _) => "failback to a member of higher priority".to_owned(),
        _ => format!("{STEP_DOWN_TO_ANNOTATION} annotation"),
    };
    PlannedEvent {
        reason: event_reasons::HANDOVER_REQUESTED,
        note: format!(
            "asked node {} (term {}) to hand over to node {}: {why}",
            h.from, h.term, h.to
        ),
        warning: false,
    }
}

/// Rule: the preferred members are written into the store when they differ
/// from the ones the store holds (none outside a rollout): a list left by a
/// controller that failed before its status write, or lost with the store's
/// data, is put right at the next reconcile.
fn preferred_nodes_to_write(
    state: &GroupState,
    rollout: Option<&crate::crd::Rollout>,
) -> PreferredMembers {
    let was = state.preferred.clone().filter(|p| !p.is_empty());
    let now = rollout
        .map(|r| r.preferred.clone())
        .filter(|p| !p.is_empty());
    match now {
        _ if was == now => PreferredMembers::Keep,
        Some(nodes) => PreferredMembers::Write(nodes),
        None => PreferredMembers::Remove,
    }
}

fn leader_elected(
    holder: Option<&str>,
    leader_pod: Option<&str>,
    elsewhere: Option<(&str, &str)>,
    term: u64,
) -> Condition {
    if let Some((cluster, pod)) = elsewhere {
        return condition(
            types::LEADER_ELECTED,
            true,
            reasons::LEASE_HELD_IN_OTHER_CLUSTER,
            format!("pod {pod} of cluster {cluster} holds the lease under term {term}"),
        );
    }
    match (holder, leader_pod) {
        (Some(_), Some(p)) => condition(
            types::LEADER_ELECTED,
            true,
            reasons::LEASE_HELD,
            format!("pod {p} holds the lease under term {term}"),
        ),
        (Some(h), None) => condition(
            types::LEADER_ELECTED,
            true,
            reasons::LEASE_HELD_BY_NODE_WITHOUT_POD,
            format!("node {h} holds the lease but is not a pod of this namespace"),
        ),
        (None, _) => condition(
            types::LEADER_ELECTED,
            false,
            reasons::NO_LEADER,
            "nobody holds the lease",
        ),
    }
}

fn label_conflict(conflicts: &[String]) -> Condition {
    if conflicts.is_empty() {
        condition(
            types::LABEL_CONFLICT,
            false,
            reasons::NO_CONFLICT,
            "no other group writes this label key on these pods",
        )
    } else {
        condition(
            types::LABEL_CONFLICT,
            true,
            reasons::SAME_ROLE_LABEL,
            format!(
                "{}; give one group another spec.roleLabel (the group whose name sorts first labels shared pods)",
                conflicts.join("; ")
            ),
        )
    }
}

/// Rule: a plan reads only some of the namespace's pods: those its
/// selector matches, those its members and its holder run in, and those
/// that carry its label key as `leader` or `follower` where no other group
/// with that key selects them (their label is its to clean up). On these
/// it decides exactly as on all of them, so a reconcile copies only these
/// out of the cache: with 1,000 groups of 3 pods in one namespace, 3 to 6
/// pods instead of 3,000.
pub struct PodsRead {
    own: PodSelector,
    key: String,
    same_key: SelectorIndex,
    /// Pods named by the members and the holder in the store.
    named: BTreeSet<String>,
}

impl PodsRead {
    pub fn new(
        group: &LeaderGroup,
        others: &[OtherGroup],
        store: &StoreView,
        cluster: Option<&str>,
    ) -> Self {
        let namespace = group.metadata.namespace.as_deref().unwrap_or_default();
        let key = group.spec.role_label.clone();
        let same_key = SelectorIndex::new(same_key(group, others).map(|o| &o.selector));
        let named = named_pods(&Locality { cluster, namespace }, store);
        Self {
            own: PodSelector::new(&group.spec.selector),
            key,
            same_key,
            named,
        }
    }

    /// Whether the plan needs the pod `name` with these labels.
    pub fn needs(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.named.contains(name)
            || self.own.matches(labels)
            || (carries_a_role(labels.get(&self.key).map(String::as_str))
                && !self.same_key.any_matches(labels))
    }
}

/// The pods of this cluster and namespace that the store names as the
/// group's members or holder.
pub fn named_pods(here: &Locality<'_>, store: &StoreView) -> BTreeSet<String> {
    match store {
        StoreView::Available(state) => state
            .members
            .iter()
            .map(|(node, _)| node.as_str())
            .chain(state.holder.as_deref())
            .filter_map(|node| here.pod(node))
            .map(str::to_owned)
            .collect(),
        StoreView::Unavailable(_) => BTreeSet::new(),
    }
}

/// The other groups of the namespace that write the same label key.
fn same_key<'o>(
    group: &LeaderGroup,
    others: &'o [OtherGroup],
) -> impl Iterator<Item = &'o OtherGroup> {
    let name = group.metadata.name.clone().unwrap_or_default();
    let key = group.spec.role_label.clone();
    others
        .iter()
        .filter(move |o| o.role_label == key && o.name != name)
}

/// A role label value this controller writes (and so may take off).
pub(crate) fn carries_a_role(value: Option<&str>) -> bool {
    matches!(value, Some(LEADER) | Some(FOLLOWER))
}

/// Rule: status is written only when something a user reads changed. No
/// field moves with a renewal (see [`LeaderGroupStatus`]), so a group at
/// rest costs its resync a read of the store and no write.
pub(crate) fn status_changed(status: &LeaderGroupStatus, previous: &LeaderGroupStatus) -> bool {
    status != previous
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
