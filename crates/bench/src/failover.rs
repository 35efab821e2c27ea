//! Takeover figures: three agent processes campaign for one group; each
//! trial breaks the leader (SIGKILL, SIGTERM, a step-down through its API),
//! kills a follower to watch the sweep, or stalls Redis (SIGSTOP), and times
//! the way back to one leader (every trial starts from one agreed leader).
//! Takeover times are taken when the engine's own
//! events arrive from Redis (`P:events`), and gaps on the Redis clock come
//! from the lease's and the registration's expiries as Redis reports them.

use leasehold_testkit::Signal;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use leasehold_engine::{ElectionConfig, Event, Store};
use tokio::sync::mpsc::UnboundedReceiver;

use super::agents::{wait_agreed, AgentProcess, GROUP, NAMESPACE};
use super::args::BenchArgs;
use super::local::{name, LocalStore};
use super::report::progress;
use super::report::{Row, Series};

const AGENTS: usize = 3;

fn full_group() -> String {
    format!("{NAMESPACE}/{GROUP}")
}

/// Waits for an engine event (`kind` names it in the error) that satisfies
/// `matches`.
async fn next_event(
    events: &mut UnboundedReceiver<Event>,
    kind: &str,
    limit: Duration,
    matches: impl Fn(&Event) -> bool,
) -> anyhow::Result<Instant> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .map_err(|_| anyhow!("no {kind} event within {limit:?}"))?
            .context("the event subscription ended")?;
        if matches(&event) {
            return Ok(Instant::now());
        }
    }
}

fn drain(events: &mut UnboundedReceiver<Event>) {
    while events.try_recv().is_ok() {}
}

fn elected_above(term: u64) -> impl Fn(&Event) -> bool {
    move |e| matches!(e, Event::Elected { group, term: t, .. } if *group == full_group() && *t > term)
}

/// The pool of agents and what every trial needs.
struct Bench<'a> {
    args: &'a BenchArgs,
    timings: ElectionConfig,
    store: Store,
    agents: Vec<AgentProcess>,
    events: UnboundedReceiver<Event>,
}

