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
mod args;
mod controller;
mod cost;
mod failover;
mod messaging;
mod procfs;
mod replicas;
mod report;
mod sentinel;

use anyhow::{bail, Context as _};
pub use args::{BenchArgs, Scenario};
use args::{MAX_CONTROLLER_GROUPS, MAX_COST_GROUPS};
use std::io::IsTerminal;

use leasehold::local_redis::LocalRedis;

// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build; figures are only meaningful from `cargo run --release -- bench`");
    }
    let timings = args.timings()?;
    args.cost_timings()?;
    if args.trials == 0 {
        bail!("--trials = 0 is out of range: it must be at least 1");
    }
    if args.sentinel_trials == 0 || args.sentinel_trials > 100 {
        bail!(
            "--sentinel-trials = {} is out of range: it must be from 1 to 100",
            args.sentinel_trials
        );
    }
    if args.controller_groups == 0 || args.controller_groups > MAX_CONTROLLER_GROUPS {
        bail!(
            "--controller-groups = {} is out of range: it must be from 1 to {MAX_CONTROLLER_GROUPS}",
            args.controller_groups
        );
    }
    if let Some(n) = args
        .cost_groups
        .iter()
        .find(|&&n| n == 0 || n > MAX_COST_GROUPS)
    {
        bail!("--cost-groups: {n} is out of range: each count must be from 1 to {MAX_COST_GROUPS}");
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
            std::fs::write(path, text).with_context(|| format!("--json {}", path.display()))?;
        }
    }
    if let Some(path) = &args.svg {
        let title = format!(
            "leasehold takeover times, {} trials each (ttl {} ms, renew {} ms, retry {} ms)",
            args.trials, timings.ttl_ms, timings.renew_interval_ms, timings.retry_interval_ms
        );
        std::fs::write(path, report::svg(&series, &title))
            .with_context(|| format!("--svg {}", path.display()))?;
    }
    Ok(())
}
