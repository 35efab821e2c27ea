//! The I/O around [`plan`](crate::plan): read the LeaderGroup's world, ask
//! the plan, apply what it says in order (the leader endpoint first, then
//! the store, the labels, commands, Events, the status). Only the replica
//! that holds the controllers' own lease writes: it checks the lease when
//! the reconcile starts, and again right before every label patch, slice
//! write and the status write (the Kubernetes writes a stale replica could
//! get wrong). A replica can still stop between a check and its write for
//! longer than its lease, so the writes are fenced besides: the slice by
//! its term, each label patch by the pod's resourceVersion as the plan
//! read it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store as Reflector;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::conditions::{self, condition, reasons, types};
use crate::crd::LeaderGroup;
use crate::endpoint_writer::{EndpointError, Outcome};
use crate::event_log::EventLog;
use crate::memory::Memory;
use crate::metrics::ControllerMetrics;
use crate::neighbourhood::Neighbourhood;
use crate::plan::{
    plan, role_labels_to_remove, LabelChange, Observed, OtherGroup, Plan, PodView, PodsRead,
    PreferredMembers, StoreView, LEADER, SPEC_VOTE_REFRESH_MS,
};
use crate::pod_status::Known;
use leasehold_daemon::names::NamespacedName;
use leasehold_engine::store::{bounded, SpecVote};
use leasehold_engine::sync::{locked, wall_clock_ms};
use leasehold_engine::{Group, Node};

/// Field manager of every write, so server-side apply knows what is ours.
pub const MANAGER: &str = "leasehold-controller";

/// How long one read of a group's state in the store may take.
const STORE_READ: Duration = Duration::from_secs(2);

pub struct Context {
    pub client: kube::Client,
    /// The controller's own engine node: reads the store, sweeps, sends commands.
    pub node: Arc<Node>,
    /// The controllers' own group: only its leader writes.
    pub leadership: Group,
    pub events: EventLog,
    pub groups: Reflector<LeaderGroup>,
    /// The pods of the watched namespaces, their metadata only, kept by one
    /// watch: a reconcile reads them here, never with a LIST of its own.
    pub pods: Reflector<PartialObjectMeta<Pod>>,
    /// Nodes this replica's sweeper removed recently (node id, ms).
    pub swept: Mutex<Vec<(String, u64)>>,
    /// Requeue interval: the safety net under the watch and store events.
    pub resync: Duration,
    /// The store server's unsafe settings, as last read (for a condition).
    pub store_settings: tokio::sync::watch::Receiver<Vec<leasehold_engine::SettingWarning>>,
    /// What reconciles remember of each other, and of what they read.
    pub memory: Memory,
    /// This cluster's name (`--cluster`), when groups span clusters.
    pub cluster: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("LeaderGroup has no namespace")]
    NoNamespace,
    /// The pod cache has not been filled by its first LIST yet: nothing is
    /// decided on a partial view of the pods.
    #[error("the pod cache is not filled yet")]
    PodsNotCached,
    #[error("labelling pod {pod}: {source}")]
    LabelPod {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing status: {0}")]
    Status(#[source] kube::Error),
    /// The preferred members could not be written into the store: the
    /// status is not written either, so the next reconcile tries again.
    #[error("writing the preferred members into the store: {0}")]
    Preferred(#[source] leasehold_engine::StoreError),
    #[error("this replica stopped being the active one before the clean-up was done")]
    NotActive,
    /// The leader Service's slice could not be written; the labels and the
    /// status were (the status says so in its `LeaderEndpoint` condition).
    #[error("writing the leader endpoint: {0}")]
    Endpoint(#[source] EndpointError),
}

impl ReconcileError {
    /// A fixed label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NoNamespace => "no_namespace",
            Self::PodsNotCached => "pods_not_cached",
            Self::LabelPod { .. } => "label_pod",
            Self::Status(_) => "status",
            Self::Preferred(_) => "preferred",
            Self::NotActive => "not_active",
            Self::Endpoint(_) => "endpoint",
        }
    }
}

fn pod_view(pod: &PartialObjectMeta<Pod>) -> PodView {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    PodView {
        name: pod.name_any(),
        revision: PodView::revision_of(&labels),
        labels,
        created_ms: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_millisecond().max(0) as u64),
        ready: None,
        ip: None,
        version: pod.metadata.resource_version.clone(),
    }
}

/// The leader's pod's IP and readiness, and during a rollout (the
/// members' pods are on more than one revision) each member pod's
/// readiness: the watch keeps metadata only, which does not say. They are
/// read from the API server only when the pod changed since they were last
/// read (see `pod_status`), so a group at rest reads nothing. A pod that
/// cannot be read stays unknown: never preferred, never Ready.
async fn read_statuses(
    pods: &mut [PodView],
    store: &StoreView,
    group: &LeaderGroup,
    ctx: &Context,
) {
    let (StoreView::Available(state), Some(namespace)) = (store, &group.metadata.namespace) else {
        return;
    };
    let here = crate::plan::Locality {
        cluster: ctx.cluster.as_deref(),
        namespace,
    };
    let holder_pod = crate::plan::live_holder(state).and_then(|node| here.pod(node));
    let member = |p: &PodView| {
        p.revision.is_some()
            && state
                .members
                .iter()
                .any(|(node, _)| here.pod(node) == Some(p.name.as_str()))
    };
    let rollout = group.spec.placement.prefer_updated && {
        let mut revisions = pods
            .iter()
            .filter(|p| member(p))
            .filter_map(|p| p.revision.as_deref());
        revisions
            .next()
            .is_some_and(|first| !revisions.all(|r| r == first))
    };
    for pod in pods.iter_mut() {
        let leads = holder_pod == Some(pod.name.as_str());
        if !(leads || (rollout && member(pod))) {
            continue;
        }
        if let Some(known) = pod_status(namespace, &pod.name, ctx).await {
            pod.ready = Some(known.ready);
            pod.ip = known.ip;
        }
    }
}

