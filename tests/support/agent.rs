//! `leasehold agent` as a real OS process (so SIGKILL, SIGTERM and SIGSTOP
//! are real), and a small HTTP client for its local API.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Timings of the agent tests: ttl 1000 ms, renew 300 ms, retry 200 ms.
pub const TTL_MS: u64 = 1000;
pub const RENEW_MS: u64 = 300;
pub const RETRY_MS: u64 = 200;

pub struct Agent {
    pub id: String,
    pub port: u16,
    child: Option<Child>,
    /// A client draining the agent's inbox (see [`Agent::read_inbox`]).
    reader: Option<tokio::task::JoinHandle<()>>,
}

/// The agent's flags for `id` on `redis_url` in group `group`, at the test
/// timings; callers add more.
pub fn args(id: &str, redis_url: &str, port: u16, group: &str) -> Vec<String> {
    [
        "agent",
        "--redis-url",
        redis_url,
        "--prefix",
        "lh",
        "--namespace",
        "t",
        "--node-id",
        id,
        "--group",
        group,
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--ttl-ms",
        &TTL_MS.to_string(),
        "--renew-interval-ms",
        &RENEW_MS.to_string(),
        "--retry-interval-ms",
        &RETRY_MS.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs the binary with `args` and returns its exit status and stderr, for
/// flags that must be refused before anything starts.
pub fn run_to_end(args: &[&str]) -> (ExitStatus, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .output()
        .expect("run leasehold");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

impl Agent {
    /// Starts an agent with these flags (see [`args`]) and waits until its
    /// API answers.
    pub async fn start(id: &str, port: u16, args: Vec<String>) -> Self {
        Self::start_under(&[], id, port, args).await
    }

    /// Like [`Agent::start`], with the binary run by `wrapper` (for example
    /// `unshare --pid --fork`): the process kept is the wrapper's.
    pub async fn start_under(wrapper: &[&str], id: &str, port: u16, args: Vec<String>) -> Self {
        let binary = env!("CARGO_BIN_EXE_leasehold");
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        let child = command
            .args(&args)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn leasehold agent");
        let agent = Self {
            id: id.to_owned(),
            port,
            child: Some(child),
            reader: None,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(port, "/healthz").await.0 != 200 {
            assert!(
                Instant::now() < deadline,
                "agent {id} did not answer on port {port}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        agent
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn signal(&self, sig: &str) {
        assert!(
            super::send_signal(self.pid(), sig),
            "kill {sig} {} failed",
            self.id
        );
    }

    /// Waits up to `limit` for the process to exit.
    pub async fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The group's role as the agent reports it (`None` if it does not answer).
    pub async fn role(&self, group: &str) -> Option<(String, Option<u64>)> {
        let (code, body) = get(self.port, "/v1/status").await;
        if code != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let g = &v["groups"][group];
        Some((g["role"].as_str()?.to_owned(), g["term"].as_u64()))
    }

    /// Keeps a client on the agent's event stream, as an application
    /// would, so its inbox is read (the agent reads it only for a client),
    /// reconnecting from the last event it saw whenever the stream breaks.
    pub fn read_inbox(&mut self) {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        self.reader = Some(tokio::spawn(async move {
            let mut last: Option<String> = None;
            loop {
                if let Ok(mut stream) = leasehold_daemon::http::EventStream::open(
                    addr,
                    "/v1/inbox/events",
                    last.as_deref(),
                )
                .await
                {
                    while stream.next().await.is_some() {}
                    last = stream.last_id().map(str::to_owned);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }

    pub async fn leads(&self, group: &str) -> bool {
        get(self.port, &format!("/v1/groups/{group}/leader"))
            .await
            .0
            == 200
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
        if let Some(mut child) = self.child.take() {
            super::send_signal(child.id(), "-CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One request to the agent on `port`; `(0, "")` when nothing answers.
pub async fn request(port: u16, method: &str, path: &str) -> (u16, String) {
    super::http(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        method,
        path,
    )
    .await
}

pub async fn get(port: u16, path: &str) -> (u16, String) {
    request(port, "GET", path).await
}

pub async fn post(port: u16, path: &str) -> (u16, String) {
    request(port, "POST", path).await
}

/// A request with a body (a publish's payload); `(0, "")` when nothing
/// answers within five seconds.
pub async fn post_body(port: u16, path: &str, body: &[u8]) -> (u16, String) {
    leasehold_daemon::http::request_with(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        "POST",
        path,
        &[],
        bytes::Bytes::copy_from_slice(body),
        Duration::from_secs(5),
    )
    .await
    .unwrap_or((0, String::new()))
}
