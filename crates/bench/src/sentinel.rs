//! Failovers behind Sentinel: how soon the group has one leader on the new
//! primary. A primary, one replica and three sentinels (quorum 2,
//! `down-after-milliseconds` [`DOWN_AFTER_MS`]), all `redis-server`
//! processes started here, and three agent processes on a
//! `redis+sentinel://` URL. Trials of two kinds, alternating: a graceful
//! failover (`SENTINEL FAILOVER`), and the primary SIGKILLed, then started
//! again on its own directory as a replica of the new primary as soon as
//! the sentinels name it (as a Redis pod comes back on its volume). Both
//! with `min-replicas-to-write 0` (Redis's default) and 1.
//!
//! The servers run Redis's own replication settings: a full sync waits
//! 5 s (`repl-diskless-sync-delay`) before it starts.
//!
//! A trial ends when the agents agree on one leader and the lease on the
//! new primary names it. Its bound is derived, not guessed: the failover
//! itself (fault to the new primary named by a majority of the sentinels,
//! measured: `down-after-milliseconds` and Sentinel's election for a
//! kill), then the agents' next look at the sentinels (`SENTINEL_RECHECK`)
//! or, with `min-replicas-to-write 1`, a replica in sync on the new
//! primary if that is later (Redis refuses writes until then), then the
//! hold of a store born again (the larger of the ttl and the term epoch's
//! hold) and one retry interval. A replica in its full sync holds no claim
//! (docs/redis.md). The goal is every trial within that bound.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use leasehold_engine::config::SENTINEL_RECHECK;
use leasehold_testkit::LocalRedis;

use super::agents::{agreed, AgentProcess, GROUP, NAMESPACE};
use super::args::BenchArgs;
use super::promotion::{born_again_hold, millis, until};
use super::report::Row;
use super::report::{percentile, progress};

/// The scenario's name in its errors.
const SCENARIO: &str = "sentinel";
/// How often a wait looks at the servers (each look starts processes).
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Sentinel's `down-after-milliseconds`: the least docs/redis.md allows.
const DOWN_AFTER_MS: u64 = 2000;
const MASTER: &str = "bench-primary";

struct Deployment {
    servers: Vec<LocalRedis>,
    sentinels: Vec<LocalRedis>,
}

fn cli(server: &LocalRedis, args: &[&str]) -> anyhow::Result<String> {
    server.cli(args)
}

