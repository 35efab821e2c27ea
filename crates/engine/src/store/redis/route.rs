//! Where the primary is. A `redis://` URL names it once and for all. Behind
//! Sentinel (`redis+sentinel://`) the sentinels name it, and name another
//! after a failover; in a Redis Cluster (`redis+cluster://`) it is the node
//! that serves the one hash slot all of a prefix's keys share. Every call
//! asks the [`Route`] for the current primary's connection; a call that
//! failed marks the answer stale, so the next one looks again.
//!
//! Behind Sentinel a primary counts only while a majority of the configured
//! sentinels names it, asked at most [`SENTINEL_RECHECK`] ago. A process cut
//! off from that majority (the old primary's side of a partition) gets no
//! connection at all, so a leader there fails its renewals and demotes
//! within its ttl, while the majority promotes a replica. The redis crate's
//! own Sentinel client takes the first sentinel's word, which a sentinel in
//! the minority would still give for the old primary.
//!
//! In a Cluster, the node itself refuses writes for slots it no longer
//! serves (MOVED) and, cut off from the majority of primaries, refuses them
//! all (CLUSTERDOWN), so its word is enough.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

use crate::config::{self, CLUSTER_RECHECK, CONNECT_TIMEOUT, SENTINEL_RECHECK, SENTINEL_TIMEOUT};
use crate::store::{ConnectError, StoreError};

/// How the URL says to find the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    Direct,
    Sentinel {
        sentinels: Vec<(String, u16)>,
        master: String,
    },
    Cluster {
        seeds: Vec<(String, u16)>,
    },
}

/// A URL taken apart: the topology, and a plain `redis[s]://` URL carrying
/// the credentials and database, for the connections to the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub topology: Topology,
    pub redis_url: String,
    pub tls: bool,
}

/// What is wrong with a URL's form (its `Display` is the sentence
/// [`ConnectError::Url`] shows).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{0:?} has no scheme")]
    NoScheme(String),
    #[error("unknown scheme {0:?}")]
    UnknownScheme(String),
    #[error("query parameters are not supported in this URL")]
    Query,
    #[error("a Sentinel URL names the master after the hosts: …/MASTER[/db]")]
    NoMaster,
    #[error("a Redis Cluster has only database 0, not {0:?}")]
    ClusterDatabase(String),
    #[error("{0:?}: too many path segments")]
    TooManySegments(String),
    #[error("database {0:?} is not a number")]
    Database(String),
    #[error("{0:?} is not host[:port]")]
    HostPort(String),
}

/// Takes a URL apart (no I/O). Sentinels default to port 26379, cluster
/// nodes to 6379.
pub(crate) fn parse(url: &str) -> Result<Parsed, UrlError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| UrlError::NoScheme(url.to_owned()))?;
    let (tls, kind) = match scheme {
        "redis" | "rediss" => {
            return Ok(Parsed {
                topology: Topology::Direct,
                redis_url: url.to_owned(),
                tls: scheme == "rediss",
            })
        }
        "redis+sentinel" => (false, "sentinel"),
        "rediss+sentinel" => (true, "sentinel"),
        "redis+cluster" => (false, "cluster"),
        "rediss+cluster" => (true, "cluster"),
        other => return Err(UrlError::UnknownScheme(other.to_owned())),
    };
    if rest.contains('?') || rest.contains('#') {
        return Err(UrlError::Query);
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (Some(user), hosts),
        None => (None, authority),
    };
    let default_port = if kind == "sentinel" { 26379 } else { 6379 };
    let mut hosts = hosts
        .split(',')
        .map(|h| host_port(h, default_port))
        .collect::<Result<Vec<_>, _>>()?;
    // A sentinel listed twice would count twice towards a majority.
    let mut seen = std::collections::HashSet::new();
    hosts.retain(|h| seen.insert(h.clone()));
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    let topology = if kind == "sentinel" {
        let master = segments.next().ok_or(UrlError::NoMaster)?;
        Topology::Sentinel {
            sentinels: hosts.clone(),
            master: master.to_owned(),
        }
    } else {
        Topology::Cluster {
            seeds: hosts.clone(),
        }
    };
    let db = segments.next().unwrap_or("0");
    if kind == "cluster" && db != "0" {
        return Err(UrlError::ClusterDatabase(db.to_owned()));
    }
    if segments.next().is_some() {
        return Err(UrlError::TooManySegments(path.to_owned()));
    }
    if db.parse::<u16>().is_err() {
        return Err(UrlError::Database(db.to_owned()));
    }
    let (host, port) = &hosts[0];
    let host = url_host(host);
    let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let plain = if tls { "rediss" } else { "redis" };
    Ok(Parsed {
        topology,
        redis_url: format!("{plain}://{user}{host}:{port}/{db}"),
        tls,
    })
}

