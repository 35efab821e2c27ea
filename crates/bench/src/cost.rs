//! Cost at rest: what holding, and following, N groups costs Redis and the
//! agent process when nothing happens. One agent leads all N groups alone
//! (the holder's cost), then a second agent joins them all as a follower
//! (its cost is the increase). What a node costs without groups is measured
//! first and taken off, so the figures are the groups' own. Timings are the
//! production defaults (`--cost-ttl-ms` etc.). Commands are counted from `INFO
//! commandstats` deltas; "client calls" are what the agents send (script
//! calls, blocking inbox reads, publishes), "commands" also count those
//! run inside the scripts (among them the renewals' hints to followers,
//! which Redis counts as publishes: `RenewalHints` tells them apart).

use leasehold_testkit::Signal;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::agents::AgentProcess;
use super::args::BenchArgs;
use super::commandstats::{self, deltas};
use super::renewal_hints::RenewalHints;
use super::report::progress;
use super::report::Row;

/// Waits until `agent` reports `role` in every one of its `n` groups.
async fn wait_roles(
    agent: &AgentProcess,
    role: &str,
    n: usize,
    limit: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        if let Some(status) = agent.status::<leasehold_agent::Status>().await {
            let count = status.groups.values().filter(|g| g.role == role).count();
            if count == n {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!(
                    "{} is {role} in {count} of {n} groups after {limit:?}",
                    agent.id
                );
            }
        } else if start.elapsed() > limit {
            bail!("{} does not answer", agent.id);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Measures `window` of rest: per-group client calls and commands per
/// second, and the CPU share of `agent`.
async fn measure(
    url: &str,
    prefix: &str,
    agent: &AgentProcess,
    window: Duration,
) -> anyhow::Result<(f64, f64, f64)> {
    let hints = RenewalHints::start(url, prefix).await?;
    let before = commandstats::calls(url).await?;
    let cpu_before = agent.cpu_time().unwrap_or_default();
    let start = Instant::now();
    tokio::time::sleep(window).await;
    let after = commandstats::calls(url).await?;
    let cpu = agent
        .cpu_time()
        .unwrap_or_default()
        .saturating_sub(cpu_before);
    let secs = start.elapsed().as_secs_f64();
    let (client, all) = deltas(&before, &after);
    // Published inside renew.lua, counted by Redis as a client's PUBLISH.
    let client = client.saturating_sub(hints.as_ref().map_or(0, RenewalHints::seen));
    Ok((
        client as f64 / secs,
        all as f64 / secs,
        cpu.as_secs_f64() / secs,
    ))
}

// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
pub async fn run(url: &str, args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    let timings = args.cost_timings()?;
    let window = Duration::from_secs(args.cost_seconds);
    let mut rows = Vec::new();
    // One store for every size: only the first pays the new store's ttl.
    let prefix = super::report::prefix();
    // The node lease at its default: heartbeats at their real rate.
    let lease = leasehold_engine::NodeConfig::default().lease_duration_ms;
    // What a node costs without any group (heartbeats, sweeps, blocking
    // inbox reads), measured once and taken off every agent's figure, so
    // what remains is the cost of the groups.
    progress("cost at rest: a node without groups");
    let (base_client, base_all) = {
        let store = leasehold_engine::Store::connect(url, &prefix).map_err(anyhow::Error::msg)?;
        let node = leasehold_engine::Node::start(
            store,
            "bench/baseline",
            leasehold_engine::NodeConfig::default(),
        )
        .await
        .map_err(anyhow::Error::msg)?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = commandstats::calls(url).await?;
        let start = Instant::now();
        tokio::time::sleep(window).await;
        let after = commandstats::calls(url).await?;
        let secs = start.elapsed().as_secs_f64();
        node.close().await.map_err(anyhow::Error::msg)?;
        let (client, all) = deltas(&before, &after);
        (client as f64 / secs, all as f64 / secs)
    };
    rows.push(Row::new(
        "a node without groups (taken off the figures below)".into(),
        "–".into(),
        format!(
            "{base_client:.3} client calls/s ({base_all:.3} commands/s with those inside scripts)"
        ),
        None,
    ));
    for (k, &n) in args.cost_groups.iter().enumerate() {
        // Short names: the list goes through one environment variable,
        // which Linux caps at 128 KiB.
        let letter = (b'a' + (k % 26) as u8) as char;
        let groups: Vec<String> = (0..n).map(|i| format!("{letter}{i}")).collect();
        // A new store waits one ttl; big sets take a moment more.
        let settle = Duration::from_millis(2 * timings.ttl_ms) + Duration::from_millis(n as u64);
        progress(&format!("cost at rest, {n} groups: the holder alone"));
        let holder = super::agents::start(
            url,
            &prefix,
            &format!("holder-{n}"),
            &groups,
            timings,
            lease,
            &[],
        )
        .await?;
        wait_roles(&holder, "leader", n, settle + Duration::from_secs(30)).await?;
        tokio::time::sleep(Duration::from_millis(timings.renew_interval_ms)).await;
        let (h_client, h_all, h_cpu) = measure(url, &prefix, &holder, window).await?;
        progress(&format!(
            "cost at rest, {n} groups: holder and one follower"
        ));
        let follower = super::agents::start(
            url,
            &prefix,
            &format!("follower-{n}"),
            &groups,
            timings,
            lease,
            &[],
        )
        .await?;
        wait_roles(&follower, "follower", n, settle + Duration::from_secs(30)).await?;
        // Past the followers' first claims: from here on they sleep until
        // the leases they saw run out.
        tokio::time::sleep(Duration::from_millis(timings.ttl_ms)).await;
        let cpu_holder_before = holder.cpu_time().unwrap_or_default();
        let (b_client, b_all, f_cpu) = measure(url, &prefix, &follower, window).await?;
        let both_cpu_holder = holder
            .cpu_time()
            .unwrap_or_default()
            .saturating_sub(cpu_holder_before)
            .as_secs_f64()
            / window.as_secs_f64();
        let per_group = |x: f64| x.max(0.0) / n as f64;
        let (h_client, h_all) = (h_client - base_client, h_all - base_all);
        let f_client = b_client - h_client - 2.0 * base_client;
        let f_all = b_all - h_all - 2.0 * base_all;
        // A follower's goal: at most one call per ttl.
        let follower_goal = 1000.0 / timings.ttl_ms as f64;
        let holder_bound = 1000.0 / timings.renew_interval_ms as f64;
        rows.push(Row::new(
            format!(
                "holder at rest, {n} group(s), ttl {} / renew {} ms: {} calls/s per group",
                timings.ttl_ms,
                timings.renew_interval_ms,
                super::local::name(url)
            ),
            format!("≈ 1 renewal per renew interval = {holder_bound:.2}/s"),
            format!(
                "{:.3} client calls/s ({:.3} commands/s with those inside scripts); agent CPU {:.1}%",
                per_group(h_client),
                per_group(h_all),
                100.0 * h_cpu.max(both_cpu_holder)
            ),
            Some(per_group(h_client) <= holder_bound * 1.2),
        ));
        rows.push(Row::new(
            format!(
                "follower at rest, {n} group(s), ttl {} ms: {} calls/s per group",
                timings.ttl_ms,
                super::local::name(url)
            ),
            format!("≤ 1 per ttl = {follower_goal:.2}/s [seed: 1 per retry interval = {:.2}/s]", 1000.0 / timings.retry_interval_ms as f64),
            format!(
                "{:.3} client calls/s ({:.3} commands/s with those inside scripts); agent CPU {:.1}%",
                per_group(f_client),
                per_group(f_all),
                100.0 * f_cpu
            ),
            Some(per_group(f_client) <= follower_goal),
        ));
        for mut a in [follower, holder] {
            a.signal(Signal::SIGTERM);
            let _ = super::agents::ended(&mut a, Duration::from_secs(30)).await;
        }
    }
    Ok(rows)
}
