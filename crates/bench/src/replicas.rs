//! What confirming lease writes with the replicas costs. Three setups, on
//! Redis servers started here: a lone Redis (`--redis-replica-acks all`,
//! the default, with nothing to wait for); a primary with one replica,
//! writes confirmed (`all`); the same primary, not confirmed (`off`). In
//! each, one in-process node claims `--trials` fresh groups one after
//! another (time from join to leading: the claim script, and `WAIT` where
//! confirmed, which a renewal makes the same way), then holds them for a
//! few renew intervals while `INFO commandstats` counts what a renewal
//! sends: the script, and at most one `WAIT` (the replica count comes from
//! an `INFO` at most once a second).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use leasehold_engine::config::REPLICA_WAIT;
use leasehold_engine::{ElectionConfig, Node, NodeConfig, ReplicaAcks, Role, Store};
use leasehold_testkit::LocalRedis;

use super::args::BenchArgs;
use super::report::Row;
use super::report::{ms, percentile, progress};

struct Figures {
    /// Join to leading, per group, sorted.
    claims: Vec<Duration>,
    scripts: u64,
    waits: u64,
    infos: u64,
    held: Duration,
}

async fn measure(
    url: &str,
    prefix: &str,
    acks: ReplicaAcks,
    groups: usize,
    timings: ElectionConfig,
) -> anyhow::Result<Figures> {
    let store = Store::connect(url, prefix)
        .map_err(anyhow::Error::msg)?
        .with_replica_acks(acks, REPLICA_WAIT);
    let node = Node::start(store, "bench/replicas", NodeConfig::default())
        .await
        .map_err(anyhow::Error::msg)?;
    let mut claims = Vec::with_capacity(groups);
    let mut held = Vec::with_capacity(groups);
    for i in 0..groups {
        let start = Instant::now();
        let group = node
            .join(&format!("bench/g{i}"), timings)
            .map_err(anyhow::Error::msg)?;
        let mut role = group.role();
        tokio::time::timeout(
            Duration::from_secs(5),
            role.wait_for(|r| matches!(r, Role::Leader { .. })),
        )
        .await
        .map_err(|_| anyhow!("group {i} was not claimed within 5 s"))??;
        claims.push(start.elapsed());
        held.push(group);
    }
    claims.sort();
    let hold = Duration::from_millis(timings.renew_interval_ms * 10);
    let before = super::commandstats::calls(url).await?;
    tokio::time::sleep(hold).await;
    let after = super::commandstats::calls(url).await?;
    let delta = |name: &str| super::commandstats::delta(&before, &after, name);
    let figures = Figures {
        claims,
        scripts: delta("evalsha") + delta("eval"),
        waits: delta("wait"),
        // The first reading's own INFO (counted by the second) is not the node's.
        infos: delta("info").saturating_sub(1),
        held: hold,
    };
    drop(held);
    node.close().await.map_err(anyhow::Error::msg)?;
    Ok(figures)
}

/// The replica scenario's rows.
// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
pub async fn run(args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    let timings = args.timings()?;
    let groups = args.trials.max(1);
    let lone = LocalRedis::start()?;
    let primary = LocalRedis::start()?;
    let replica = LocalRedis::start()?;
    replica.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()])?;
    // In sync (a replica still in its full sync confirms nothing and is
    // not waited for): Redis's default diskless delay, 5 s, comes first.
    let start = Instant::now();
    while !primary
        .cli(&["INFO", "replication"])?
        .contains("state=online")
    {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the bench's replica was not in sync within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let setups = [
        ("a lone Redis, acks all", &lone, "lone", ReplicaAcks::All),
        (
            "a primary with 1 replica, acks all",
            &primary,
            "all",
            ReplicaAcks::All,
        ),
        (
            "the same primary, acks off",
            &primary,
            "off",
            ReplicaAcks::Off,
        ),
    ];
    let mut measured = Vec::new();
    for (label, server, prefix, acks) in setups {
        progress(&format!("replicas: {label}, {groups} claims"));
        // An established store (past its first ttl and its epoch's hold),
        // as in production.
        server.cli(&[
            "MSET",
            &format!("{prefix}:born"),
            "0",
            &format!("{prefix}:epoch"),
            "0",
        ])?;
        measured.push((
            label,
            measure(&server.url(), prefix, acks, groups, timings).await?,
        ));
    }
    // One round trip to the primary, for scale.
    let store = Store::connect(&primary.url(), "rtt").map_err(anyhow::Error::msg)?;
    let mut pings = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let start = Instant::now();
        store.ping().await.map_err(anyhow::Error::msg)?;
        pings.push(start.elapsed());
    }
    pings.sort();
    let rtt = percentile(&pings, 50.0);
    let mut rows = Vec::new();
    rows.push(Row::new(
        "one round trip to the primary (PING)".into(),
        "–".into(),
        format!("p50 {}, p99 {}", ms(rtt), ms(percentile(&pings, 99.0))),
        None,
    ));
    let lone_p50 = percentile(&measured[0].1.claims, 50.0);
    let off_p50 = percentile(&measured[2].1.claims, 50.0);
    for (i, (label, f)) in measured.iter().enumerate() {
        let p50 = percentile(&f.claims, 50.0);
        // Confirmed by the replica: at most one round trip more than the
        // same primary unconfirmed.
        let (goal, met) = if i == 1 {
            (
                format!("p50 at most one round trip ({}) above acks off", ms(rtt)),
                Some(p50.saturating_sub(off_p50) <= rtt),
            )
        } else {
            ("–".into(), None)
        };
        rows.push(Row::new(
            format!("claim to leading, {label} ({groups} groups one after another)"),
            goal,
            format!(
                "p50 {}, p99 {} (p50 {:+.3} ms against the lone Redis)",
                ms(p50),
                ms(percentile(&f.claims, 99.0)),
                (p50.as_secs_f64() - lone_p50.as_secs_f64()) * 1000.0
            ),
            met,
        ));
        let per_script = f.waits as f64 / f.scripts.max(1) as f64;
        let infos_per_s = f.infos as f64 / f.held.as_secs_f64();
        rows.push(Row::new(
            format!(
                "holding {groups} groups for {} s, {label}: Redis calls",
                f.held.as_secs_f64()
            ),
            "INFO at most 1/s (WAIT rides with the script: no call of its own)".into(),
            format!(
                "{} scripts (renewals, heartbeats), {} WAIT ({per_script:.3} per script), {} INFO ({infos_per_s:.2}/s)",
                f.scripts, f.waits, f.infos
            ),
            Some(infos_per_s <= 1.2),
        ));
    }
    Ok(rows)
}
