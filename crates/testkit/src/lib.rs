//! leasehold's test fixtures, apart from the product (`publish = false`;
//! no package but the tests and the bench depends on it): real
//! `redis-server` processes on free ports that a test can kill, pause
//! (SIGSTOP/SIGCONT) and restart on their own data ([`redis`], and
//! [`RedisServer`] for a test), Sentinel deployments ([`sentinel`]), a TCP
//! proxy that stalls or cuts connections ([`proxy`]), agent processes
//! ([`agent`]), an HTTP and event-stream client ([`http`]), a fenced sink
//! that sees a term handed out twice ([`fenced`]), throwaway PostgreSQL
//! servers ([`postgres`]), the throwaway
//! Kubernetes API server (feature `kube`: [`kube`], [`kube_api`]), and
//! small waiting helpers with explicit bounds.

pub mod agent;
pub mod cluster;
pub mod cpu_quota;
pub mod fenced;
pub mod http;
#[cfg(feature = "kube")]
pub mod kube;
#[cfg(feature = "kube")]
pub mod kube_api;
pub mod part;
pub mod pgbouncer;
pub mod postgres;
pub mod procfs;
pub mod proxy;
pub mod redis;
pub mod sentinel;
pub mod store;

pub use nix::sys::signal::Signal;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_engine::{ElectionConfig, Event, Group, Node, NodeConfig, Role, Store};
use tokio::sync::broadcast;

pub use part::{lacks, skipped, Part};
pub use redis::LocalRedis;

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    redis::free_port().expect("a free port on loopback")
}

/// The project's throwaway `redis-server` (the one the demo starts), as an
/// established store: tests start where a deployment runs, past the first
/// ttl after the store's birth, when no lease is handed out (see
/// claim.lua), in term epoch 0, so terms count 1, 2, 3... (see the
/// engine's `term.rs`). A restart loses this, as a real one would; the
/// tests of the birth restart Redis.
pub struct RedisServer(LocalRedis);

impl std::ops::Deref for RedisServer {
    type Target = LocalRedis;
    fn deref(&self) -> &LocalRedis {
        &self.0
    }
}

impl std::ops::DerefMut for RedisServer {
    fn deref_mut(&mut self) -> &mut LocalRedis {
        &mut self.0
    }
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    pub fn start_with_password(password: &str) -> Self {
        Self::start_with(Some(password))
    }

    fn start_with(password: Option<&str>) -> Self {
        let server = Self(LocalRedis::start_with_password(password).expect("redis-server"));
        server.cli(&["MSET", "lh:born", "0", "lh:epoch", "0"]);
        server
    }

    pub fn store(&self) -> Store {
        Store::connect(&self.url(), "lh").expect("store")
    }

    /// SIGSTOP: connections stay open, nothing answers. Panics if the
    /// server is not running, so a fault test cannot pass without its fault.
    pub fn pause(&self) {
        self.0.pause().expect("SIGSTOP to redis-server");
    }

    pub fn resume(&self) {
        self.0.resume().expect("SIGCONT to redis-server");
    }

    /// Kill and start again on the same port, empty.
    pub fn restart(&mut self) {
        self.0.restart().expect("redis-server restarts");
    }

    /// SIGKILL and start again on the same port with the snapshot its
    /// directory holds (`SAVE` one first), as a Redis pod restarted on an
    /// older volume would.
    pub fn restart_on_own_data(&mut self) {
        self.0
            .restart_on_own_data(&[])
            .expect("redis-server restarts on its own data");
    }

    /// [`RedisServer::restart_on_own_data`] with more arguments for this
    /// start (`--replicaof HOST PORT`, say).
    pub fn restart_on_own_data_with(&mut self, args: &[&str]) {
        self.0
            .restart_on_own_data(args)
            .expect("redis-server restarts on its own data");
    }

    /// SIGKILL; the process is gone until [`RedisServer::start_on_own_data`].
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Starts a killed server again on its own directory.
    pub fn start_on_own_data(&mut self) {
        self.0
            .start_on_own_data(&[])
            .expect("redis-server starts on its own data");
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .cli(&["KEYS", "*"])
            .lines()
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys
    }

    /// A plain synchronous command, for inspecting state from the test.
    pub fn cli(&self, args: &[&str]) -> String {
        self.0.cli(args).expect("redis-cli")
    }
}

