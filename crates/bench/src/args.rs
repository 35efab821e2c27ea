//! The bench's command line: which scenarios, at which timings and sizes.

use leasehold_daemon::election_args::{election_config, FLAGS};
use leasehold_engine::ElectionConfig;

/// Most groups one cost step joins: their names go through one environment
/// variable, which Linux caps at 128 KiB.
pub(super) const MAX_COST_GROUPS: usize = 15_000;

/// Most groups of the controller scenario: three in-process nodes each,
/// with two connections of their own, must fit the open-file limit.
pub(super) const MAX_CONTROLLER_GROUPS: usize = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    Failover,
    Cost,
    Messaging,
    Idle,
    Replicas,
    Sentinel,
    Cluster,
    PostgresFailover,
    Controller,
    All,
}

/// Which store the bench starts when it is given no URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    Redis,
    Postgres,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The store to use (redis://... or postgres://...); when absent, a
    /// throwaway server of the kind --store names is started on a free port
    /// (needed for the pause scenarios, which stop and resume it).
    #[arg(
        long = "store-url",
        visible_alias = "redis-url",
        env = "LEASEHOLD_REDIS_URL"
    )]
    pub redis_url: Option<String>,
    /// Which store to start when no URL is given. The replicas, Sentinel,
    /// cluster and controller scenarios run on Redis only, the
    /// postgres-failover scenario on PostgreSQL only.
    #[arg(long, value_enum, default_value = "redis")]
    pub store: StoreKind,
    #[arg(long, value_enum, default_value = "all")]
    pub scenario: Scenario,
    /// Trials per takeover scenario.
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Trials of each failover kind (graceful, SIGKILL) per
    /// `min-replicas-to-write` setting of the Sentinel scenario.
    #[arg(long, default_value_t = 5)]
    pub sentinel_trials: usize,
    /// Trials of each fault of the cluster scenario (graceful, SIGKILL)
    /// and of the postgres-failover scenario (SIGKILL and promotion). The
    /// failover scenario's agent takeovers take `--trials`.
    #[arg(long, default_value_t = 5)]
    pub failover_trials: usize,
    /// Lease time to live of the takeover and cost scenarios, ms.
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// Renew interval, ms (less than the ttl).
    #[arg(long, default_value_t = 300)]
    pub renew_interval_ms: u64,
    /// Retry interval, ms.
    #[arg(long, default_value_t = 200)]
    pub retry_interval_ms: u64,
    /// The agents' node lease, ms; defaults to the ttl.
    #[arg(long)]
    pub node_lease_ms: Option<u64>,
    /// Lease ttl of the cost-at-rest scenario, ms: the production default,
    /// since thousands of groups at the scaled-down timings would measure a
    /// saturated machine rather than the cost at rest.
    #[arg(long, default_value_t = ElectionConfig::default().ttl_ms)]
    pub cost_ttl_ms: u64,
    /// Renew interval of the cost-at-rest scenario, ms.
    #[arg(long, default_value_t = ElectionConfig::default().renew_interval_ms)]
    pub cost_renew_interval_ms: u64,
    /// Retry interval of the cost-at-rest scenario, ms.
    #[arg(long, default_value_t = ElectionConfig::default().retry_interval_ms)]
    pub cost_retry_interval_ms: u64,
    /// Group counts of the cost-at-rest scenario.
    #[arg(long, value_delimiter = ',', default_value = "1,100,10000")]
    pub cost_groups: Vec<usize>,
    /// How long each cost window is measured, s (a few ttls).
    #[arg(long, default_value_t = 45)]
    pub cost_seconds: u64,
    /// Messages published one at a time for the latency figure. On Redis
    /// each follows one message of each floor: the spec's (the engine's
    /// publish.lua by EVALSHA + XREAD BLOCK, no engine), which leasehold's
    /// p99 is judged against (at most 1.2 times its p99), and the bare
    /// XADD + XREAD BLOCK, shown only.
    #[arg(long, default_value_t = 5_000)]
    pub latency_messages: u64,
    /// Messages published for the one-subscriber throughput figure.
    #[arg(long, default_value_t = 50_000)]
    pub throughput_messages: u64,
    /// Publishes in flight at once for the throughput figures.
    #[arg(long, default_value_t = 100)]
    pub in_flight: usize,
    /// Messages per request for the agent path's batched throughput figure
    /// (`POST /v1/publish/batch`); the messages in flight stay `--in-flight`.
    #[arg(long, default_value_t = 20)]
    pub agent_batch: usize,
    /// Subscribers for the fan-out figure.
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    /// Messages published for the fan-out figure.
    #[arg(long, default_value_t = 2_000)]
    pub fanout_messages: u64,
    /// Idle nodes for the idle-cost figure.
    #[arg(long, default_value_t = 10)]
    pub idle_nodes: usize,
    /// Node lease for the idle-cost figure, ms.
    #[arg(long, default_value_t = 30_000)]
    pub idle_lease_ms: u64,
    /// How long idle cost is measured, s.
    #[arg(long, default_value_t = 60)]
    pub idle_seconds: u64,
    /// LeaderGroups (of three pods each, all live members) of the
    /// controller scenario's scale step.
    #[arg(long, default_value_t = 1000)]
    pub controller_groups: usize,
    /// The peers' scripts (BullMQ's Relay, run with Node.js before the
    /// messaging figures); the checkout's `bench/peers` when absent.
    #[arg(long)]
    pub peers_dir: Option<std::path::PathBuf>,
    /// Leave the peers out of the messaging scenario (no Node.js needed;
    /// the goals stated against them are then not judged).
    #[arg(long)]
    pub no_peers: bool,
    /// Also write the results as JSON to this file (`-` for standard output).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Also draw the takeover trials against their bounds as an SVG chart in this file.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
}

impl BenchArgs {
    pub fn timings(&self) -> anyhow::Result<ElectionConfig> {
        let timings = election_config(
            FLAGS,
            self.ttl_ms,
            self.renew_interval_ms,
            self.retry_interval_ms,
        )?;
        Ok(timings)
    }

    pub fn cost_timings(&self) -> anyhow::Result<ElectionConfig> {
        let timings = election_config(
            "--cost-ttl-ms/--cost-renew-interval-ms/--cost-retry-interval-ms",
            self.cost_ttl_ms,
            self.cost_renew_interval_ms,
            self.cost_retry_interval_ms,
        )?;
        Ok(timings)
    }

    pub fn node_lease_ms(&self) -> u64 {
        self.node_lease_ms.unwrap_or(self.ttl_ms)
    }
}
