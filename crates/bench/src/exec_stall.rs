//! Exec mode with the leading agent stalled: three agents run a command in
//! exec mode; each trial stops the leading agent (SIGSTOP) for three ttl
//! while its command, a process of its own, runs on, and times the command's
//! end against the end of the lease. The command ignores SIGTERM (it only
//! notes when it came), so it is the guard's SIGKILL that ends it: the
//! worst case, a command that does not stop when asked.
//!
//! What each trial reads, all on this machine's wall clock:
//! - the stop, just before SIGSTOP;
//! - the local view's end: `until` in the stopped agent's role file (the
//!   agent cannot rewrite it while stopped), which is its last confirmed
//!   renewal's send + ttl. Another task of the agent hands the guard the
//!   same renewal; a stop that falls between the two (a few microseconds
//!   in a renew interval) would show a margin one renewal too small;
//! - the store's end: the lease's expiry as the store reports it then
//!   (`now + PTTL`; the store runs on this machine, on the same clock);
//! - when the command got SIGTERM (it writes the time), and when its
//!   process was gone (polled every millisecond).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use leasehold_engine::{ElectionConfig, Store};
use leasehold_testkit::Signal;

use super::agents::{wait_agreed, AgentProcess, NAMESPACE};
use super::args::BenchArgs;
use super::report::{progress, Row, Series};

/// The group of the exec trials (its own, beside the takeover trials').
const GROUP: &str = "bench-exec";
const AGENTS: usize = 3;

/// The guard's SIGKILL comes this long before the deadline.
const LEAD_MS: u64 = leasehold_agent::exec_guard::KILL_LEAD.as_millis() as u64;

/// The Unix clock now, in ns, signed: margins below may be negative.
fn wall_ns() -> i128 {
    leasehold_testkit::wall_ns() as i128
}

fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}

/// The command each agent runs: notes its pid, and the time of a SIGTERM,
/// which it otherwise ignores.
fn script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "echo $$ > {d}/pid.$LEASEHOLD_TERM; \
         trap 'date +%s%N > {d}/term.$LEASEHOLD_TERM' TERM; \
         while :; do sleep 1 & wait $!; done"
    )
}

/// One stall, in ns of the wall clock.
struct Trial {
    stopped: i128,
    term_signal: i128,
    gone: i128,
    local_end: i128,
    store_end: i128,
}

struct Stalls<'a> {
    timings: ElectionConfig,
    grace_ms: u64,
    store: &'a Store,
    dir: PathBuf,
    agents: Vec<AgentProcess>,
}

