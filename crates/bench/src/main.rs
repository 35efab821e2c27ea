//! `leasehold-bench`: figures from real runs against a real Redis, printed
//! as Markdown tables (and `--json`, `--svg`). Build with `--release`; a
//! debug build measures the debug build. A binary of its own, on the
//! test fixtures (`leasehold-testkit`), so that the product carries none of
//! them; the agents and the controller it measures are this binary run
//! again with the hidden `agent` or `controller` subcommand, which are the
//! product's own code (`leasehold_agent::run`, `leasehold_kube::run::run`),
//! so the figures are of the code that ships and never of a stale build.
//!
//! Scenarios (`--scenario`): `failover` (agent processes: SIGKILL, SIGTERM
//! and step-down of the leader, the sweep of a dead node, Redis stalled for
//! less and more than a ttl, and the leading agent stopped for 3 ttl in
//! exec mode: its command's end against the lease's end), `cost` (Redis calls and CPU of holding and
//! following 1, 100 and 10,000 groups at rest), `messaging`
//! (publish-to-delivery latency, judged against the spec's floor, the
//! engine's publish.lua by `EVALSHA` + `XREAD BLOCK` with no engine, and
//! shown beside the bare floor, `XADD` + `XREAD BLOCK`; throughput,
//! fan-out; on Redis after BullMQ's Relay measured the same way by
//! `bench/peers/run`, unless `--no-peers`), `idle` (what an
//! idle node costs) and `replicas` (what confirming lease writes with a
//! replica costs: claim latency and calls per renewal, on Redis servers of
//! its own), `sentinel` (failovers behind three sentinels, graceful and
//! after a SIGKILL, with and without `min-replicas-to-write 1`: fault to
//! one leader on the new primary against a bound derived from the
//! failover and the timings), `cluster` (failovers of the prefix's slot in
//! a Redis Cluster, graceful and after a SIGKILL of its primary, measured
//! the same way), `postgres-failover` (with `--store postgres`: the
//! primary SIGKILLed and its synchronous standby promoted) and `controller` (the controller process against a real API
//! server: label latency after a leader change, API requests per change,
//! memory and CPU with one group and with `--controller-groups`; needs
//! `scripts/kubernetes/build.sh apiserver`, and `all` skips it, said out
//! loud, where that has not been run). Timings default to a scaled-down ttl 1000 / renew 300 /
//! retry 200 ms so a full run takes minutes; the bounds scale with them.

// Production code only (clippy.toml sets the length); a test reads as one scenario.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod agents;
mod args;
mod cluster;
mod commandstats;
mod controller;
mod cost;
mod cross_cluster;
mod exec_stall;
mod failover;
mod local;
mod messaging;
mod peers;
mod postgres_failover;
mod promotion;
mod renewal_hints;
mod replicas;
mod report;
mod sentinel;

use std::io::IsTerminal;

use anyhow::{bail, Context as _};
use args::{BenchArgs, Scenario};
use args::{MAX_CONTROLLER_GROUPS, MAX_COST_GROUPS};
use clap::{Parser, Subcommand};
use local::LocalStore;

#[derive(Debug, Parser)]
#[command(
    name = "leasehold-bench",
    version,
    about = "Measured figures against a real Redis (build with --release)",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    process: Option<Process>,
    #[command(flatten)]
    args: BenchArgs,
}

/// The processes a scenario starts: this binary again, as the product.
#[derive(Debug, Subcommand)]
enum Process {
    #[command(hide = true)]
    Agent(Box<leasehold_agent::AgentArgs>),
    #[command(hide = true)]
    Controller(Box<leasehold_kube::run::ControllerArgs>),
    /// The guard of an exec-mode command (the exec trials' agents run
    /// this binary as `exec-guard`, as the product's agent runs its own).
    #[command(name = leasehold_agent::exec_guard::SUBCOMMAND, hide = true)]
    ExecGuard {
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The guard waits for signals blocked on its one thread: it runs before
    // any runtime thread exists that a signal could land on.
    let process = match cli.process {
        Some(Process::ExecGuard { command }) => {
            return std::process::ExitCode::from(leasehold_agent::exec_guard::run(&command))
        }
        process => process,
    };
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run_process(process, cli.args)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The bench itself, or one of the product's processes it measures.
async fn run_process(process: Option<Process>, args: BenchArgs) -> std::process::ExitCode {
    let result = match process {
        None => {
            leasehold_daemon::init_logging("warn");
            run(args).await
        }
        Some(Process::ExecGuard { command }) => {
            // `main` runs the guard before any runtime exists; here only
            // by mistake.
            eprintln!("error: exec-guard {command:?} must run before the runtime");
            return std::process::ExitCode::FAILURE;
        }
        Some(Process::Agent(args)) => {
            leasehold_daemon::init_logging("info");
            match leasehold_agent::run(*args).await {
                Ok(code) => return std::process::ExitCode::from(code),
                Err(e) => Err(anyhow::Error::msg(e)),
            }
        }
        Some(Process::Controller(args)) => {
            leasehold_daemon::init_logging("info");
            leasehold_kube::run::run(*args)
                .await
                .map_err(anyhow::Error::msg)
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build; figures are only meaningful from `cargo run --release -p leasehold-bench`");
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
    if args.failover_trials == 0 || args.failover_trials > 100 {
        bail!(
            "--failover-trials = {} is out of range: it must be from 1 to 100",
            args.failover_trials
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
    let (mut local, url) = match &args.redis_url {
        Some(url) => (None, url.clone()),
        None => {
            let local = LocalStore::start(args.store)?;
            let url = local.url();
            (Some(local), url)
        }
    };
    let redis = local::name(&url) == "Redis";
    let all = args.scenario == Scenario::All;
    let mut series = Vec::new();
    let mut rows = Vec::new();
    if all || args.scenario == Scenario::Failover {
        let (takeovers, exec) = failover::run(&url, local.as_mut(), &args).await?;
        series.extend(takeovers);
        rows.extend(exec);
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
    let redis_only = [
        Scenario::Replicas,
        Scenario::Sentinel,
        Scenario::Cluster,
        Scenario::Controller,
    ];
    if !redis && redis_only.contains(&args.scenario) {
        bail!("--scenario {:?} runs on Redis only", args.scenario);
    }
    let postgres_only = [Scenario::PostgresFailover];
    if redis && postgres_only.contains(&args.scenario) {
        bail!(
            "--scenario {:?} runs on PostgreSQL only (--store postgres)",
            args.scenario
        );
    }
    if (all && redis) || args.scenario == Scenario::Replicas {
        rows.extend(replicas::run(&args).await?);
    }
    if (all && redis) || args.scenario == Scenario::Sentinel {
        rows.extend(sentinel::run(&args).await?);
    }
    // Not part of `all`: a minute or more each, on servers of their own.
    if args.scenario == Scenario::Cluster {
        rows.extend(cluster::run(&args).await?);
    }
    if args.scenario == Scenario::PostgresFailover {
        rows.extend(postgres_failover::run(&args).await?);
    }
    if args.scenario == Scenario::Controller {
        rows.extend(controller::run(&url, &args).await?);
        rows.extend(cross_cluster::run(&url, &args).await?);
    } else if all && !redis {
        eprintln!(
            "bench: the replicas, Sentinel and controller scenarios run on Redis only: skipped"
        );
    } else if all {
        match leasehold_testkit::kube::missing() {
            None => {
                rows.extend(controller::run(&url, &args).await?);
                rows.extend(cross_cluster::run(&url, &args).await?);
            }
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
