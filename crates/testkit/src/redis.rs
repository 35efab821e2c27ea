//! A throwaway `redis-server` for commands that need one and were not given
//! a URL (`demo`, `bench`), and for the tests: a free loopback port, no
//! persistence, killed when dropped. It can be paused (SIGSTOP), killed and
//! restarted on the same port, empty or on the snapshot its directory holds,
//! which is how the fault tests and the bench's Redis-stall scenarios break
//! it.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

/// A free TCP port on 127.0.0.1 (free when asked; bind it soon).
pub fn free_port() -> anyhow::Result<u16> {
    // The port is free when asked, and taken only later by whoever gets
    // it: two calls in a row may get the same one back from the kernel
    // (seen: two controller replicas given one port). So this process never
    // hands out a port twice.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .context("no free port on 127.0.0.1")?;
        let mut given = leasehold_engine::sync::locked(&GIVEN);
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    anyhow::bail!("no port on 127.0.0.1 that this process has not handed out already")
}

pub struct LocalRedis {
    child: Option<Child>,
    pub port: u16,
    /// Its own working directory: a snapshot it receives as a replica, or
    /// one left in the caller's directory, must never be loaded by a start
    /// that is meant to be empty.
    dir: std::path::PathBuf,
    password: Option<String>,
    /// More `redis-server` arguments (a Cluster node's, say).
    extra: Vec<String>,
    /// Runs as a Sentinel, with this configuration file (in `dir`; Sentinel
    /// rewrites it, and keeps its state across a restart).
    sentinel_config: Option<std::path::PathBuf>,
    /// Set while SIGSTOPped, so a kill resumes it first.
    paused: AtomicBool,
}

impl LocalRedis {
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with_password(None)
    }

    /// With `password`, the server requires it (`requirepass`).
    pub fn start_with_password(password: Option<&str>) -> anyhow::Result<Self> {
        Self::launch(password, &[], None)
    }

    /// With more `redis-server` arguments, e.g. `--cluster-enabled yes`.
    pub fn start_with_args(args: &[&str]) -> anyhow::Result<Self> {
        Self::launch(None, args, None)
    }

    /// A Sentinel watching the primary at `primary_port` as `master`, with
    /// `quorum`, that finds it down after `down_after_ms` of silence.
    pub fn start_sentinel(
        primary_port: u16,
        master: &str,
        quorum: u32,
        down_after_ms: u64,
    ) -> anyhow::Result<Self> {
        let config = format!(
            "sentinel monitor {master} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {master} {down_after_ms}\n\
             sentinel failover-timeout {master} {}\n\
             sentinel parallel-syncs {master} 1\n",
            down_after_ms.max(2500)
        );
        Self::launch(None, &[], Some(config))
    }

    fn launch(
        password: Option<&str>,
        args: &[&str],
        sentinel_config: Option<String>,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("leasehold-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let sentinel_config = match sentinel_config {
            Some(text) => {
                let path = dir.join("sentinel.conf");
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                Some(path)
            }
            None => None,
        };
        let mut redis = Self {
            child: None,
            port,
            dir,
            password: password.map(str::to_owned),
            extra: args.iter().map(|a| (*a).to_owned()).collect(),
            sentinel_config,
            paused: AtomicBool::new(false),
        };
        redis.spawn()?;
        Ok(redis)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        // Empty at every start: no snapshot from an earlier life.
        let _ = std::fs::remove_file(self.dir.join("dump.rdb"));
        self.spawn_on_own_data(&[])
    }

    /// Starts the server on whatever its directory holds (a snapshot it
    /// saved or received as a replica), with `args` added.
    fn spawn_on_own_data(&mut self, args: &[&str]) -> anyhow::Result<()> {
        let mut cmd = Command::new("redis-server");
        if let Some(config) = &self.sentinel_config {
            cmd.arg(config).arg("--sentinel");
            // A sentinel's log says why it did or did not fail over.
            cmd.arg("--logfile").arg(self.dir.join("sentinel.log"));
        }
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(p) = &self.password {
            cmd.args(["--requirepass", p]);
        }
        cmd.args(&self.extra);
        cmd.args(args);
        let child = cmd.spawn().map_err(|e| {
            anyhow!(
                "could not start redis-server ({e}); install it (Debian: apt-get install redis-server) \
                 or pass --redis-url redis://HOST:PORT"
            )
        })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                bail!("redis-server exited at start ({status})");
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server did not listen on port {} within 10 s",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// SIGSTOP: connections stay open and nothing answers, like a stalled
    /// server; [`LocalRedis::resume`] sends SIGCONT.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGSTOP)?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGCONT)?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let child = self
            .child
            .as_ref()
            .context("redis-server is not running (killed)")?;
        nix::sys::signal::kill(Pid::from_raw(child.id() as i32), signal)
            .with_context(|| format!("signal {signal} to redis-server"))
    }

    /// SIGKILL; the data is gone (no persistence).
    pub fn kill(&mut self) {
        if self.paused.load(Ordering::SeqCst) {
            let _ = self.resume();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill and start again on the same port, empty.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Kill (SIGKILL) and start again on the same port on its own
    /// directory, as a restarted Redis pod comes back on its volume: with
    /// the last snapshot it saved, or received from a primary, maybe older
    /// than what it served. `args` are added to this start only
    /// (`--replicaof HOST PORT`, say).
    pub fn restart_on_own_data(&mut self, args: &[&str]) -> anyhow::Result<()> {
        self.kill();
        self.spawn_on_own_data(args)
    }

    /// Starts a killed server again on its own directory (see
    /// [`LocalRedis::restart_on_own_data`]).
    pub fn start_on_own_data(&mut self, args: &[&str]) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("redis-server is still running");
        }
        self.spawn_on_own_data(args)
    }

    /// Its working directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    pub fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// A plain synchronous `redis-cli` command; its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-p", &self.port.to_string()]);
        if let Some(p) = &self.password {
            cmd.args(["-a", p, "--no-auth-warning"]);
        }
        let out = cmd
            .args(args)
            .output()
            .map_err(|e| anyhow!("redis-cli: {e} (Debian: apt-get install redis-tools)"))?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
