//! `leasehold agent`: the sidecar. One node per pod, named `NAMESPACE/POD`,
//! campaigns for the pod's LeaderGroups (engine group `NAMESPACE/NAME`) and
//! tells the pod what it is: through a local HTTP API (`api`), a file per
//! group (`role_file`) and, in exec mode (`exec`), by running a command
//! only while it leads. It talks to the store only; the controller reflects what
//! it does into Kubernetes.
//!
//! One task owns the [`Node`]. It carries out step-downs asked for through
//! the API, and on SIGTERM or SIGINT it stops the exec'd command first and
//! releases the leases second, so a successor never starts its copy of the
//! command while this pod's still runs.
// Production code only (clippy.toml sets the length); a test reads as one scenario.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod api;
pub mod config;
mod exec;
mod health;
mod invalid;
mod mailbox;
mod metrics;
mod payload;
mod role_file;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};

use api::StepDown;

use leasehold_daemon::election_args::ElectionArgs;
use leasehold_daemon::error::{FlagError, StartError};
use leasehold_daemon::http;
use leasehold_daemon::names::{validate_object_name, NamespacedName};
use leasehold_daemon::store_settings::SettingsWatch;
use leasehold_engine::config::{
    validate_name, ConfigError, ElectionConfig, InboxConfig, NodeConfig,
};
use leasehold_engine::{Event, Group, Node, NodeOptions};

pub use api::{DeferView, GroupView, InboxView, Status};
pub use health::HealthView;
pub use mailbox::Item;

/// The exec guard, run by the `leasehold` binary as its hidden
/// `exec-guard` subcommand (see `exec::guard`).
pub mod exec_guard {
    pub use crate::exec::deadline::LEAD as KILL_LEAD;
    pub use crate::exec::guard::{run, SUBCOMMAND};
}

#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub store: leasehold_daemon::store_args::StoreArgs,
    /// The pod's name (downward API); the node id is NAMESPACE/POD_NAME.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The pod's namespace (downward API): the namespace of the LeaderGroups.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// Node id to use instead of NAMESPACE/POD_NAME (outside Kubernetes).
    #[arg(long, env = "LEASEHOLD_NODE_ID")]
    pub node_id: Option<String>,
    /// Name of a LeaderGroup in the namespace to campaign for; repeat it, or separate names with commas. Without one the agent only relays messages.
    #[arg(
        long = "group",
        value_name = "NAME",
        env = "LEASEHOLD_GROUPS",
        value_delimiter = ','
    )]
    pub groups: Vec<String>,
    /// Address of the local HTTP API (step-down included), probes and metrics.
    #[arg(long, env = "LEASEHOLD_LISTEN", default_value = config::DEFAULT_AGENT_LISTEN)]
    pub listen: SocketAddr,
    /// Also serve /healthz, /readyz and /metrics, and nothing else, on this address (e.g. 0.0.0.0:4041 for the kubelet and Prometheus).
    #[arg(long, env = "LEASEHOLD_PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,
    /// Directory where the agent keeps one file per group, holding `leader TERM`, `follower`, `candidate`, `abstaining` or `stopped`.
    #[arg(long, env = "LEASEHOLD_ROLE_DIR")]
    pub role_dir: Option<PathBuf>,
    #[command(flatten)]
    pub election: ElectionArgs,
    /// Priority in every group: a free seat goes to the live member of highest priority; 0 follows and never leads (0 to 100, default 1). Empty means the default, so it can come from a pod annotation through the downward API.
    #[arg(
        long,
        env = "LEASEHOLD_PRIORITY",
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub priority: Option<String>,
    /// Check the application's health with a GET of this http:// URL (200 to 399 passes), at start and every retry interval: an unhealthy pod never takes the lead, and a leader that fails --health-failures checks in a row steps down.
    #[arg(
        long,
        env = "LEASEHOLD_HEALTH_URL",
        value_name = "URL",
        conflicts_with = "health_command"
    )]
    pub health_url: Option<String>,
    /// Check the application's health with this shell command (exit 0 passes), as --health-url does.
    #[arg(long, env = "LEASEHOLD_HEALTH_COMMAND", value_name = "COMMAND")]
    pub health_command: Option<String>,
    /// How long one health check may take, ms (1 to 60000).
    #[arg(long, env = "LEASEHOLD_HEALTH_TIMEOUT_MS", default_value_t = health::DEFAULT_HEALTH_TIMEOUT_MS)]
    pub health_timeout_ms: u64,
    /// Failed health checks in a row after which a leader steps down (1 to 100).
    #[arg(long, env = "LEASEHOLD_HEALTH_FAILURES", default_value_t = health::DEFAULT_HEALTH_FAILURES)]
    pub health_failures: u32,
    /// How long the node stays registered without a heartbeat, ms.
    #[arg(long, env = "LEASEHOLD_NODE_LEASE_MS", default_value_t = NodeConfig::default().lease_duration_ms)]
    pub node_lease_ms: u64,
    /// Exec mode: time between SIGTERM and SIGKILL when the command must stop, ms.
    #[arg(long, env = "LEASEHOLD_GRACE_PERIOD_MS", default_value_t = config::DEFAULT_EXEC_GRACE_MS)]
    pub grace_period_ms: u64,
    /// Unread messages the node's inbox holds in the store; past it the oldest are dropped and counted (1 to 10000000).
    #[arg(long, env = "LEASEHOLD_INBOX_MAX_LENGTH", default_value_t = leasehold_engine::config::DEFAULT_INBOX_MAX_LENGTH)]
    pub inbox_max_length: u64,
    /// Unread messages past which the inbox reports `lag` (default: half of --inbox-max-length).
    #[arg(long, env = "LEASEHOLD_INBOX_LAG_THRESHOLD")]
    pub inbox_lag_threshold: Option<u64>,
    /// Topic or pattern to subscribe to at start (`orders.*`, `orders.>`); repeat it, or separate them with commas. Read the messages from the API (GET /v1/inbox/events).
    #[arg(
        long = "subscribe",
        value_name = "PATTERN",
        env = "LEASEHOLD_SUBSCRIBE",
        value_delimiter = ','
    )]
    pub subscribe: Vec<String>,
    /// Exec mode: the command (after `--`) to run only while this pod leads its one group.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The arguments, checked: what the agent will do.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub node_id: String,
    /// `(LeaderGroup name, engine group NAMESPACE/NAME)`.
    pub groups: Vec<(String, String)>,
    pub election: ElectionConfig,
    /// The priority this pod campaigns with in every group.
    pub priority: u32,
    /// How the application's health is checked, if it is.
    pub health: Option<health::HealthSettings>,
    pub node: NodeConfig,
    pub grace: Duration,
    pub command: Vec<String>,
    /// Subscriptions made at start.
    pub subscribe: Vec<String>,
    pub inbox: InboxConfig,
}

