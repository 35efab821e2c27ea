//! Starting the agent: everything that can be refused (the store's flags,
//! the listen addresses, the role directory, a group or a subscription) is
//! refused before a task runs, and a refusal after the node registered
//! unregisters it again.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Agent, AgentError};
use crate::api::{self, StepDown};
use crate::args::AgentArgs;
use crate::settings::Settings;
use crate::{exec, health, mailbox, metrics, role_file};
use leasehold_daemon::error::{FlagError, StartError};
use leasehold_daemon::http;
use leasehold_daemon::store_settings::SettingsWatch;
use leasehold_engine::{Group, Node, NodeOptions};

impl Agent {
    /// Checks what can be checked before anything starts (the store's
    /// flags, the listen address, the role directory), then starts the
    /// node, joins the groups and starts the API server, the role files and
    /// the command.
    // Linear wiring, read top to bottom: each step needs the one before.
    #[allow(clippy::too_many_lines)]
    pub(crate) async fn start(args: &AgentArgs, settings: Settings) -> Result<Self, AgentError> {
        let store = args.store.connect_checked().await?;
        let (listener, probe_listener) = bind(args).await?;
        let role_files = match &args.role_dir {
            Some(dir) => Some(role_file::RoleFiles::create(dir.clone())?),
            None => None,
        };
        let (deferred_tx, deferred) = mpsc::unbounded_channel();
        let mut registry = leasehold_daemon::metrics::new_registry();
        let options = node_options(args, &settings, deferred_tx, &mut registry);
        let agent_metrics = metrics::AgentMetrics::register(&mut registry);
        let store_settings = SettingsWatch::start(store.clone(), &mut registry).await;
        let node = Node::start_with(store.clone(), &settings.node_id, settings.node, options)
            .await
            .map_err(StartError::from)?;
        let events = node.events();
        let (node, groups) = join(node, &settings).await?;

        let node = Arc::new(node);
        let (tasks, stopping) = (TaskTracker::new(), CancellationToken::new());
        let health_stopping = stopping.child_token();
        let (step_downs, requests) = mpsc::channel::<StepDown>(16);
        let mailbox = Arc::new(mailbox::Mailbox::new(node.inbox()));
        let notices = mailbox
            .clone()
            .follow(settings.node_id.clone(), node.events());
        spawn(&tasks, &stopping, notices);
        let health = settings
            .health
            .as_ref()
            .map(|_| Arc::new(health::Health::default()));
        let state = Arc::new(api::AgentState {
            health: health.clone(),
            node: node.clone(),
            mailbox,
            node_id: settings.node_id.clone(),
            namespace: args.namespace.clone(),
            groups: groups.clone(),
            store,
            step_downs,
            registry: Arc::new(registry),
            metrics: agent_metrics.clone(),
        });
        let (unhealthy_tx, unhealthy) = mpsc::unbounded_channel();
        if let (Some(check), Some(health)) = (settings.health.clone(), health) {
            let (groups, priority) = (groups.clone(), settings.priority);
            let watch = health::watch(check, groups, priority, health, unhealthy_tx, agent_metrics);
            spawn(&tasks, &health_stopping, watch);
        }
        serve(&tasks, &stopping, state, listener, probe_listener);
        if let Some(files) = &role_files {
            for (name, group) in &groups {
                spawn(&tasks, &stopping, files.keep_current(name, group.clone()));
            }
        }
        let own_children = exec::reaper::OwnChildren::default();
        if let Some(reaper) = exec::reaper::if_pid_one(own_children.clone()) {
            spawn(&tasks, &stopping, reaper);
        }
        let command = start_command(&settings, &groups, own_children);
        if settings.groups.is_empty() {
            tracing::info!("no --group: this agent campaigns for nothing and only relays messages");
        }
        tracing::info!(
            node = %settings.node_id,
            groups = ?settings.groups.iter().map(|g| &g.1).collect::<Vec<_>>(),
            listen = %args.listen,
            exec = command.is_some(),
            "agent started"
        );
        Ok(Self {
            _store_settings: store_settings,
            settings,
            namespace: args.namespace.clone(),
            node,
            groups,
            events,
            requests,
            deferred,
            unhealthy,
            role_files,
            command,
            tasks,
            stopping,
            health_stopping,
        })
    }
}

/// Runs `task` on `tasks` until `stop` is cancelled (it is then dropped at
/// its next await, as an aborted task would be).
fn spawn(
    tasks: &TaskTracker,
    stop: &CancellationToken,
    task: impl Future<Output = ()> + Send + 'static,
) {
    tasks.spawn(stop.clone().run_until_cancelled_owned(task));
}