/// The pod's IP and readiness: as last read while the cache shows the same
/// version, from the API server otherwise (a pod gone is not ready).
async fn pod_status(namespace: &str, pod: &str, ctx: &Context) -> Option<Known> {
    let key = format!("{namespace}/{pod}");
    let version = cached_version(namespace, pod, ctx);
    if let Some(known) = ctx.memory.pod_statuses.at(&key, version.as_deref()) {
        return Some(known);
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    match api.get_opt(pod).await {
        Ok(Some(full)) => {
            let known = Known::of(&full);
            ctx.memory.pod_statuses.record(&key, known.clone());
            Some(known)
        }
        Ok(None) => {
            ctx.memory.pod_statuses.forget(&key);
            Some(Known::default())
        }
        Err(e) => {
            tracing::debug!(%pod, error = %e, "could not read the pod's IP and readiness");
            None
        }
    }
}

/// A hash of what a plan reads from the group object apart from its
/// status: the spec, the annotations (a step-down) and deletion (the
/// predicate's cache already tells objects apart by uid). A change of
/// status alone (this controller's own writes, most of all) triggers no
/// reconcile; the resync still reads it.
pub fn what_the_plan_reads(group: &LeaderGroup) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&group.spec).ok()?.hash(&mut hasher);
    let meta = &group.metadata;
    meta.annotations.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_millisecond())
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Records the reconcile's duration however it ends.
struct Timer<'a>(Instant, &'a ControllerMetrics);
impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.1.observe_reconcile(self.0.elapsed());
    }
}

/// Read, decide, write: the group's world is read, [`plan`] decides, and
/// its writes are applied in order, each behind a check that this replica
/// still leads.
#[tracing::instrument(skip_all, fields(group = %group.name_any(), namespace = group.namespace().unwrap_or_default()))]
pub async fn reconcile(
    group: Arc<LeaderGroup>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let _timer = Timer(Instant::now(), &ctx.memory.metrics);
    let ctx = ctx.as_ref();
    if !ctx.leadership.is_leader() {
        if ctx.cluster.is_some() {
            return unconfirm_while_cut_off(&group, ctx).await;
        }
        // A standby keeps its caches warm and writes nothing.
        return Ok(Action::requeue(ctx.resync));
    }
    let namespace = group.namespace().ok_or(ReconcileError::NoNamespace)?;
    let store_group = NamespacedName::new(&namespace, group.name_any()).to_string();
    let group = with_own_last_status(&group, &store_group, ctx);
    let asked_ms = wall_clock_ms();
    let world = World::read(&group, &namespace, &store_group, ctx).await?;
    let read_took = Duration::from_millis(wall_clock_ms().saturating_sub(asked_ms));
    let lease_seen_until_ms = note_read(&store_group, asked_ms, &world.store, &group, ctx);
    let plan = plan(&Observed {
        group: &group,
        cluster: ctx.cluster.as_deref(),
        votes: world.votes.as_deref(),
        pods: &world.pods,
        others: &world.others,
        store: &world.store,
        swept: &world.swept,
        local_now_ms: wall_clock_ms(),
        store_warnings: &ctx.store_settings.borrow().clone(),
        lease_seen_until_ms,
        holder_gone_since_ms: ctx.memory.of(&store_group, |m| m.holder_gone_since_ms),
    });
    let since = plan.awaiting_successor.map(|(since, _)| since);
    ctx.memory
        .of(&store_group, |m| m.holder_gone_since_ms = since);
    if let Some((_, remaining)) = plan.awaiting_successor {
        return Ok(Action::requeue(Duration::from_millis(remaining)));
    }
    let mut plan = plan;
    let active = || ctx.leadership.is_leader();
    // Across clusters, a replica cut off from the store loses its lease
    // about when the lease it last saw runs out: what the plan takes off
    // then needs none (see `unconfirm_while_cut_off`).
    let anyone = || true;
    let cut_off = ctx.cluster.is_some() && matches!(world.store, StoreView::Unavailable(_));
    let may_write: &(dyn Fn() -> bool + Sync) = if cut_off { &anyone } else { &active };
    let endpoint = match write_endpoint(&mut plan, &group, may_write, ctx).await {
        // Cut off, what the slice says does not hold back the labels.
        Ok(Some(Outcome::Stale)) if !cut_off => return Ok(Action::requeue(STALE_AGAIN)),
        Ok(Some(Outcome::NotActive)) => return Ok(Action::requeue(ctx.resync)),
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    };
    apply_to_store(&plan, &store_group, ctx).await?;
    match apply_labels(&plan.labels, &world.pods, &namespace, may_write, ctx).await {
        Ok(true) if cut_off => acted_on(&plan, lease_seen_until_ms, &store_group, ctx),
        Ok(true) => {}
        // No longer the active replica: the rest is the new one's to write
        // (across clusters, perhaps this one's once cut off: looked at again
        // when the plan says).
        Ok(false) => return Ok(requeue_as_standby(&plan, &world, read_took, &group, ctx)),
        Err(e) if stale(&e) => {
            // What the plan read is behind the pod: the rest of it may be
            // too. The watch brings the change, which triggers the group
            // again at once; the requeue is the net under it.
            tracing::info!(error = %e, "a pod changed after the plan read it; planning again");
            return Ok(Action::requeue(STALE_AGAIN));
        }
        Err(e) => return Err(e),
    }
    send_commands(&plan, &store_group, ctx).await;
    record_events(&plan, &group, ctx).await;
    write_status(&plan, &group, &namespace, may_write, ctx).await?;
    ctx.memory.of(&store_group, |m| {
        if let Some(version) = group.resource_version().filter(|_| plan.write_status) {
            m.last_written = Some((version, plan.status.clone()));
        }
        m.refusals = 0;
    });
    let figures =
        crate::metrics::GroupFigures::of(&plan.status, group.spec.election_config().ok().as_ref());
    ctx.memory.metrics.observe_group(
        &namespace,
        &group.name_any(),
        &figures,
        wall_clock_ms() as f64 / 1000.0,
    );
    endpoint?;
    Ok(Action::requeue(next_look(
        &plan, &world, read_took, &group, ctx,
    )))
}