impl Stalls<'_> {
    fn ttl(&self) -> Duration {
        Duration::from_millis(self.timings.ttl_ms)
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    /// The role file's `until` of agent `i` under `term`, in ns.
    fn local_end(&self, i: usize, term: u64) -> anyhow::Result<i128> {
        let text = self.read(&format!("roles-{i}/{GROUP}")).unwrap_or_default();
        let until: i128 = text
            .trim_end()
            .strip_prefix(&format!("leader {term} until "))
            .and_then(|ms| ms.parse().ok())
            .with_context(|| format!("the stopped leader's role file says {text:?}"))?;
        Ok(until * 1_000_000)
    }

    async fn trial(&mut self) -> anyhow::Result<Trial> {
        let limit = 5 * self.ttl() + Duration::from_secs(5);
        let (l, term, _) = wait_agreed(&self.agents, GROUP, limit).await?;
        let started = Instant::now();
        let pid: u32 = loop {
            if let Some(pid) = self
                .read(&format!("pid.{term}"))
                .and_then(|p| p.trim().parse().ok())
            {
                break pid;
            }
            if started.elapsed() > self.ttl() {
                bail!("the leader's command under term {term} wrote no pid");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let stopped = wall_ns();
        self.agents[l].signal(Signal::SIGSTOP);
        let state = self
            .store
            .group_state(&format!("{NAMESPACE}/{GROUP}"))
            .await
            .map_err(anyhow::Error::msg)?;
        let store_end = i128::from(state.now_ms + state.lease_pttl_ms.unwrap_or(0)) * 1_000_000;
        let local_end = self.local_end(l, term)?;
        let gone = loop {
            if !leasehold_testkit::procfs::alive(pid) {
                break wall_ns();
            }
            if started.elapsed() > limit {
                bail!("the stopped leader's command (pid {pid}) still ran after {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let term_signal: i128 = self
            .read(&format!("term.{term}"))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(gone);
        let stall_end = stopped + 3 * self.ttl().as_nanos() as i128;
        let rest = (stall_end - wall_ns()).max(0);
        tokio::time::sleep(Duration::from_nanos(rest as u64)).await;
        self.agents[l].signal(Signal::SIGCONT);
        Ok(Trial {
            stopped,
            term_signal,
            gone,
            local_end,
            store_end,
        })
    }
}

/// A margin row: how long before `end` the command was gone, per trial.
fn margin_row(what: &str, margins: &[i128]) -> Row {
    let mut sorted = margins.to_vec();
    sorted.sort_unstable();
    let at = |p: f64| sorted[((p / 100.0) * (sorted.len() - 1) as f64).round() as usize];
    let min = sorted[0];
    Row::new(
        format!("exec, leading agent stopped: command gone before {what}"),
        "never after it (margin ≥ 0)".into(),
        format!(
            "margin p50 {:.1} ms, p99 {:.1} ms (the 1% smallest), min {:.1} ms, {} stalls",
            ms(at(50.0)),
            ms(at(1.0)),
            ms(min),
            sorted.len()
        ),
        Some(min >= 0),
    )
}

/// Runs `args.trials` stalls of the leading agent on `url`.
pub async fn run(
    url: &str,
    prefix: &str,
    store: &Store,
    args: &BenchArgs,
) -> anyhow::Result<(Vec<Series>, Vec<Row>)> {
    let timings = args.timings()?;
    // 250 ms, where the timings leave room for it (the agent refuses a
    // grace period longer than ttl - renew - retry - 40 ms).
    let grace_ms = timings
        .ttl_ms
        .saturating_sub(timings.renew_interval_ms + timings.retry_interval_ms + 40)
        .min(250);
    let dir = std::env::temp_dir().join(format!("leasehold-bench-exec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    progress(&format!("starting {AGENTS} agents in exec mode"));
    let mut agents = Vec::with_capacity(AGENTS);
    for i in 0..AGENTS {
        let options = vec![
            format!("--grace-period-ms={grace_ms}"),
            format!("--role-dir={}", dir.join(format!("roles-{i}")).display()),
            "--".into(),
            "sh".into(),
            "-c".into(),
            script(&dir),
        ];
        let name = format!("exec-{i}");
        let groups = [GROUP.to_owned()];
        agents.push(
            super::agents::start(
                url,
                prefix,
                &name,
                &groups,
                timings,
                args.node_lease_ms(),
                &options,
            )
            .await?,
        );
    }
    let mut stalls = Stalls {
        timings,
        grace_ms,
        store,
        dir: dir.clone(),
        agents,
    };
    let (ttl, grace) = (timings.ttl_ms, stalls.grace_ms);
    let mut to_term = Series::new(
        &format!("exec, leading agent stopped: stop to its command's SIGTERM (grace {grace} ms)"),
        ttl - grace - LEAD_MS,
        None,
    );
    let mut to_gone = Series::new(
        "exec, leading agent stopped: stop to its command's tree gone",
        ttl - LEAD_MS,
        None,
    );
    let (mut local, mut in_store) = (Vec::new(), Vec::new());
    let n = args.trials;
    for k in 1..=n {
        progress(&format!(
            "exec: leading agent stopped for 3 ttl, trial {k} of {n}"
        ));
        let t = stalls.trial().await?;
        to_term.push(Duration::from_nanos(
            (t.term_signal - t.stopped).max(0) as u64
        ));
        to_gone.push(Duration::from_nanos((t.gone - t.stopped).max(0) as u64));
        local.push(t.local_end - t.gone);
        in_store.push(t.store_end - t.gone);
    }
    for mut a in stalls.agents {
        a.signal(Signal::SIGTERM);
        let _ = super::agents::ended(&mut a, Duration::from_secs(5)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let rows = vec![
        margin_row("the local view's end (last confirmed send + ttl)", &local),
        margin_row("the lease's end in the store", &in_store),
    ];
    Ok((vec![to_term, to_gone], rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_margin_misses_the_goal() {
        let ms = 1_000_000;
        let met = margin_row("x", &[20 * ms, 19 * ms, 21 * ms]);
        assert_eq!(met.met, Some(true));
        assert!(met.measured.contains("min 19.0 ms"), "{}", met.measured);
        let missed = margin_row("x", &[20 * ms, -ms]);
        assert_eq!(missed.met, Some(false));
    }
}
