//! A throwaway PostgreSQL server for the tests: `initdb` into a directory
//! of its own, `postgres` on a free loopback port (and a Unix socket in the
//! same directory), trust authentication, killed and removed when dropped.
//! `initdb` and `postgres` refuse to run as root, so when the tests run as
//! root (CI does) both run as the package's `postgres` user, on a
//! directory that user owns.
//!
//! Like [`crate::LocalRedis`], it breaks the way production does: SIGKILL
//! of the whole server (postmaster and backends) and a start again on the
//! data directory it had ([`LocalPostgres::restart_on_own_data`]), SIGSTOP
//! of every process of the server ([`LocalPostgres::pause`]), and a copy of
//! its data directory to start from later (an older volume, a restored
//! backup).
//!
//! Most tests need only a database: [`PgDatabase::in_shared`] makes one in
//! the process's shared server (one cluster per test binary, started at
//! the first such test, stopped and removed when the process exits), and
//! drops it at the end. A test that stops, kills or replicates its server
//! starts one of its own ([`PgDatabase::own`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use nix::sys::signal::Signal;

/// Where Debian's PostgreSQL binaries are: `LEASEHOLD_PG_BIN_DIR`
/// (scripts/setup.sh exports it), else the newest `/usr/lib/postgresql/*/bin`.
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LEASEHOLD_PG_BIN_DIR") {
        return Some(PathBuf::from(dir));
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    // Version directories are numbers ("15", "16"): the newest last.
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

/// Why a PostgreSQL server cannot be started here, if it cannot.
pub fn missing() -> Option<String> {
    let Some(bin) = bin_dir() else {
        return Some(
            "needs Debian's postgresql (initdb and postgres under /usr/lib/postgresql/*/bin; \
             scripts/setup.sh installs it, or set LEASEHOLD_PG_BIN_DIR)"
                .into(),
        );
    };
    if !bin.join("initdb").is_file() {
        return Some(format!(
            "needs initdb and postgres in {} (LEASEHOLD_PG_BIN_DIR; scripts/setup.sh installs Debian's postgresql)",
            bin.display()
        ));
    }
    if crate::root()
        && nix::unistd::User::from_name("postgres")
            .ok()
            .flatten()
            .is_none()
    {
        return Some(format!(
            "runs as root, and {} refuses root: needs the postgres user to run it as",
            bin.join("initdb").display()
        ));
    }
    None
}

pub struct LocalPostgres {
    child: Option<Child>,
    pub port: u16,
    bin: PathBuf,
    /// Holds `data/` (the cluster) and the server's Unix socket.
    dir: PathBuf,
    /// Extra `-c name=value` settings for every start.
    settings: Vec<String>,
    /// Set while SIGSTOPped, so a kill resumes it first.
    paused: bool,
}