/// Across clusters, cut off from the store: when the plan took the leader
/// off (the lease last seen has run out), the lapse it acted on, which
/// `unconfirm_while_cut_off` does not act on again.
fn acted_on(plan: &Plan, lapse_ms: Option<u64>, store_group: &str, ctx: &Context) {
    let unconfirmed = (plan.status.condition(types::READY))
        .is_some_and(|c| c.reason == reasons::LEADER_UNCONFIRMED);
    if unconfirmed {
        ctx.memory.of(store_group, |m| m.acted_on_ms = lapse_ms);
    }
}

/// When the plan asks to look again (the resync at the latest). Across
/// clusters, while the store does not answer (its read took `read_took`),
/// a read's bound early when the read waited out its bound: the read of
/// that look has failed by the time the lease last seen runs out, and the
/// label comes off then. A read that failed at once (a refused
/// connection) fails at once again: it is not asked early, so it does not
/// spin.
fn next_look(
    plan: &Plan,
    world: &World,
    read_took: Duration,
    group: &LeaderGroup,
    ctx: &Context,
) -> Duration {
    let Some(ms) = plan.look_again_ms else {
        return ctx.resync;
    };
    let mut again = Duration::from_millis(ms);
    let bound = read_bound(group, ctx);
    if let (Some(_), StoreView::Unavailable(_)) = (&ctx.cluster, &world.store) {
        if read_took >= bound / 2 {
            again = again.saturating_sub(bound);
        }
    }
    again.min(ctx.resync)
}

/// Across clusters, when the lease last read from the store must have run
/// out, remembered (`plan::Observed::lease_seen_until_ms`): from this read
/// (asked at `asked_ms`) when it answered, a ttl after the first failed one
/// when none did.
fn note_read(
    store_group: &str,
    asked_ms: u64,
    store: &StoreView,
    group: &LeaderGroup,
    ctx: &Context,
) -> Option<u64> {
    ctx.cluster.as_ref()?;
    let ttl_ms = group.spec.election_config().unwrap_or_default().ttl_ms;
    let seen = match store {
        StoreView::Available(state) => {
            let left = state.lease_pttl_ms.filter(|_| state.holder.is_some());
            Some(asked_ms + left.unwrap_or(ttl_ms))
        }
        StoreView::Unavailable(_) => None,
    };
    ctx.memory.of(store_group, |m| {
        m.lease_seen_until_ms = seen.or(m.lease_seen_until_ms).or(Some(asked_ms + ttl_ms));
        m.lease_seen_until_ms
    })
}

/// When a replica that stopped being the active one looks again: at the
/// resync, or across clusters when the plan asked (see
/// [`unconfirm_while_cut_off`]).
fn requeue_as_standby(
    plan: &Plan,
    world: &World,
    read_took: Duration,
    group: &LeaderGroup,
    ctx: &Context,
) -> Action {
    match &ctx.cluster {
        Some(_) => Action::requeue(next_look(plan, world, read_took, group, ctx)),
        None => Action::requeue(ctx.resync),
    }
}

/// How long a read of the group's state may take: across clusters, half a
/// ttl at most, so that a controller cut off from the store knows it within
/// the ttl (see `plan::while_store_is_unavailable`).
fn read_bound(group: &LeaderGroup, ctx: &Context) -> Duration {
    let half_ttl = group.spec.election_config().ok().map(|c| c.ttl() / 2);
    match (&ctx.cluster, half_ttl) {
        (Some(_), Some(half)) => STORE_READ.min(half),
        _ => STORE_READ,
    }
}

