//! `leasehold controller`: wires the kube-runtime Controller to the plan and
//! to Redis, elects one active replica, and serves probes and metrics.
//!
//! Triggers of a group's reconcile: the LeaderGroup changing, a pod of its
//! namespace changing (one it selects, or one carrying its label key), any
//! engine event for the group on `P:events` (so a new leader shows within
//! milliseconds, not at the next resync), and a periodic requeue as a net.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use super::crd::LeaderGroup;
use super::reconcile::{error_policy, reconcile, Context};
use super::selector;
use crate::config::{validate_name, ElectionConfig, NodeConfig};
use crate::events::Event;
use crate::telemetry::http::{self, Response};
use crate::telemetry::metrics::{controller_metrics, metrics};
use crate::{Node, NodeOptions};

/// How long sweeps stay in memory for reporting on the groups they touched.
const SWEEP_MEMORY: Duration = Duration::from_secs(600);

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub redis: crate::redis_args::RedisArgs,
    /// This replica's pod name (downward API); its node id is NAMESPACE/POD.
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
    #[arg(long, default_value_t = ElectionConfig::default().ttl_ms)]
    pub replica_ttl_ms: u64,
    /// Renew interval of the replicas' election, ms.
    #[arg(long, default_value_t = ElectionConfig::default().renew_interval_ms)]
    pub replica_renew_interval_ms: u64,
    /// Retry interval of the replicas' election, ms.
    #[arg(long, default_value_t = ElectionConfig::default().retry_interval_ms)]
    pub replica_retry_interval_ms: u64,
    /// Watch LeaderGroups and pods of this namespace only (needs only
    /// namespaced RBAC); all namespaces when absent.
    #[arg(long, env = "LEASEHOLD_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
}

pub async fn run(args: ControllerArgs) -> Result<(), String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("no Kubernetes client (in-cluster or KUBECONFIG): {e}"))?;
    run_with(client, args, crate::signal::shutdown()).await
}

/// The controller with a given client (tests pass a mock API server's) until
/// `shutdown` resolves.
pub async fn run_with(
    client: kube::Client,
    args: ControllerArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), String> {
    let replicas = ElectionConfig {
        ttl_ms: args.replica_ttl_ms,
        renew_interval_ms: args.replica_renew_interval_ms,
        retry_interval_ms: args.replica_retry_interval_ms,
    };
    replicas.validate().map_err(|e| {
        format!("--replica-ttl-ms/--replica-renew-interval-ms/--replica-retry-interval-ms: {e}")
    })?;
    let node_id = format!("{}/{}", args.namespace, args.pod_name);
    validate_name("node id", &node_id).map_err(|e| format!("--namespace/--pod-name: {e}"))?;
    let store = args.redis.connect()?;
    let options = NodeOptions {
        metadata: vec![("role".into(), "controller".into())],
        ..Default::default()
    };
    let node = Arc::new(
        Node::start_with(store.clone(), &node_id, NodeConfig::default(), options)
            .await
            .map_err(|e| e.to_string())?,
    );
    let leadership = node
        .join(
            &format!("{}/leasehold-controller", args.namespace),
            replicas,
        )
        .map_err(|e| e.to_string())?;

    let groups: Api<LeaderGroup> = match &args.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let controller = Controller::new(groups, watcher::Config::default());
    let reflector = controller.store();
    let ctx = Arc::new(Context {
        client: client.clone(),
        node: node.clone(),
        leadership: leadership.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "leasehold-controller".into(),
                instance: Some(args.pod_name.clone()),
            },
        ),
        groups: reflector.clone(),
        swept: Mutex::new(Vec::new()),
        resync: Duration::from_secs(args.resync_seconds.max(1)),
    });

    // Engine events: reconcile the group they name, remember sweeps.
    let (triggers_tx, triggers) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<LeaderGroup>>();
    let mut redis_events = store.follow_events();
    let sweep_ctx = ctx.clone();
    let sweep_reflector = reflector.clone();
    let mut local_events = node.events();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(event) = redis_events.recv() => {
                    if let Some(group) = event.get("group").and_then(|g| g.as_str()) {
                        if let Some((ns, name)) = group.split_once('/') {
                            let _ = triggers_tx.send(ObjectRef::new(name).within(ns));
                        }
                    }
                }
                Ok(event) = local_events.recv() => {
                    if let Event::Swept { nodes, .. } = event {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64);
                        if let Ok(mut swept) = sweep_ctx.swept.lock() {
                            swept.retain(|(_, at)| now.saturating_sub(*at) < SWEEP_MEMORY.as_millis() as u64);
                            swept.extend(nodes.iter().map(|n| (n.clone(), now)));
                        }
                        // Reconcile the groups that listed a swept node.
                        for g in sweep_reflector.state() {
                            let listed = g.status.as_ref().is_some_and(|s| s.members.iter().any(|m| nodes.contains(&m.node)));
                            if listed {
                                let _ = triggers_tx.send(ObjectRef::from_obj(&*g));
                            }
                        }
                    }
                }
                else => break,
            }
        }
    });
    let trigger_stream = futures::stream::unfold(triggers, |mut rx| async move {
        rx.recv().await.map(|t| (t, rx))
    });

    // Becoming the active replica reconciles every group at once (a standby
    // skipped them); also kept for probes and metrics.
    let (became_active_tx, became_active) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut role = leadership.role();
    tokio::spawn(async move {
        let mut was_active = false;
        loop {
            let active = matches!(*role.borrow_and_update(), crate::Role::Leader { .. });
            controller_metrics().set_active(active);
            if active && !was_active {
                tracing::info!("this replica is now the active controller");
                let _ = became_active_tx.send(());
            }
            was_active = active;
            if role.changed().await.is_err() {
                break;
            }
        }
    });
    let became_active = futures::stream::unfold(became_active, |mut rx| async move {
        rx.recv().await.map(|t| (t, rx))
    });

    // Probes and metrics.
    let listener = http::bind(args.listen).await?;
    let probe_store = store.clone();
    tokio::spawn(http::serve(listener, move |method, path| {
        let store = probe_store.clone();
        async move {
            match (method.as_str(), path.as_str()) {
                ("GET", "/healthz") => Response::text(200, "ok\n"),
                ("GET", "/readyz") => {
                    match crate::store::bounded(Duration::from_secs(1), store.ping()).await {
                        Ok(()) => Response::text(200, "ready\n"),
                        Err(e) => Response::text(503, format!("{e}\n")),
                    }
                }
                ("GET", "/metrics") => {
                    Response::text(200, metrics().render() + &controller_metrics().render())
                }
                _ => Response::text(404, "not found\n"),
            }
        }
    }));

    let pods: Api<Pod> = match &args.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let pod_reflector = reflector.clone();
    tracing::info!(node = %node_id, listen = %args.listen, "controller started");
    controller
        .watches(pods, watcher::Config::default(), move |pod| {
            let ns = pod.namespace().unwrap_or_default();
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            pod_reflector
                .state()
                .into_iter()
                .filter(|g| g.namespace().as_deref() == Some(ns.as_str()))
                .filter(|g| {
                    labels.contains_key(&g.spec.role_label)
                        || selector::matches(&g.spec.selector, &labels)
                })
                .map(|g| ObjectRef::from_obj(&*g))
                .collect::<Vec<_>>()
        })
        .reconcile_on(trigger_stream)
        .reconcile_all_on(became_active)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller stream");
            }
        })
        .await;
    // Graceful: hand the controllers' lease to a standby at once. The
    // registration itself expires (other tasks still hold the node).
    node.shutdown().await;
    Ok(())
}
