//! A Sentinel deployment started by the test: a primary, replicas (each
//! linked through a proxy the test can stall or cut), and three sentinels
//! with a quorum of two. Every process is a real `redis-server`.

use std::time::{Duration, Instant};

use leasehold_engine::Group;

use crate::proxy::Proxy;
use crate::{LocalRedis, RedisServer};

pub const MASTER: &str = "lh-primary";

pub struct Deployment {
    /// Every data server; `servers[0]` is the first primary.
    pub servers: Vec<RedisServer>,
    /// `links[i]` carries replication from whichever primary `servers[i]`
    /// followed first (the first primary): `None` for the primary.
    pub links: Vec<Option<Proxy>>,
    pub sentinels: Vec<LocalRedis>,
    pub down_after_ms: u64,
}

/// Waits until `check` holds, or panics with `what` after `limit`; checks
/// every 50 ms, since each check starts `redis-cli` processes.
pub async fn slowly(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Deployment {
    /// A primary with `replicas` replicas and three sentinels that find a
    /// silent primary down after `down_after_ms`; returns once every
    /// sentinel knows every replica and the other sentinels.
    pub async fn start(replicas: usize, down_after_ms: u64) -> Self {
        // Redis's own replication settings: a replica's first full sync
        // waits for `repl-diskless-sync-delay` (5 s) for others to join.
        let primary = RedisServer::start();
        let mut servers = vec![primary];
        let mut links = vec![None];
        for _ in 0..replicas {
            let replica = RedisServer::start();
            let link = Proxy::start(servers[0].port).await;
            replica.cli(&["REPLICAOF", "127.0.0.1", &link.port.to_string()]);
            servers.push(replica);
            links.push(Some(link));
        }
        // In sync as the primary sees it: only then does a lease write
        // wait for them.
        slowly(Duration::from_secs(30), "the replicas are in sync", || {
            servers[0]
                .cli(&["INFO", "replication"])
                .matches("state=online")
                .count()
                == replicas
                && servers[1..].iter().all(|r| {
                    r.cli(&["INFO", "replication"])
                        .contains("master_link_status:up")
                })
        })
        .await;
        let sentinels: Vec<LocalRedis> = (0..3)
            .map(|_| {
                LocalRedis::start_sentinel(servers[0].port, MASTER, 2, down_after_ms)
                    .expect("a sentinel")
            })
            .collect();
        let ready = format!("slaves={replicas},sentinels=3");
        slowly(
            Duration::from_secs(30),
            "the sentinels know the replicas and each other",
            || {
                sentinels.iter().all(|s| {
                    s.cli(&["INFO", "sentinel"])
                        .map(|i| i.contains(&ready))
                        .unwrap_or(false)
                })
            },
        )
        .await;
        Self {
            servers,
            links,
            sentinels,
            down_after_ms,
        }
    }

    /// The URL a node uses: every sentinel, then the master's name.
    pub fn url(&self) -> String {
        self.url_via(&self.sentinels.iter().map(|s| s.port).collect::<Vec<_>>())
    }

    /// The URL with the sentinels at these ports (proxies in front of them).
    pub fn url_via(&self, ports: &[u16]) -> String {
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The primary's port as each sentinel names it (0: no answer).
    pub fn named(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .map(|s| {
                s.cli(&["SENTINEL", "get-master-addr-by-name", MASTER])
                    .ok()
                    .and_then(|out| out.lines().nth(1).and_then(|p| p.trim().parse().ok()))
                    .unwrap_or(0)
            })
            .collect()
    }

    /// The index of the server a majority of sentinels names.
    pub fn primary(&self) -> Option<usize> {
        let named = self.named();
        self.servers
            .iter()
            .position(|s| named.iter().filter(|p| **p == s.port).count() >= 2)
    }

    /// Waits until a majority of sentinels names a server other than
    /// `old`; returns its index.
    pub async fn failed_over_from(&self, old: usize, limit: Duration) -> usize {
        let mut new = None;
        slowly(limit, "the sentinels name a new primary", || {
            new = self.primary().filter(|p| *p != old);
            new.is_some()
        })
        .await;
        new.expect("checked")
    }
}

/// A stand-in for a sentinel on the minority side of a partition: it
/// answers every `SENTINEL get-master-addr-by-name` with the address it was
/// given, as a real sentinel that cannot hear of a failover goes on doing.
/// (Cutting a real sentinel off from the others here would need network
/// namespaces: sentinels also tell each other of a new primary directly.)
/// It speaks just enough RESP for the redis crate's connection.
pub struct StaleSentinel {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl StaleSentinel {
    pub async fn start(primary_port: u16) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut read = BufReader::new(read);
                    let mut line = String::new();
                    loop {
                        // A command: *N, then N bulk strings.
                        line.clear();
                        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let Some(n) = line
                            .trim()
                            .strip_prefix('*')
                            .and_then(|n| n.parse::<usize>().ok())
                        else {
                            return;
                        };
                        let mut args = Vec::new();
                        for _ in 0..n {
                            line.clear();
                            read.read_line(&mut line).await.ok();
                            let len: usize =
                                line.trim().trim_start_matches('$').parse().unwrap_or(0);
                            let mut buf = vec![0; len + 2];
                            if read.read_exact(&mut buf).await.is_err() {
                                return;
                            }
                            buf.truncate(len);
                            args.push(String::from_utf8_lossy(&buf).to_lowercase());
                        }
                        let reply = match args.first().map(String::as_str) {
                            Some("sentinel") => {
                                let port = primary_port.to_string();
                                format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
                            }
                            Some("ping") => "+PONG\r\n".to_owned(),
                            _ => "+OK\r\n".to_owned(),
                        };
                        if write.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { port, task }
    }
}

impl Drop for StaleSentinel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The referee of a failover test: what it saw while sampling every
/// group's own view (two leaders at once, a term going backwards).
#[derive(Debug, Default)]
pub struct Tally {
    samples: u64,
    /// Instants at which two groups said they lead.
    two_leaders: u64,
    /// The highest term any group led under.
    pub highest: u64,
    /// A leader under a term below one led under earlier.
    backwards: u64,
}

impl Tally {
    pub fn sample(&mut self, groups: &[&Group]) {
        self.samples += 1;
        let terms: Vec<u64> = groups.iter().filter_map(|g| g.leader_term()).collect();
        if terms.len() > 1 {
            self.two_leaders += 1;
        }
        for term in terms {
            if term < self.highest {
                self.backwards += 1;
            }
            self.highest = self.highest.max(term);
        }
    }

    /// Samples every 5 ms until `done`, or panics with `what` after `limit`.
    pub async fn until(
        &mut self,
        groups: &[&Group],
        limit: Duration,
        what: &str,
        mut done: impl FnMut() -> bool,
    ) -> Duration {
        let start = Instant::now();
        loop {
            self.sample(groups);
            if done() {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "not within {limit:?}: {what}; {self:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn assert_clean(&self) {
        assert!(self.samples > 100, "{self:?}");
        assert_eq!(self.two_leaders, 0, "two leaders at once: {self:?}");
        assert_eq!(self.backwards, 0, "a term went backwards: {self:?}");
    }
}

/// A leader that must lead on through a change of the store's replicas:
/// every sample sees its term or, for less than `limit`, no leader at all
/// (a renewal that a replica just back in sync confirms late demotes it
/// for a moment, and its next claim takes the same lease back).
#[derive(Debug)]
pub struct Steady {
    term: u64,
    limit: Duration,
    gap_since: Option<Instant>,
    /// The longest moment without a leader seen.
    pub longest_gap: Duration,
}

impl Steady {
    pub fn new(term: u64, limit: Duration) -> Self {
        Self {
            term,
            limit,
            gap_since: None,
            longest_gap: Duration::ZERO,
        }
    }

    /// One sample of every group: `what` names the moment in a failure.
    pub fn sample(&mut self, groups: &[&Group], what: &str) {
        match groups.iter().find_map(|g| g.leader_term()) {
            Some(term) => {
                assert_eq!(term, self.term, "{what}: a leader under another term");
                if let Some(since) = self.gap_since.take() {
                    self.longest_gap = self.longest_gap.max(since.elapsed());
                }
            }
            None => {
                let since = *self.gap_since.get_or_insert_with(Instant::now);
                assert!(
                    since.elapsed() < self.limit,
                    "{what}: no leader for {:?}",
                    since.elapsed()
                );
            }
        }
    }
}