/// Across clusters, a replica cut off from the store loses its own lease
/// as well (it is kept in the store), so while the store is away no
/// replica of the cluster is active. The rule of
/// `plan::while_store_is_unavailable` is then kept by a replica that read
/// the group while it was active, once: when the store does not answer it
/// either, it takes this cluster's leader label, and the leader slice's
/// address, off when the lease it last saw must have run out, and says so
/// in the status and an Event. Taking a leader away never makes two
/// leaders, so it needs no lease; nothing else is written without it (no
/// Service, no slice made). A replica that can read the store leaves the
/// group to the active one, and forgets; so does one whose memory is a
/// lease older than itself (it has been a standby since: another replica
/// looks after the group). When another replica is active after all (only
/// this one cut off), it puts the label and the address back at its next
/// look: the status this one wrote tells it the slice changed
/// (`EndpointWriter::doubt`).
async fn unconfirm_while_cut_off(
    group: &LeaderGroup,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let standby = Ok(Action::requeue(ctx.resync));
    let namespace = group.namespace().ok_or(ReconcileError::NoNamespace)?;
    let store_group = NamespacedName::new(&namespace, group.name_any()).to_string();
    let Some(due_ms) = ctx.memory.of(&store_group, |m| m.lease_seen_until_ms) else {
        return standby;
    };
    let forget = || {
        ctx.memory.of(&store_group, |m| {
            m.lease_seen_until_ms = None;
            m.acted_on_ms = None;
        })
    };
    let ttl_ms = group.spec.election_config().unwrap_or_default().ttl_ms;
    // The store is asked a read's bound before the lease last seen runs
    // out, so that its silence is known by then.
    let bound = read_bound(group, ctx);
    let ask_ms = due_ms.saturating_sub(bound.as_millis() as u64);
    let now_ms = wall_clock_ms();
    if now_ms < ask_ms {
        return Ok(Action::requeue(Duration::from_millis(ask_ms - now_ms)));
    }
    let acted = ctx.memory.of(&store_group, |m| m.acted_on_ms);
    if now_ms > due_ms + ttl_ms || acted == Some(due_ms) {
        forget();
        return standby;
    }
    let read = ctx.node.store().group_state(&store_group);
    let reason = match bounded(bound, read).await {
        Err(e) => e.to_string(),
        Ok(_) => {
            forget();
            return standby;
        }
    };
    let now_ms = wall_clock_ms();
    if now_ms < due_ms {
        tokio::time::sleep(Duration::from_millis(due_ms - now_ms)).await;
    }
    // Once per cut, even if a write below fails: the next word on the
    // group is the store's.
    forget();
    let group = with_own_last_status(group, &store_group, ctx);
    let others = other_groups(&group, &namespace, ctx);
    let pods = cached_pods(&namespace, ctx, |_, _| true)?;
    let plan = plan(&Observed {
        group: &group,
        cluster: ctx.cluster.as_deref(),
        pods: &pods,
        others: &others,
        store: &StoreView::Unavailable(reason),
        swept: &[],
        local_now_ms: wall_clock_ms(),
        store_warnings: &[],
        votes: None,
        lease_seen_until_ms: Some(due_ms),
        holder_gone_since_ms: None,
    });
    let mut plan = plan;
    let anyone = || true;
    // What the slice says (perhaps a newer term, written before the cut)
    // does not hold back the labels.
    let endpoint = write_endpoint(&mut plan, &group, &anyone, ctx).await;
    let labels = apply_labels(&plan.labels, &pods, &namespace, &anyone, ctx).await;
    if labels.is_ok() {
        record_events(&plan, &group, ctx).await;
    }
    // Written even when a label was not: it tells the active replica, if
    // there is one after all, that the slice changed (`EndpointWriter::doubt`).
    write_status(&plan, &group, &namespace, &anyone, ctx).await?;
    labels?;
    endpoint?;
    standby
}

/// How soon a group is looked at again when what this replica read is
/// behind: its slice further on than its read of the store, or a pod
/// changed after the plan read it (a label patch refused with a conflict).
const STALE_AGAIN: Duration = Duration::from_millis(200);

/// The leader Service's slice, first of the writes (it is what a client
/// waits for), and a Service the group no longer names is removed. A slice
/// that could not be written leaves `status.endpoint` as it was, and the
/// `LeaderEndpoint` condition says why; the labels and the status are
/// written all the same, and an error the next try may not meet again is
/// returned once they are. A slice further on than this replica's read of
/// the store (`Stale`) stops the reconcile: what it planned is behind;
/// except across clusters while the store does not answer, where the
/// planned write only takes an address off (at the slice's own term if
/// newer, see `LeaderEndpoint::aimed_at`), and `Stale` means there is
/// none to take: the slice is vacated, or there is no slice.
async fn write_endpoint(
    plan: &mut Plan,
    group: &LeaderGroup,
    may_write: &(dyn Fn() -> bool + Sync),
    ctx: &Context,
) -> Result<Option<Outcome>, ReconcileError> {
    let previous = group.status.clone().unwrap_or_default();
    let endpoints = &ctx.memory.endpoints;
    if let Some(old) = &plan.retire_service {
        if let Err(e) = endpoints.retire(&ctx.client, group, old, may_write).await {
            // Owned by the group, it goes with it at the latest.
            tracing::warn!(service = %old, error = %e, "could not remove the Service the group no longer names");
        }
    }
    let Some(desired) = &plan.endpoint else {
        return Ok(None);
    };
    endpoints.doubt(group, &desired.service.name, previous.endpoint.as_ref());
    let result = endpoints
        .write(&ctx.client, group, desired, may_write)
        .await;
    let not_written = |plan: &mut Plan, reason: &str, message: String| {
        let now = crate::plan::time_of(wall_clock_ms());
        conditions::replace(
            &mut plan.status.conditions,
            &previous.conditions,
            condition(types::LEADER_ENDPOINT, false, reason, message),
            &now,
            group.metadata.generation,
        );
        plan.status.endpoint = previous.endpoint.clone();
        plan.write_status = crate::plan::status_changed(&plan.status, &previous);
    };
    match result {
        Ok(Outcome::Written) => {
            ctx.memory.metrics.endpoint_written();
            tracing::info!(
                service = %desired.service.name,
                term = desired.term,
                leader = ?desired.leader.as_ref().map(|a| &a.pod),
                "leader endpoint written"
            );
            Ok(Some(Outcome::Written))
        }
        Ok(Outcome::Stale) => {
            // Another replica wrote a newer term than this read of the
            // store holds: the labels and status planned from it would be
            // behind too. Nothing more is written; the group is read again
            // soon. (A term's leader never follows its vacating, and a
            // leader whose pod the cache does not show is not vacated, so
            // this lasts until the next read.)
            tracing::info!(
                term = desired.term,
                "the leader endpoint is further on than this read of the store; reading again"
            );
            Ok(Some(Outcome::Stale))
        }
        Ok(outcome) => Ok(Some(outcome)),
        Err(e) if e.standing() => {
            tracing::warn!(service = %desired.service.name, error = %e, "leader endpoint not written");
            not_written(plan, reasons::ENDPOINT_NOT_WRITTEN, e.to_string());
            Ok(None)
        }
        Err(e) => {
            not_written(plan, reasons::ENDPOINT_NOT_WRITTEN, e.to_string());
            Err(ReconcileError::Endpoint(e))
        }
    }
}

