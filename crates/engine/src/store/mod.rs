//! The one module that talks to Redis.
//!
//! It owns the connections, the key names and the Lua scripts, and turns every
//! script reply into a typed outcome. Every read-compare-write is one script,
//! and every expiry is computed from the Redis server's clock inside it, so
//! machines whose clocks disagree still agree on who holds what.
//!
//! Calls are never retried here and never wait forever: the caller bounds each
//! one with [`bounded`] (the engine's loops know how long they can afford to
//! wait) and retries on its own schedule. `ConnectionManager` reconnects in
//! the background, so a retried call finds a fresh connection.

mod control;
mod error;
mod keys;
pub(crate) mod messaging;
pub mod postgres;
mod replication;
mod reply;
mod route;
pub(crate) mod safety;
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, ProtocolVersion, Value};

pub use error::{bounded, StoreError};
pub(crate) use keys::{GroupKeys, Keys};
pub use replication::ReplicaAcks;
use replication::Replication;
pub(crate) use reply::holder_id;
use reply::{array, as_int, as_string, group_config, int_at, split_lease, string_at, uint_at};
pub use route::ConnectError;
use route::{check_ca, manager_config, tcp_settings};
use route::{Route, Topology};

use crate::config::{self, ElectionConfig};

/// Outcome of a claim attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This node holds the lease now. `fresh` is false when it kept a lease it
    /// already held (re-claim after a fail-safe demotion).
    Won {
        term: u64,
        fresh: bool,
        config: Option<ElectionConfig>,
    },
    /// Another node holds it for `pttl_ms` more (Redis clock). While the
    /// store is in its first ttl (see claim.lua) nobody holds it, `holder`
    /// is empty and `pttl_ms` is the time until leases are handed out.
    Lost {
        term: u64,
        pttl_ms: i64,
        holder: String,
        config: Option<ElectionConfig>,
    },
}

/// Outcome of a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Renewed; `config` is the group's timings from Redis, if set; `term`
    /// is the lease's term afterwards (higher than before if the counter
    /// was restored above it).
    Renewed {
        config: Option<ElectionConfig>,
        term: u64,
    },
    /// The lease expired before the renewal reached Redis.
    Gone,
    /// Someone else holds it now (possibly this node id's newer incarnation).
    Replaced { holder: String, incarnation: String },
}

/// Outcome of a node heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heartbeat {
    Extended,
    /// The node's lease ran out (swept or not): it must register again.
    Expired,
    /// Another incarnation registered under this node id.
    Displaced {
        incarnation: String,
    },
}

/// Outcome of one sweep pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sweep {
    pub swept: Vec<String>,
    pub now_ms: u64,
    /// Earliest lease expiry among the remaining nodes, if any.
    pub next_expiry_ms: Option<u64>,
}

/// A group's state in Redis, read in one script so the parts agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    pub holder: Option<String>,
    pub term: u64,
    /// Remaining lease time in ms, when held.
    pub lease_pttl_ms: Option<u64>,
    /// Node ids with live candidacy and their candidacy expiry (ms, Redis clock).
    pub members: Vec<(String, u64)>,
    pub now_ms: u64,
}

/// A handle on Redis: cheap to clone, shared by every loop of a process.
#[derive(Clone)]
pub struct Store {
    route: Arc<Route>,
    keys: Arc<Keys>,
    replication: Arc<Replication>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("prefix", &self.keys.prefix())
            .finish()
    }
}

/// How to reach Redis beyond its URL. All optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnectOptions<'a> {
    /// The password of the Redis server (wins over one in the URL).
    pub password: Option<&'a str>,
    /// PEM of the CA that signed the server's (and the sentinels')
    /// certificate, for a `rediss` URL.
    pub ca_pem: Option<&'a [u8]>,
    /// The sentinels' own password, for a Sentinel URL whose sentinels
    /// require one.
    pub sentinel_password: Option<&'a str>,
}