/// A host as it goes into a URL: an IPv6 address in brackets.
fn url_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// `host[:port]` or `[v6]:port`.
fn host_port(text: &str, default_port: u16) -> Result<(String, u16), UrlError> {
    let bad = || UrlError::HostPort(text.to_owned());
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        (host, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port {
        None => default_port,
        Some(p) => p.parse().map_err(|_| bad())?,
    };
    Ok((host.to_owned(), port))
}

/// The primary's client and the shared command connection to it.
#[derive(Clone)]
pub(crate) struct Primary {
    pub client: Client,
    pub conn: ConnectionManager,
    /// Which one: the count of primaries found when it was (0 for a fixed
    /// one), so what is learnt of one primary is not taken for another's.
    pub generation: u64,
}

/// What is known of the primary behind Sentinel or in a Cluster.
struct Found {
    addr: (String, u16),
    primary: Primary,
    checked: Instant,
}

enum Finder {
    Sentinel {
        master: String,
        sentinels: Vec<ConnectionManager>,
    },
    Cluster {
        seeds: Vec<(String, u16)>,
        /// The key prefix, a hash tag: its slot is every key's.
        tag: String,
    },
}

/// How a [`super::RedisStore`] reaches its primary. One per store, behind an
/// `Arc`, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Route {
    Fixed(Primary),
    Found(Discovery),
}

/// A primary looked up through Sentinel or a Cluster, and how to look again.
pub(crate) struct Discovery {
    finder: Finder,
    /// Credentials, database, TLS and TCP settings for any primary.
    template: ConnectionInfo,
    ca_pem: Option<Vec<u8>>,
    found: tokio::sync::Mutex<Option<Found>>,
    stale: AtomicBool,
    /// Primaries found so far.
    generation: AtomicU64,
}

/// A client for `template` (TLS checked against `ca_pem` if given).
pub(crate) fn client(
    template: ConnectionInfo,
    ca_pem: Option<&[u8]>,
) -> Result<Client, redis::RedisError> {
    match ca_pem {
        None => Client::open(template),
        Some(pem) => Client::build_with_tls(
            template,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
    }
}

fn at_addr(template: &ConnectionInfo, (host, port): &(String, u16)) -> ConnectionInfo {
    let addr = match template.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
            host: host.clone(),
            port: *port,
            insecure: *insecure,
            tls_params: None,
        },
        _ => ConnectionAddr::Tcp(host.clone(), *port),
    };
    template.clone().set_addr(addr)
}

