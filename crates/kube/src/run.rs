//! `leasehold controller`: wires the kube-runtime Controller to the plan and
//! to the store, elects one active replica, and serves probes and metrics.
//!
//! Triggers of a group's reconcile: the LeaderGroup changing, a pod of its
//! namespace changing (one it selects, or one carrying its label key), any
//! engine event for the group on `P:events` (so a new leader shows within
//! milliseconds, not at the next resync), and a periodic requeue as a net.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::crd::LeaderGroup;
use crate::event_log::EventLog;
use crate::memory::Memory;
use crate::metrics::ControllerMetrics;
use crate::neighbourhood::Neighbours;
use crate::pods::Locality;
use crate::reconcile::{error_policy, reconcile, Context};
use crate::selector;
use leasehold_daemon::election_args::election_config;
use leasehold_daemon::error::{FlagError, StartError};
use leasehold_daemon::http;
use leasehold_daemon::metrics::{self, EngineMetrics};
use leasehold_daemon::names::{validate_cluster_name, NamespacedName, PodId};
use leasehold_daemon::store_settings::SettingsWatch;
use leasehold_engine::config::{validate_name, ElectionConfig, NodeConfig};
use leasehold_engine::events::Event;
use leasehold_engine::{Node, NodeOptions};

/// The engine group in which the controller's replicas elect the active
/// one, in the controller's own namespace.
pub const CONTROLLER_GROUP: &str = "leasehold-controller";

/// Reconciles running at once, so that a resync of 1,000 groups does not
/// hold 1,000 reconciles' copies of pods and groups at once. A reconcile
/// mostly waits on the store and the API server: a few keep both cores busy.
const RECONCILE_CONCURRENCY: u16 = 8;

/// How long sweeps stay in memory for reporting on the groups they touched.
const SWEEP_MEMORY: Duration = Duration::from_secs(600);

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub store: leasehold_daemon::store_args::StoreArgs,
    /// This cluster's name, when LeaderGroups span clusters that share a
    /// store: the same as its agents' --cluster, and one of its own per
    /// cluster. Node ids are then CLUSTER/NAMESPACE/POD; the controller
    /// labels only this cluster's pods, and its replicas elect their active
    /// one apart from other clusters'.
    #[arg(long, env = "LEASEHOLD_CLUSTER")]
    pub cluster: Option<String>,
    /// This replica's pod name (downward API); its node id is
    /// [CLUSTER/]NAMESPACE/POD.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: String,
    /// This replica's namespace; the replicas elect their active one there.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "LEASEHOLD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Requeue every group at least this often, seconds.
    #[arg(long, default_value_t = 30)]
    pub resync_seconds: u64,
    /// Lease ttl of the replicas' own election of their active one, ms.
    #[arg(long, default_value_t = REPLICA_TIMINGS.ttl_ms)]
    pub replica_ttl_ms: u64,
    /// Renew interval of the replicas' election, ms.
    #[arg(long, default_value_t = REPLICA_TIMINGS.renew_interval_ms)]
    pub replica_renew_interval_ms: u64,
    /// Retry interval of the replicas' election, ms.
    #[arg(long, default_value_t = REPLICA_TIMINGS.retry_interval_ms)]
    pub replica_retry_interval_ms: u64,
    /// Watch LeaderGroups and pods of this namespace only (needs only
    /// namespaced RBAC); all namespaces when absent.
    #[arg(long, env = "LEASEHOLD_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Write the leader Services and EndpointSlices of groups with
    /// `spec.service` (needs RBAC on services and endpointslices: the
    /// chart's `leaderEndpoints.enabled`).
    #[arg(long, env = "LEASEHOLD_LEADER_ENDPOINTS")]
    pub leader_endpoints: bool,
}

/// Default timings of the replicas' own election. Shorter than a group's
/// defaults: they bound how long labels stand still when the active replica
/// dies, and how long a store born again (a store started with the install,
/// or restarted empty) keeps every replica a standby. A renewal every 1.5 s
/// costs the store nothing.
pub const REPLICA_TIMINGS: ElectionConfig = ElectionConfig {
    ttl_ms: 5_000,
    renew_interval_ms: 1_500,
    retry_interval_ms: 1_000,
};

/// Why the controller could not run.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("no Kubernetes client (in-cluster or KUBECONFIG): {0}")]
    Client(#[source] kube::Error),
}

impl From<FlagError> for ControllerError {
    fn from(e: FlagError) -> Self {
        Self::Start(e.into())
    }
}