impl Store {
    /// Prepares a connection to `url` (`redis://`, or `rediss://` for TLS
    /// checked against the system's root certificates, or the file named by
    /// `SSL_CERT_FILE`; a password in the URL is used for AUTH). The
    /// connection is made lazily: a Redis that is down at start is normal
    /// weather, and the first calls fail and are retried like any other.
    pub fn connect(url: &str, prefix: &str) -> Result<Self, ConnectError> {
        Self::connect_with_options(url, prefix, ConnectOptions::default())
    }

    /// Like [`Store::connect`], for a `rediss://` URL whose server certificate
    /// is signed by the CA in `ca_pem` (PEM) rather than a public one.
    pub fn connect_with_ca(url: &str, prefix: &str, ca_pem: &[u8]) -> Result<Self, ConnectError> {
        let options = ConnectOptions {
            ca_pem: Some(ca_pem),
            ..ConnectOptions::default()
        };
        Self::connect_with_options(url, prefix, options)
    }

    /// Like [`Store::connect`], with the password given apart from the URL
    /// (read from a mounted secret file, say) and, for a private CA, its
    /// certificate. A password here wins over one in the URL.
    pub fn connect_with(
        url: &str,
        prefix: &str,
        password: Option<&str>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, ConnectError> {
        let options = ConnectOptions {
            password,
            ca_pem,
            ..ConnectOptions::default()
        };
        Self::connect_with_options(url, prefix, options)
    }

    /// Like [`Store::connect`], for any URL form: `redis://` and `rediss://`
    /// name the server; `redis+sentinel://` names sentinels that name the
    /// primary; `redis+cluster://` names nodes of a Redis Cluster, in which
    /// all keys go to one slot: the prefix becomes a hash tag, `{PREFIX}`.
    pub fn connect_with_options(
        url: &str,
        prefix: &str,
        options: ConnectOptions<'_>,
    ) -> Result<Self, ConnectError> {
        config::validate_prefix(prefix)?;
        // rustls needs a process-wide crypto provider; a second install is a no-op error.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let parsed = route::parse(url)?;
        let mut info = parsed
            .redis_url
            .as_str()
            .into_connection_info()
            .map_err(ConnectError::Url)?
            .set_tcp_settings(tcp_settings());
        if let Some(password) = options.password {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        if let Some(pem) = options.ca_pem {
            if !parsed.tls {
                return Err(ConnectError::CaWithoutTls);
            }
            check_ca(pem)?;
        }
        let (route, key_prefix) = match &parsed.topology {
            Topology::Direct => {
                let client = route::client(info, options.ca_pem).map_err(ConnectError::Url)?;
                (Route::fixed(client)?, prefix.to_owned())
            }
            Topology::Sentinel { sentinels, master } => (
                Route::sentinel(
                    info,
                    options.ca_pem,
                    sentinels,
                    master,
                    options.sentinel_password,
                )?,
                prefix.to_owned(),
            ),
            Topology::Cluster { seeds } => {
                let tag = format!("{{{prefix}}}");
                (Route::cluster(info, options.ca_pem, seeds, &tag), tag)
            }
        };
        Ok(Self {
            route: Arc::new(route),
            keys: Arc::new(Keys::new(&key_prefix)),
            replication: Arc::default(),
        })
    }

    /// How many replicas a claim or renewal must reach before it counts
    /// (default [`ReplicaAcks::All`]), and how long one `WAIT` for them may
    /// block (default [`config::REPLICA_WAIT`]).
    pub fn with_replica_acks(mut self, acks: ReplicaAcks, wait: Duration) -> Self {
        self.replication = Arc::new(Replication::new(acks, wait));
        self
    }

    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    /// A separate RESP3 connection whose pub/sub messages go to `sink`; it
    /// resubscribes by itself after a reconnect. Blocking and push traffic
    /// never share the command connection.
    pub(crate) async fn subscriber(
        &self,
        sink: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
    ) -> Result<ConnectionManager, StoreError> {
        let primary = self.route.primary().await?;
        let info = primary.client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let config = manager_config()
            .set_push_sender(sink)
            .set_automatic_resubscription();
        Ok(ConnectionManager::new_lazy_with_config(client, config)?)
    }

    /// The Redis server's clock, in ms since the epoch.
    pub async fn time_ms(&self) -> Result<u64, StoreError> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(secs * 1000 + micros / 1000)
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(())
    }

    /// PUBLISH on a Redis pub/sub channel (not a topic: see [`Store::publish`]).
    pub(crate) async fn publish_raw(&self, channel: &str, payload: &str) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(channel)
            .arg(payload)
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(())
    }

