//! The bench's agent processes: real OS processes, so SIGKILL, SIGTERM and
//! SIGSTOP are the real thing, observed through their local API and the
//! engine's events in Redis; and whether they agree on one leader.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use leasehold_agent::Status;
use leasehold_engine::ElectionConfig;
use leasehold_testkit::agent::{Agent, Launch};

/// The group every takeover trial campaigns for.
pub const GROUP: &str = "bench";
pub const NAMESPACE: &str = "bench";

/// An agent process of the bench: the harness of the tests
/// (`leasehold_testkit::agent`), running this binary.
pub type AgentProcess = Agent;

/// Starts `leasehold agent` (this very binary, see `main.rs`) for `groups`
/// at these timings, with more of its options (`--name=value`) if any, and
/// waits until its API answers.
pub async fn start(
    url: &str,
    prefix: &str,
    name: &str,
    groups: &[String],
    timings: ElectionConfig,
    node_lease_ms: u64,
    options: &[String],
) -> anyhow::Result<Agent> {
    let port = leasehold_testkit::redis::free_port()?;
    let mut args = vec![
        "agent".to_owned(),
        format!("--redis-url={url}"),
        format!("--prefix={prefix}"),
        format!("--namespace={NAMESPACE}"),
        format!("--pod-name={name}"),
        format!("--listen=127.0.0.1:{port}"),
        format!("--ttl-ms={}", timings.ttl_ms),
        format!("--renew-interval-ms={}", timings.renew_interval_ms),
        format!("--retry-interval-ms={}", timings.retry_interval_ms),
        format!("--node-lease-ms={node_lease_ms}"),
    ];
    args.extend_from_slice(options);
    let exe = std::env::current_exe().context("cannot find this binary")?;
    let groups = groups.join(",");
    let launch = Launch {
        program: &exe,
        wrapper: &[],
        args,
        env: &[("LEASEHOLD_GROUPS", &groups)],
    };
    Agent::launch(&format!("{NAMESPACE}/{name}"), port, launch).await
}

/// The agents' agreed view of one group: exactly one leader, every other
/// agent a follower naming it under the same term.
pub async fn agreed(agents: &[AgentProcess], group: &str) -> Option<(usize, u64)> {
    let mut leader = None;
    let mut views = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let status: Status = a.status().await?;
        let view = status.groups.get(group)?.clone();
        if view.role == "leader" {
            if leader.is_some() {
                return None;
            }
            leader = Some((i, view.term?));
        }
        views.push(view);
    }
    let (l, term) = leader?;
    let all_follow = views
        .iter()
        .enumerate()
        .all(|(i, v)| i == l || (v.role == "follower" && v.term == Some(term)));
    all_follow.then_some((l, term))
}

/// Waits until [`agreed`] holds, polling every millisecond or so.
pub async fn wait_agreed(
    agents: &[AgentProcess],
    group: &str,
    limit: Duration,
) -> anyhow::Result<(usize, u64, Duration)> {
    let start = Instant::now();
    loop {
        if let Some((l, term)) = agreed(agents, group).await {
            return Ok((l, term, start.elapsed()));
        }
        if start.elapsed() > limit {
            bail!("the agents did not agree on one leader of {group} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `n` agents `agent-0`, `agent-1`... campaigning for [`GROUP`].
pub async fn start_many(
    url: &str,
    prefix: &str,
    n: usize,
    timings: ElectionConfig,
    node_lease_ms: u64,
) -> anyhow::Result<Vec<Agent>> {
    let mut agents = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("agent-{i}");
        let groups = [GROUP.to_owned()];
        agents.push(start(url, prefix, &name, &groups, timings, node_lease_ms, &[]).await?);
    }
    Ok(agents)
}

/// Waits up to `limit` for `agent` to exit (after a signal).
pub async fn ended(agent: &mut Agent, limit: Duration) -> anyhow::Result<()> {
    match agent.exited_within(limit).await {
        Some(_) => Ok(()),
        None => bail!("agent {} did not exit within {limit:?}", agent.id),
    }
}