impl Settings {
    /// Checks every flag and names the one at fault, before anything starts.
    pub fn from_args(args: &AgentArgs) -> Result<Self, FlagError> {
        object_name("--namespace", &args.namespace)?;
        let node_id = Self::node_id(args)?;
        let groups = Self::groups(args)?;
        let election = args.election.config()?;
        let node = NodeConfig::with_lease(args.node_lease_ms);
        node.validate()
            .map_err(|e| FlagError::new("--node-lease-ms", e))?;
        Self::check_exec(args, groups.len(), &election)?;
        Ok(Self {
            node_id,
            groups,
            election,
            priority: Self::priority(args)?,
            health: Self::health(args)?,
            node,
            grace: Duration::from_millis(args.grace_period_ms),
            command: args.command.clone(),
            subscribe: Self::subscriptions(args)?,
            inbox: Self::inbox(args)?,
        })
    }

    /// `--node-id`, or `NAMESPACE/POD_NAME`.
    fn node_id(args: &AgentArgs) -> Result<String, FlagError> {
        let node_id = match (&args.node_id, &args.pod_name) {
            (Some(id), _) => id.clone(),
            (None, Some(pod)) => {
                object_name("POD_NAME", pod)?;
                NamespacedName::new(&args.namespace, pod).to_string()
            }
            (None, None) => {
                return Err(FlagError::worded(
                    "POD_NAME",
                    "no node id: set POD_NAME (from the downward API) or --node-id",
                ))
            }
        };
        validate_name("--node-id", &node_id)
            .map_err(|e| FlagError::worded("--node-id", e.to_string()))?;
        Ok(node_id)
    }

