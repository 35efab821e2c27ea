//! The demo's own PostgreSQL, for `leasehold demo --store postgres` with no
//! URL: `initdb` into an empty directory of its own, `postgres` on a free
//! loopback port with trust authentication, stopped and removed at exit.
//! Both refuse to run as root, so as root they run as the `postgres` user
//! that Debian's package creates. Only what the demo needs; the tests'
//! launcher, which can also crash, copy and promote a server, is in
//! `leasehold-testkit`, apart from the product.

use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

pub struct PostgresServer {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

const INSTALL: &str = "install PostgreSQL (Debian: apt-get install postgresql) \
                       or pass --store-url postgres://USER@HOST:PORT/DATABASE";

/// The newest `/usr/lib/postgresql/*/bin` holding `initdb`.
fn bin_dir() -> anyhow::Result<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .with_context(|| format!("no /usr/lib/postgresql: {INSTALL}"))?
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop()
        .map(|(_, bin)| bin)
        .with_context(|| format!("no initdb under /usr/lib/postgresql: {INSTALL}"))
}

/// The uid and gid to run as: ours, or the `postgres` user's when we are
/// root.
fn account() -> anyhow::Result<Option<(u32, u32)>> {
    let id = |flag: &str, user: Option<&str>| -> anyhow::Result<u32> {
        let out = Command::new("id").arg(flag).args(user).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .with_context(|| format!("id {flag} {}", user.unwrap_or_default()))
    };
    if id("-u", None)? != 0 {
        return Ok(None);
    }
    let uid = id("-u", Some("postgres"))
        .context("PostgreSQL refuses to run as root, and there is no postgres user to run it as")?;
    Ok(Some((uid, id("-g", Some("postgres"))?)))
}

impl PostgresServer {
    /// Starts it and waits (up to 30 s) until it takes queries.
    pub fn start() -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let account = account()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("no free port on 127.0.0.1")?
            .port();
        let dir = std::env::temp_dir().join(format!("leasehold-demo-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .with_context(|| format!("cannot hand {} to postgres", dir.display()))?;
        }
        let command = |program: &Path| {
            let mut c = Command::new(program);
            c.current_dir(&dir).stdin(Stdio::null());
            if let Some((uid, gid)) = account {
                c.uid(uid).gid(gid);
            }
            c
        };
        let data = dir.join("data");
        let out = command(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--no-locale",
                "-E",
                "UTF8",
                "-N",
            ])
            .output()
            .with_context(|| format!("could not run initdb: {INSTALL}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            bail!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let child = command(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&dir)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("could not start postgres: {INSTALL}"))?;
        let mut server = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(&server.dir)
                .args(["-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                bail!("postgres exited at start ({status})");
            }
            if Instant::now() > deadline {
                bail!("postgres did not take queries on port {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // A fast shutdown (SIGINT) ends the backends too; then the files go.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
