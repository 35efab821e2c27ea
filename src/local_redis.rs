//! A throwaway `redis-server` for commands that need one and were not given
//! a URL (`demo`, `bench`): free loopback port, no persistence, killed
//! when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LocalRedis {
    child: Child,
    pub port: u16,
}

impl LocalRedis {
    pub fn start() -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("no free port on 127.0.0.1: {e}"))?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "could not start redis-server ({e}); install it (Debian: apt-get install redis-server) \
                     or pass --redis-url redis://HOST:PORT"
                )
            })?;
        let mut redis = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = redis.child.try_wait() {
                return Err(format!("redis-server exited at start ({status})"));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server did not listen on port {port} within 10 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(redis)
    }

    /// SIGSTOP: connections stay open and nothing answers, like a stalled
    /// server; [`LocalRedis::resume`] sends SIGCONT.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: a plain syscall on our own child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.resume();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