    /// `--priority`: a whole number from 0 to MAX_PRIORITY; unset or empty
    /// (a downward-API annotation the pod does not have) is the default.
    fn priority(args: &AgentArgs) -> Result<u32, FlagError> {
        let text = args.priority.as_deref().map(str::trim).unwrap_or("");
        if text.is_empty() {
            return Ok(leasehold_engine::DEFAULT_PRIORITY);
        }
        let out_of_range = || {
            FlagError::worded(
                "--priority",
                format!(
                    "--priority = {text:?} is out of range: it must be a whole number from 0 (never leads) to {}",
                    leasehold_engine::MAX_PRIORITY
                ),
            )
        };
        let priority: u32 = text.parse().map_err(|_| out_of_range())?;
        leasehold_engine::config::validate_priority("--priority", priority)
            .map_err(|_| out_of_range())?;
        Ok(priority)
    }

    /// `--health-url` or `--health-command`, with its timeout and count.
    fn health(args: &AgentArgs) -> Result<Option<health::HealthSettings>, FlagError> {
        let check = match (&args.health_url, &args.health_command) {
            (Some(url), _) => health::Check::url(url)
                .map_err(|e| FlagError::worded("--health-url", e.to_string()))?,
            (None, Some(line)) if !line.trim().is_empty() => health::Check::Command(line.clone()),
            (None, Some(_)) => {
                return Err(FlagError::worded(
                    "--health-command",
                    "--health-command is empty",
                ))
            }
            (None, None) => return Ok(None),
        };
        if !(1..=health::MAX_HEALTH_TIMEOUT_MS).contains(&args.health_timeout_ms) {
            return Err(FlagError::worded("--health-timeout-ms", format!(
                "--health-timeout-ms = {} is out of range: it must be a whole number of milliseconds from 1 to {}",
                args.health_timeout_ms,
                health::MAX_HEALTH_TIMEOUT_MS
            )));
        }
        if !(1..=health::MAX_HEALTH_FAILURES).contains(&args.health_failures) {
            return Err(FlagError::worded(
                "--health-failures",
                format!(
                "--health-failures = {} is out of range: it must be a whole number from 1 to {}",
                args.health_failures,
                health::MAX_HEALTH_FAILURES
            ),
            ));
        }
        Ok(Some(health::HealthSettings {
            check,
            timeout: Duration::from_millis(args.health_timeout_ms),
            failures: args.health_failures,
        }))
    }

    /// `(LeaderGroup name, engine group name)` per `--group`, each once.
    fn groups(args: &AgentArgs) -> Result<Vec<(String, String)>, FlagError> {
        let mut groups: Vec<(String, String)> = Vec::new();
        for name in &args.groups {
            object_name("--group", name)?;
            if groups.iter().any(|(n, _)| n == name) {
                return Err(FlagError::worded(
                    "--group",
                    format!("--group {name:?} is given twice"),
                ));
            }
            groups.push((
                name.clone(),
                NamespacedName::new(&args.namespace, name).to_string(),
            ));
        }
        Ok(groups)
    }

    /// The grace period, and in exec mode one group, a command that exists
    /// and a grace period that fits the timings.
    fn check_exec(
        args: &AgentArgs,
        groups: usize,
        election: &ElectionConfig,
    ) -> Result<(), FlagError> {
        if args.grace_period_ms > config::MAX_EXEC_GRACE_MS {
            return Err(FlagError::worded("--grace-period-ms", format!(
                "--grace-period-ms = {} is out of range: it must be a whole number of milliseconds from 0 to {}",
                args.grace_period_ms,
                config::MAX_EXEC_GRACE_MS
            )));
        }
        if args.command.is_empty() {
            return Ok(());
        }
        if groups != 1 {
            return Err(FlagError::worded("--group", format!(
                "exec mode runs the command while this pod leads one group; {groups} --group flags were given"
            )));
        }
        exec::check_program(&args.command[0])?;
        // The command is stopped once less than the grace period is left
        // on the lease; a healthy renewal cycle, even one slow by a retry
        // interval, must never get there. (Timings adopted later from the
        // LeaderGroup shorten the grace period instead: see `exec`.)
        let room = exec::grace_room(election).as_millis();
        if u128::from(args.grace_period_ms) > room {
            return Err(FlagError::worded("--grace-period-ms", format!(
                "--grace-period-ms = {} is too long for these timings: exec mode needs at most ttl - renew interval - retry interval - 40 ms = {room} ms",
                args.grace_period_ms
            )));
        }
        Ok(())
    }