pub async fn run(args: ControllerArgs) -> Result<(), ControllerError> {
    let client = kube::Client::try_default()
        .await
        .map_err(ControllerError::Client)?;
    run_with(client, args, leasehold_daemon::signal::shutdown()).await
}

/// The controller with a given client (tests pass a mock API server's) until
/// `shutdown` resolves. Its parts (the kube-runtime controller, the bridge
/// from engine events to reconciles, the replica's activity watch and the
/// probe server) run as futures joined here, so none outlives the call.
// Linear wiring: each part is built and handed to the join in order.
#[allow(clippy::too_many_lines)]
pub async fn run_with(
    client: kube::Client,
    args: ControllerArgs,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), ControllerError> {
    let shutdown = shutdown.boxed().shared();
    // Every flag is checked before anything connects or listens.
    let replicas = election_config(
        "--replica-ttl-ms/--replica-renew-interval-ms/--replica-retry-interval-ms",
        args.replica_ttl_ms,
        args.replica_renew_interval_ms,
        args.replica_retry_interval_ms,
    )?;
    if let Some(cluster) = &args.cluster {
        validate_cluster_name("--cluster", cluster)
            .map_err(|e| FlagError::worded("--cluster", e.to_string()))?;
    }
    let node_id = own_id(&args, &args.pod_name);
    validate_name("node id", &node_id).map_err(|e| FlagError::new("--namespace/--pod-name", e))?;
    let store = args.store.connect_checked().await?;
    let listener = http::bind(args.listen).await?;
    let mut registry = metrics::new_registry();
    let store_settings = SettingsWatch::start(store.clone(), &mut registry).await;
    let (node, leadership) =
        start_replica(&args, &node_id, replicas, &store, &mut registry).await?;
    let controller_metrics = ControllerMetrics::register(&mut registry);
    let registry = Arc::new(registry);

    let (reflector, groups_writer) = reflector::store::<LeaderGroup>();
    // One watch of the pods' metadata feeds the cache reconciles read and
    // the triggers of the groups a pod change concerns.
    let (pods, pods_writer) = reflector::store::<PartialObjectMeta<Pod>>();
    let ctx = Arc::new(Context {
        client: client.clone(),
        node: node.clone(),
        leadership: leadership.clone(),
        events: EventLog::new(
            client.clone(),
            Reporter {
                controller: "leasehold-controller".into(),
                instance: Some(args.pod_name.clone()),
            },
        ),
        groups: reflector.clone(),
        pods,
        swept: Mutex::new(Vec::new()),
        resync: Duration::from_secs(args.resync_seconds.max(1)),
        store_settings: store_settings.current(),
        memory: Memory::new(controller_metrics.clone(), args.leader_endpoints),
        cluster: args.cluster.clone(),
    });
    let groups: Api<LeaderGroup> = watched(&client, &args);
    // The cache sees every change; a reconcile is triggered only by what
    // the plan reads from the object itself, so a status this controller
    // wrote does not bring the group straight back.
    let group_changes = watcher(groups.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(groups_writer)
        .inspect({
            let ctx = ctx.clone();
            move |event| mark_change(&ctx.memory.neighbours, event)
        })
        .applied_objects()
        .predicate_filter(
            crate::reconcile::what_the_plan_reads,
            kube::runtime::PredicateConfig::default(),
        );
    let controller = Controller::for_stream(group_changes, reflector.clone());

    let (triggers_tx, triggers) = mpsc::unbounded_channel::<ObjectRef<LeaderGroup>>();
    let pod_changes = follow_pods(
        watcher(
            watched::<PartialObjectMeta<Pod>>(&client, &args),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(pods_writer),
        reflector.clone(),
        ctx.clone(),
        triggers_tx.clone(),
    );
    let bridge = bridge_engine_events(
        store.follow_events(),
        node.events(),
        ctx.clone(),
        triggers_tx,
    );
    let (became_active_tx, became_active) = mpsc::unbounded_channel::<()>();
    let activity = follow_activity(leadership.role(), became_active_tx, ctx.clone());
    let deletions = follow_deletions(groups, ctx.clone());
    let forgotten = forget_missed_deletions(ctx.clone());
    // Probes answer until the rest has stopped and the lease is handed over.
    let (stop_probes, probes_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = probe_server(listener, store, registry, async {
        let _ = probes_stopped.await;
    });
    tracing::info!(node = %node.id(), listen = %args.listen, "controller started");
    let controller = controller
        .with_config(
            kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY),
        )
        .reconcile_on(UnboundedReceiverStream::new(triggers))
        .reconcile_all_on(UnboundedReceiverStream::new(became_active))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller stream");
            }
        });
    let work = async {
        tokio::join!(
            controller,
            until(shutdown.clone(), bridge),
            until(shutdown.clone(), pod_changes),
            until(shutdown.clone(), activity),
            until(shutdown.clone(), deletions),
            until(shutdown, forgotten),
        );
        // Graceful: hand the controllers' lease to a standby at once. The
        // registration itself expires (other tasks still hold the node).
        node.shutdown().await;
        let _ = stop_probes.send(());
    };
    tokio::join!(work, server);
    Ok(())
}

