//! Chaos on the Sentinel topology: a primary, two replicas and three
//! sentinels (real `redis-server` processes), three `leasehold agent`
//! processes campaigning for one group through a `redis+sentinel://` URL,
//! and one failover after another, of three kinds, picked at random:
//! - forced: `SENTINEL FAILOVER`, the old primary demoted in order;
//! - killed: the primary SIGKILLed, found down by the sentinels, restarted
//!   on its own directory (as a Redis pod on its volume: with the snapshot
//!   of its last full sync, older than what it served) as a replica of the
//!   new primary;
//! - lagging: a replica SIGSTOPped (its replication stalls, so lease writes
//!   cannot be confirmed), then the primary killed; the replica resumes
//!   once the new primary is named;
//! - lossy: the primary's replica links cut (`CLIENT KILL TYPE replica`,
//!   `repl-timeout` on Redis's default 60 s), the leader told to step down, so the next
//!   claim's term is written while no replica has the link, the primary
//!   SIGKILLed 150 ms later and restarted on its own directory 0.5 s after
//!   the switch, as a replica of the new primary.
//!
//! Every 5 ms each agent's report is read through its API, and each
//! "leader under term t" it reports is offered to a fenced sink
//! (`testkit::fenced`), which refuses a term another agent used first
//! (the broken promise) and a term below the highest accepted (a term gone
//! back). Also counted: samples in which two agents report leading (under
//! one term, or at all).
//!
//! Before any of that is asserted, the faults must have happened: the
//! failovers wanted (one per 10 s, at least one), a new primary named by
//! the sentinels after each, and leaders seen under at least two terms. A
//! run without them proves nothing and fails.
//!
//! Short by default (CI: 30 s, and on until it has held three failovers).
//! `LEASEHOLD_SENTINEL_CHAOS_SECONDS=600` runs ten
//! minutes (a cycle takes about 6.4 s here: 94 failovers in the last run);
//! `LEASEHOLD_CHAOS_SEED=N` repeats a run.

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use testkit::agent::{args, post, Agent};
use testkit::fenced::FencedSink;
use testkit::sentinel::Deployment;
use testkit::{free_port, LocalRedis};

const GROUP: &str = "chaos";
// The timings of the run (22).
const DOWN_AFTER_MS: u64 = 1000;
const TTL_MS: u64 = 1000;
const RENEW_MS: u64 = 300;
const RETRY_MS: u64 = 200;
/// A steady leader watched between two faults, so that a second holder of
/// its term would be seen (100 samples).
const PAUSE_MS: u64 = 500;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Forced,
    Killed,
    Lagging,
    Lossy,
}

struct Referee {
    agents: Vec<Agent>,
    sink: FencedSink,
    samples: u64,
    two_leaders: u64,
    same_term: u64,
    /// When a leader was last seen.
    last_leader: Option<Instant>,
}

impl Referee {
    /// One sample of every agent; returns whether someone leads.
    async fn sample(&mut self) -> bool {
        let mut leaders = Vec::new();
        for (i, agent) in self.agents.iter().enumerate() {
            if let Some((role, Some(term))) = agent.role(GROUP).await {
                if role == "leader" {
                    leaders.push((i, term));
                }
            }
        }
        self.samples += 1;
        if leaders.len() > 1 {
            self.two_leaders += 1;
            let mut terms: Vec<u64> = leaders.iter().map(|(_, t)| *t).collect();
            terms.sort_unstable();
            terms.dedup();
            if terms.len() < leaders.len() {
                self.same_term += 1;
            }
            eprintln!("two leaders: {leaders:?}");
        }
        for (i, term) in &leaders {
            self.sink.write(&format!("agent-{i}"), *term);
        }
        if !leaders.is_empty() {
            self.last_leader = Some(Instant::now());
        }
        !leaders.is_empty()
    }