impl LocalPostgres {
    /// A new cluster (about 1.5 s of `initdb` on two cores), started.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&[])
    }

    /// With more server settings, each `name=value` (`fsync=off`, ...).
    pub fn start_with(settings: &[&str]) -> anyhow::Result<Self> {
        let mut server = Self::unstarted(settings)?;
        server.init()?;
        server.spawn()?;
        Ok(server)
    }

    /// With TLS on (`ssl = on`), its certificate made for `localhost` by a
    /// CA of the test's own; returns the server and that CA's PEM.
    pub fn start_with_tls() -> anyhow::Result<(Self, Vec<u8>)> {
        let mut server = Self::unstarted(&[])?;
        let tls = server.dir.join("tls");
        std::fs::create_dir_all(&tls)?;
        crate::make_certificates(&tls)?;
        // The server refuses a key others may read.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tls.join("srv.key"), std::fs::Permissions::from_mode(0o600))?;
        server.own_dir()?;
        server.settings.extend([
            "ssl=on".to_owned(),
            format!("ssl_cert_file={}", tls.join("srv.pem").display()),
            format!("ssl_key_file={}", tls.join("srv.key").display()),
        ]);
        server.init()?;
        server.spawn()?;
        let ca = std::fs::read(tls.join("ca.pem"))?;
        Ok((server, ca))
    }

    /// `initdb` into the data directory.
    fn init(&mut self) -> anyhow::Result<()> {
        let server = self;
        let initdb = server.bin.join("initdb");
        let data = server.data_dir();
        let out = server
            .command(&initdb)
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
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {}", initdb.display()))?;
        if !out.status.success() {
            bail!(
                "initdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// A directory of its own and a free port, nothing in it yet.
    fn unstarted(settings: &[&str]) -> anyhow::Result<Self> {
        if let Some(why) = missing() {
            bail!("cannot start PostgreSQL: it {why}");
        }
        let bin = bin_dir().context("checked")?;
        let port = crate::redis::free_port()?;
        let dir = std::env::temp_dir().join(format!("leasehold-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let server = Self {
            child: None,
            port,
            bin,
            dir,
            settings: settings.iter().map(|s| s.to_string()).collect(),
            paused: false,
        };
        server.own_dir()?;
        Ok(server)
    }

    /// A standby of `primary`, made as an operator makes one
    /// (`pg_basebackup -R`: streaming replication, asynchronous) with the
    /// primary's settings, on a port of its own, started. It follows the
    /// primary until [`LocalPostgres::promote`].
    pub fn standby_of(primary: &LocalPostgres) -> anyhow::Result<Self> {
        Self::standby_through(primary, primary.port)
    }

    /// Like [`LocalPostgres::standby_of`], streaming from `port` (a proxy
    /// in front of the primary, which a test can cut) once started.
    pub fn standby_through(primary: &LocalPostgres, port: u16) -> anyhow::Result<Self> {
        let settings: Vec<&str> = primary.settings.iter().map(String::as_str).collect();
        let mut server = Self::unstarted(&settings)?;
        let basebackup = server.bin.join("pg_basebackup");
        let out = server
            .command(&basebackup)
            .arg("-D")
            .arg(server.data_dir())
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", "postgres", "-R", "-X", "stream", "-c", "fast"])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {}", basebackup.display()))?;
        if !out.status.success() {
            bail!(
                "pg_basebackup failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if port != primary.port {
            // A later line of the file wins over the one -R wrote.
            use std::io::Write;
            let auto = server.data_dir().join("postgresql.auto.conf");
            let mut file = std::fs::OpenOptions::new().append(true).open(&auto)?;
            writeln!(
                file,
                "primary_conninfo = 'host=127.0.0.1 port={port} user=postgres'"
            )?;
        }
        server.spawn()?;
        Ok(server)
    }

    /// Promotes a standby (`pg_promote()`, waiting for it to take writes):
    /// a new timeline begins.
    pub fn promote(&self) -> anyhow::Result<()> {
        let done = self.psql("SELECT pg_promote(true, 30)")?;
        if done != "t" {
            bail!("pg_promote() answered {done:?}: {}", self.log_tail(10));
        }
        Ok(())
    }

    /// The data directory (`initdb`'s `-D`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A URL for the `postgres` superuser and database over TCP.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// As root, hands the directory to the postgres user, which the server
    /// runs as.
    fn own_dir(&self) -> anyhow::Result<()> {
        if !crate::root() {
            return Ok(());
        }
        let user = nix::unistd::User::from_name("postgres")?.context("the postgres user")?;
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", user.uid, user.gid))
            .arg(&self.dir)
            .status()
            .context("chown")?;
        if !status.success() {
            bail!("chown -R postgres {} failed", self.dir.display());
        }
        Ok(())
    }

    /// `program`, run as the postgres user when the tests run as root
    /// (std drops root's supplementary groups with it). The process is this
    /// launcher's own child, so a kill is reaped here, not left a zombie
    /// that a restart would take for a running server.
    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        // A directory the postgres user may read (not root's home).
        command.current_dir(&self.dir);
        if let Some(user) = crate::root()
            .then(|| nix::unistd::User::from_name("postgres").ok().flatten())
            .flatten()
        {
            use std::os::unix::process::CommandExt;
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        command
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let postgres = self.bin.join("postgres");
        let mut command = self.command(&postgres);
        command
            .arg("-D")
            .arg(self.data_dir())
            .arg("-k")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"]);
        for setting in &self.settings {
            command.args(["-c", setting]);
        }
        let log = std::fs::File::create(self.dir.join("server.log"))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("run {}", postgres.display()))?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Until `pg_isready` says the server takes queries (30 s at most: a
    /// crash recovery on two busy cores). Asked on the server's own socket
    /// directory, so another test's server on a reused port cannot answer.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(&self.dir)
                .args(["-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                bail!("postgres exited at start ({status}): {}", self.log_tail(10));
            }
            if Instant::now() > deadline {
                bail!(
                    "postgres did not take queries on port {} within 30 s: {}",
                    self.port,
                    self.log_tail(10)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// One statement through `psql` (unaligned, tuples only), for a test to
    /// look at or change state from outside the code under test.
    pub fn psql(&self, sql: &str) -> anyhow::Result<String> {
        self.psql_in("postgres", sql)
    }

    /// [`LocalPostgres::psql`] in `database`.
    pub fn psql_in(&self, database: &str, sql: &str) -> anyhow::Result<String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", database, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .context("run psql")?;
        if !out.status.success() {
            bail!(
                "psql {sql:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
    }

    /// The postmaster's children (backends and auxiliary processes).
    fn children(&self) -> Vec<u32> {
        let Some(postmaster) = self.postmaster() else {
            return Vec::new();
        };
        let Ok(all) = procfs::process::all_processes() else {
            return Vec::new();
        };
        all.filter_map(|p| p.ok()?.stat().ok())
            .filter(|s| s.ppid == postmaster as i32)
            .map(|s| s.pid as u32)
            .collect()
    }

    /// The postmaster's pid: this launcher's own child.
    pub fn postmaster(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP to every process of the server: connections stay open,
    /// nothing answers, as a frozen machine's would.
    pub fn pause(&mut self) -> anyhow::Result<()> {
        let postmaster = self.postmaster().context("postgres is not running")?;
        // The postmaster first, so it forks no backend after the list.
        crate::send_signal(postmaster, Signal::SIGSTOP);
        for pid in self.children() {
            crate::send_signal(pid, Signal::SIGSTOP);
        }
        self.paused = true;
        Ok(())
    }

    pub fn resume(&mut self) {
        for pid in self.children() {
            crate::send_signal(pid, Signal::SIGCONT);
        }
        if let Some(postmaster) = self.postmaster() {
            crate::send_signal(postmaster, Signal::SIGCONT);
        }
        self.paused = false;
    }

    /// SIGKILL to every process of the server, as a crash would: what was
    /// not yet written to the WAL (`synchronous_commit = off`) is lost.
    pub fn kill(&mut self) {
        let Some(postmaster) = self.postmaster() else {
            return;
        };
        // Stopped first, so it forks no backend after the list; SIGKILL
        // ends a stopped process too.
        crate::send_signal(postmaster, Signal::SIGSTOP);
        let children = self.children();
        for &pid in children.iter().chain([&postmaster]) {
            crate::send_signal(pid, Signal::SIGKILL);
        }
        self.paused = false;
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        // A start again must not find the old shared memory in use: wait
        // for the backends to be gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while children.iter().any(|&pid| running(pid)) {
            if Instant::now() > deadline {
                // Not a panic: this runs in Drop too. A start after it
                // fails and says why.
                eprintln!("postgres backends {children:?} outlived a SIGKILL by 10 s");
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // What a crashed server leaves: a pid file naming a dead process.
        let _ = std::fs::remove_file(self.data_dir().join("postmaster.pid"));
    }

    /// SIGKILL, then a start on the data directory as it is (crash
    /// recovery replays the WAL that reached it).
    pub fn restart_on_own_data(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    /// A copy of the data directory as it is now (stop or pause the server
    /// first for a consistent one), to start from later with
    /// [`LocalPostgres::start_on_copy`].
    pub fn copy_data(&self) -> anyhow::Result<PathBuf> {
        let copy = self.dir.join(format!("copy-{}", fastrand::u32(..)));
        let status = Command::new("cp")
            .arg("-a")
            .arg(self.data_dir())
            .arg(&copy)
            .status()
            .context("cp -a")?;
        if !status.success() {
            bail!("cp -a {} failed", self.data_dir().display());
        }
        Ok(copy)
    }

    /// SIGKILL, then a start on `copy` (from [`LocalPostgres::copy_data`])
    /// in place of the data directory: an older volume, or a restored backup.
    pub fn start_on_copy(&mut self, copy: &Path) -> anyhow::Result<()> {
        self.kill();
        let data = self.data_dir();
        std::fs::remove_dir_all(&data).with_context(|| format!("remove {}", data.display()))?;
        let status = Command::new("cp").arg("-a").arg(copy).arg(&data).status()?;
        if !status.success() {
            bail!("cp -a {} failed", copy.display());
        }
        // Its pid file names the server that was running when it was taken.
        let _ = std::fs::remove_file(data.join("postmaster.pid"));
        self.spawn()
    }
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn running(pid: u32) -> bool {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.state != 'Z')
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The process's shared server: started once, by the first test that asks;
/// a watchdog stops it and removes its directory when the process is gone
/// (a static is never dropped).
fn shared() -> Result<&'static LocalPostgres, &'static anyhow::Error> {
    static SHARED: OnceLock<anyhow::Result<LocalPostgres>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            // Room for as many tests at once as cargo runs (one per core
            // by default), each with a hundred nodes of a command
            // connection and a listener.
            let tests = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
            let connections = format!("max_connections={}", 250 * tests.min(8));
            let server = LocalPostgres::start_with(&[&connections])?;
            let postmaster = server
                .postmaster()
                .context("the shared server has no postmaster")?;
            Command::new("sh")
                .args([
                    "-c",
                    "while kill -0 \"$1\" 2>/dev/null; do sleep 0.5; done; \
                     kill -QUIT \"$2\" 2>/dev/null; sleep 3; kill -KILL \"$2\" 2>/dev/null; \
                     rm -rf \"$3\"",
                    "leasehold-pg-watchdog",
                ])
                .arg(std::process::id().to_string())
                .arg(postmaster.to_string())
                .arg(&server.dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("the shared server's watchdog")?;
            Ok(server)
        })
        .as_ref()
}

/// A database for one test: in the process's shared server, or the
/// `postgres` database of a server of its own.
pub struct PgDatabase {
    server: Server,
    pub name: String,
}

enum Server {
    Own(LocalPostgres),
    Shared(&'static LocalPostgres),
}

impl PgDatabase {
    /// A new database in the shared server (about a tenth of a second,
    /// where a server of its own is one and a half).
    pub fn in_shared() -> anyhow::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let server = shared().map_err(|e| anyhow::anyhow!("the shared server: {e:#}"))?;
        let name = format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed));
        server.psql(&format!("CREATE DATABASE {name}"))?;
        Ok(Self {
            server: Server::Shared(server),
            name,
        })
    }

    /// The `postgres` database of a server of its own.
    pub fn own(server: LocalPostgres) -> Self {
        Self {
            server: Server::Own(server),
            name: "postgres".into(),
        }
    }

    /// The server, to read from.
    pub fn server(&self) -> &LocalPostgres {
        match &self.server {
            Server::Own(s) => s,
            Server::Shared(s) => s,
        }
    }

    /// The server, to stop, kill or restart: only one of its own.
    pub fn own_server(&mut self) -> &mut LocalPostgres {
        match &mut self.server {
            Server::Own(s) => s,
            Server::Shared(_) => panic!(
                "this test stops, kills or replicates its server, which is shared: \
                 give it one of its own (on_both_stores! {{ async fn name(server: own) ... }})"
            ),
        }
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.server().port,
            self.name
        )
    }

    pub fn port(&self) -> u16 {
        self.server().port
    }

    /// One statement through `psql`, in this database.
    pub fn psql(&self, sql: &str) -> anyhow::Result<String> {
        self.server().psql_in(&self.name, sql)
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        if let Server::Shared(server) = &self.server {
            let _ = server.psql(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}