/// `group` with the status this replica last wrote in place of the one
/// the cache has, when the cache is still at the version that write
/// started from (its own write not seen yet). Any newer version holds that
/// write, or a newer one, and is taken as it is.
fn with_own_last_status(group: &LeaderGroup, key: &str, ctx: &Context) -> LeaderGroup {
    let mut group = group.clone();
    ctx.memory.of(key, |m| match &m.last_written {
        Some((version, status)) if group.metadata.resource_version.as_ref() == Some(version) => {
            group.status = Some(status.clone());
        }
        Some(_) => m.last_written = None,
        None => {}
    });
    group
}

/// A deleted group: its role labels come off its pods (see
/// [`role_labels_to_remove`]), so a leader Service stops routing to a pod
/// that no longer leads anything. Only the active replica does it. The
/// group's keys in the store are left alone: agents may still be
/// campaigning, here or in another cluster. Across clusters, this
/// cluster's record of its timings goes, so it no longer counts against
/// the other clusters' (`plan::spec_conflict`). Returns how many labels
/// were removed.
#[tracing::instrument(skip_all, fields(group = %group.name_any(), namespace = group.namespace().unwrap_or_default()))]
pub async fn clean_up(group: &LeaderGroup, ctx: &Context) -> Result<usize, ReconcileError> {
    let namespace = group.namespace().ok_or(ReconcileError::NoNamespace)?;
    ctx.memory.forget(group);
    if !ctx.leadership.is_leader() {
        return Err(ReconcileError::NotActive);
    }
    let namespace = namespace.as_str();
    withdraw_timings(group, namespace, ctx).await;
    let pods = cached_pods(namespace, ctx, |_, _| true)?;
    let others = other_groups(group, namespace, ctx);
    let changes = role_labels_to_remove(group, &pods, &others);
    if !apply_labels(
        &changes,
        &pods,
        namespace,
        &|| ctx.leadership.is_leader(),
        ctx,
    )
    .await?
    {
        return Err(ReconcileError::NotActive);
    }
    if !changes.is_empty() {
        tracing::info!(
            removed = changes.len(),
            "group deleted: role labels removed"
        );
    }
    Ok(changes.len())
}

/// Across clusters, this cluster's record of a deleted group's timings is
/// removed, unless a group of the same name was made anew meanwhile (its
/// record is its own).
async fn withdraw_timings(group: &LeaderGroup, namespace: &str, ctx: &Context) {
    let Some(cluster) = &ctx.cluster else {
        return;
    };
    let name = group.name_any();
    let found = ctx
        .groups
        .get(&kube::runtime::reflector::ObjectRef::new(&name).within(namespace));
    if found.is_some_and(|g| g.metadata.uid != group.metadata.uid) {
        return;
    }
    let store_group = NamespacedName::new(namespace, &name).to_string();
    let withdrawn = ctx.node.store().withdraw_spec(&store_group, cluster);
    if let Err(e) = bounded(STORE_READ, withdrawn).await {
        // It stops counting once stale.
        tracing::warn!(error = %e, "could not withdraw this cluster's timings of the deleted group");
    }
}

/// The namespace's pods from the cache, those `wanted` by their name and
/// labels (with this replica's label writes that the watch has not shown
/// yet laid over them). Only those are copied.
fn cached_pods(
    namespace: &str,
    ctx: &Context,
    wanted: impl Fn(&str, &BTreeMap<String, String>) -> bool,
) -> Result<Vec<PodView>, ReconcileError> {
    if !matches!(ctx.pods.wait_until_ready().now_or_never(), Some(Ok(()))) {
        return Err(ReconcileError::PodsNotCached);
    }
    let cached = ctx.pods.state();
    let no_labels = BTreeMap::new();
    let in_namespace = || {
        cached
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
    };
    let mut writes = locked(&ctx.memory.label_writes);
    if !writes.pending_in(namespace) {
        // Nearly always: nothing of this replica's is waiting for the watch.
        return Ok(in_namespace()
            .filter(|p| {
                let name = p.metadata.name.as_deref().unwrap_or_default();
                wanted(name, p.metadata.labels.as_ref().unwrap_or(&no_labels))
            })
            .map(|p| pod_view(p))
            .collect());
    }
    let mut views = Vec::new();
    let mut present = std::collections::HashSet::new();
    for pod in in_namespace() {
        let mut view = pod_view(pod);
        let key = format!("{namespace}/{}", view.name);
        writes.overlay(&key, pod.metadata.resource_version.as_deref(), &mut view);
        present.insert(key);
        if wanted(&view.name, &view.labels) {
            views.push(view);
        }
    }
    let prefix = format!("{namespace}/");
    writes.retain_pods(|p| !p.starts_with(&prefix) || present.contains(p));
    Ok(views)
}

/// The cached resourceVersion of `namespace/pod`, if the cache has it.
fn cached_version(namespace: &str, pod: &str, ctx: &Context) -> Option<String> {
    ctx.pods
        .get(&kube::runtime::reflector::ObjectRef::new(pod).within(namespace))
        .and_then(|p| p.metadata.resource_version.clone())
}

/// The namespace's other groups, from the reflector.
fn other_groups(group: &LeaderGroup, namespace: &str, ctx: &Context) -> Vec<OtherGroup> {
    let name = group.name_any();
    let mut groups = groups_in(namespace, ctx);
    groups.retain(|g| g.name != name);
    groups
}

/// The namespace's groups, from the reflector; those being deleted no
/// longer claim their pods.
fn groups_in(namespace: &str, ctx: &Context) -> Vec<OtherGroup> {
    ctx.groups
        .state()
        .iter()
        .filter(|g| g.namespace().as_deref() == Some(namespace))
        .filter(|g| g.metadata.deletion_timestamp.is_none())
        .map(|g| OtherGroup {
            name: g.name_any(),
            role_label: g.spec.role_label.clone(),
            selector: g.spec.selector.clone(),
        })
        .collect()
}