impl Deployment {
    async fn start() -> anyhow::Result<Self> {
        let primary = LocalRedis::start()?;
        // On Redis's own replication settings: the first full sync waits
        // 5 s (`repl-diskless-sync-delay`), as in production.
        let replica = LocalRedis::start()?;
        cli(
            &replica,
            &["REPLICAOF", "127.0.0.1", &primary.port.to_string()],
        )?;
        until(
            SCENARIO,
            LOOK_EVERY,
            Duration::from_secs(30),
            "the replica in sync",
            || {
                cli(&replica, &["INFO", "replication"])
                    .is_ok_and(|i| i.contains("master_link_status:up"))
            },
        )
        .await?;
        let sentinels = (0..3)
            .map(|_| LocalRedis::start_sentinel(primary.port, MASTER, 2, DOWN_AFTER_MS))
            .collect::<Result<Vec<_>, _>>()?;
        until(
            SCENARIO,
            LOOK_EVERY,
            Duration::from_secs(30),
            "the sentinels know the replica and each other",
            || {
                sentinels.iter().all(|s| {
                    cli(s, &["INFO", "sentinel"]).is_ok_and(|i| i.contains("slaves=1,sentinels=3"))
                })
            },
        )
        .await?;
        Ok(Self {
            servers: vec![primary, replica],
            sentinels,
        })
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The server a majority of the sentinels names.
    fn primary(&self) -> Option<usize> {
        let named: Vec<u16> = self
            .sentinels
            .iter()
            .filter_map(|s| {
                let out = cli(s, &["SENTINEL", "get-master-addr-by-name", MASTER]).ok()?;
                out.lines().nth(1)?.trim().parse().ok()
            })
            .collect();
        self.servers
            .iter()
            .position(|s| named.iter().filter(|p| **p == s.port).count() >= 2)
    }

    /// Both servers set to `min-replicas-to-write n` (kept across restarts
    /// by setting it again).
    fn min_replicas(&self, n: u32) -> anyhow::Result<()> {
        for s in &self.servers {
            cli(
                s,
                &["CONFIG", "SET", "min-replicas-to-write", &n.to_string()],
            )?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Graceful,
    Killed,
}

struct Trial {
    kind: Kind,
    named: Duration,
    /// Fault to a replica online on the new primary (if before the leader).
    attached: Option<Duration>,
    led: Duration,
    bound: Duration,
}

/// Samples the agents every 10 ms until one leads and the lease on
/// `server` names it; returns when `server` first had a replica online,
/// if it had one by then.
async fn one_leader_on(
    agents: &[AgentProcess],
    server: &LocalRedis,
    prefix: &str,
    limit: Duration,
) -> anyhow::Result<Option<Instant>> {
    let key = format!("{prefix}:g:{{{NAMESPACE}/{GROUP}}}:lease");
    let start = Instant::now();
    let mut attached = None;
    loop {
        if attached.is_none()
            && cli(server, &["INFO", "replication"]).is_ok_and(|i| i.contains("state=online"))
        {
            attached = Some(Instant::now());
        }
        if let Some((l, _)) = agreed(agents, GROUP).await {
            let lease = cli(server, &["GET", &key]).unwrap_or_default();
            if lease.starts_with(&format!("{}#", agents[l].id)) {
                return Ok(attached);
            }
        }
        if start.elapsed() > limit {
            bail!("sentinel: no leader on the new primary within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn trial(
    d: &mut Deployment,
    agents: &[AgentProcess],
    prefix: &str,
    kind: Kind,
    min_replicas: u32,
    hold: Duration,
) -> anyhow::Result<Trial> {
    let old = d.primary().context("sentinel: no primary named")?;
    let start = Instant::now();
    match kind {
        Kind::Graceful => {
            // A sentinel refuses while it winds up the last failover.
            let mut tries = 0;
            while cli(&d.sentinels[0], &["SENTINEL", "FAILOVER", MASTER])? != "OK" {
                tries += 1;
                if tries > 100 {
                    bail!("sentinel: SENTINEL FAILOVER refused for 20 s");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Kind::Killed => d.servers[old].kill(),
    }
    let mut new = None;
    until(
        SCENARIO,
        LOOK_EVERY,
        Duration::from_secs(30),
        "the sentinels name a new primary",
        || {
            new = d.primary().filter(|p| *p != old);
            new.is_some()
        },
    )
    .await?;
    let named = start.elapsed();
    let new = new.expect("checked");
    if kind == Kind::Killed {
        let port = d.servers[new].port.to_string();
        d.servers[old].restart_on_own_data(&["--replicaof", "127.0.0.1", &port])?;
        d.min_replicas(min_replicas)?;
    }
    let attached = one_leader_on(agents, &d.servers[new], prefix, Duration::from_secs(60))
        .await?
        .map(|at| at.duration_since(start));
    let led = start.elapsed();
    // Settle: the old primary follows the new one before the next trial.
    until(
        SCENARIO,
        LOOK_EVERY,
        Duration::from_secs(60),
        "the old primary follows",
        || {
            cli(&d.servers[new], &["INFO", "replication"])
                .is_ok_and(|i| i.contains("connected_slaves:1"))
                && cli(&d.servers[old], &["INFO", "replication"])
                    .is_ok_and(|i| i.contains("master_link_status:up"))
        },
    )
    .await?;
    // The agents find the new primary at their next look at the sentinels
    // (`SENTINEL_RECHECK` at most after it was named); with
    // min-replicas-to-write the primary itself refuses writes until a
    // replica is in sync, however long that takes. Without, a replica in
    // its full sync holds no claim.
    let found = named + SENTINEL_RECHECK;
    let confirmable = if min_replicas > 0 {
        attached.unwrap_or(led).max(found)
    } else {
        found
    };
    Ok(Trial {
        kind,
        named,
        attached,
        led,
        bound: confirmable + hold,
    })
}

// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
pub async fn run(args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    let timings = args.timings()?;
    let hold = born_again_hold(&timings);
    let mut rows = Vec::new();
    for min_replicas in [0, 1] {
        progress(&format!(
            "sentinel: deployment, min-replicas-to-write {min_replicas}"
        ));
        let mut d = Deployment::start().await?;
        d.min_replicas(min_replicas)?;
        let prefix = super::report::prefix();
        let agents =
            super::agents::start_many(&d.url(), &prefix, 3, timings, args.node_lease_ms()).await?;
        let first = d.primary().context("sentinel: no primary named")?;
        one_leader_on(&agents, &d.servers[first], &prefix, Duration::from_secs(30)).await?;
        let mut trials = Vec::new();
        for i in 0..args.sentinel_trials * 2 {
            let kind = if i % 2 == 0 {
                Kind::Graceful
            } else {
                Kind::Killed
            };
            progress(&format!(
                "sentinel: min-replicas-to-write {min_replicas}, trial {} of {} ({kind:?})",
                i + 1,
                args.sentinel_trials * 2
            ));
            trials.push(trial(&mut d, &agents, &prefix, kind, min_replicas, hold).await?);
        }
        for kind in [Kind::Graceful, Kind::Killed] {
            let of: Vec<&Trial> = trials.iter().filter(|t| t.kind == kind).collect();
            let mut led: Vec<Duration> = of.iter().map(|t| t.led).collect();
            led.sort();
            let mut named: Vec<Duration> = of.iter().map(|t| t.named).collect();
            named.sort();
            let mut attached: Vec<Duration> = of.iter().filter_map(|t| t.attached).collect();
            attached.sort();
            let mut over: Vec<f64> = of
                .iter()
                .map(|t| t.led.as_secs_f64() - t.bound.as_secs_f64())
                .collect();
            over.sort_by(f64::total_cmp);
            let worst = over.last().copied().unwrap_or(0.0);
            let what = match kind {
                Kind::Graceful => "graceful (SENTINEL FAILOVER)",
                Kind::Killed => "primary SIGKILLed, restarted on its own data",
            };
            rows.push(Row::new(
                format!(
                    "Sentinel, {what}, min-replicas-to-write {min_replicas}: fault to one leader on the new primary ({} trials)",
                    of.len()
                ),
                format!(
                    "each within its bound: named + recheck {} ms{} + max(ttl, epoch hold) + retry ({} ms)",
                    SENTINEL_RECHECK.as_millis(),
                    if min_replicas > 0 {
                        ", or a replica in sync on the new primary if later,"
                    } else {
                        ""
                    },
                    hold.as_millis()
                ),
                format!(
                    "p50 {:.0} ms, max {:.0} ms; named p50 {:.0} ms, max {:.0} ms; a replica online {}; worst against the bound {:+.0} ms",
                    millis(percentile(&led, 50.0)),
                    millis(led.last().copied().unwrap_or_default()),
                    millis(percentile(&named, 50.0)),
                    millis(named.last().copied().unwrap_or_default()),
                    if attached.is_empty() {
                        format!("in none of {} trials before the leader", of.len())
                    } else {
                        format!(
                            "p50 {:.0} ms ({} of {} trials before the leader)",
                            millis(percentile(&attached, 50.0)),
                            attached.len(),
                            of.len()
                        )
                    },
                    worst * 1000.0
                ),
                Some(worst <= 0.0),
            ));
        }
        drop(agents);
    }
    Ok(rows)
}