impl Route {
    pub fn fixed(client: Client) -> Result<Self, ConnectError> {
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config())
            .map_err(|e| ConnectError::Setup(Box::new(e)))?;
        Ok(Self::Fixed(Primary {
            client,
            conn,
            generation: 0,
        }))
    }

    /// A route found through Sentinel; `sentinel_password` authenticates to
    /// the sentinels (the URL's credentials are the primary's).
    pub fn sentinel(
        template: ConnectionInfo,
        ca_pem: Option<&[u8]>,
        sentinels: &[(String, u16)],
        master: &str,
        sentinel_password: Option<&str>,
    ) -> Result<Self, ConnectError> {
        let scheme = match template.addr() {
            ConnectionAddr::TcpTls { .. } => "rediss",
            _ => "redis",
        };
        let mut conns = Vec::new();
        for (host, port) in sentinels {
            let host = url_host(host);
            let mut info = format!("{scheme}://{host}:{port}")
                .into_connection_info()
                .map_err(|e| ConnectError::Url(Box::new(e)))?
                .set_tcp_settings(template.tcp_settings().clone());
            if let Some(p) = sentinel_password {
                let settings = info.redis_settings().clone().set_password(p);
                info = info.set_redis_settings(settings);
            }
            let client = client(info, ca_pem).map_err(|e| ConnectError::Url(Box::new(e)))?;
            conns.push(
                ConnectionManager::new_lazy_with_config(client, manager_config())
                    .map_err(|e| ConnectError::Setup(Box::new(e)))?,
            );
        }
        Ok(Self::found(
            Finder::Sentinel {
                master: master.to_owned(),
                sentinels: conns,
            },
            template,
            ca_pem,
        ))
    }

    /// A route to the Cluster node serving the slot of `tag` (the key
    /// prefix, itself a hash tag).
    pub fn cluster(
        template: ConnectionInfo,
        ca_pem: Option<&[u8]>,
        seeds: &[(String, u16)],
        tag: &str,
    ) -> Self {
        Self::found(
            Finder::Cluster {
                seeds: seeds.to_vec(),
                tag: tag.to_owned(),
            },
            template,
            ca_pem,
        )
    }

    fn found(finder: Finder, template: ConnectionInfo, ca_pem: Option<&[u8]>) -> Self {
        Self::Found(Discovery {
            finder,
            template,
            ca_pem: ca_pem.map(<[u8]>::to_vec),
            found: tokio::sync::Mutex::new(None),
            stale: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        })
    }

    /// The current primary.
    pub async fn primary(&self) -> Result<Primary, StoreError> {
        match self {
            Self::Fixed(primary) => Ok(primary.clone()),
            Self::Found(discovery) => discovery.primary().await,
        }
    }

    /// How many primaries were found so far (0 for a fixed one).
    pub fn primaries_found(&self) -> u64 {
        match self {
            Self::Fixed(_) => 0,
            Self::Found(discovery) => discovery.generation.load(Ordering::SeqCst),
        }
    }

    /// Notes a failed call: the next one looks for the primary again.
    pub fn failed(&self, error: &StoreError) {
        if let Self::Found(discovery) = self {
            if !matches!(error, StoreError::Reply(_) | StoreError::Unconfirmed { .. }) {
                discovery.stale.store(true, Ordering::SeqCst);
            }
        }
    }
}

impl Discovery {
    /// The primary as last found, or looked up again when that is too old
    /// or a call to it failed since.
    async fn primary(&self) -> Result<Primary, StoreError> {
        let mut found = self.found.lock().await;
        let recheck = match self.finder {
            Finder::Sentinel { .. } => SENTINEL_RECHECK,
            Finder::Cluster { .. } => CLUSTER_RECHECK,
        };
        if let Some(f) = found.as_ref() {
            if !self.stale.load(Ordering::SeqCst) && f.checked.elapsed() < recheck {
                return Ok(f.primary.clone());
            }
        }
        // The answer is as old as the question: a lookup that takes a while
        // does not stretch how long it is trusted.
        let asked = Instant::now();
        let known = found.as_ref().map(|f| f.addr.clone());
        let addr = match self
            .finder
            .find(&self.template, self.ca_pem.as_deref(), known.as_ref())
            .await
        {
            Ok(addr) => addr,
            Err(e) => {
                // A Cluster node refuses what it must not take; a primary
                // the sentinels no longer vouch for gets nothing.
                return match (&self.finder, found.as_ref()) {
                    (Finder::Cluster { .. }, Some(f)) => Ok(f.primary.clone()),
                    _ => Err(e),
                };
            }
        };
        // Cleared only by an answer: a lookup that failed, or that the
        // caller gave up on, leaves the next call to look again.
        self.stale.store(false, Ordering::SeqCst);
        if let Some(f) = found.as_mut().filter(|f| f.addr == addr) {
            f.checked = asked;
            return Ok(f.primary.clone());
        }
        tracing::info!(primary = %format!("{}:{}", addr.0, addr.1), "redis primary found");
        let client = client(at_addr(&self.template, &addr), self.ca_pem.as_deref())?;
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config())?;
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let primary = Primary {
            client,
            conn,
            generation,
        };
        *found = Some(Found {
            addr,
            primary: primary.clone(),
            checked: asked,
        });
        Ok(primary)
    }
}