impl Bench<'_> {
    fn settle_limit(&self) -> Duration {
        Duration::from_millis(5 * self.timings.ttl_ms) + Duration::from_secs(5)
    }

    async fn steady(&self) -> anyhow::Result<(usize, u64)> {
        let (l, term, _) = wait_agreed(&self.agents, GROUP, self.settle_limit()).await?;
        Ok((l, term))
    }

    /// SIGKILL or SIGTERM of the leader: time to the next Elected, and (for
    /// SIGKILL) the gap between the old lease's expiry and the new
    /// acquisition, both on the Redis clock.
    async fn signal_leader(
        &mut self,
        signal: Signal,
        kill_to_leader: &mut Series,
        expiry_gap: Option<&mut Series>,
    ) -> anyhow::Result<()> {
        let (l, term) = self.steady().await?;
        drain(&mut self.events);
        let sent = Instant::now();
        self.agents[l].signal(signal);
        // The old lease as Redis sees it, just after the kill.
        let before = self
            .store
            .group_state(&full_group())
            .await
            .map_err(anyhow::Error::msg)?;
        let old_expiry = before.now_ms + before.lease_pttl_ms.unwrap_or(0);
        let limit =
            Duration::from_millis(2 * self.timings.ttl_ms + 2 * self.timings.retry_interval_ms)
                + Duration::from_secs(2);
        let at = next_event(&mut self.events, "elected", limit, elected_above(term)).await?;
        kill_to_leader.push(at - sent);
        if let Some(gap) = expiry_gap {
            let after = self
                .store
                .group_state(&full_group())
                .await
                .map_err(anyhow::Error::msg)?;
            let acquired = (after.now_ms + after.lease_pttl_ms.unwrap_or(0)) as i64
                - self.timings.ttl_ms as i64;
            let gap_ms = (acquired - old_expiry as i64).max(0) as u64;
            gap.push(Duration::from_millis(gap_ms));
        }
        super::agents::ended(&mut self.agents[l], Duration::from_secs(10)).await?;
        self.agents[l].restart().await
    }

    async fn step_down(&mut self, series: &mut Series) -> anyhow::Result<()> {
        let (l, term) = self.steady().await?;
        drain(&mut self.events);
        let sent = Instant::now();
        let (code, body) = leasehold_testkit::agent::post(
            self.agents[l].port,
            &format!("/v1/groups/{GROUP}/step-down"),
        )
        .await;
        if code != 200 {
            bail!("step-down answered {code}: {body}");
        }
        let limit = Duration::from_millis(self.timings.ttl_ms) + Duration::from_secs(2);
        let at = next_event(&mut self.events, "elected", limit, elected_above(term)).await?;
        series.push(at - sent);
        // The one that stepped down abstains for a ttl; let it come back.
        tokio::time::sleep(Duration::from_millis(self.timings.ttl_ms)).await;
        Ok(())
    }

    /// SIGKILL of a follower: time from the kill, and from its registration's
    /// expiry (Redis clock), to a sweep that names it.
    async fn sweep(&mut self, after_lease: &mut Series) -> anyhow::Result<()> {
        let (l, _) = self.steady().await?;
        let victim = (l + 1) % self.agents.len();
        drain(&mut self.events);
        self.agents[victim].signal(Signal::SIGKILL);
        let id = self.agents[victim].id.clone();
        let nodes = self.store.list_nodes().await.map_err(anyhow::Error::msg)?;
        let lease_until = nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| n.lease_until_ms)
            .with_context(|| format!("{id} is not registered"))?;
        let limit = Duration::from_millis(3 * self.args.node_lease_ms()) + Duration::from_secs(5);
        let victim_id = id.clone();
        next_event(
            &mut self.events,
            "swept",
            limit,
            move |e| matches!(e, Event::Swept { nodes, .. } if nodes.contains(&victim_id)),
        )
        .await?;
        let now = self.store.time_ms().await.map_err(anyhow::Error::msg)?;
        after_lease.push(Duration::from_millis(now.saturating_sub(lease_until)));
        super::agents::ended(&mut self.agents[victim], Duration::from_secs(10)).await?;
        self.agents[victim].restart().await
    }

    /// The store stalled (SIGSTOP) for `pause`: time from SIGCONT until
    /// exactly one agent leads again.
    async fn pause(
        &mut self,
        server: &mut LocalStore,
        pause: Duration,
        series: &mut Series,
    ) -> anyhow::Result<()> {
        self.steady().await?;
        server.pause()?;
        tokio::time::sleep(pause).await;
        server.resume()?;
        let resumed = Instant::now();
        // Exactly one agent leads (the takeover docs/behaviour.md E6 bounds); the others
        // learning who it is comes after, and is waited for by `steady`.
        loop {
            let mut leaders = 0;
            for a in &self.agents {
                if a.leads(GROUP).await {
                    leaders += 1;
                }
            }
            if leaders == 1 {
                break;
            }
            if resumed.elapsed() > self.settle_limit() {
                bail!(
                    "no single leader within {:?} of the store resuming",
                    self.settle_limit()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        series.push(resumed.elapsed());
        Ok(())
    }
}

// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
pub async fn run(
    url: &str,
    local: Option<&mut LocalStore>,
    args: &BenchArgs,
) -> anyhow::Result<(Vec<Series>, Vec<Row>)> {
    let store_name = name(url);
    let timings = args.timings()?;
    let prefix = super::report::prefix();
    let store = Store::connect(url, &prefix).map_err(anyhow::Error::msg)?;
    let events = store.follow_events();
    // The subscription is made in the background: give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    progress(&format!("starting {AGENTS} agent processes"));
    let agents =
        super::agents::start_many(url, &prefix, AGENTS, timings, args.node_lease_ms()).await?;
    let mut bench = Bench {
        args,
        timings,
        store,
        agents,
        events,
    };
    let (ttl, retry) = (timings.ttl_ms, timings.retry_interval_ms);
    let n = args.trials;
    let mut crash = Series::new("crash (SIGKILL): kill to new leader", ttl + retry, None);
    let mut crash_gap = Series::new(
        &format!("crash: old lease expiry to new acquisition ({store_name} clock)"),
        retry,
        Some(10),
    );
    let mut graceful = Series::new("graceful (SIGTERM): signal to new leader", retry, Some(50));
    let mut step_down = Series::new("step-down (API): request to new leader", retry, Some(50));
    let mut swept = Series::new(
        &format!("dead node: registration expiry to sweep ({store_name} clock)"),
        args.node_lease_ms(),
        Some(50),
    );
    for k in 1..=n {
        progress(&format!("crash, trial {k} of {n}"));
        bench
            .signal_leader(Signal::SIGKILL, &mut crash, Some(&mut crash_gap))
            .await?;
    }
    for k in 1..=n {
        progress(&format!("graceful shutdown, trial {k} of {n}"));
        bench
            .signal_leader(Signal::SIGTERM, &mut graceful, None)
            .await?;
    }
    for k in 1..=n {
        progress(&format!("step-down, trial {k} of {n}"));
        bench.step_down(&mut step_down).await?;
    }
    for k in 1..=n {
        progress(&format!("dead-node sweep, trial {k} of {n}"));
        bench.sweep(&mut swept).await?;
    }
    let mut out = vec![crash, crash_gap, graceful, step_down, swept];
    match local {
        Some(server) => {
            let mut short = Series::new(
                &format!("{store_name} paused < ttl: resume to one leader"),
                retry,
                None,
            );
            let mut long = Series::new(
                &format!("{store_name} paused > ttl: resume to one leader"),
                retry,
                None,
            );
            let (short_pause, long_pause) = (
                Duration::from_millis(ttl / 2),
                Duration::from_millis(ttl * 2),
            );
            for k in 1..=n {
                progress(&format!(
                    "{store_name} paused for {short_pause:?}, trial {k} of {n}"
                ));
                bench.pause(server, short_pause, &mut short).await?;
            }
            for k in 1..=n {
                progress(&format!(
                    "{store_name} paused for {long_pause:?}, trial {k} of {n}"
                ));
                bench.pause(server, long_pause, &mut long).await?;
            }
            out.push(short);
            out.push(long);
        }
        None => {
            progress("pause scenarios skipped: they need the bench's own store (no --store-url)")
        }
    }
    for mut a in bench.agents {
        a.signal(Signal::SIGTERM);
        let _ = super::agents::ended(&mut a, Duration::from_secs(5)).await;
    }
    let (exec, rows) = super::exec_stall::run(url, &prefix, &bench.store, args).await?;
    out.extend(exec);
    Ok((out, rows))
}
