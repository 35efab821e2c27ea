//! Failovers in a Redis Cluster: how soon the group has one leader on the
//! slot's new owner. Three primaries and one replica of the slot that holds
//! the key prefix (the testkit's [`Cluster`], `cluster-node-timeout`
//! [`NODE_TIMEOUT_MS`]), all `redis-server` processes started here, and
//! three agent processes on a `redis+cluster://` URL listing every node.
//! Trials of two kinds, alternating: a graceful failover (`CLUSTER
//! FAILOVER` on the slot's replica), and the slot's primary SIGKILLed (the
//! cluster fails over by itself after `cluster-node-timeout`), then started
//! again on its own directory, where its `nodes.conf` makes it rejoin as
//! the replica of the new owner (as a Redis pod comes back on its volume).
//! Every trial starts with the replica in sync (`state=online` on its
//! primary), so lease writes are confirmed by it (`--redis-replica-acks
//! all`, the agents' default).
//!
//! The servers run Redis's own settings (a full sync waits 5 s,
//! `repl-diskless-sync-delay`), but for the cluster's: `cluster-enabled`,
//! and `cluster-node-timeout` 2 s, shorter than the ttl as docs/redis.md
//! asks, which is what the failover after a kill waits for.
//!
//! A trial ends when the agents agree on one leader and the lease on the
//! new owner names it under the agreed term, written there by the new owner
//! (a renewal or a claim it took, not the copy it had as a replica). Its
//! bound is derived, not guessed: the failover itself (fault to the replica
//! serving the slot as a primary, measured), then the agents' next look at
//! the owner: the call in flight ends within its timeout, and every answer
//! of the old owner fails (a MOVED after a graceful failover, a refused
//! connection after a kill), which marks the route stale (route.rs), so the
//! next call, after at most a retry interval of backoff, looks the owner up
//! again at once, never after `CLUSTER_RECHECK`; then the hold of a store
//! born again (claim.lua: a promoted replica is a new replication history,
//! no new lease for one ttl and the term epoch's hold, whichever is
//! longer) and one retry interval, within which every agent's claim sees
//! the new holder. A leader may keep its lease through a graceful failover
//! (it renews on the new owner; its claim there finds its own lease
//! standing): that is a fine outcome, and the trial ends at its first
//! renewal on the new owner.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use leasehold_engine::config::CLUSTER_RECHECK;
use leasehold_engine::ElectionConfig;
use leasehold_testkit::cluster::{serves, Cluster, NODE_TIMEOUT_MS};
use leasehold_testkit::LocalRedis;

use super::agents::{agreed, AgentProcess, GROUP, NAMESPACE};
use super::args::BenchArgs;
use super::promotion::{born_again_hold, millis, reconnect, until};
use super::report::{percentile, progress, Row};

/// The scenario's name in its errors.
const SCENARIO: &str = "cluster";
/// How often a wait looks at the servers (each look starts processes).
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// How long the cluster may take to fail over: a kill waits for
/// `cluster-node-timeout`, the failure reports and the replica's election.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);

/// How long the old owner may take to follow the new one: after a kill,
/// a full sync that waits 5 s before it starts.
const SETTLE_LIMIT: Duration = Duration::from_secs(90);

/// The group's lease key: in a cluster the prefix is a hash tag.
fn lease_key(prefix: &str) -> String {
    format!("{{{prefix}}}:g:{{{NAMESPACE}/{GROUP}}}:lease")
}

/// The lease as one node holds it: its value (`ID#INCARNATION#TERM`) and
/// its expiry (`PEXPIRETIME`, ms on the Unix clock), which every write the
/// node takes (a claim, a renewal) moves, and a replicated copy keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeaseCopy {
    value: String,
    expires_at_ms: String,
}

fn lease_on(node: &LocalRedis, key: &str) -> anyhow::Result<LeaseCopy> {
    Ok(LeaseCopy {
        value: node.cli(&["GET", key])?,
        expires_at_ms: node.cli(&["PEXPIRETIME", key])?,
    })
}