/// Exec mode's command, when there is one.
fn start_command(
    settings: &Settings,
    groups: &[(String, Group)],
    own: exec::reaper::OwnChildren,
) -> Option<exec::Exec> {
    (!settings.command.is_empty()).then(|| {
        let (name, group) = &groups[0];
        exec::Exec::spawn(exec::Run {
            command: settings.command.clone(),
            name: name.clone(),
            group: group.clone(),
            node_id: settings.node_id.clone(),
            grace: settings.grace,
            own,
        })
    })
}

/// The API's listener and, with `--probe-listen`, the probes' own.
async fn bind(args: &AgentArgs) -> Result<(TcpListener, Option<TcpListener>), AgentError> {
    let listener = http::bind(args.listen).await?;
    let probe_listener = match args.probe_listen {
        Some(addr) if addr == args.listen => {
            return Err(FlagError::worded(
                "--probe-listen",
                format!("--probe-listen {addr} is the same address as --listen"),
            )
            .into())
        }
        Some(addr) => Some(http::bind(addr).await?),
        None => None,
    };
    Ok((listener, probe_listener))
}

/// The node's metadata (what `leasehold nodes` shows), its inbox
/// settings, and the engine's metrics in `registry`.
fn node_options(
    args: &AgentArgs,
    settings: &Settings,
    step_downs: mpsc::UnboundedSender<leasehold_engine::StepDownRequest>,
    registry: &mut prometheus_client::registry::Registry,
) -> NodeOptions {
    let mut metadata = vec![
        ("agent".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        ("namespace".to_owned(), args.namespace.clone()),
    ];
    if let Some(pod) = &args.pod_name {
        metadata.push(("pod".to_owned(), pod.clone()));
    }
    NodeOptions {
        inbox: settings.inbox,
        metadata,
        step_down_requests: Some(step_downs),
        observer: Some(leasehold_daemon::metrics::EngineMetrics::register(registry)),
        ..Default::default()
    }
}

/// Joins the groups and subscribes. The node is registered but nothing
/// runs yet: a group or a subscription refused here unregisters it
/// rather than leave it live, with its subscriptions, until its lease
/// runs out.
async fn join(node: Node, settings: &Settings) -> Result<(Node, Vec<(String, Group)>), AgentError> {
    let joined = match join_and_subscribe(&node, settings).await {
        Ok(joined) => joined,
        Err(e) => {
            if let Err(close) = node.close().await {
                tracing::warn!(error = %close, "unregistering after a refused start");
            }
            return Err(e.into());
        }
    };
    let groups = settings
        .groups
        .iter()
        .map(|(name, _)| name.clone())
        .zip(joined)
        .collect();
    Ok((node, groups))
}

/// Serves the API (and the probes on their own listener) until `stop` is
/// cancelled; each server then closes its connections itself.
fn serve(
    tasks: &TaskTracker,
    stop: &CancellationToken,
    state: Arc<api::AgentState>,
    listener: TcpListener,
    probe_listener: Option<TcpListener>,
) {
    if let Some(probe_listener) = probe_listener {
        let probes = api::router(state.clone(), api::Surface::Probes);
        tasks.spawn(http::serve(
            probe_listener,
            probes,
            stop.clone().cancelled_owned(),
        ));
    }
    let api = api::router(state, api::Surface::Api);
    tasks.spawn(http::serve(listener, api, stop.clone().cancelled_owned()));
}

/// Joins the groups of `--group` and subscribes to `--subscribe`.
async fn join_and_subscribe(node: &Node, settings: &Settings) -> Result<Vec<Group>, FlagError> {
    // With a health check, a pod campaigns with priority 0 until the
    // first check passes (health.rs).
    let priority = match settings.health {
        Some(_) => 0,
        None => settings.priority,
    };
    let joined = node
        .join_all_with_priority(
            settings.groups.iter().map(|(_, full)| full.as_str()),
            settings.election,
            priority,
        )
        .map_err(|e| FlagError::new("--group", e))?;
    if settings.health.is_some() {
        for group in &joined {
            group.set_problem(Some("unhealthy: not checked yet"));
        }
    }
    for pattern in &settings.subscribe {
        node.subscribe(pattern).await.map_err(|e| {
            FlagError::worded("--subscribe", format!("--subscribe {pattern:?}: {e}"))
        })?;
    }
    Ok(joined)
}