/// The namespace's groups and pods as the caches hold them, indexed (see
/// `neighbourhood`); `None` while label writes of this replica's are not
/// in the pod cache yet (then the long way lays them over it).
fn neighbourhood(
    namespace: &str,
    ctx: &Context,
) -> Result<Option<Arc<Neighbourhood>>, ReconcileError> {
    if !matches!(ctx.pods.wait_until_ready().now_or_never(), Some(Ok(()))) {
        return Err(ReconcileError::PodsNotCached);
    }
    if locked(&ctx.memory.label_writes).pending_in(namespace) {
        return Ok(None);
    }
    Ok(Some(ctx.memory.neighbours.of(namespace, || {
        let pods = ctx
            .pods
            .state()
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(namespace))
            .map(|p| pod_view(p))
            .collect();
        Neighbourhood::new(groups_in(namespace, ctx), pods)
    })))
}

/// What the plan needs, read from the API server, the reflector and the store.
struct World {
    pods: Vec<PodView>,
    others: Vec<OtherGroup>,
    store: StoreView,
    swept: Vec<(String, u64)>,
    /// Across clusters, every cluster's timings for the group, this one's
    /// recorded first (`None`: one cluster, or not read).
    votes: Option<Vec<SpecVote>>,
}

impl World {
    async fn read(
        group: &LeaderGroup,
        namespace: &str,
        store_group: &str,
        ctx: &Context,
    ) -> Result<Self, ReconcileError> {
        let read = ctx.node.store().group_state(store_group);
        let store = match bounded(read_bound(group, ctx), read).await {
            Ok(state) => StoreView::Available(state),
            Err(e) => StoreView::Unavailable(e.to_string()),
        };
        let votes = match (&ctx.cluster, group.spec.election_config(), &store) {
            (Some(cluster), Ok(config), StoreView::Available(_)) => {
                let refresh = SPEC_VOTE_REFRESH_MS;
                let vote = ctx
                    .node
                    .store()
                    .vote_spec(store_group, cluster, &config, refresh);
                let votes = bounded(read_bound(group, ctx), vote).await;
                votes.inspect_err(|e| tracing::warn!(error = %e, "could not record the group's timings for this cluster")).ok()
            }
            _ => None,
        };
        let (mut pods, others) = match neighbourhood(namespace, ctx)? {
            Some(around) => {
                let pods = around.pods_for(group, &store, ctx.cluster.as_deref());
                let others = around.others_for(group, &pods);
                (pods, others)
            }
            // Label writes the cache does not show yet are laid over it.
            None => {
                let others = other_groups(group, namespace, ctx);
                let read = PodsRead::new(group, &others, &store, ctx.cluster.as_deref());
                let pods = cached_pods(namespace, ctx, |name, labels| read.needs(name, labels))?;
                (pods, others)
            }
        };
        read_statuses(&mut pods, &store, group, ctx).await;
        let swept = locked(&ctx.swept).clone();
        Ok(Self {
            pods,
            others,
            store,
            swept,
            votes,
        })
    }
}

/// The group's timings and a lost term go back into the store; a failure is
/// logged and retried at the next reconcile. The preferred members too,
/// but a failure to write them ends the reconcile, before the status that
/// would record them.
async fn apply_to_store(
    plan: &Plan,
    store_group: &str,
    ctx: &Context,
) -> Result<(), ReconcileError> {
    let store = ctx.node.store();
    if let Some(config) = &plan.config {
        if let Err(e) = bounded(STORE_READ, store.write_group_config(store_group, config)).await {
            tracing::warn!(error = %e, "could not write the group's timings");
        }
    }
    let preferred = match &plan.preferred_nodes {
        PreferredMembers::Keep => None,
        PreferredMembers::Remove => Some(None),
        PreferredMembers::Write(nodes) => Some(Some(nodes.as_slice())),
    };
    if let Some(nodes) = preferred {
        bounded(STORE_READ, store.write_preferred(store_group, nodes))
            .await
            .map_err(ReconcileError::Preferred)?;
    }
    if let Some(term) = plan.restore_term {
        match bounded(STORE_READ, store.restore_term(store_group, term)).await {
            Ok(raised) => tracing::info!(term, raised, "restored the term the store lost"),
            Err(e) => tracing::warn!(error = %e, "could not restore the term"),
        }
    }
    Ok(())
}

/// A step-down or a handover the plan asks of the leader. A command that
/// cannot be sent is logged; the status still records the handover asked
/// for, so it is not asked again in the same term (a rollout's next pod
/// change, or the next term, asks again).
async fn send_commands(plan: &Plan, store_group: &str, ctx: &Context) {
    if let Some(holder) = &plan.step_down {
        if let Err(e) = ctx.node.ask_to_step_down(holder, store_group).await {
            tracing::warn!(%holder, error = %e, "could not send the step-down command");
        }
    }
    if let Some(h) = &plan.hand_over {
        match ctx.node.ask_to_hand_over(&h.from, store_group, &h.to).await {
            Ok(_) => {
                tracing::info!(from = %h.from, to = %h.to, reason = %h.reason, "asked for a handover")
            }
            Err(e) => {
                tracing::warn!(from = %h.from, to = %h.to, error = %e, "could not send the handover command")
            }
        }
    }
}