    /// Samples every 5 ms until `check` (run every 100 ms: it may start
    /// `redis-cli`) holds; panics after `limit`.
    async fn until(
        &mut self,
        limit: Duration,
        what: &str,
        check: impl FnMut() -> bool,
    ) -> Duration {
        self.until_or(limit, what, check, || ()).await
    }

    /// Like [`Referee::until`], running `explain` before it panics.
    async fn until_or(
        &mut self,
        limit: Duration,
        what: &str,
        mut check: impl FnMut() -> bool,
        explain: impl FnOnce(),
    ) -> Duration {
        let start = Instant::now();
        let mut checked = start - Duration::from_secs(1);
        loop {
            self.sample().await;
            if checked.elapsed() >= Duration::from_millis(100) {
                checked = Instant::now();
                if check() {
                    return start.elapsed();
                }
            }
            if start.elapsed() >= limit {
                explain();
                panic!("not within {limit:?}: {what}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Samples every 5 ms until `check` (every 100 ms) holds or `limit`
    /// passes; returns whether it held.
    async fn until_or_not(&mut self, limit: Duration, mut check: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            self.sample().await;
            if check() {
                return true;
            }
            for _ in 0..20 {
                self.sample().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        false
    }

    /// Samples every 5 ms for `span`. (`until` with a check that holds
    /// returns at its first sample: the pauses written that way were none.)
    async fn watch(&mut self, span: Duration) {
        self.until_or_not(span, || false).await;
    }

    /// Samples until someone leads; returns when that was seen, or `None`
    /// after `limit`.
    async fn until_led(&mut self, limit: Duration) -> Option<Instant> {
        let start = Instant::now();
        loop {
            if self.sample().await {
                return Some(Instant::now());
            }
            if start.elapsed() >= limit {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// What every agent reports, and the store's keys on every server, for
    /// a group left without a leader.
    async fn explain_leaderless(&self, d: &Deployment) {
        for (i, agent) in self.agents.iter().enumerate() {
            let status = testkit::agent::get(agent.port, "/v1/status").await;
            eprintln!("agent {i}: {status:?}");
        }
        let group = format!("t/{GROUP}");
        for (i, server) in d.servers.iter().enumerate() {
            let get = |key: &str| server.cli(&["GET", key]);
            eprintln!(
                "server {i} (port {}): time {} born {} epoch {} history {} term {} lease {} pttl {} {}",
                server.port,
                server.cli(&["TIME"]).replace('\n', " "),
                get("lh:born"),
                get("lh:epoch"),
                get("lh:history"),
                get(&format!("lh:g:{{{group}}}:term")),
                get(&format!("lh:g:{{{group}}}:lease")),
                server.cli(&["PTTL", &format!("lh:g:{{{group}}}:lease")]),
                server.cli(&["ROLE"]).replace('\n', " "),
            );
        }
    }
}

/// Prints what the sentinels and servers say, for a failover that did not
/// happen.
fn diagnose(d: &Deployment, fault: Fault) {
    eprintln!(
        "sentinel chaos: no failover after a {fault:?} fault; named {:?}",
        d.named()
    );
    for (i, s) in d.servers.iter().enumerate() {
        let role = LocalRedis::cli(s, &["ROLE"]).unwrap_or_else(|e| format!("{e:#}"));
        eprintln!("server {i} (port {}): {}", s.port, role.replace('\n', " "));
    }
    if let Ok(replicas) = d.sentinels[0].cli(&["SENTINEL", "replicas", testkit::sentinel::MASTER]) {
        eprintln!(
            "sentinel 0 on the replicas: {}",
            replicas.replace('\n', " ")
        );
    }
    for (i, s) in d.sentinels.iter().enumerate() {
        let path = s.dir().join("sentinel.log");
        let log =
            std::fs::read_to_string(&path).unwrap_or_else(|e| format!("{}: {e}", path.display()));
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("sentinel {i} log, last lines:");
        for line in tail.iter().rev() {
            eprintln!("  {line}");
        }
    }
}

/// Whether this server says it is a primary (`ROLE`).
fn says_primary(server: &testkit::RedisServer) -> bool {
    LocalRedis::cli(server, &["ROLE"]).is_ok_and(|role| role.starts_with("master"))
}

/// The primary a majority of sentinels names, if that server agrees.
fn named_primary(d: &Deployment) -> Option<usize> {
    d.primary().filter(|p| says_primary(&d.servers[*p]))
}

/// Points every server at the primary the majority of sentinels names, as
/// an operator would, and first makes that one a primary if it is not (a
/// Sentinel split: seen once in a 600 s run at down-after 1000 on two busy
/// cores, two sentinels naming a server that was a replica, the third
/// another server; Sentinel had no replica left to promote and stayed so).
/// Returns whether there was a named primary to point at.
fn follow_the_named_primary(d: &Deployment) -> bool {
    let Some(primary) = d.primary() else {
        return false;
    };
    if !says_primary(&d.servers[primary]) {
        d.servers[primary].cli(&["REPLICAOF", "NO", "ONE"]);
    }
    let port = d.servers[primary].port.to_string();
    for (i, server) in d.servers.iter().enumerate() {
        if i != primary {
            server.cli(&["REPLICAOF", "127.0.0.1", &port]);
        }
    }
    true
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failovers_never_give_a_term_two_holders() {
    let seconds: u64 = std::env::var("LEASEHOLD_SENTINEL_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let seed: u64 = std::env::var("LEASEHOLD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("sentinel chaos: seed {seed} ({seconds} s; LEASEHOLD_CHAOS_SEED={seed} repeats it)");
    let mut rng = fastrand::Rng::with_seed(seed);

    let mut d = Deployment::start(2, DOWN_AFTER_MS).await;
    let url = d.url();
    let mut agents = Vec::new();
    for i in 0..3 {
        let port = free_port();
        let id = format!("chaos/agent-{i}");
        let mut flags = args(&id, &url, port, GROUP);
        for (flag, value) in [
            ("--ttl-ms", TTL_MS),
            ("--renew-interval-ms", RENEW_MS),
            ("--retry-interval-ms", RETRY_MS),
        ] {
            let at = flags.iter().position(|f| f == flag).expect("flag") + 1;
            flags[at] = value.to_string();
        }
        agents.push(Agent::start(&id, port, flags).await);
    }
    let mut r = Referee {
        agents,
        sink: FencedSink::default(),
        samples: 0,
        two_leaders: 0,
        same_term: 0,
        last_leader: None,
    };
    r.until_led(Duration::from_secs(10))
        .await
        .expect("a first leader within 10 s");

    // The run lasts `seconds`, and on past that until it holds one
    // failover per 10 s: a forced failover Sentinel drops costs its 15 s
    // wait, and Sentinel's slow conversion of an old primary can hold a
    // window near 11 s, so two of those fill a 30 s run (seen in CI:
    // 2 failovers in 30 s, every safety count 0). Without a cap on the
    // overtime a harness that stopped producing failovers would hang, so
    // the count is still asserted, after at most 4 × `seconds`.
    // Against the bounds of docs/redis.md ("After a failover"): the
    // failover (fault to the new primary named), the agents' next look at
    // the sentinels (the recheck and the ask's own timeout), the hold of a
    // store born again (the larger of the ttl and the term epoch's hold)
    // and a retry interval. After a lossy or lagging failover, the larger
    // of two more holds: a second hold of the store born again (a claimant
    // remembering the term the new primary lacks), or the replica-loss
    // grace with its count refresh (a replica of the new primary that
    // leaves again as Sentinel reconfigures it).
    let hold = Duration::from_millis(TTL_MS.max(leasehold_engine::TERM_EPOCH_HOLD_MS));
    let look =
        leasehold_engine::config::SENTINEL_RECHECK + leasehold_engine::config::SENTINEL_TIMEOUT;
    let budget = |fault: Fault| {
        let holds = match fault {
            Fault::Forced | Fault::Killed => hold,
            Fault::Lossy | Fault::Lagging => (2 * hold).max(
                leasehold_engine::config::REPLICA_LOSS_GRACE
                    + leasehold_engine::config::REPLICA_COUNT_REFRESH,
            ),
        };
        look + holds + Duration::from_millis(RETRY_MS)
    };
    let began = Instant::now();
    let deadline = began + Duration::from_secs(seconds);
    let cap = began + Duration::from_secs(4 * seconds);
    let wanted = (seconds / 10).max(1) as usize;
    let mut failovers: Vec<(Fault, Duration, Duration, Duration)> = Vec::new();
    let mut dropped = 0;
    let mut pointed = 0;
    let mut splits = 0;
    while Instant::now() < deadline || (failovers.len() < wanted && Instant::now() < cap) {
        let old = d.primary().expect("a primary");
        // The replicas in sync with the primary (an old primary that
        // Sentinel has not converted yet is not one).
        let info = d.servers[old].cli(&["INFO", "replication"]);
        let replicas: Vec<usize> = (0..d.servers.len())
            .filter(|i| {
                *i != old && info.contains(&format!("port={},state=online", d.servers[*i].port))
            })
            .collect();
        // A lagging fault stalls one replica and needs another to promote.
        let faults: &[Fault] = if replicas.len() >= 2 {
            &[Fault::Forced, Fault::Killed, Fault::Lagging, Fault::Lossy]
        } else {
            &[Fault::Forced, Fault::Killed, Fault::Lossy]
        };
        let fault = faults[rng.usize(..faults.len())];
        let start = Instant::now();
        let mut stalled = None;
        match fault {
            Fault::Forced => {
                // A sentinel refuses while it still winds up the last one
                // (INPROG) or sees no replica fit yet (NOGOODSLAVE).
                let mut tries = 0;
                loop {
                    let s = rng.usize(..d.sentinels.len());
                    let out = d.sentinels[s]
                        .cli(&["SENTINEL", "FAILOVER", testkit::sentinel::MASTER])
                        .unwrap();
                    if out == "OK" {
                        break;
                    }
                    tries += 1;
                    if tries == 50 {
                        diagnose(&d, fault);
                        panic!("SENTINEL FAILOVER: {out}");
                    }
                    r.watch(Duration::from_millis(200)).await;
                }
            }
            Fault::Killed => d.servers[old].kill(),
            Fault::Lagging => {
                let lagging = replicas[rng.usize(..replicas.len())];
                d.servers[lagging].pause();
                stalled = Some(lagging);
                // Long enough for a lease write to go unconfirmed.
                r.until(Duration::from_secs(2), "the replica lags", || {
                    start.elapsed() > Duration::from_millis(RENEW_MS + 300)
                })
                .await;
                d.servers[old].kill();
            }
            Fault::Lossy => {
                d.servers[old].cli(&["CLIENT", "KILL", "TYPE", "replica"]);
                for agent in &r.agents {
                    if agent.leads(GROUP).await {
                        post(agent.port, &format!("/v1/groups/{GROUP}/step-down")).await;
                    }
                }
                r.until(Duration::from_secs(1), "150 ms", || {
                    start.elapsed() >= Duration::from_millis(150)
                })
                .await;
                d.servers[old].kill();
            }
        }
        let mut new = None;
        if fault == Fault::Forced {
            // A forced failover the sentinels accepted but then gave up on
            // (no replica fit by their lights) is Sentinel's business, not
            // leasehold's: counted, shown, and the next fault follows.
            let switched = r
                .until_or_not(Duration::from_secs(15), || {
                    new = d.primary().filter(|p| *p != old);
                    new.is_some()
                })
                .await;
            if !switched {
                diagnose(&d, fault);
                dropped += 1;
                continue;
            }
        }
        r.until_or(
            Duration::from_secs(30),
            "the sentinels name a new primary",
            || {
                new = d.primary().filter(|p| *p != old);
                new.is_some()
            },
            || diagnose(&d, fault),
        )
        .await;
        // From the fault, as the window is (a forced failover's switch was
        // waited for above).
        let named = start.elapsed();
        let switched = Instant::now();
        if let Some(lagging) = stalled {
            d.servers[lagging].resume();
        }
        if fault != Fault::Forced {
            // Back on its own directory, as a replica of the new primary,
            // the way a restarted Redis pod comes back on its volume (the
            // sentinels would make it a replica too, at their next look at
            // it, up to 10 s later).
            if fault == Fault::Lossy {
                r.until(Duration::from_secs(1), "0.5 s after the switch", || {
                    switched.elapsed() >= Duration::from_millis(500)
                })
                .await;
            }
            let new_port = d.servers[new.expect("named")].port.to_string();
            d.servers[old].restart_on_own_data_with(&["--replicaof", "127.0.0.1", &new_port]);
        }
        // The window without a leader that the failover caused.
        let before = r.last_leader;
        let mut led = r.until_led(Duration::from_secs(30)).await;
        let mut split = false;
        if led.is_none() && named_primary(&d).is_none() {
            // No lease can be written through a name that leads to a
            // replica (the agents follow the majority's name, and a replica
            // refuses writes): Sentinel's state, mended by hand, counted,
            // and left out of the windows. Then leasehold has its 30 s.
            eprintln!(
                "sentinel chaos: the sentinels name no primary that says so; mending by hand"
            );
            diagnose(&d, fault);
            split = follow_the_named_primary(&d);
            if split {
                splits += 1;
                led = r.until_led(Duration::from_secs(30)).await;
            }
        }
        let Some(led) = led else {
            r.explain_leaderless(&d).await;
            diagnose(&d, fault);
            panic!("no leader within 30 s after a {fault:?} failover");
        };
        let leaderless = match before {
            Some(seen) if seen >= start => led.duration_since(seen),
            Some(seen) => led.duration_since(start.max(seen)),
            None => led.duration_since(start),
        };
        if !split {
            failovers.push((fault, named, leaderless, start.elapsed()));
            // One line per failover: what a window past its bound was made
            // of (the new primary's replicas as it had them when led).
            let replicas: Vec<String> = new
                .map(|n| d.servers[n].cli(&["INFO", "replication"]))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("slave"))
                .map(str::to_owned)
                .collect();
            eprintln!(
                "sentinel chaos: {fault:?}: named {named:?}, leaderless {leaderless:?}, over the bound {:+.3} s; the new primary's replicas {replicas:?}",
                leaderless.as_secs_f64() - (named + budget(fault)).as_secs_f64()
            );
        }
        // Replicas in sync with the primary the sentinels name now: mostly
        // the new one, but with `down-after-milliseconds` 1000 on two busy
        // cores they may fail over again on their own, back to the restarted
        // server (seen in a 60 s run), and the harness follows them.
        let online = |d: &Deployment| {
            let primary = named_primary(d)?;
            let info = d.servers[primary].cli(&["INFO", "replication"]);
            Some((primary, info.matches("state=online").count()))
        };
        let synced = |d: &Deployment| online(d).is_some_and(|(_, n)| n >= 1);
        // The next fault needs a replica in sync to promote. Sentinel
        // converts an old primary left standing by a forced failover only
        // about 10 s later, and that is part of the weather: a fault may
        // come while it is still a primary nobody names (the run).
        // The cycle waits a moment for both replicas, then for one. If none
        // is in sync after 30 s (Sentinel reconfigures replicas at its own
        // pace, and after a reconfiguration timed out only at a later
        // look), they are pointed at the named primary by hand, as an
        // operator would (shown and counted: the harness's doing).
        r.until_or_not(Duration::from_secs(1), || {
            online(&d).is_some_and(|(_, n)| n == 2)
        })
        .await;
        if !r.until_or_not(Duration::from_secs(30), || synced(&d)).await {
            eprintln!("sentinel chaos: no replica follows the named primary after 30 s");
            diagnose(&d, fault);
            if follow_the_named_primary(&d) {
                pointed += 1;
            }
        }
        r.until_or(
            Duration::from_secs(30),
            "a replica follows the named primary",
            || synced(&d),
            || diagnose(&d, fault),
        )
        .await;
        r.watch(Duration::from_millis(PAUSE_MS)).await;
    }

    let n = failovers.len();
    let ran = began.elapsed().as_secs();
    let mut windows: Vec<Duration> = failovers.iter().map(|f| f.2).collect();
    windows.sort();
    let mut named: Vec<Duration> = failovers.iter().map(|f| f.1).collect();
    named.sort();
    let count = |k: Fault| failovers.iter().filter(|f| f.0 == k).count();
    eprintln!(
        "sentinel chaos: {n} failovers ({} forced, {} killed, {} lagging, {} lossy) in {ran} s, {dropped} forced failovers Sentinel dropped, replicas pointed by hand after {pointed}, a Sentinel split mended by hand after {splits} (left out of the windows); {} samples; sink accepted {} under {} terms, refused {} as a term another agent used, {} as below the highest; two leaders at once {} (same term {})",
        count(Fault::Forced),
        count(Fault::Killed),
        count(Fault::Lagging),
        count(Fault::Lossy),
        r.samples,
        r.sink.accepted,
        r.sink.terms(),
        r.sink.duplicates,
        r.sink.stale,
        r.two_leaders,
        r.same_term,
    );
    eprintln!(
        "sentinel chaos: fault to new primary named p50 {:?} p99 {:?}; leaderless window p50 {:?} p99 {:?} max {:?} (ttl {TTL_MS} ms, retry {RETRY_MS} ms)",
        percentile(&named, 0.5),
        percentile(&named, 0.99),
        percentile(&windows, 0.5),
        percentile(&windows, 0.99),
        windows.last().copied().unwrap_or_default(),
    );
    let mut over: Vec<f64> = failovers
        .iter()
        .map(|f| f.2.as_secs_f64() - (f.1 + budget(f.0)).as_secs_f64())
        .collect();
    over.sort_by(f64::total_cmp);
    let pick = |p: f64| {
        over.get(((over.len().saturating_sub(1)) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    eprintln!(
        "sentinel chaos: leaderless window minus its bound (failover + the next look + holds + retry): p50 {:+.3} s p99 {:+.3} s max {:+.3} s",
        pick(0.5),
        pick(0.99),
        over.last().copied().unwrap_or(0.0)
    );
    for k in [Fault::Forced, Fault::Killed, Fault::Lagging, Fault::Lossy] {
        let mut w: Vec<Duration> = failovers.iter().filter(|f| f.0 == k).map(|f| f.2).collect();
        w.sort();
        eprintln!(
            "sentinel chaos: {k:?}: leaderless p50 {:?} p99 {:?}",
            percentile(&w, 0.5),
            percentile(&w, 0.99)
        );
    }
    // The faults happened, before anything is concluded from the run.
    assert!(
        n >= wanted,
        "only {n} failovers in {ran} s (wanted {wanted}; the run may go on to {} s for them): a run without failovers proves nothing",
        4 * seconds
    );
    assert!(
        r.sink.terms() >= 2,
        "leaders seen under {} term(s) through {n} failovers: no failover moved the lease, so the run proves nothing",
        r.sink.terms()
    );
    assert_eq!(r.sink.duplicates, 0, "a term had two holders");
    assert_eq!(r.sink.stale, 0, "a term went back");
    assert_eq!(r.same_term, 0, "two agents led under one term");
    assert_eq!(r.two_leaders, 0, "two agents led at once");
    // Every failover within its bound, two retry intervals to spare.
    let spare = 2.0 * RETRY_MS as f64 / 1000.0;
    assert!(
        over.last().copied().unwrap_or(0.0) <= spare,
        "a failover past its bound by {:+.3} s",
        over.last().copied().unwrap_or(0.0)
    );
}
