//! Failovers of PostgreSQL: how soon the group has one leader on a promoted
//! standby. A primary and one streaming standby (`pg_basebackup -R`, the
//! testkit's [`LocalPostgres`]), both started here on PostgreSQL's
//! defaults, and three agent processes on a multi-host URL that asks for
//! the writable host (`postgres://postgres@HOST1,HOST2/postgres?target_session_attrs=read-write`,
//! docs/postgres.md "Connecting"; the user and database the bench's
//! `--store postgres` uses). The one setting changed is the one the
//! scenario is about: `synchronous_standby_names = '*'` on the primary (as
//! the testkit's `replica()` sets it), so every lease write is on the
//! standby before it counts (the agents' sessions commit with
//! `synchronous_commit = remote_apply`): the standby promoted holds every
//! lease granted.
//!
//! Each trial SIGKILLs the primary (every process of the server), then
//! promotes the standby (`pg_promote()`, waiting until it takes writes),
//! as an operator or Patroni would; the group must lead on the promoted
//! one. The promoted server starts with no synchronous standby (its
//! settings came from the primary before `synchronous_standby_names` was
//! set there), as Patroni's `synchronous_mode` (not strict) leaves a
//! primary with none to wait for. For the next trial a fresh standby of
//! the new primary takes the killed one's place, then the new primary names
//! it synchronous, and the next fault waits for `sync_state = sync`.
//!
//! Each host of the URL is a TCP proxy (the testkit's) in front of a server:
//! the agents' URL is fixed when they start, as a Deployment's host names
//! are, while each fresh standby gets a port of its own, so the proxy of
//! the killed server's place is pointed at it (a pod's DNS name at a new
//! pod). A proxy only forwards bytes; in front of a dead server it closes
//! each connection it accepts at once, where a dead host's port would
//! refuse it: either way the client goes on to the next host.
//!
//! A trial ends when the agents agree on one leader and the lease on the
//! promoted server names it under the agreed term, written there by the
//! promoted server (a claim or a renewal, not the row it had as a standby).
//! Its bound is derived, not guessed: the promotion (fault to
//! `pg_promote()` done, measured), then the agents' reconnection: the call
//! in flight ends within its timeout, a closed connection is dropped
//! (session.rs `Slot::failed`, as one to a server turned standby, SQLSTATE
//! 25006, would be), and the next call, after at most a retry interval of
//! backoff, connects again, to the host that takes writes
//! (`target_session_attrs=read-write` skips the standby, and a standby is
//! refused anyway); then the hold of a store born again (a new timeline is
//! a new history, docs/postgres.md "Histories": no new lease for one ttl
//! and the term epoch's hold, whichever is longer) and one retry interval,
//! within which every agent's claim sees the new holder. A leader whose
//! lease still stands on the promoted server when it reconnects keeps it
//! (its claim finds its own lease), which is a fine outcome too.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use leasehold_engine::ElectionConfig;
use leasehold_testkit::postgres::LocalPostgres;
use leasehold_testkit::proxy::Proxy;

use super::agents::{agreed, AgentProcess, GROUP, NAMESPACE};
use super::args::BenchArgs;
use super::promotion::{born_again_hold, millis, reconnect, until};
use super::report::{percentile, progress, Row};

/// The scenario's name in its errors.
const SCENARIO: &str = "postgres failover";
/// How often a wait looks at the servers (each look starts processes).
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// How long a standby may take to stream, then to be synchronous.
const SYNC_LIMIT: Duration = Duration::from_secs(30);

/// Runs `f`, which blocks (a process such as `psql`, `pg_basebackup`, a
/// kill that waits for the server's processes), off the runtime's
/// scheduling: the proxies the agents' connections go through run on this
/// runtime, and must not wait behind it.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn psql(server: &LocalPostgres, sql: &str) -> anyhow::Result<String> {
    blocking(|| server.psql(sql))
}