/// The id of `name` in the replica's namespace and cluster: its node id, or
/// the replicas' group, which is one per cluster (each cluster's controller
/// labels its own pods).
fn own_id(args: &ControllerArgs, name: &str) -> String {
    let id = PodId {
        cluster: args.cluster.as_deref(),
        namespace: &args.namespace,
        pod: name,
    };
    id.to_string()
}

/// This replica's engine node, and its candidacy in the replicas' own
/// election of the active one.
async fn start_replica(
    args: &ControllerArgs,
    node_id: &str,
    replicas: ElectionConfig,
    store: &leasehold_engine::Store,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<(Arc<Node>, leasehold_engine::Group), ControllerError> {
    let options = NodeOptions {
        metadata: vec![("role".into(), "controller".into())],
        observer: Some(EngineMetrics::register(registry)),
        ..Default::default()
    };
    let node = Arc::new(
        Node::start_with(store.clone(), node_id, NodeConfig::default(), options)
            .await
            .map_err(StartError::from)?,
    );
    let leadership = node
        .join(&own_id(args, CONTROLLER_GROUP), replicas)
        .map_err(StartError::from)?;
    Ok((node, leadership))
}

/// The API of resources of kind `K` the controller watches: one namespace
/// or all.
fn watched<K>(client: &kube::Client, args: &ControllerArgs) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match &args.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The groups a pod change concerns: those of its namespace that select it,
/// and those whose status names it (the leader, or a member's pod), which
/// may have labelled it before it left their selector. Not every group
/// whose label key it carries: groups share the default key, and a label
/// patch would then wake every group of the namespace (a thousand groups
/// sharing the key: a thousand reconciles per patch).
fn groups_of_pod(
    groups: &kube::runtime::reflector::Store<LeaderGroup>,
    pod: &PartialObjectMeta<Pod>,
    cluster: Option<&str>,
) -> Vec<ObjectRef<LeaderGroup>> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    groups
        .state()
        .into_iter()
        .filter(|g| g.namespace().as_deref() == Some(ns.as_str()))
        .filter(|g| {
            let here = Locality {
                cluster,
                namespace: &ns,
            };
            names_pod(g, &name, &here) || selector::matches(&g.spec.selector, &labels)
        })
        .map(|g| ObjectRef::from_obj(&*g))
        .collect()
}

/// Whether the group's status names `pod` of this cluster (`here`) as its
/// leader or a member's pod: a pod of the same name in another cluster is
/// not this one.
fn names_pod(group: &LeaderGroup, pod: &str, here: &Locality<'_>) -> bool {
    let leader = here.shown(&here.node_id(pod));
    group.status.as_ref().is_some_and(|s| {
        s.leader.is_some() && s.leader == leader
            || (s.members.iter())
                .any(|m| m.pod.as_deref() == Some(pod) && m.cluster.as_deref() == here.cluster)
    })
}

/// Marks what a watch event changed in the cache it went into: its
/// object's namespace, or every namespace for a relist.
fn mark_change<K: Resource>(neighbours: &Neighbours, event: &watcher::Result<watcher::Event<K>>) {
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
    match event {
        Ok(Apply(object) | Delete(object) | InitApply(object)) => {
            neighbours.changed_in(object.meta().namespace.as_deref().unwrap_or_default());
        }
        Ok(Init | InitDone) => neighbours.changed_everywhere(),
        // The cache keeps its last state.
        Err(_) => {}
    }
}

