//! Test support: real `redis-server` processes on free ports, one per test,
//! that a test can kill, pause (SIGSTOP/SIGCONT) and restart, plus small
//! waiting helpers with explicit bounds.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod agent;
pub mod proxy;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_engine::{ElectionConfig, Event, Group, Node, NodeConfig, Role, Store};
use tokio::sync::broadcast;

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    password: Option<String>,
    paused: bool,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on loopback")
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    pub fn start_with_password(password: &str) -> Self {
        Self::start_with(Some(password.to_owned()))
    }

    fn start_with(password: Option<String>) -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
            password,
            paused: false,
        };
        server.spawn();
        // An established store: tests start where a deployment runs, past
        // the first ttl after the store's birth, when no lease is handed
        // out (see claim.lua). A restart loses this, as a real one would;
        // the tests of the birth restart Redis.
        server.cli(&["SET", "lh:born", "0"]);
        server
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(p) = &self.password {
            cmd.args(["--requirepass", p]);
        }
        let child = cmd
            .spawn()
            .expect("redis-server must be installed (Debian package redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    pub fn store(&self) -> Store {
        Store::connect(&self.url(), "lh").expect("store")
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig} failed");
    }

    /// SIGSTOP: connections stay open, nothing answers.
    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.paused = false;
    }

    /// SIGKILL; the data is gone (no persistence).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused {
                let _ = Command::new("kill")
                    .args(["-CONT", &child.id().to_string()])
                    .status();
                self.paused = false;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill and start again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A plain synchronous command, for inspecting state from the test.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-p", &self.port.to_string()]);
        if let Some(p) = &self.password {
            cmd.args(["-a", p, "--no-auth-warning"]);
        }
        let out = cmd.args(args).output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Short timings for tests: ttl 600 ms, renew 200 ms, retry 100 ms.
pub fn fast() -> ElectionConfig {
    ElectionConfig {
        ttl_ms: 600,
        renew_interval_ms: 200,
        retry_interval_ms: 100,
    }
}

pub fn node_config() -> NodeConfig {
    NodeConfig::with_lease(600)
}

pub async fn node(redis: &RedisServer, id: &str) -> Node {
    Node::start(redis.store(), id, node_config())
        .await
        .expect("node")
}

/// Waits until `check` holds, or panics with `what` after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Like [`eventually`], for a check that has to await.
pub async fn eventually_async<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Index of the one group handle that leads, once exactly one does.
pub async fn one_leader(groups: &[&Group], limit: Duration) -> usize {
    let mut found = 0;
    eventually(limit, "exactly one leader", || {
        let leaders: Vec<usize> = (0..groups.len())
            .filter(|&i| groups[i].is_leader())
            .collect();
        if leaders.len() == 1 {
            found = leaders[0];
            true
        } else {
            false
        }
    })
    .await;
    found
}

pub fn role(group: &Group) -> Role {
    group.role().borrow().clone()
}

/// Next event matching `pred`, within `limit`.
pub async fn next_event(
    rx: &mut broadcast::Receiver<Event>,
    limit: Duration,
    mut pred: impl FnMut(&Event) -> bool,
) -> Event {
    tokio::time::timeout(limit, async {
        loop {
            match rx.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event stream closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no matching event within {limit:?}"))
}

/// Lines published on a channel, read by a `redis-cli SUBSCRIBE` child.
pub struct Subscription {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl RedisServer {
    pub fn subscribe(&self, channel: &str) -> Subscription {
        let mut child = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--raw", "SUBSCRIBE", channel])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait for the subscription confirmation before anything is published.
        let sub = Subscription { child, lines };
        sub.next_line_containing("subscribe", Duration::from_secs(5));
        sub
    }
}

impl Subscription {
    pub fn next_line_containing(&self, text: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line containing {text:?} within {limit:?}"),
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn is_follower(group: &Group) -> bool {
    matches!(role(group), Role::Follower { .. })
}

/// Waits until every group handle but the leader's follows: their last claim
/// read the lease's expiry, so they wake when it is due.
pub async fn followers_see_the_leader(groups: &[leasehold_engine::Group], limit: Duration) {
    eventually(limit, "followers see the leader", || {
        groups.iter().filter(|g| is_follower(g)).count() == groups.len() - 1
    })
    .await;
}
