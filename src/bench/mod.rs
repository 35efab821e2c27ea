//! `leasehold bench`: figures from real runs against a real Redis, printed
//! as Markdown tables (and `--json`, `--svg`). Build with `--release`; a
//! debug build measures the debug build.
//!
//! Scenarios (`--scenario`): `failover` (agent processes: SIGKILL, SIGTERM
//! and step-down of the leader, the sweep of a dead node, Redis stalled for
//! less and more than a ttl), `cost` (Redis calls and CPU of holding and
//! following 1, 100 and 10,000 groups at rest), `messaging`
//! (publish-to-delivery latency, throughput, fan-out), `idle` (what an
//! idle node costs) and `replicas` (what confirming lease writes with a
//! replica costs: claim latency and calls per renewal, on Redis servers of
//! its own), `sentinel` (failovers behind three sentinels, graceful and
//! after a SIGKILL, with and without `min-replicas-to-write 1`: fault to
//! one leader on the new primary against a bound derived from the
//! failover and the timings) and `controller` (the controller process against a real API
//! server: label latency after a leader change, API requests per change,
//! memory and CPU with one group and with `--controller-groups`; needs
//! `scripts/kubernetes/build.sh apiserver`, and `all` skips it, said out
//! loud, where that has not been run). Timings default to a scaled-down ttl 1000 / renew 300 /
//! retry 200 ms so a full run takes minutes; the bounds scale with them.

mod agents;
mod controller;
mod cost;
mod failover;
mod messaging;
mod replicas;
mod report;
mod sentinel;

use std::io::IsTerminal;
use std::time::Duration;

use leasehold_daemon::election_args::{election_config, FLAGS};
use leasehold_engine::ElectionConfig;

use leasehold::local_redis::LocalRedis;
pub use report::Row;

/// Most groups one cost step joins: their names go through one environment
/// variable, which Linux caps at 128 KiB.
const MAX_COST_GROUPS: usize = 15_000;

/// Most groups of the controller scenario: three in-process nodes each,
/// with two connections of their own, must fit the open-file limit.
const MAX_CONTROLLER_GROUPS: usize = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    Failover,
    Cost,
    Messaging,
    Idle,
    Replicas,
    Sentinel,
    Controller,
    All,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Redis to use; when absent, a redis-server is started on a free port
    /// (needed for the Redis pause scenarios, which stop and resume it).
    #[arg(long, env = "LEASEHOLD_REDIS_URL")]
    pub redis_url: Option<String>,
    #[arg(long, value_enum, default_value = "all")]
    pub scenario: Scenario,
    /// Trials per takeover scenario.
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Trials of each failover kind (graceful, SIGKILL) per
    /// `min-replicas-to-write` setting of the Sentinel scenario.
    #[arg(long, default_value_t = 5)]
    pub sentinel_trials: usize,
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
    /// Messages published one at a time for the latency figure.
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
    /// Also write the results as JSON to this file (`-` for standard output).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Also draw the takeover trials against their bounds as an SVG chart in this file.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
}

impl BenchArgs {
    pub fn timings(&self) -> Result<ElectionConfig, String> {
        election_config(
            FLAGS,
            self.ttl_ms,
            self.renew_interval_ms,
            self.retry_interval_ms,
        )
        .map_err(|e| e.to_string())
    }

    pub fn cost_timings(&self) -> Result<ElectionConfig, String> {
        election_config(
            "--cost-ttl-ms/--cost-renew-interval-ms/--cost-retry-interval-ms",
            self.cost_ttl_ms,
            self.cost_renew_interval_ms,
            self.cost_retry_interval_ms,
        )
        .map_err(|e| e.to_string())
    }

    pub fn node_lease_ms(&self) -> u64 {
        self.node_lease_ms.unwrap_or(self.ttl_ms)
    }
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// A fresh key prefix per run, so a bench never touches other data.
pub fn prefix() -> String {
    format!("leasehold-bench-{:08x}", fastrand::u32(..))
}

/// Progress on standard error: one line per step (rewritten in place on a
/// terminal), so the tables on standard output stay clean.
pub fn progress(what: &str) {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2Kbench: {what}");
    } else {
        eprintln!("bench: {what}");
    }
}

pub async fn run(args: BenchArgs) -> Result<(), String> {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build; figures are only meaningful from `cargo run --release -- bench`");
    }
    let timings = args.timings()?;
    args.cost_timings()?;
    if args.trials == 0 {
        return Err("--trials = 0 is out of range: it must be at least 1".into());
    }
    if args.sentinel_trials == 0 || args.sentinel_trials > 100 {
        return Err(format!(
            "--sentinel-trials = {} is out of range: it must be from 1 to 100",
            args.sentinel_trials
        ));
    }
    if args.controller_groups == 0 || args.controller_groups > MAX_CONTROLLER_GROUPS {
        return Err(format!(
            "--controller-groups = {} is out of range: it must be from 1 to {MAX_CONTROLLER_GROUPS}",
            args.controller_groups
        ));
    }
    if let Some(n) = args
        .cost_groups
        .iter()
        .find(|&&n| n == 0 || n > MAX_COST_GROUPS)
    {
        return Err(format!(
            "--cost-groups: {n} is out of range: each count must be from 1 to {MAX_COST_GROUPS}"
        ));
    }
    let (local, url) = match &args.redis_url {
        Some(url) => (None, url.clone()),
        None => {
            let local = LocalRedis::start()?;
            let url = local.url();
            (Some(local), url)
        }
    };
    let all = args.scenario == Scenario::All;
    let mut series = Vec::new();
    let mut rows = Vec::new();
    if all || args.scenario == Scenario::Failover {
        series.extend(failover::run(&url, local.as_ref(), &args).await?);
    }
    if all || args.scenario == Scenario::Cost {
        rows.extend(cost::run(&url, &args).await?);
    }
    if all || args.scenario == Scenario::Messaging {
        rows.extend(messaging::run(&url, &args).await?);
    }
    if all || args.scenario == Scenario::Idle {
        rows.extend(messaging::idle(&url, &args).await?);
    }
    if all || args.scenario == Scenario::Replicas {
        rows.extend(replicas::run(&args).await?);
    }
    if all || args.scenario == Scenario::Sentinel {
        rows.extend(sentinel::run(&args).await?);
    }
    if args.scenario == Scenario::Controller {
        rows.extend(controller::run(&url, &args).await?);
    } else if all {
        match leasehold::local_kube::missing() {
            None => rows.extend(controller::run(&url, &args).await?),
            Some(why) => eprintln!("bench: controller scenario skipped: it {why}"),
        }
    }
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    print!("{}", report::markdown(&series, &rows));
    if let Some(path) = &args.json {
        let text = report::json(&timings, args.node_lease_ms(), args.trials, &series, &rows);
        if path.as_os_str() == "-" {
            print!("{text}");
        } else {
            std::fs::write(path, text).map_err(|e| format!("--json {}: {e}", path.display()))?;
        }
    }
    if let Some(path) = &args.svg {
        let title = format!(
            "leasehold takeover times, {} trials each (ttl {} ms, renew {} ms, retry {} ms)",
            args.trials, timings.ttl_ms, timings.renew_interval_ms, timings.retry_interval_ms
        );
        std::fs::write(path, report::svg(&series, &title))
            .map_err(|e| format!("--svg {}: {e}", path.display()))?;
    }
    Ok(())
}