impl Finder {
    async fn find(
        &self,
        template: &ConnectionInfo,
        ca_pem: Option<&[u8]>,
        known: Option<&(String, u16)>,
    ) -> Result<(String, u16), StoreError> {
        match self {
            Finder::Sentinel { master, sentinels } => ask_sentinels(master, sentinels).await,
            Finder::Cluster { seeds, tag } => {
                let mut last = None;
                for seed in known.into_iter().chain(seeds) {
                    match slot_owner(template, ca_pem, seed, tag).await {
                        Ok(addr) => return Ok(addr),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| StoreError::Topology("no cluster node given".into())))
            }
        }
    }
}

/// The primary a majority of `sentinels` names for `master`, asked at once.
async fn ask_sentinels(
    master: &str,
    sentinels: &[ConnectionManager],
) -> Result<(String, u16), StoreError> {
    let mut asks = tokio::task::JoinSet::new();
    for conn in sentinels {
        let mut conn = conn.clone();
        let cmd = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .clone();
        asks.spawn(async move {
            tokio::time::timeout(
                SENTINEL_TIMEOUT,
                cmd.query_async::<Option<(String, u16)>>(&mut conn),
            )
            .await
        });
    }
    // Done as soon as a majority agrees, or can no longer agree; the
    // sentinels not heard from yet are dropped (the set aborts them).
    let majority = sentinels.len() / 2 + 1;
    let mut votes: Vec<((String, u16), usize)> = Vec::new();
    let mut unanswered = 0;
    let mut pending = sentinels.len();
    while let Some(answer) = asks.join_next().await {
        pending -= 1;
        match answer {
            Ok(Ok(Ok(Some(addr)))) => match votes.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, n)) => *n += 1,
                None => votes.push((addr, 1)),
            },
            _ => unanswered += 1,
        }
        let best = votes.iter().map(|(_, n)| *n).max().unwrap_or(0);
        if best >= majority || best + pending < majority {
            break;
        }
    }
    votes
        .iter()
        .find(|(_, n)| *n >= majority)
        .map(|(addr, _)| addr.clone())
        .ok_or_else(|| {
            StoreError::Topology(format!(
                "no majority of the {} sentinels names a primary for {master:?} ({} did not answer, {} not waited for, named: {})",
                sentinels.len(),
                unanswered,
                pending,
                votes
                    .iter()
                    .map(|((h, p), n)| format!("{h}:{p} by {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// The primary serving `tag`'s slot, as the cluster node at `seed` says.
async fn slot_owner(
    template: &ConnectionInfo,
    ca_pem: Option<&[u8]>,
    seed: &(String, u16),
    tag: &str,
) -> Result<(String, u16), StoreError> {
    let client = client(at_addr(template, seed), ca_pem)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(CONNECT_TIMEOUT));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(tag)
        .query_async(&mut conn)
        .await?;
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await?;
    owner_in(&slots, slot, &seed.0).ok_or_else(|| {
        StoreError::Topology(format!(
            "no cluster node serves slot {slot} (of {tag}), as {}:{} sees it",
            seed.0, seed.1
        ))
    })
}

/// The primary of the `CLUSTER SLOTS` range holding `slot`; an empty host
/// means the node that answered (`asked`).
fn owner_in(slots: &Value, slot: i64, asked: &str) -> Option<(String, u16)> {
    let Value::Array(ranges) = slots else {
        return None;
    };
    ranges.iter().find_map(|range| {
        // [start, end, [host, port, ...] of the primary, replicas...]
        let Value::Array(parts) = range else {
            return None;
        };
        let [Value::Int(start), Value::Int(end), Value::Array(node), ..] = &parts[..] else {
            return None;
        };
        if !(*start..=*end).contains(&slot) {
            return None;
        }
        let [host, Value::Int(port), ..] = &node[..] else {
            return None;
        };
        let host = match host {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let port = u16::try_from(*port).ok()?;
        let host = if host.is_empty() {
            asked.to_owned()
        } else {
            host
        };
        Some((host, port))
    })
}

/// A CA file that holds no PEM certificate, and what it should hold.
const NOT_PEM: &str = "the CA certificate is not PEM";
const PEM_BLOCKS: &str = "expected one or more -----BEGIN CERTIFICATE----- blocks";
/// A CA file given for a URL without TLS.
pub(super) const CA_WITHOUT_TLS: &str =
    "a CA certificate was given for a plain redis:// URL; it is used only with rediss://";

impl From<UrlError> for ConnectError {
    fn from(e: UrlError) -> Self {
        Self::Url(Box::new(e))
    }
}

/// Checks that `pem` holds at least one PEM certificate, so a wrong file
/// fails at start instead of as TLS errors later.
pub(super) fn check_ca(pem: &[u8]) -> Result<(), ConnectError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut found = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| ConnectError::Ca(format!("{NOT_PEM} ({e}); {PEM_BLOCKS}").into()))?;
        found += 1;
    }
    if found == 0 {
        return Err(ConnectError::Ca(
            format!("{NOT_PEM} (no certificate in it); {PEM_BLOCKS}").into(),
        ));
    }
    Ok(())
}

/// No response timeout here: every engine call is bounded by its caller, with
/// a limit that fits that call (see [`bounded`]).
pub(super) fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config::CONNECT_TIMEOUT))
        .set_response_timeout(None)
        // Few, quick reconnection attempts per failure: a call should fail
        // fast and be retried by its loop, which knows its own schedule.
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1))
}