    /// `--subscribe` patterns, checked, each once.
    fn subscriptions(args: &AgentArgs) -> Result<Vec<String>, FlagError> {
        let mut subscribe: Vec<String> = Vec::new();
        for pattern in &args.subscribe {
            leasehold_engine::inbox::topic::validate_subscription(pattern)
                .map_err(|e| FlagError::worded("--subscribe", format!("--subscribe: {e}")))?;
            if !subscribe.contains(pattern) {
                subscribe.push(pattern.clone());
            }
        }
        Ok(subscribe)
    }

    /// The inbox limits, within the engine's own bounds, naming the flag.
    fn inbox(args: &AgentArgs) -> Result<InboxConfig, FlagError> {
        let mut inbox = InboxConfig::with_max_length(args.inbox_max_length);
        if let Some(threshold) = args.inbox_lag_threshold {
            inbox.lag_threshold = threshold;
        }
        inbox.validate().map_err(|e| {
            let flag = match e {
                ConfigError::OutOfBounds {
                    option: "lag_threshold",
                    ..
                } => "--inbox-lag-threshold",
                _ => "--inbox-max-length",
            };
            FlagError::new(flag, e)
        })?;
        Ok(inbox)
    }
}

/// A Kubernetes object name given as `flag`, or what is wrong with it.
fn object_name(flag: &'static str, value: &str) -> Result<(), FlagError> {
    validate_object_name(flag, value).map_err(|e| FlagError::worded(flag, e.to_string()))
}

/// Why the agent stopped.
enum Exit {
    Signal,
    Command(u8),
    Displaced,
    Failed(AgentError),
}

/// Why the agent could not run, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("another live process took over node id {0:?}; this agent stopped campaigning")]
    Displaced(String),
    #[error(transparent)]
    Exec(#[from] exec::ExecError),
    #[error("the node's event stream ended")]
    EventsEnded,
}

impl From<FlagError> for AgentError {
    fn from(e: FlagError) -> Self {
        Self::Start(e.into())
    }
}

/// Steps down from `group`, handing it to the node `to` when one is named;
/// in exec mode, the command of that group is stopped first, so it is gone
/// before another pod can win the lease. A handover that would be refused
/// is refused before the command stops; one refused after (the successor
/// died in between) becomes a plain step-down, as a command stopped for a
/// term is not started again in it.
async fn step_down(
    node: &Node,
    command: Option<&exec::Exec>,
    settings: &Settings,
    group: &str,
    to: Option<&str>,
) -> Result<bool, leasehold_engine::Error> {
    if let Some(to) = to {
        node.check_hand_over(group, to).await?;
    }
    let stopped = match command {
        Some(command) if settings.groups[0].1 == group => {
            command.hand_over().await;
            true
        }
        _ => false,
    };
    match to {
        None => node.step_down(group).await,
        Some(to) => match node.hand_over(group, to).await {
            Ok(()) => Ok(true),
            Err(e) if stopped => {
                tracing::warn!(%group, %to, error = %e, "the handover was refused after the command stopped; stepping down");
                node.step_down(group).await
            }
            Err(e) => Err(e),
        },
    }
}

/// Runs the agent until SIGTERM/SIGINT (exit code 0), or in exec mode until
/// the command ends by itself while leading (its exit code).
pub async fn run(args: AgentArgs) -> Result<u8, AgentError> {
    // Installed first, so a SIGTERM during start-up is still graceful.
    let shutdown = leasehold_daemon::signal::shutdown();
    let settings = Settings::from_args(&args)?;
    let mut agent = Agent::start(&args, settings).await?;
    let exit = agent.run_until(shutdown).await;
    agent.stop(exit).await
}

