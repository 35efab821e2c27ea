//! The agent's flags as clap reads them, before any is checked: what a
//! user can type or set in the environment. [`crate::settings`] checks them.

use std::net::SocketAddr;
use std::path::PathBuf;

use leasehold_daemon::election_args::ElectionArgs;
use leasehold_engine::config::NodeConfig;

use crate::{config, health};

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
    /// This pod's cluster, when groups span clusters that share a store: the node id is then CLUSTER/NAMESPACE/POD_NAME. Give every cluster that shares the store its own name, the same as its controller's --cluster.
    #[arg(long, env = "LEASEHOLD_CLUSTER")]
    pub cluster: Option<String>,
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
