//! A throwaway PgBouncer (Debian's `pgbouncer`) in front of a
//! [`LocalPostgres`], in the pool mode a test asks for, on a free loopback
//! port, with trust authentication; run as the `postgres` user when the
//! tests run as root (it refuses root too), killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::postgres::LocalPostgres;

pub struct LocalPgBouncer {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

/// Why PgBouncer cannot be started here, if it cannot.
pub fn missing() -> Option<String> {
    crate::on_path("pgbouncer")
        .or_else(|| Some("/usr/sbin/pgbouncer".into()).filter(|p: &PathBuf| p.is_file()))
        .is_none()
        .then(|| "needs Debian's pgbouncer (scripts/setup.sh installs it)".to_owned())
}

impl LocalPgBouncer {
    /// In front of `server`, with `pool_mode` (`session`, `transaction`).
    pub fn start(server: &LocalPostgres, pool_mode: &str) -> anyhow::Result<Self> {
        let port = crate::redis::free_port()?;
        let dir = std::env::temp_dir().join(format!("leasehold-pgbouncer-{:x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n")?;
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host=127.0.0.1 port={pg}\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {dir}/users.txt\npool_mode = {pool_mode}\n\
                 default_pool_size = 50\nmax_client_conn = 200\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {dir}/pgbouncer.log\n",
                pg = server.port,
                dir = dir.display(),
            ),
        )?;
        let program = crate::on_path("pgbouncer").unwrap_or_else(|| "/usr/sbin/pgbouncer".into());
        let mut command = Command::new(&program);
        if crate::root() {
            let user = nix::unistd::User::from_name("postgres")?.context("the postgres user")?;
            let status = Command::new("chown")
                .arg("-R")
                .arg(format!("{}:{}", user.uid, user.gid))
                .arg(&dir)
                .status()?;
            anyhow::ensure!(status.success(), "chown {}", dir.display());
            use std::os::unix::process::CommandExt;
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("run {}", program.display()))?;
        let mut bouncer = Self { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = bouncer.child.try_wait() {
                bail!("pgbouncer exited at start ({status}): {}", bouncer.log());
            }
            if Instant::now() > deadline {
                bail!("pgbouncer did not listen within 10 s: {}", bouncer.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(bouncer)
    }

    /// A URL for the `postgres` user and `database` through the pooler.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for LocalPgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
