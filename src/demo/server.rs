//! The demo's own `redis-server`, when it is given no URL: a free loopback
//! port, no persistence, an empty directory of its own, killed and removed
//! at exit. Only what the demo needs; the tests' launcher, which can also
//! pause, restart and keep data, is in `leasehold-testkit`, apart from the
//! product.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

pub struct RedisServer {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts it and waits (up to 10 s) until it takes connections.
    pub fn start() -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("no free port on 127.0.0.1")?
            .port();
        let dir = std::env::temp_dir().join(format!("leasehold-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(
                "could not start redis-server; install it (Debian: apt-get install redis-server) \
                 or pass --redis-url redis://HOST:PORT",
            )?;
        let mut server = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                bail!("redis-server exited at start ({status})");
            }
            if Instant::now() > deadline {
                bail!("redis-server did not listen on port {port} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