    /// The shared command connection to the current primary.
    async fn conn(&self) -> Result<ConnectionManager, StoreError> {
        Ok(self.route.primary().await?.conn)
    }

    /// How many times the store found a new primary behind Sentinel or in
    /// a Cluster (always 0 for a plain URL): a change is the moment to
    /// look at the new primary's settings.
    pub fn primaries_found(&self) -> u64 {
        self.route.primaries_found()
    }

    /// The client of the current primary, for connections of their own.
    pub(crate) async fn client(&self) -> Result<redis::Client, StoreError> {
        Ok(self.route.primary().await?.client)
    }

    /// Passes `result` on; a failure makes the route look for the primary
    /// again before the next call (a failover may be under way).
    fn noted<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &result {
            self.route.failed(e);
        }
        result
    }

    async fn run(&self, invocation: &mut redis::ScriptInvocation<'_>) -> Result<Value, StoreError> {
        let mut conn = self.conn().await?;
        self.noted(invocation.invoke_async(&mut conn).await.map_err(Into::into))
    }

    /// A claim or renewal (`call`, an invocation of `script`) with the
    /// `WAIT` for the replicas in the same request (see [`ReplicaAcks`]);
    /// the caller checks the confirmation when the write took a lease.
    async fn write_lease(
        &self,
        write: replication::Write,
        script: &redis::Script,
        call: &redis::ScriptInvocation<'_>,
    ) -> Result<(Value, replication::Confirmation), StoreError> {
        let mut primary = self.route.primary().await?;
        let result = self
            .replication
            .write(&mut primary.conn, primary.generation, write, script, call)
            .await;
        self.noted(result)
    }

    // ---- election ----

    /// Claims `group`'s lease (claim.lua). `confirmed` is the term of a
    /// lease this incarnation held as leader and may still hold in Redis (a
    /// fail-safe demotion): finding it standing, the claim needs only a
    /// renewal's confirmation.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim(
        &self,
        group: &GroupKeys,
        id: &str,
        incarnation: &str,
        ttl_ms: u64,
        seen_term: u64,
        candidacy_ms: u64,
        confirmed: Option<u64>,
    ) -> Result<Claim, StoreError> {
        let mut call = scripts::CLAIM.prepare_invoke();
        call.key(&group.lease)
            .key(&group.term)
            .key(&group.members)
            .key(&group.config)
            .key(self.keys.born())
            .key(self.keys.node(id))
            .key(self.keys.history())
            .key(self.keys.epoch())
            .arg(id)
            .arg(incarnation)
            .arg(ttl_ms)
            .arg(seen_term)
            .arg(candidacy_ms);
        // Expecting its own confirmed lease, a claim waits as a renewal does.
        let expected = match confirmed {
            Some(_) => replication::Write::Renewal,
            None => replication::Write::Claim,
        };
        let (reply, confirmation) = self.write_lease(expected, &scripts::CLAIM, &call).await?;
        let items = array(reply)?;
        match int_at(&items, 0)? {
            1 => {
                // Leading only once the replicas have the lease too: a new
                // term as many as a new term needs; a lease kept that was
                // confirmed before (`confirmed`: still standing after a
                // fail-safe demotion) as many as a renewal. A lease kept
                // that was never confirmed (its claim went unconfirmed) is
                // a new term still.
                let term = uint_at(&items, 1)?;
                let fresh = int_at(&items, 2)? == 1;
                self.noted(if !fresh && confirmed == Some(term) {
                    confirmation.check_kept()
                } else {
                    confirmation.check()
                })?;
                Ok(Claim::Won {
                    term,
                    fresh,
                    config: group_config(items.get(3)),
                })
            }
            _ => Ok(Claim::Lost {
                term: uint_at(&items, 1)?,
                pttl_ms: int_at(&items, 2)?,
                holder: string_at(&items, 3)?,
                config: group_config(items.get(4)),
            }),
        }
    }

    pub(crate) async fn renew(
        &self,
        group: &GroupKeys,
        id: &str,
        incarnation: &str,
        term: u64,
        ttl_ms: u64,
        candidacy_ms: u64,
    ) -> Result<Renewal, StoreError> {
        let mut call = scripts::RENEW.prepare_invoke();
        call.key(&group.lease)
            .key(&group.members)
            .key(&group.config)
            .key(&group.term)
            .key(self.keys.epoch())
            .arg(id)
            .arg(incarnation)
            .arg(term)
            .arg(ttl_ms)
            .arg(candidacy_ms);
        let (reply, confirmation) = self
            .write_lease(replication::Write::Renewal, &scripts::RENEW, &call)
            .await?;
        let items = array(reply)?;
        Ok(match int_at(&items, 0)? {
            1 => {
                // A lease that moved to a new term (renew.lua) is confirmed
                // as a new term is.
                let renewed = uint_at(&items, 2)?;
                self.noted(if renewed == term {
                    confirmation.check_kept()
                } else {
                    confirmation.check()
                })?;
                Renewal::Renewed {
                    config: group_config(items.get(1)),
                    term: renewed,
                }
            }
            0 => Renewal::Gone,
            _ => {
                let value = string_at(&items, 1)?;
                let (holder, incarnation, _) = split_lease(&value);
                Renewal::Replaced {
                    holder: holder.to_owned(),
                    incarnation: incarnation.to_owned(),
                }
            }
        })
    }

    /// Compare-and-delete of the lease this incarnation holds under `term`
    /// (`None`: it holds none, only withdraw); `withdraw` also removes the node
    /// from the members.
    pub(crate) async fn release(
        &self,
        group: &GroupKeys,
        id: &str,
        incarnation: &str,
        term: Option<u64>,
        withdraw: bool,
    ) -> Result<bool, StoreError> {
        // Term 0 is never issued, so it matches no lease.
        let term = term.unwrap_or(0);
        let reply = self
            .run(
                scripts::RELEASE
                    .key(&group.lease)
                    .key(&group.members)
                    .arg(id)
                    .arg(incarnation)
                    .arg(term)
                    .arg(&group.released)
                    .arg(if withdraw { "1" } else { "0" }),
            )
            .await?;
        Ok(as_int(&reply)? == 1)
    }

    /// Holder, term, lease time left and live members of a group.
    pub async fn group_state(&self, group: &str) -> Result<GroupState, StoreError> {
        let keys = self.keys.group(group);
        let reply = self
            .run(
                scripts::GROUP_STATE
                    .key(&keys.lease)
                    .key(&keys.term)
                    .key(&keys.members),
            )
            .await?;
        let items = array(reply)?;
        let holder = match items.first() {
            Some(Value::BulkString(b)) => Some(holder_id(&String::from_utf8_lossy(b)).to_owned()),
            _ => None,
        };
        let pttl = int_at(&items, 2)?;
        let flat = match items.get(4) {
            Some(Value::Array(v)) => v.clone(),
            _ => Vec::new(),
        };
        let mut members = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            members.push((string_at(pair, 0)?, uint_at(pair, 1)?));
        }
        Ok(GroupState {
            holder,
            term: uint_at(&items, 1)?,
            lease_pttl_ms: (pttl >= 0).then_some(pttl as u64),
            members,
            now_ms: uint_at(&items, 3)?,
        })
    }

    // ---- nodes ----

    /// Registers a node incarnation; returns the previous incarnation of the
    /// same id, if another one was registered. A `recovery` (the node found
    /// its lease expired) restores `subscriptions` and marks the point in the
    /// inbox after which messages are new.
    pub(crate) async fn register(
        &self,
        id: &str,
        incarnation: &str,
        lease_ms: u64,
        recovery: bool,
        subscriptions: &[String],
        metadata: &[(String, String)],
    ) -> Result<Option<String>, StoreError> {
        let mut invocation = scripts::REGISTER.key(self.keys.nodes());
        invocation
            .key(self.keys.node(id))
            .key(self.keys.inbox(id))
            .arg(id)
            .arg(incarnation)
            .arg(lease_ms)
            .arg(if recovery { "1" } else { "0" })
            .arg(subscriptions.len());
        for sub in subscriptions {
            invocation.arg(sub);
        }
        for (field, value) in metadata {
            invocation.arg(field).arg(value);
        }
        let items = array(self.run(&mut invocation).await?)?;
        let previous = string_at(&items, 1)?;
        Ok((!previous.is_empty() && previous != incarnation).then_some(previous))
    }

    pub(crate) async fn heartbeat(
        &self,
        id: &str,
        incarnation: &str,
        lease_ms: u64,
    ) -> Result<Heartbeat, StoreError> {
        let reply = self
            .run(
                scripts::HEARTBEAT
                    .key(self.keys.nodes())
                    .key(self.keys.node(id))
                    .arg(id)
                    .arg(incarnation)
                    .arg(lease_ms),
            )
            .await?;
        let items = array(reply)?;
        Ok(match int_at(&items, 0)? {
            1 => Heartbeat::Extended,
            0 => Heartbeat::Expired,
            _ => Heartbeat::Displaced {
                incarnation: string_at(&items, 1)?,
            },
        })
    }

    /// Writes one metadata field of a node (e.g. its groups).
    /// Sets a field of `id`'s registration while `incarnation` owns it;
    /// returns whether it was written (a swept node's hash is never
    /// recreated by it).
    pub(crate) async fn set_node_field(
        &self,
        id: &str,
        incarnation: &str,
        field: &str,
        value: &str,
    ) -> Result<bool, StoreError> {
        let reply = self
            .run(
                scripts::SET_FIELD
                    .key(self.keys.node(id))
                    .arg(incarnation)
                    .arg(field)
                    .arg(value),
            )
            .await?;
        Ok(as_int(&reply)? == 1)
    }

    pub(crate) async fn sweep(&self, batch: usize) -> Result<Sweep, StoreError> {
        let reply = self
            .run(
                scripts::SWEEP
                    .key(self.keys.nodes())
                    .arg(self.keys.prefix())
                    .arg(batch),
            )
            .await?;
        let items = array(reply)?;
        let swept = match items.first() {
            Some(Value::Array(ids)) => ids.iter().map(as_string).collect::<Result<Vec<_>, _>>()?,
            other => return Err(StoreError::Reply(format!("sweep: {other:?}"))),
        };
        let next = int_at(&items, 2)?;
        Ok(Sweep {
            swept,
            now_ms: uint_at(&items, 1)?,
            next_expiry_ms: (next >= 0).then_some(next as u64),
        })
    }

    /// Removes a node and its keys, unless a newer incarnation owns the id.
    pub(crate) async fn unregister(&self, id: &str, incarnation: &str) -> Result<bool, StoreError> {
        let reply = self
            .run(
                scripts::UNREGISTER
                    .key(self.keys.node(id))
                    .arg(self.keys.prefix())
                    .arg(id)
                    .arg(incarnation),
            )
            .await?;
        Ok(as_int(&reply)? == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_id_strips_the_incarnation() {
        assert_eq!(holder_id("ns/pod-0#ab12#7"), "ns/pod-0");
        assert_eq!(holder_id("plain"), "plain");
        assert_eq!(split_lease("ns/a#f00#12"), ("ns/a", "f00", "12"));
    }

    #[test]
    fn a_bad_url_names_the_option() {
        let err = Store::connect("http://nope", "leasehold").unwrap_err();
        assert!(err.to_string().starts_with("redis_url is invalid"), "{err}");
        let err = Store::connect("redis://127.0.0.1:1", "bad prefix").unwrap_err();
        assert!(err.to_string().contains("prefix"), "{err}");
    }
}