/// Runs the pod watch (which keeps the cache behind `Context::pods`) and
/// triggers the groups each changed pod concerns; a deleted pod's status is
/// forgotten. A watch error is retried with the watcher's default backoff;
/// meanwhile the cache keeps its last state.
async fn follow_pods(
    events: impl futures::Stream<Item = watcher::Result<watcher::Event<PartialObjectMeta<Pod>>>>,
    groups: kube::runtime::reflector::Store<LeaderGroup>,
    ctx: Arc<Context>,
    triggers: mpsc::UnboundedSender<ObjectRef<LeaderGroup>>,
) {
    let changes = events
        .inspect(|event| {
            mark_change(&ctx.memory.neighbours, event);
            // A deleted pod's IP and readiness are of no more use.
            if let Ok(watcher::Event::Delete(pod)) = event {
                let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                ctx.memory.pod_statuses.forget(&key);
            }
        })
        .touched_objects();
    futures::pin_mut!(changes);
    while let Some(change) = changes.next().await {
        match change {
            Ok(pod) => {
                for group in groups_of_pod(&groups, &pod, ctx.cluster.as_deref()) {
                    if triggers.send(group).is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "pod watch"),
        }
    }
}

/// `/healthz`, `/readyz` (the store answers) and `/metrics` until `stop`.
async fn probe_server(
    listener: tokio::net::TcpListener,
    store: leasehold_engine::Store,
    registry: Arc<prometheus_client::registry::Registry>,
    stop: impl Future<Output = ()>,
) {
    let app = http::probes(store, registry, || ())
        .fallback(|| async { http::text(http::StatusCode::NOT_FOUND, "not found\n") });
    http::serve(listener, app, stop).await
}

/// How long after a group's deletion its role labels are looked at once
/// more: a reconcile of the group that was already running when it was
/// deleted may have labelled a pod after the first clean-up.
const CLEAN_UP_AGAIN: Duration = Duration::from_secs(2);

/// Takes a deleted LeaderGroup's role labels off its pods
/// ([`reconcile::clean_up`]), twice, on the active replica. kube-runtime's
/// controller does not reconcile deleted objects, so deletions come from a
/// watch of their own. Deliberately no finalizer: a finalizer would hold
/// every deletion hostage to a running controller, and a namespace deleted
/// together with the controller in it would never finish. A group deleted
/// while no replica is active keeps its labels (see the README).
async fn follow_deletions(groups: Api<LeaderGroup>, ctx: Arc<Context>) {
    let mut events = watcher(groups, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut pending = tokio::task::JoinSet::new();
    while let Some(event) = events.next().await {
        while pending.try_join_next().is_some() {}
        let Ok(watcher::Event::Delete(group)) = event else {
            continue;
        };
        if !ctx.leadership.is_leader() {
            // A standby writes nothing.
            continue;
        }
        let ctx = ctx.clone();
        pending.spawn(async move {
            for pass in [Duration::ZERO, CLEAN_UP_AGAIN] {
                tokio::time::sleep(pass).await;
                if let Err(e) = crate::reconcile::clean_up(&group, &ctx).await {
                    tracing::warn!(group = %group.name_any(), error = %e, "could not take a deleted group's role labels off its pods");
                }
            }
        });
    }
    pending.shutdown().await;
}

/// Once per resync, what this replica remembers of groups (and pods) no
/// longer in the caches goes (see `memory`): the deletion watch forgets a
/// group when its Delete arrives, and a deletion made while the watch was
/// relisting arrives as no event at all.
async fn forget_missed_deletions(ctx: Arc<Context>) {
    let mut every = tokio::time::interval(ctx.resync);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if !matches!(ctx.groups.wait_until_ready().now_or_never(), Some(Ok(()))) {
            continue;
        }
        let pods_filled = matches!(ctx.pods.wait_until_ready().now_or_never(), Some(Ok(())));
        let pods = pods_filled.then(|| ctx.pods.state());
        ctx.memory.keep_only(&ctx.groups.state(), pods.as_deref());
    }
}

/// Runs `work` until `stop` resolves.
async fn until(stop: impl Future<Output = ()>, work: impl Future<Output = ()>) {
    tokio::select! {
        _ = stop => {}
        _ = work => {}
    }
}

/// Engine events: reconcile the group an event on `P:events` names (any
/// node's), and remember every sweep, whichever node made it (agents
/// usually sweep first), for the groups that listed a swept node. This
/// replica's own sweeps also come straight from its node, in case their
/// publication to the store was lost.
async fn bridge_engine_events(
    mut store_events: mpsc::UnboundedReceiver<Event>,
    mut local_events: tokio::sync::broadcast::Receiver<Event>,
    ctx: Arc<Context>,
    triggers: mpsc::UnboundedSender<ObjectRef<LeaderGroup>>,
) {
    loop {
        let event = tokio::select! {
            Some(event) = store_events.recv() => event,
            Ok(event) = local_events.recv() => event,
            else => break,
        };
        if let Some(group) = event.group() {
            if let Some((ns, name)) = NamespacedName::split(group) {
                let _ = triggers.send(ObjectRef::new(name).within(ns));
            }
        }
        if let Event::Swept { nodes, .. } = event {
            if remember_sweep(&ctx, &nodes) {
                for g in ctx.groups.state() {
                    let listed = g
                        .status
                        .as_ref()
                        .is_some_and(|s| s.members.iter().any(|m| nodes.contains(&m.node)));
                    if listed {
                        let _ = triggers.send(ObjectRef::from_obj(&*g));
                    }
                }
            }
        }
    }
}

/// Remembers swept node ids for [`SWEEP_MEMORY`]; false if every one was
/// already known (the same sweep seen both locally and through the store).
fn remember_sweep(ctx: &Context, nodes: &[String]) -> bool {
    let now = leasehold_engine::sync::wall_clock_ms();
    let mut swept = leasehold_engine::sync::locked(&ctx.swept);
    swept.retain(|(_, at)| now.saturating_sub(*at) < SWEEP_MEMORY.as_millis() as u64);
    let new: Vec<&String> = nodes
        .iter()
        .filter(|n| !swept.iter().any(|(known, _)| known == *n))
        .collect();
    let any = !new.is_empty();
    swept.extend(new.into_iter().map(|n| (n.clone(), now)));
    any
}

/// Becoming the active replica reconciles every group at once (a standby
/// skipped them); the state is also a metric. What this replica wrote into
/// leader slices in an earlier spell as the active one is forgotten then:
/// the other replica may have written them since, and a memory that
/// matched what is wanted would keep this one from looking.
async fn follow_activity(
    mut role: tokio::sync::watch::Receiver<leasehold_engine::Role>,
    became_active: mpsc::UnboundedSender<()>,
    ctx: Arc<Context>,
) {
    // The term of this replica's spell as the active one: a spell lost and
    // won again between two looks at the role is a new term.
    let mut spell = None;
    loop {
        let term = match *role.borrow_and_update() {
            leasehold_engine::Role::Leader { term } => Some(term),
            _ => None,
        };
        ctx.memory.metrics.set_active(term.is_some());
        if term.is_some() && term != spell {
            tracing::info!("this replica is now the active controller");
            ctx.memory.endpoints.retain(|_| false);
            let _ = became_active.send(());
        }
        spell = term;
        if role.changed().await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{LeaderGroupStatus, Member};

    fn member(cluster: Option<&str>, pod: &str) -> Member {
        let member =
            serde_json::json!({ "node": pod, "cluster": cluster, "pod": pod, "role": "follower" });
        serde_json::from_value(member).unwrap()
    }

    fn led(leader: &str, members: Vec<Member>) -> LeaderGroup {
        let spec = serde_json::from_value(serde_json::json!({ "selector": {} })).unwrap();
        let mut g = LeaderGroup::new("web", spec);
        g.status = Some(LeaderGroupStatus {
            leader: Some(leader.to_owned()),
            members,
            ..Default::default()
        });
        g
    }

    fn at(cluster: Option<&str>) -> Locality<'_> {
        Locality {
            cluster,
            namespace: "shop",
        }
    }

    #[test]
    fn a_pod_is_named_by_its_own_cluster_s_members_not_by_another_s_of_the_same_name() {
        let one = led("web-0", vec![member(None, "web-0"), member(None, "web-1")]);
        assert!(names_pod(&one, "web-0", &at(None)) && names_pod(&one, "web-1", &at(None)));
        assert!(!names_pod(&one, "web-2", &at(None)));
        // West leads with its web-0; east has a web-1 of its own.
        let across = led(
            "west/web-0",
            vec![member(Some("west"), "web-0"), member(Some("east"), "web-1")],
        );
        assert!(names_pod(&across, "web-0", &at(Some("west"))));
        assert!(!names_pod(&across, "web-0", &at(Some("east"))));
        assert!(names_pod(&across, "web-1", &at(Some("east"))));
        assert!(!names_pod(&across, "web-1", &at(Some("west"))));
    }
}
