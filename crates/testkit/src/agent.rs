//! `leasehold agent` as a real OS process (so SIGKILL, SIGTERM and SIGSTOP
//! are real), for the tests and the bench: started from the flags given,
//! waited for until its API answers, asked through that API, and killed
//! when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use nix::sys::signal::Signal;
use tokio_util::task::AbortOnDropHandle;

/// Timings of the agent tests: ttl 1000 ms, renew 300 ms, retry 200 ms.
pub const TTL_MS: u64 = 1000;
pub const RENEW_MS: u64 = 300;
pub const RETRY_MS: u64 = 200;

/// The `leasehold` binary the integration tests run:
/// `LEASEHOLD_TEST_BINARY`, or the one cargo built beside the test binary
/// (`target/<profile>/`, built for the root package's tests); a panic that
/// says so when there is none.
pub fn binary() -> PathBuf {
    let path = match std::env::var_os("LEASEHOLD_TEST_BINARY") {
        Some(path) => PathBuf::from(path),
        None => {
            let exe = std::env::current_exe().expect("the test binary's path");
            // target/<profile>/deps/<test>-<hash> → target/<profile>/leasehold
            let profile = exe.parent().and_then(Path::parent);
            profile.expect("target/<profile>").join("leasehold")
        }
    };
    assert!(
        path.is_file(),
        "no leasehold binary at {} (cargo builds it for the root package's tests; \
         or set LEASEHOLD_TEST_BINARY)",
        path.display()
    );
    path
}

pub struct Agent {
    pub id: String,
    pub port: u16,
    program: PathBuf,
    wrapper: Vec<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    /// A client draining the agent's inbox (see [`Agent::read_inbox`]).
    reader: Option<AbortOnDropHandle<()>>,
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
    let out = Command::new(binary())
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

/// What to run: the program (the `leasehold` binary, or the bench's own),
/// an optional wrapper before it (`unshare --pid --fork`, `prlimit ...`),
/// its flags and extra environment.
pub struct Launch<'a> {
    pub program: &'a Path,
    pub wrapper: &'a [&'a str],
    pub args: Vec<String>,
    pub env: &'a [(&'a str, &'a str)],
}

impl Agent {
    /// Starts the `leasehold` binary with these flags (see [`args`]) and
    /// waits until its API answers.
    pub async fn start(id: &str, port: u16, args: Vec<String>) -> Self {
        Self::start_under(&[], id, port, args).await
    }

    /// Like [`Agent::start`], with the binary run by `wrapper` (for example
    /// `unshare --pid --fork`): the process kept is the wrapper's.
    pub async fn start_under(wrapper: &[&str], id: &str, port: u16, args: Vec<String>) -> Self {
        let program = binary();
        let launch = Launch {
            program: &program,
            wrapper,
            args,
            env: &[],
        };
        Self::launch(id, port, launch)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Starts `launch` as agent `id` listening on `port`, and waits until
    /// its API answers (an error if it exits first or takes over 10 s).
    pub async fn launch(id: &str, port: u16, launch: Launch<'_>) -> anyhow::Result<Self> {
        let mut agent = Self {
            id: id.to_owned(),
            port,
            program: launch.program.to_owned(),
            wrapper: launch.wrapper.iter().map(|s| s.to_string()).collect(),
            args: launch.args,
            env: launch
                .env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            reader: None,
        };
        agent.spawn()?;
        agent.wait_until_up().await?;
        Ok(agent)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let mut command = match self.wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        let child = command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // Errors only, unless a run asks for more
            // (`LEASEHOLD_AGENT_LOG=debug`, say, while chasing a failure).
            .env(
                "RUST_LOG",
                std::env::var("LEASEHOLD_AGENT_LOG").unwrap_or_else(|_| "error".into()),
            )
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start agent {}", self.id))?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_until_up(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if get(self.port, "/healthz").await.0 == 200 {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("agent {} exited at start: {status}", self.id);
            }
            if Instant::now() > deadline {
                bail!(
                    "agent {} did not answer on port {} within 10 s",
                    self.id,
                    self.port
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Starts the same agent again (same node id, same flags) after it was
    /// stopped or killed.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.end();
        self.spawn()?;
        self.wait_until_up().await
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends `signal` to the process; panics if it is not running, so a
    /// fault test cannot pass without its fault.
    pub fn signal(&self, signal: Signal) {
        assert!(
            crate::send_signal(self.pid(), signal),
            "{signal} to {} failed",
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

    /// `/v1/status` as `T` (the agent's `Status`, or a `serde_json::Value`);
    /// `None` if it does not answer.
    pub async fn status<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        let (code, body) = get(self.port, "/v1/status").await;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    /// The group's role as the agent reports it (`None` if it does not answer).
    pub async fn role(&self, group: &str) -> Option<(String, Option<u64>)> {
        let v: serde_json::Value = self.status().await?;
        let g = &v["groups"][group];
        Some((g["role"].as_str()?.to_owned(), g["term"].as_u64()))
    }

    /// Keeps a client on the agent's event stream, as an application
    /// would, so its inbox is read (the agent reads it only for a client),
    /// reconnecting from the last event it saw whenever the stream breaks.
    pub fn read_inbox(&mut self) {
        let addr = self.addr();
        self.reader = Some(AbortOnDropHandle::new(tokio::spawn(async move {
            let mut last: Option<String> = None;
            loop {
                if let Ok(mut stream) =
                    crate::http::EventStream::open(addr, "/v1/inbox/events", last.as_deref()).await
                {
                    while stream.next().await.is_some() {}
                    last = stream.last_id().map(str::to_owned);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })));
    }

    pub async fn leads(&self, group: &str) -> bool {
        get(self.port, &format!("/v1/groups/{group}/leader"))
            .await
            .0
            == 200
    }

    /// User plus system CPU time the process has used so far.
    pub fn cpu_time(&self) -> Option<Duration> {
        crate::procfs::cpu_time(self.child.as_ref()?.id())
    }

    /// SIGKILLs the process (resumed first, if it was stopped) and reaps it.
    fn end(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::send_signal(child.id(), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.reader = None;
        self.end();
    }
}

/// One request to the agent on `port`; `(0, "")` when nothing answers
/// within a second.
pub async fn request(port: u16, method: &str, path: &str) -> (u16, String) {
    crate::http_status(SocketAddr::from(([127, 0, 0, 1], port)), method, path).await
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
    crate::http::request_with(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "POST",
        path,
        &[],
        bytes::Bytes::copy_from_slice(body),
        Duration::from_secs(5),
    )
    .await
    .unwrap_or((0, String::new()))
}