/// The merge patch of one role label: other labels are never touched, and
/// `null` removes the key. `version` is the pod's resourceVersion as the
/// plan read it: the API server applies the patch only to that version and
/// answers 409 Conflict otherwise, so a patch planned from a pod that has
/// changed since (by a successor replica, most of all, while this one was
/// stopped between its leadership check and the write) changes nothing.
pub fn label_patch(change: &LabelChange, version: Option<&str>) -> serde_json::Value {
    let mut patch = json!({ "metadata": { "labels": { &change.key: &change.value } } });
    if let Some(version) = version {
        patch["metadata"]["resourceVersion"] = json!(version);
    }
    patch
}

/// The label changes in their order, each at the version of its pod in
/// `pods` (what the plan read), stopping at the first failure or as soon as
/// this replica no longer leads (then it returns false).
async fn apply_labels(
    changes: &[LabelChange],
    pods: &[PodView],
    namespace: &str,
    may_write: &(dyn Fn() -> bool + Sync),
    ctx: &Context,
) -> Result<bool, ReconcileError> {
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let versions: HashMap<&str, Option<&str>> = if changes.is_empty() {
        HashMap::new()
    } else {
        pods.iter()
            .map(|p| (p.name.as_str(), p.version.as_deref()))
            .collect()
    };
    for change in changes {
        if !may_write() {
            return Ok(false);
        }
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::before_label_patch(&change.pod, &change.key, change.value.as_deref());
        let planned_from = versions.get(change.pod.as_str()).copied().flatten();
        let patch = label_patch(change, planned_from);
        let result = pods_api
            .patch(&change.pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        if let Ok(pod) = &result {
            // The answer is the whole pod: its IP and readiness at this
            // version come free.
            ctx.memory
                .pod_statuses
                .record(&format!("{namespace}/{}", change.pod), Known::of(pod));
        }
        if let Some(written_as) = written_as(&result, change.value.as_deref()) {
            locked(&ctx.memory.label_writes).record(
                &format!("{namespace}/{}", change.pod),
                &change.key,
                change.value.as_deref(),
                planned_from.map(str::to_owned),
                written_as,
            );
        }
        result.map_err(|source| ReconcileError::LabelPod {
            pod: change.pod.clone(),
            source,
        })?;
        ctx.memory.metrics.label_patched();
    }
    Ok(true)
}

/// What a label patch's answer leaves to lay over the cache until the
/// watch brings it (see `label_writes`): a write that was applied, with the
/// version it made (`Some(Some(_))`), and a leader label that perhaps was,
/// having no answer (`Some(None)`): the next plan then takes it away before
/// giving it elsewhere. `None` for a write that changed nothing: one the
/// API server refused (a conflict above all: the pod had moved on), or any
/// other without an answer, taken as not applied so the next plan sends it
/// again.
fn written_as(result: &Result<Pod, kube::Error>, value: Option<&str>) -> Option<Option<String>> {
    match result {
        Ok(pod) => Some(pod.metadata.resource_version.clone()),
        Err(kube::Error::Api(_)) => None,
        Err(_) if value == Some(LEADER) => Some(None),
        Err(_) => None,
    }
}

async fn record_events(plan: &Plan, group: &LeaderGroup, ctx: &Context) {
    for event in &plan.events {
        if let Err(e) = ctx.events.record(event, group).await {
            tracing::warn!(error = %e, "could not record an event");
        }
    }
}

/// Server-side apply of the status, only when the plan says it changed and
/// only while this replica `may_write` (leads, most of the time).
async fn write_status(
    plan: &Plan,
    group: &LeaderGroup,
    namespace: &str,
    may_write: &(dyn Fn() -> bool + Sync),
    ctx: &Context,
) -> Result<(), ReconcileError> {
    if !plan.write_status || !may_write() {
        return Ok(());
    }
    let groups: Api<LeaderGroup> = Api::namespaced(ctx.client.clone(), namespace);
    let status = json!({
        "apiVersion": LeaderGroup::api_version(&()),
        "kind": LeaderGroup::kind(&()),
        "status": plan.status,
    });
    groups
        .patch_status(
            &group.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&status),
        )
        .await
        .map_err(ReconcileError::Status)?;
    Ok(())
}

/// Whether the API server refused a label patch for good: forbidden (RBAC,
/// or an admission policy such as the chart's) or invalid. Retrying every
/// second would not change the answer.
pub fn refused(error: &ReconcileError) -> bool {
    matches!(
        error,
        ReconcileError::LabelPod { source: kube::Error::Api(status), .. }
            if matches!(status.code, 403 | 422)
    )
}

/// Whether a label patch was refused because its pod changed after the
/// plan read it (409 Conflict on the version it was sent with): the plan is
/// behind, not wrong, and is made again from the cache. Not an error: under
/// churn (a kubelet's status updates move the version too) it happens.
pub fn stale(error: &ReconcileError) -> bool {
    matches!(
        error,
        ReconcileError::LabelPod { source: kube::Error::Api(status), .. } if status.code == 409
    )
}

/// Requeue delay by what went wrong: a conflict or a missing pod clears up
/// fast, an unreachable API server takes longer, a refused patch backs off
/// to the resync ([`refusal_delay`]).
pub fn error_policy(group: Arc<LeaderGroup>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.memory.metrics.reconcile_failed(error.kind());
    if refused(error) {
        let key = NamespacedName::new(group.namespace().unwrap_or_default(), group.name_any());
        let refusals = ctx.memory.of(&key.to_string(), |m| {
            m.refusals = m.refusals.saturating_add(1);
            m.refusals
        });
        let delay = refusal_delay(refusals, ctx.resync);
        tracing::error!(
            kind = error.kind(),
            %error,
            refusals,
            retry_in = ?delay,
            "the API server refused a label patch; check the controller's RBAC and the chart's admissionPolicy.allowedLabelKeys (it must list the group's roleLabel)"
        );
        return Action::requeue(delay);
    }
    tracing::warn!(kind = error.kind(), %error, "reconcile failed");
    match error {
        ReconcileError::NoNamespace => Action::await_change(),
        ReconcileError::LabelPod { .. } => Action::requeue(Duration::from_secs(1)),
        ReconcileError::PodsNotCached => Action::requeue(Duration::from_secs(1)),
        ReconcileError::Status(_) => Action::requeue(Duration::from_secs(5)),
        ReconcileError::Preferred(_) => Action::requeue(Duration::from_secs(1)),
        ReconcileError::NotActive => Action::requeue(ctx.resync),
        ReconcileError::Endpoint(_) => Action::requeue(Duration::from_secs(1)),
    }
}