/// Samples the agents every 10 ms until they agree on one leader and the
/// lease on `node` names it under the agreed term, other than `inherited`
/// (what `node` held when it took the slot over: a copy from the old
/// owner); returns the agreed term.
async fn one_leader_on(
    agents: &[AgentProcess],
    node: &LocalRedis,
    key: &str,
    inherited: Option<&LeaseCopy>,
    limit: Duration,
) -> anyhow::Result<u64> {
    let start = Instant::now();
    loop {
        if let Some((l, term)) = agreed(agents, GROUP).await {
            let lease = lease_on(node, key)?;
            let names = lease.value.starts_with(&format!("{}#", agents[l].id))
                && lease.value.ends_with(&format!("#{term}"));
            if names && inherited != Some(&lease) {
                return Ok(term);
            }
        }
        if start.elapsed() > limit {
            bail!("cluster: no leader on the slot's owner within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Graceful,
    Killed,
}

struct Trial {
    kind: Kind,
    /// Fault to the replica saying it serves the slot as a primary.
    promoted: Duration,
    /// Fault to one leader on the new owner.
    led: Duration,
    /// The leader kept the term it held before the fault.
    kept: bool,
    bound: Duration,
}

/// One fault of `kind`, from a steady state (one leader on the slot's
/// owner, its replica in sync) back to one: the old owner in sync as the
/// new owner's replica, so the next trial starts where this one did.
async fn trial(
    cluster: &mut Cluster,
    agents: &[AgentProcess],
    key: &str,
    kind: Kind,
    timings: &ElectionConfig,
) -> anyhow::Result<Trial> {
    let slot = cluster.slot;
    let old = cluster
        .owner(slot)
        .context("cluster: no node serves the slot")?;
    let new = cluster
        .replica_of(old)
        .context("cluster: the slot's owner has no replica")?;
    // From a steady state: one leader on the owner.
    let before = one_leader_on(agents, &cluster.nodes[old], key, None, FAILOVER_LIMIT).await?;
    let start = Instant::now();
    match kind {
        Kind::Graceful => {
            let answer = cluster.nodes[new].cli(&["CLUSTER", "FAILOVER"])?;
            if answer != "OK" {
                bail!("cluster: CLUSTER FAILOVER answered {answer:?}");
            }
        }
        Kind::Killed => cluster.nodes[old].kill(),
    }
    until(
        SCENARIO,
        LOOK_EVERY,
        FAILOVER_LIMIT,
        "the slot's replica serves it",
        || serves(&cluster.nodes[new], slot),
    )
    .await?;
    let promoted = start.elapsed();
    let inherited = lease_on(&cluster.nodes[new], key)?;
    if kind == Kind::Killed {
        cluster.nodes[old]
            .start_on_own_data(&[])
            .context("cluster: the killed node starts again on its own directory")?;
    }
    let term = one_leader_on(
        agents,
        &cluster.nodes[new],
        key,
        Some(&inherited),
        Duration::from_secs(60),
    )
    .await?;
    let led = start.elapsed();
    // Settle: the old owner in sync as the new owner's replica.
    until(
        SCENARIO,
        LOOK_EVERY,
        SETTLE_LIMIT,
        "the old owner in sync as the new owner's replica",
        || cluster.ok() && cluster.replica_of(new) == Some(old) && cluster.in_sync(new),
    )
    .await?;
    Ok(Trial {
        kind,
        promoted,
        led,
        kept: term == before,
        bound: promoted + reconnect(timings) + born_again_hold(timings),
    })
}

/// One row per kind of trial.
fn row(kind: Kind, trials: &[Trial], timings: &ElectionConfig) -> Row {
    let of: Vec<&Trial> = trials.iter().filter(|t| t.kind == kind).collect();
    let mut led: Vec<Duration> = of.iter().map(|t| t.led).collect();
    led.sort();
    let mut promoted: Vec<Duration> = of.iter().map(|t| t.promoted).collect();
    promoted.sort();
    let worst = of
        .iter()
        .map(|t| t.led.as_secs_f64() - t.bound.as_secs_f64())
        .max_by(f64::total_cmp)
        .unwrap_or(0.0);
    let kept = of.iter().filter(|t| t.kept).count();
    let what = match kind {
        Kind::Graceful => "graceful (CLUSTER FAILOVER on the slot's replica)".to_owned(),
        Kind::Killed => format!(
            "the slot's primary SIGKILLed (cluster-node-timeout {NODE_TIMEOUT_MS} ms), restarted on its own directory"
        ),
    };
    let (find, hold) = (reconnect(timings), born_again_hold(timings));
    Row::new(
        format!(
            "Redis Cluster, {what}: fault to one leader on the slot's new owner ({} trials)",
            of.len()
        ),
        format!(
            "each within its bound: promoted + the next look at the owner (the call in flight and the error backoff, {} ms: a MOVED or a failed call looks again at once, not after the {} ms recheck) + max(ttl, epoch hold) + retry ({} ms)",
            find.as_millis(),
            CLUSTER_RECHECK.as_millis(),
            hold.as_millis()
        ),
        format!(
            "p50 {:.0} ms, max {:.0} ms; promoted p50 {:.0} ms, max {:.0} ms; the leader kept its term in {kept} of {}; worst against the bound {:+.0} ms",
            millis(percentile(&led, 50.0)),
            millis(led.last().copied().unwrap_or_default()),
            millis(percentile(&promoted, 50.0)),
            millis(promoted.last().copied().unwrap_or_default()),
            of.len(),
            worst * 1000.0
        ),
        Some(worst <= 0.0),
    )
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    let timings = args.timings()?;
    let prefix = super::report::prefix();
    progress("cluster: three primaries and a replica of the prefix's slot");
    let mut cluster = Cluster::start(&prefix).await?;
    let key = lease_key(&prefix);
    let agents =
        super::agents::start_many(&cluster.url(), &prefix, 3, timings, args.node_lease_ms())
            .await?;
    let mut trials = Vec::new();
    let total = args.failover_trials * 2;
    for i in 0..total {
        let kind = if i % 2 == 0 {
            Kind::Graceful
        } else {
            Kind::Killed
        };
        progress(&format!("cluster: trial {} of {total} ({kind:?})", i + 1));
        trials.push(trial(&mut cluster, &agents, &key, kind, &timings).await?);
    }
    drop(agents);
    Ok([Kind::Graceful, Kind::Killed]
        .into_iter()
        .map(|kind| row(kind, &trials, &timings))
        .collect())
}
