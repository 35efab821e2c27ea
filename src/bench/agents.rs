//! `leasehold agent` processes for the bench: real OS processes, so SIGKILL,
//! SIGTERM and SIGSTOP are the real thing, observed through their local API
//! and the engine's events in Redis.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use anyhow::{anyhow, bail, Context as _};
use leasehold_agent::Status;
use leasehold_engine::ElectionConfig;
use tokio::process::{Child, Command};

/// The group every takeover trial campaigns for.
pub const GROUP: &str = "bench";
pub const NAMESPACE: &str = "bench";

pub struct AgentProcess {
    pub id: String,
    pub addr: SocketAddr,
    args: Vec<String>,
    groups: String,
    child: Child,
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    leasehold::local_redis::free_port().map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
}

impl AgentProcess {
    /// Starts `leasehold agent` (this very binary) for `groups` and waits
    /// until its API answers.
    pub async fn start(
        url: &str,
        prefix: &str,
        name: &str,
        groups: &[String],
        timings: ElectionConfig,
        node_lease_ms: u64,
    ) -> anyhow::Result<Self> {
        let addr = free_addr()?;
        let args = vec![
            "agent".to_owned(),
            format!("--redis-url={url}"),
            format!("--prefix={prefix}"),
            format!("--namespace={NAMESPACE}"),
            format!("--pod-name={name}"),
            format!("--listen={addr}"),
            format!("--ttl-ms={}", timings.ttl_ms),
            format!("--renew-interval-ms={}", timings.renew_interval_ms),
            format!("--retry-interval-ms={}", timings.retry_interval_ms),
            format!("--node-lease-ms={node_lease_ms}"),
        ];
        let groups = groups.join(",");
        let child = spawn(&args, &groups)?;
        let mut agent = Self {
            id: format!("{NAMESPACE}/{name}"),
            addr,
            args,
            groups,
            child,
        };
        agent.wait_until_up().await?;
        Ok(agent)
    }

    async fn wait_until_up(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.get("/healthz").await.is_ok_and(|(s, _)| s == 200) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!("agent {} exited at start: {status}", self.id);
            }
            if Instant::now() > deadline {
                bail!("agent {} did not answer within 10 s", self.id);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Starts the same agent again (same node id, same flags) after it was
    /// stopped or killed.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let _ = self.child.kill().await;
        self.child = spawn(&self.args, &self.groups)?;
        self.wait_until_up().await
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
        }
    }

    /// Waits for the process to end (after a signal).
    pub async fn wait(&mut self, limit: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .map_err(|_| anyhow!("agent {} did not exit within {limit:?}", self.id))?
            .map(drop)
            .map_err(anyhow::Error::from)
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        Ok(leasehold_daemon::http::request(self.addr, "GET", path, Duration::from_secs(2)).await?)
    }

    pub async fn post(&self, path: &str) -> anyhow::Result<(u16, String)> {
        Ok(
            leasehold_daemon::http::request(self.addr, "POST", path, Duration::from_secs(2))
                .await?,
        )
    }

    pub async fn status(&self) -> Option<Status> {
        let (code, body) = self.get("/v1/status").await.ok()?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    /// User plus system CPU time the process has used so far.
    pub fn cpu_time(&self) -> Option<Duration> {
        super::procfs::cpu_time(self.pid()?)
    }
}

fn spawn(args: &[String], groups: &str) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("cannot find this binary")?;
    Command::new(exe)
        .args(args)
        .env("LEASEHOLD_GROUPS", groups)
        .env("RUST_LOG", "error")
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start an agent process")
}

/// The agents' agreed view of one group: exactly one leader, every other
/// agent a follower naming it under the same term.
pub async fn agreed(agents: &[AgentProcess], group: &str) -> Option<(usize, u64)> {
    let mut leader = None;
    let mut views = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let status = a.status().await?;
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