/// A running agent: its node and groups, and every task it started, each
/// kept by a handle so that [`Agent::stop`] ends them all.
struct Agent {
    settings: Settings,
    /// Reports the store server's unsafe settings while the agent runs.
    _store_settings: SettingsWatch,
    namespace: String,
    /// Shared with the API, which publishes and subscribes through it.
    node: Arc<Node>,
    /// `(LeaderGroup name, handle)`.
    groups: Vec<(String, Group)>,
    events: broadcast::Receiver<Event>,
    /// Step-downs asked through the API.
    requests: mpsc::Receiver<StepDown>,
    /// Step-downs the controller asked for, held back so exec mode can stop
    /// the command before the lease is released.
    deferred: mpsc::UnboundedReceiver<leasehold_engine::StepDownRequest>,
    /// The API server, and the probe server if `--probe-listen` is set.
    servers: tokio::task::JoinSet<()>,
    stop_server: tokio::sync::watch::Sender<bool>,
    /// Logs the inbox's lag and drop notices into the mailbox.
    mailbox_notices: tokio::task::JoinHandle<()>,
    role_files: Option<role_file::RoleFiles>,
    role_watchers: Option<tokio::task::JoinSet<()>>,
    command: Option<exec::Exec>,
    /// Reaps orphans when the agent is PID 1 of its namespace.
    reaper: Option<tokio::task::JoinHandle<()>>,
    /// Checks the application's health (`--health-url`, `--health-command`).
    health: Option<tokio::task::JoinHandle<()>>,
    /// Groups (LeaderGroup names) to step down from because the
    /// application failed its health checks.
    unhealthy: mpsc::UnboundedReceiver<String>,
}