/// Anything a node can be started on: [`RedisServer`], or either store's
/// `store::StoreServer`.
pub trait StoreFixture {
    /// A fresh handle on the store, under the prefix `lh`.
    fn store(&self) -> Store;

    /// The store's URL.
    fn url(&self) -> String;
}

impl StoreFixture for RedisServer {
    fn store(&self) -> Store {
        RedisServer::store(self)
    }

    fn url(&self) -> String {
        self.0.url()
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

pub async fn node(server: &impl StoreFixture, id: &str) -> Node {
    Node::start(server.store(), id, node_config())
        .await
        .expect("node")
}

/// The Unix clock now in nanoseconds: the time a command's shell `date
/// +%s%N` writes, for comparing with it.
pub fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
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

/// Like [`eventually`], for a check that has to await (a request to an
/// agent or an API server): the pause between checks doubles from 2 ms to
/// 100 ms, so a slow condition does not turn into a request flood.
pub async fn eventually_async<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(feature = "kube")]
/// Controller flags for a test: this store under prefix `prefix`, replica
/// timings of 1000/300/100 ms, no resync to speak of, probes on `listen`.
pub fn controller_args(
    redis: &impl StoreFixture,
    prefix: &str,
    namespace: &str,
    listen: std::net::SocketAddr,
) -> leasehold_kube::run::ControllerArgs {
    leasehold_kube::run::ControllerArgs {
        store: leasehold_daemon::store_args::StoreArgs {
            store_url: Some(redis.url()),
            store_password_file: None,
            store_sentinel_password_file: None,
            store_ca_file: None,
            prefix: prefix.into(),
            store_replica_acks: Some(leasehold_engine::ReplicaAcks::All),
            store_replica_wait_ms: Some(250),
        },
        cluster: None,
        pod_name: "controller-0".into(),
        namespace: namespace.into(),
        listen,
        resync_seconds: 3_600,
        watch_namespace: None,
        leader_endpoints: false,
        replica_ttl_ms: 1000,
        replica_renew_interval_ms: 300,
        replica_retry_interval_ms: 100,
    }
}

/// One HTTP request with the [`http`] client; `(0, "")` when nothing
/// answers within a second.
pub async fn http_status(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    http::request(addr, method, path, Duration::from_secs(1))
        .await
        .unwrap_or((0, String::new()))
}

/// A free loopback address to listen on.
pub fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
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

/// The helm binary: `LEASEHOLD_HELM`, or `helm` on the PATH.
pub fn helm() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("LEASEHOLD_HELM") {
        return Some(std::path::PathBuf::from(path));
    }
    on_path("helm")
}

/// The helm binary, or `None` when the helm part is left out on purpose
/// (a failure otherwise: [`lacks`]).
pub fn helm_or_skip(test: &str) -> Option<std::path::PathBuf> {
    let helm = helm();
    if helm.is_none() {
        lacks(
            test,
            Part::Helm,
            "no helm (scripts/test fetches a pinned one; or set LEASEHOLD_HELM, or put helm in PATH)",
        );
    }
    helm
}

/// Sends `signal` to `pid`; whether it was delivered.
pub fn send_signal(pid: u32, signal: Signal) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).is_ok()
}

/// `openssl ARGS` in `dir`, for the throwaway certificates of the TLS and
/// API-server tests.
pub fn openssl(dir: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    anyhow::ensure!(ok, "openssl {args:?} failed (is openssl installed?)");
    Ok(())
}

/// A CA made for a test (`ca.pem`, `ca.key`) and a server certificate it
/// signed for the name `localhost` only (`srv.pem`, `srv.key`), in `dir`,
/// with the `openssl` command.
pub fn make_certificates(dir: &std::path::Path) -> anyhow::Result<()> {
    #[rustfmt::skip]
    openssl(dir, &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
        "-out", "ca.pem", "-days", "2", "-subj", "/CN=leasehold-test-ca"])?;
    #[rustfmt::skip]
    openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key",
        "-out", "srv.csr", "-subj", "/CN=localhost"])?;
    std::fs::write(dir.join("ext"), "subjectAltName=DNS:localhost\n")?;
    #[rustfmt::skip]
    openssl(dir, &["x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext"])?;
    Ok(())
}

/// `name` on the PATH.
pub fn on_path(name: &str) -> Option<std::path::PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether the tests run as root.
pub fn root() -> bool {
    nix::unistd::geteuid().is_root()
}