pub(super) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(config::TCP_KEEPALIVE)
        .with_interval(config::TCP_KEEPALIVE / 2);
    let settings = redis::io::tcp::TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive);
    // TCP_USER_TIMEOUT exists on Linux only; elsewhere keepalive and the
    // engine's own call bounds retire a dead connection.
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    let settings = settings.set_user_timeout(config::TCP_USER_TIMEOUT);
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_their_sentinels_master_and_database() {
        let p = parse("redis+sentinel://:pw@s1,s2:26380,[::1]:26381/mymaster/2").unwrap();
        assert_eq!(
            p.topology,
            Topology::Sentinel {
                sentinels: vec![
                    ("s1".into(), 26379),
                    ("s2".into(), 26380),
                    ("::1".into(), 26381)
                ],
                master: "mymaster".into()
            }
        );
        assert_eq!(p.redis_url, "redis://:pw@s1:26379/2");
        assert!(!p.tls);
        let p = parse("rediss+sentinel://h/m").unwrap();
        assert!(p.tls);
        assert_eq!(p.redis_url, "rediss://h:26379/0");
        assert_eq!(
            parse("redis+sentinel://h1,h2").unwrap_err(),
            UrlError::NoMaster
        );
        assert_eq!(
            parse("redis+sentinel://h/m/x").unwrap_err(),
            UrlError::Database("x".into())
        );
        assert_eq!(
            parse("redis+sentinel://h:port/m").unwrap_err(),
            UrlError::HostPort("h:port".into())
        );
        assert!(UrlError::NoMaster.to_string().contains("MASTER"));
    }

    #[test]
    fn cluster_urls_name_seeds_and_only_database_0() {
        let p = parse("redis+cluster://u:p@a:7000,b").unwrap();
        assert_eq!(
            p.topology,
            Topology::Cluster {
                seeds: vec![("a".into(), 7000), ("b".into(), 6379)]
            }
        );
        assert_eq!(p.redis_url, "redis://u:p@a:7000/0");
        assert_eq!(
            parse("redis+cluster://a/3").unwrap_err(),
            UrlError::ClusterDatabase("3".into())
        );
        assert_eq!(
            parse("redis+cluster://a/0?x=1").unwrap_err(),
            UrlError::Query
        );
        assert_eq!(
            parse("http://a").unwrap_err(),
            UrlError::UnknownScheme("http".into())
        );
        assert_eq!(parse("redis://a:1/3").unwrap().topology, Topology::Direct);
    }

    #[test]
    fn the_slot_owner_is_the_primary_of_its_range() {
        let node = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let slots = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
        ]);
        assert_eq!(
            owner_in(&slots, 12, "seed"),
            Some(("10.0.0.1".into(), 7000))
        );
        assert_eq!(owner_in(&slots, 9000, "seed"), Some(("seed".into(), 7001)));
        assert_eq!(owner_in(&Value::Array(vec![]), 1, "seed"), None);
    }
}
