//! The peers' figures from the same run. `bench/peers/run` (Node.js, its
//! packages pinned there) measures BullMQ's `Relay` against the same Redis
//! just before leasehold's own messaging figures, so the ratios the goals
//! are stated in come from one machine in one hour, not from two days.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{bail, Context as _};
use serde_json::Value;

use super::args::BenchArgs;
use super::report::progress;

/// Relay's three messaging figures, measured as leasehold's are.
#[derive(Debug, Clone, Copy)]
pub struct Relay {
    pub latency_p99_ms: f64,
    pub one_subscriber_per_s: f64,
    pub fanout_per_s: f64,
}

/// Where the peers' scripts are: `--peers-dir`, or the checkout this bench
/// was built from.
fn dir(args: &BenchArgs) -> PathBuf {
    args.peers_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/peers")))
}

/// Runs Relay's figures with this run's counts; `None` with `--no-peers`.
pub async fn relay(url: &str, args: &BenchArgs) -> anyhow::Result<Option<Relay>> {
    if args.no_peers {
        return Ok(None);
    }
    let run = dir(args).join("run");
    progress("peers: BullMQ Relay, its three messaging figures (bench/peers/run)");
    let output = tokio::process::Command::new(&run)
        .arg(url)
        .arg("relay")
        .env("PEER_LATENCY_MESSAGES", args.latency_messages.to_string())
        .env(
            "PEER_THROUGHPUT_MESSAGES",
            args.throughput_messages.to_string(),
        )
        .env("PEER_IN_FLIGHT", args.in_flight.to_string())
        .env("PEER_FANOUT_MESSAGES", args.fanout_messages.to_string())
        .env("PEER_SUBSCRIBERS", args.subscribers.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {} (or pass --no-peers)", run.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed ({}); its reasons are above (or pass --no-peers)",
            run.display(),
            output.status
        );
    }
    let lines = String::from_utf8_lossy(&output.stdout);
    let figure = |name: &str, field: &str| -> anyhow::Result<f64> {
        lines
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["peer"] == "bullmq-relay" && v["figure"] == name)
            .and_then(|v| v[field].as_f64())
            .with_context(|| format!("no {name} {field} from bench/peers/run: {lines}"))
    };
    Ok(Some(Relay {
        latency_p99_ms: figure("latency", "p99_ms")?,
        one_subscriber_per_s: figure("one_subscriber_rate", "per_s")?,
        fanout_per_s: figure("fanout_rate", "per_s")?,
    }))
}