/// When to try again after the `refusals`-th refused label patch in a row:
/// 1 s, doubling, at most the resync. An API server that has just started
/// answers 403 until its RBAC caches are filled, so the first retries come
/// soon; a refusal that stays (RBAC or an admission policy missing the
/// label key) is retried, and logged, once per resync.
pub fn refusal_delay(refusals: u32, resync: Duration) -> Duration {
    let doublings = refusals.saturating_sub(1).min(16);
    (REFUSAL_FIRST_RETRY * 2u32.pow(doublings)).min(resync.max(REFUSAL_FIRST_RETRY))
}

const REFUSAL_FIRST_RETRY: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_change_alone_triggers_no_reconcile() {
        let spec: crate::crd::LeaderGroupSpec = serde_json::from_value(
            serde_json::json!({ "selector": { "matchLabels": { "app": "web" } } }),
        )
        .unwrap();
        let mut group = LeaderGroup::new("web", spec);
        group.metadata.resource_version = Some("1".into());
        let before = what_the_plan_reads(&group);
        assert!(before.is_some());

        let mut written = group.clone();
        written.metadata.resource_version = Some("2".into());
        written.status = Some(crate::crd::LeaderGroupStatus {
            leader: Some("web-0".into()),
            term: Some(4),
            ..Default::default()
        });
        assert_eq!(
            what_the_plan_reads(&written),
            before,
            "status and resourceVersion"
        );

        let mut stepped = group.clone();
        stepped.metadata.annotations =
            Some([("leasehold.dev/step-down".to_owned(), "1".to_owned())].into());
        let mut respecced = group.clone();
        respecced.spec.ttl_ms += 1000;
        let mut deleted = group.clone();
        deleted.metadata.deletion_timestamp = Some(crate::plan::time_of(1_000));
        for (what, changed) in [
            ("an annotation", stepped),
            ("the spec", respecced),
            ("deletion", deleted),
        ] {
            assert_ne!(what_the_plan_reads(&changed), before, "{what}");
        }
    }

    #[test]
    fn refused_patches_back_off_from_a_second_to_the_resync() {
        let resync = Duration::from_secs(30);
        let delays: Vec<u64> = (1..=7)
            .map(|n| refusal_delay(n, resync).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(refusal_delay(u32::MAX, resync), resync);
        assert_eq!(refusal_delay(1, Duration::ZERO), REFUSAL_FIRST_RETRY);
    }

    fn label_error(code: u16) -> ReconcileError {
        let status = kube::core::Status {
            code,
            ..Default::default()
        };
        ReconcileError::LabelPod {
            pod: "web-0".into(),
            source: kube::Error::Api(Box::new(status)),
        }
    }

    #[test]
    fn a_forbidden_or_invalid_patch_is_refused_for_good_a_conflict_is_not() {
        assert!(refused(&label_error(403)));
        assert!(refused(&label_error(422)));
        assert!(!refused(&label_error(409)));
        assert!(!refused(&label_error(404)));
        assert!(!refused(&ReconcileError::NoNamespace));
    }

    #[test]
    fn a_conflict_is_a_stale_plan_and_nothing_else_is() {
        assert!(stale(&label_error(409)));
        for code in [403, 404, 422, 500] {
            assert!(!stale(&label_error(code)), "{code}");
        }
        assert!(!stale(&ReconcileError::Status(kube::Error::Api(Box::new(
            kube::core::Status {
                code: 409,
                ..Default::default()
            }
        )))));
    }

    #[test]
    fn a_refused_patch_leaves_nothing_over_the_cache_an_unanswered_leader_label_does() {
        let mut pod = Pod::default();
        pod.metadata.resource_version = Some("211".into());
        let api = |code| {
            Err(kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            })))
        };
        let cut = || Err(kube::Error::ReadEvents(std::io::Error::other("cut")));
        assert_eq!(written_as(&Ok(pod), Some(LEADER)), Some(Some("211".into())));
        for value in [Some(LEADER), Some("follower"), None] {
            for code in [409, 403, 422, 404] {
                assert_eq!(written_as(&api(code), value), None, "{code} {value:?}");
            }
        }
        assert_eq!(written_as(&cut(), Some(LEADER)), Some(None));
        assert_eq!(written_as(&cut(), Some("follower")), None);
        assert_eq!(written_as(&cut(), None), None);
    }

    #[test]
    fn a_label_patch_names_the_version_the_plan_read() {
        let change = |value: Option<&str>| LabelChange {
            pod: "web-0".into(),
            key: "leasehold.dev/role".into(),
            value: value.map(str::to_owned),
        };
        assert_eq!(
            label_patch(&change(Some("leader")), Some("210")),
            json!({ "metadata": {
                "labels": { "leasehold.dev/role": "leader" },
                "resourceVersion": "210" } })
        );
        assert_eq!(
            label_patch(&change(None), Some("7")),
            json!({ "metadata": {
                "labels": { "leasehold.dev/role": null },
                "resourceVersion": "7" } })
        );
        // A pod the cache has no version of: nothing to fence with.
        assert_eq!(
            label_patch(&change(Some("follower")), None),
            json!({ "metadata": { "labels": { "leasehold.dev/role": "follower" } } })
        );
    }
}