struct Deployment {
    /// Two places, each a server behind a proxy (`proxies[i]` in front of
    /// `servers[i]`): `servers[primary]` takes writes, the other streams
    /// from it.
    servers: Vec<LocalPostgres>,
    proxies: Vec<Proxy>,
    primary: usize,
}

impl Deployment {
    async fn start() -> anyhow::Result<Self> {
        let primary = blocking(LocalPostgres::start).context("postgres failover: the primary")?;
        let standby = blocking(|| LocalPostgres::standby_of(&primary))
            .context("postgres failover: the standby")?;
        let proxies = vec![
            Proxy::start(primary.port).await,
            Proxy::start(standby.port).await,
        ];
        let deployment = Self {
            servers: vec![primary, standby],
            proxies,
            primary: 0,
        };
        deployment.synchronous().await?;
        Ok(deployment)
    }

    /// The URL the agents use: both places, the writable one asked for.
    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        format!(
            "postgres://postgres@{}/postgres?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    fn standby(&self) -> usize {
        1 - self.primary
    }

    /// Names the standby synchronous on the primary, once it streams (a
    /// standby still catching up is no candidate, and every commit, lease
    /// writes too, would wait for it meanwhile), and waits until the
    /// primary says it is (`sync_state = sync`).
    async fn synchronous(&self) -> anyhow::Result<()> {
        let primary = &self.servers[self.primary];
        let replication = |column: &str| {
            psql(
                primary,
                &format!("SELECT {column} FROM pg_stat_replication"),
            )
            .unwrap_or_default()
        };
        until(
            SCENARIO,
            LOOK_EVERY,
            SYNC_LIMIT,
            "the standby streams",
            || replication("state") == "streaming",
        )
        .await?;
        // (ALTER SYSTEM refuses to run in a transaction block: one
        // statement per call.)
        psql(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")?;
        psql(primary, "SELECT pg_reload_conf()")?;
        until(
            SCENARIO,
            LOOK_EVERY,
            SYNC_LIMIT,
            "the standby is synchronous",
            || replication("sync_state") == "sync",
        )
        .await
    }
}

/// The lease as one server holds it: holder, term and expiry (ms on the
/// server's clock), which every claim or renewal it takes moves; `None`
/// when no lease stands.
fn lease_on(server: &LocalPostgres, prefix: &str) -> anyhow::Result<Option<String>> {
    let schema = format!("\"{}\"", prefix.replace('"', "\"\""));
    let row = psql(
        server,
        &format!(
            "SELECT holder || '#' || lease_term || '#' || expires_ms FROM {schema}.groups
             WHERE name = '{NAMESPACE}/{GROUP}' AND holder IS NOT NULL
               AND expires_ms > {schema}.now_ms()"
        ),
    )?;
    Ok((!row.is_empty()).then_some(row))
}

/// Samples the agents every 10 ms until they agree on one leader and the
/// lease on `server` names it under the agreed term, other than
/// `inherited` (the row `server` held when it was promoted); returns the
/// agreed term.
async fn one_leader_on(
    agents: &[AgentProcess],
    server: &LocalPostgres,
    prefix: &str,
    inherited: Option<&str>,
    limit: Duration,
) -> anyhow::Result<u64> {
    let start = Instant::now();
    // A read that failed is read again (a server under a restart's load
    // may refuse one); the last failure is said if no leader comes.
    let mut failed = None;
    loop {
        if let Some((l, term)) = agreed(agents, GROUP).await {
            match lease_on(server, prefix) {
                Ok(Some(lease)) => {
                    let names = lease.starts_with(&format!("{}#{term}#", agents[l].id));
                    if names && inherited != Some(lease.as_str()) {
                        return Ok(term);
                    }
                }
                Ok(None) => {}
                Err(e) => failed = Some(e),
            }
        }
        if start.elapsed() > limit {
            let why = failed.map_or(String::new(), |e| format!(" (last read: {e:#})"));
            bail!("postgres failover: no leader on the primary within {limit:?}{why}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct Trial {
    /// Fault to `pg_promote()` done.
    promoted: Duration,
    /// Fault to one leader on the promoted server.
    led: Duration,
    /// The leader kept the term it held before the fault.
    kept: bool,
    bound: Duration,
}

/// One fault, from a steady state (one leader on the primary, its standby
/// synchronous) back to one: a fresh synchronous standby of the promoted
/// server, so the next trial starts where this one did.
async fn trial(
    d: &mut Deployment,
    agents: &[AgentProcess],
    prefix: &str,
    timings: &ElectionConfig,
) -> anyhow::Result<Trial> {
    let (old, new) = (d.primary, d.standby());
    // From a steady state: one leader on the primary.
    let before = one_leader_on(agents, &d.servers[old], prefix, None, SYNC_LIMIT).await?;
    let start = Instant::now();
    blocking(|| d.servers[old].kill());
    blocking(|| d.servers[new].promote()).context("postgres failover: pg_promote")?;
    let promoted = start.elapsed();
    let inherited = lease_on(&d.servers[new], prefix)?;
    let term = one_leader_on(
        agents,
        &d.servers[new],
        prefix,
        inherited.as_deref(),
        Duration::from_secs(60),
    )
    .await?;
    let led = start.elapsed();
    // A fresh standby of the new primary in the killed one's place (the
    // killed server and its directory go).
    let standby = blocking(|| LocalPostgres::standby_of(&d.servers[new]))
        .context("postgres failover: a standby of the promoted server")?;
    d.proxies[old].retarget(standby.port);
    d.servers[old] = standby;
    d.primary = new;
    d.synchronous().await?;
    Ok(Trial {
        promoted,
        led,
        kept: term == before,
        bound: promoted + reconnect(timings) + born_again_hold(timings),
    })
}

fn row(trials: &[Trial], timings: &ElectionConfig) -> Row {
    let mut led: Vec<Duration> = trials.iter().map(|t| t.led).collect();
    led.sort();
    let mut promoted: Vec<Duration> = trials.iter().map(|t| t.promoted).collect();
    promoted.sort();
    let worst = trials
        .iter()
        .map(|t| t.led.as_secs_f64() - t.bound.as_secs_f64())
        .max_by(f64::total_cmp)
        .unwrap_or(0.0);
    let kept = trials.iter().filter(|t| t.kept).count();
    let (reconnect, hold) = (reconnect(timings), born_again_hold(timings));
    Row::new(
        format!(
            "PostgreSQL, the primary SIGKILLed and its synchronous standby promoted: fault to one leader on the promoted server ({} trials)",
            trials.len()
        ),
        format!(
            "each within its bound: promoted + the reconnection (the call in flight and the error backoff, {} ms: a closed connection is dropped and the next call connects to the host that takes writes) + max(ttl, epoch hold) + retry ({} ms)",
            reconnect.as_millis(),
            hold.as_millis()
        ),
        format!(
            "p50 {:.0} ms, max {:.0} ms; promoted p50 {:.0} ms, max {:.0} ms; the leader kept its term in {kept} of {}; worst against the bound {:+.0} ms",
            millis(percentile(&led, 50.0)),
            millis(led.last().copied().unwrap_or_default()),
            millis(percentile(&promoted, 50.0)),
            millis(promoted.last().copied().unwrap_or_default()),
            trials.len(),
            worst * 1000.0
        ),
        Some(worst <= 0.0),
    )
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    let timings = args.timings()?;
    progress("postgres failover: a primary and a synchronous standby");
    let mut d = Deployment::start().await?;
    let prefix = super::report::prefix();
    let agents =
        super::agents::start_many(&d.url(), &prefix, 3, timings, args.node_lease_ms()).await?;
    let mut trials = Vec::new();
    for i in 0..args.failover_trials {
        progress(&format!(
            "postgres failover: trial {} of {}",
            i + 1,
            args.failover_trials
        ));
        trials.push(trial(&mut d, &agents, &prefix, &timings).await?);
    }
    drop(agents);
    Ok(vec![row(&trials, &timings)])
}