impl Agent {
    /// Checks what can be checked before anything starts (store flags, the
    /// listen address, the role directory), then starts the node, joins
    /// the groups and starts the API server, the role files and the command.
    async fn start(args: &AgentArgs, settings: Settings) -> Result<Self, AgentError> {
        let store = args.store.connect_checked().await?;
        let (listener, probe_listener) = Self::bind(args).await?;
        let role_files = match &args.role_dir {
            Some(dir) => Some(role_file::RoleFiles::create(dir.clone())?),
            None => None,
        };
        let (deferred_tx, deferred) = mpsc::unbounded_channel();
        let mut registry = leasehold_daemon::metrics::new_registry();
        let options = Self::node_options(args, &settings, deferred_tx, &mut registry);
        let agent_metrics = metrics::AgentMetrics::register(&mut registry);
        let store_settings = SettingsWatch::start(store.clone(), &mut registry).await;
        let node = Node::start_with(store.clone(), &settings.node_id, settings.node, options)
            .await
            .map_err(StartError::from)?;
        let events = node.events();
        let (node, groups) = Self::join(node, &settings).await?;

        let node = Arc::new(node);
        let (step_downs, requests) = mpsc::channel::<StepDown>(16);
        let mailbox = Arc::new(mailbox::Mailbox::new(node.inbox()));
        let mailbox_notices = {
            let (mailbox, id, events) = (mailbox.clone(), settings.node_id.clone(), node.events());
            tokio::spawn(async move { mailbox.follow(&id, events).await })
        };
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
        let health = Self::start_health(&settings, &groups, health, unhealthy_tx, agent_metrics);
        let (servers, stop_server) = Self::serve(state, listener, probe_listener);
        let role_watchers = role_files.as_ref().map(|files| files.watch(&groups));
        let own_children = exec::reaper::OwnChildren::default();
        let reaper = exec::reaper::start_if_pid_one(own_children.clone());
        let command = Self::start_command(&settings, &groups, own_children);
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
            servers,
            stop_server,
            mailbox_notices,
            role_files,
            role_watchers,
            command,
            reaper,
            health,
            unhealthy,
        })
    }

    /// The health checks, when the agent is told how to check.
    fn start_health(
        settings: &Settings,
        groups: &[(String, Group)],
        health: Option<Arc<health::Health>>,
        step_downs: mpsc::UnboundedSender<String>,
        metrics: Arc<metrics::AgentMetrics>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let check = settings.health.clone()?;
        Some(tokio::spawn(health::watch(
            check,
            groups.to_vec(),
            settings.priority,
            health?,
            step_downs,
            metrics,
        )))
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
    async fn bind(
        args: &AgentArgs,
    ) -> Result<(tokio::net::TcpListener, Option<tokio::net::TcpListener>), AgentError> {
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
    async fn join(
        node: Node,
        settings: &Settings,
    ) -> Result<(Node, Vec<(String, Group)>), AgentError> {
        let joined = match Self::join_and_subscribe(&node, settings).await {
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

    /// Serves the API (and the probes on their own listener) until the
    /// returned sender says stop.
    fn serve(
        state: Arc<api::AgentState>,
        listener: tokio::net::TcpListener,
        probe_listener: Option<tokio::net::TcpListener>,
    ) -> (tokio::task::JoinSet<()>, tokio::sync::watch::Sender<bool>) {
        let (stop_server, server_stopped) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let mut servers = tokio::task::JoinSet::new();
        if let Some(probe_listener) = probe_listener {
            servers.spawn(http::serve(
                probe_listener,
                api::router(state.clone(), api::Surface::Probes),
                stopped(server_stopped.clone()),
            ));
        }
        servers.spawn(http::serve(
            listener,
            api::router(state, api::Surface::Api),
            stopped(server_stopped),
        ));
        (servers, stop_server)
    }

    /// Carries out step-downs until `shutdown`, the command's own end, or
    /// the node's displacement.
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

    async fn run_until(&mut self, shutdown: impl std::future::Future<Output = ()>) -> Exit {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return Exit::Signal,
                Some(request) = self.requests.recv() => {
                    let full = NamespacedName::new(&self.namespace, &request.group).to_string();
                    let result = step_down(&self.node, self.command.as_ref(), &self.settings, &full, request.to.as_deref()).await;
                    tracing::info!(group = %full, to = ?request.to, ?result, "step-down asked through the API");
                    let _ = request.reply.send(result);
                }
                Some(name) = self.unhealthy.recv() => {
                    let full = NamespacedName::new(&self.namespace, &name).to_string();
                    let result = step_down(&self.node, self.command.as_ref(), &self.settings, &full, None).await;
                    tracing::warn!(group = %full, ?result, "stepped down: the application failed its health checks");
                }
                Some(request) = self.deferred.recv() => {
                    let result = step_down(&self.node, self.command.as_ref(), &self.settings, &request.group, request.to.as_deref()).await;
                    tracing::info!(group = %request.group, from = %request.from, to = ?request.to, ?result, "step-down asked by the controller");
                }
                ended = async { self.command.as_mut().expect("guarded").ended().await }, if self.command.is_some() => {
                    self.command = None;
                    return match ended {
                        Ok(code) => Exit::Command(code),
                        Err(e) => Exit::Failed(e.into()),
                    };
                }
                event = self.events.recv() => match event {
                    Ok(Event::Displaced { by_incarnation, .. }) => {
                        tracing::error!(%by_incarnation, "another process took over this node id");
                        return Exit::Displaced;
                    }
                    Err(broadcast::error::RecvError::Closed) => return Exit::Failed(AgentError::EventsEnded),
                    _ => {}
                },
            }
        }
    }

    /// Ends every task of the agent, in the order that keeps a single
    /// leader: the command first (nothing may run as leader once the lease
    /// is free), role files `stopped` before the leases go, the node last.
    async fn stop(self, exit: Exit) -> Result<u8, AgentError> {
        if let Some(health) = self.health {
            health.abort();
        }
        if let Some(command) = self.command {
            command.stop().await;
        }
        if let Some(reaper) = self.reaper {
            reaper.abort();
        }
        let _ = self.stop_server.send(true);
        let mut servers = self.servers;
        while servers.join_next().await.is_some() {}
        self.mailbox_notices.abort();
        let _ = self.mailbox_notices.await;
        // Each watcher is awaited: one that is mid-write on another thread
        // must not land after `stopped`.
        if let Some(mut watchers) = self.role_watchers {
            watchers.shutdown().await;
        }
        if let Some(files) = &self.role_files {
            files.write_stopped(&self.groups);
        }
        let unreleased = self.node.shutdown().await;
        if unreleased.is_empty() {
            tracing::info!("leases released");
        } else {
            tracing::warn!(groups = ?unreleased, "leases not released (the store did not answer); they run out within their ttl");
        }
        match only_owner(self.node).await {
            Some(node) => {
                if let Err(e) = node.close().await {
                    tracing::warn!(error = %e, "removing the registration failed (it expires on its own)");
                }
            }
            None => tracing::warn!(
                "an API request still held the node; its registration expires on its own"
            ),
        }
        match exit {
            Exit::Signal => {
                tracing::info!("agent stopped");
                Ok(0)
            }
            Exit::Command(code) => {
                tracing::info!(
                    code,
                    "the command ended by itself; the agent stops with its exit code"
                );
                Ok(code)
            }
            Exit::Displaced => Err(AgentError::Displaced(self.settings.node_id)),
            Exit::Failed(e) => Err(e),
        }
    }
}

/// The node once the API's last request has let go of it (the servers
/// are stopped; an event stream's task ends when its connection closes),
/// waiting up to a second.
async fn only_owner(mut node: Arc<Node>) -> Option<Node> {
    for _ in 0..100 {
        match Arc::try_unwrap(node) {
            Ok(node) => return Some(node),
            Err(shared) => node = shared,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
