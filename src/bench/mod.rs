//! `leasehold bench`: figures from real runs against a real Redis, printed
//! as a Markdown table. Build with `--release`; a debug build measures the
//! debug build.
//!
//! Scenarios so far (`--scenario`): `messaging` (publish-to-delivery latency
//! one message at a time, throughput to one subscriber with many publishes in
//! flight, fan-out to many subscribers) and `idle` (Redis commands per second
//! an idle node costs, from `INFO commandstats`). Failover scenarios follow.

mod messaging;

use std::time::Duration;

use crate::local_redis::LocalRedis;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    Messaging,
    Idle,
    All,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Redis to use; when absent, a redis-server is started on a free port.
    #[arg(long, env = "LEASEHOLD_REDIS_URL")]
    pub redis_url: Option<String>,
    #[arg(long, value_enum, default_value = "all")]
    pub scenario: Scenario,
    /// Messages published one at a time for the latency figure.
    #[arg(long, default_value_t = 5_000)]
    pub latency_messages: u64,
    /// Messages published for the one-subscriber throughput figure.
    #[arg(long, default_value_t = 50_000)]
    pub throughput_messages: u64,
    /// Publishes in flight at once for the throughput figures.
    #[arg(long, default_value_t = 100)]
    pub in_flight: usize,
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
}

/// One row of the output table.
pub struct Row {
    pub scenario: String,
    pub goal: String,
    pub measured: String,
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

pub async fn run(args: BenchArgs) -> Result<(), String> {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build; figures are only meaningful from `cargo run --release -- bench`");
    }
    let (_local, url) = match &args.redis_url {
        Some(url) => (None, url.clone()),
        None => {
            let local = LocalRedis::start()?;
            let url = local.url();
            (Some(local), url)
        }
    };
    let mut rows = Vec::new();
    if matches!(args.scenario, Scenario::Messaging | Scenario::All) {
        rows.extend(messaging::run(&url, &args).await?);
    }
    if matches!(args.scenario, Scenario::Idle | Scenario::All) {
        rows.extend(messaging::idle(&url, &args).await?);
    }
    println!("| scenario | goal | measured |");
    println!("|---|---|---|");
    for row in rows {
        println!("| {} | {} | {} |", row.scenario, row.goal, row.measured);
    }
    Ok(())
}
