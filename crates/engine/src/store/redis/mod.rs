//! The Redis store: the one module that talks to Redis. It owns the
//! connections, the key names and the Lua scripts, and turns every script
//! reply into the interface's typed outcomes. Every read-compare-write is
//! one script, with its expiries from the Redis server's clock.
//! `ConnectionManager` reconnects in the background, so a retried call
//! finds a fresh connection.

mod control;
mod events;
mod keys;
mod messaging;
mod replication;
mod reply;
mod route;
mod safety;
mod scripts;
mod stream;
mod wake;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, ProtocolVersion, Value};

pub(crate) use keys::{GroupKeys, Keys};
pub use replication::ReplicaAcks;
use replication::Replication;
use reply::{
    array, as_int, as_string, group_config, holder_id, int_at, split_lease, string_at, uint_at,
};
use route::{check_ca, manager_config, tcp_settings, CA_WITHOUT_TLS};
use route::{Route, Topology};
pub(crate) use stream::StreamReader;

use crate::store::candidacy::Candidacy;
use crate::store::options::ConnectOptions;
use crate::store::outcome::{deferral, Claim, GroupState, Handover, Heartbeat, Renewal, Sweep};
use crate::store::{ConnectError, StoreError};

/// A value of a group's priorities hash (seat.lua): `N`, or `0 REASON`
/// for a member whose application is unhealthy.
fn priority_and_problem(value: &str) -> (u32, Option<String>) {
    let (number, problem) = match value.split_once(' ') {
        Some((n, reason)) => (n, Some(reason.to_owned())),
        None => (value, None),
    };
    let priority = number.parse().unwrap_or(crate::config::DEFAULT_PRIORITY);
    (priority, problem)
}

// Public, as every trait impl is: a library user's `?` on a RedisError
// meets it too. Kept for the many `?`s of this module.
impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        Self::Failed {
            store: "redis",
            source: Arc::new(e),
        }
    }
}

/// A handle on Redis: cheap to clone, shared by every loop of a process.
#[derive(Clone)]
pub(crate) struct RedisStore {
    route: Arc<Route>,
    keys: Arc<Keys>,
    replication: Arc<Replication>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("prefix", &self.keys.prefix())
            .finish()
    }
}

impl RedisStore {
    /// Prepares the connections to `url`, of any Redis form (see
    /// [`super::Store::connect_with_options`]).
    pub fn connect(
        url: &str,
        prefix: &str,
        options: ConnectOptions<'_>,
    ) -> Result<Self, ConnectError> {
        // rustls needs a process-wide crypto provider; a second install is a no-op error.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let parsed = route::parse(url)?;
        let mut info = parsed
            .redis_url
            .as_str()
            .into_connection_info()
            .map_err(|e| ConnectError::Url(Box::new(e)))?
            .set_tcp_settings(tcp_settings());
        if let Some(password) = options.password {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        if let Some(pem) = options.ca_pem {
            if !parsed.tls {
                return Err(ConnectError::Ca(CA_WITHOUT_TLS.into()));
            }
            check_ca(pem)?;
        }
        let (route, key_prefix) = match &parsed.topology {
            Topology::Direct => {
                let client = route::client(info, options.ca_pem)
                    .map_err(|e| ConnectError::Url(Box::new(e)))?;
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

    /// How many replicas a claim or renewal must reach before it counts,
    /// and how long one `WAIT` for them may block.
    pub fn with_replica_acks(mut self, acks: ReplicaAcks, wait: Duration) -> Self {
        self.replication = Arc::new(Replication::new(acks, wait));
        self
    }

    pub(super) fn keys(&self) -> &Keys {
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

    /// PUBLISH on a Redis pub/sub channel (not a topic: see [`RedisStore::publish`]).
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
    /// a Cluster (always 0 for a plain URL).
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

    /// `call`, an `EVALSHA` of `script` built by the caller; on NOSCRIPT
    /// (a restarted or new primary) the script is loaded and the call sent
    /// once more.
    async fn evalsha(
        &self,
        script: &redis::Script,
        call: &redis::Cmd,
    ) -> Result<Value, StoreError> {
        let mut conn = self.conn().await?;
        let result = match call.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                match script.load_async(&mut conn).await {
                    Ok(_) => call.query_async(&mut conn).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        self.noted(result.map_err(Into::into))
    }

    /// A claim or renewal (`call`, an invocation of `script`) with the
    /// `WAIT` for the replicas in the same request (see [`ReplicaAcks`]);
    /// the caller checks the confirmation when the write took a lease, and
    /// gives up on the call after `within`.
    async fn write_lease(
        &self,
        script: &redis::Script,
        call: &redis::ScriptInvocation<'_>,
        within: Duration,
    ) -> Result<(Value, replication::Confirmation), StoreError> {
        let mut primary = self.route.primary().await?;
        let result = self
            .replication
            .write(&mut primary.conn, primary.generation, script, call, within)
            .await;
        self.noted(result)
    }

    // ---- election ----

    /// Claims `group`'s lease (claim.lua).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim(
        &self,
        group: &GroupKeys,
        id: &str,
        incarnation: &str,
        ttl_ms: u64,
        seen_term: u64,
        candidacy: &Candidacy,
        within: Duration,
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
            .key(&group.priorities)
            .key(&group.seat)
            .arg(id)
            .arg(incarnation)
            .arg(ttl_ms)
            .arg(seen_term)
            .arg(candidacy.ms)
            .arg(candidacy.priority)
            .arg(candidacy.defer_ms)
            .arg(candidacy.problem.as_deref().unwrap_or(""));
        let (reply, confirmation) = self.write_lease(&scripts::CLAIM, &call, within).await?;
        let items = array(reply)?;
        match int_at(&items, 0)? {
            1 => {
                // Leading only once the replicas in sync have the lease too.
                self.noted(confirmation.check())?;
                Ok(Claim::Won {
                    term: uint_at(&items, 1)?,
                    fresh: int_at(&items, 2)? == 1,
                    config: group_config(items.get(3)),
                })
            }
            _ => Ok(Claim::Lost {
                term: uint_at(&items, 1)?,
                pttl_ms: int_at(&items, 2)?,
                holder: string_at(&items, 3)?,
                config: group_config(items.get(4)),
                deferred: match items.get(5) {
                    Some(_) => Some(deferral(&string_at(&items, 5)?, string_at(&items, 6)?)?),
                    None => None,
                },
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn renew(
        &self,
        group: &GroupKeys,
        id: &str,
        incarnation: &str,
        term: u64,
        ttl_ms: u64,
        candidacy: &Candidacy,
        hint: bool,
        within: Duration,
    ) -> Result<Renewal, StoreError> {
        let mut call = scripts::RENEW.prepare_invoke();
        call.key(&group.lease)
            .key(&group.members)
            .key(&group.config)
            .key(&group.term)
            .key(self.keys.epoch())
            .key(&group.priorities)
            .arg(id)
            .arg(incarnation)
            .arg(term)
            .arg(ttl_ms)
            .arg(candidacy.ms)
            .arg(&group.released)
            .arg(if hint { "1" } else { "0" })
            .arg(candidacy.priority)
            .arg(candidacy.problem.as_deref().unwrap_or(""));
        let (reply, confirmation) = self.write_lease(&scripts::RENEW, &call, within).await?;
        let items = array(reply)?;
        Ok(match int_at(&items, 0)? {
            1 => {
                self.noted(confirmation.check())?;
                Renewal::Renewed {
                    config: group_config(items.get(1)),
                    term: uint_at(&items, 2)?,
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

    /// Compare-and-delete (release.lua), announced on the release channel.
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
                    .key(&group.priorities)
                    .arg(id)
                    .arg(incarnation)
                    .arg(term)
                    .arg(&group.released)
                    .arg(if withdraw { "1" } else { "0" }),
            )
            .await?;
        Ok(as_int(&reply)? == 1)
    }

    /// A release to a named successor (handover.lua).
    pub(crate) async fn hand_over(
        &self,
        group: &GroupKeys,
        id: &str,
        incarnation: &str,
        term: u64,
        successor: &str,
        window_ms: u64,
    ) -> Result<Handover, StoreError> {
        let reply = self
            .run(
                scripts::HANDOVER
                    .key(&group.lease)
                    .key(&group.members)
                    .key(&group.priorities)
                    .key(&group.seat)
                    .arg(id)
                    .arg(incarnation)
                    .arg(term)
                    .arg(&group.released)
                    .arg(successor)
                    .arg(window_ms),
            )
            .await?;
        Ok(Handover::from_code(as_int(&reply)?))
    }

    pub async fn group_state(&self, group: &str) -> Result<GroupState, StoreError> {
        let keys = self.keys.group(group);
        let reply = self
            .run(
                scripts::GROUP_STATE
                    .key(&keys.lease)
                    .key(&keys.term)
                    .key(&keys.members)
                    .key(&keys.priorities)
                    .key(&keys.config),
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
        let mut set = std::collections::BTreeMap::new();
        if let Some(Value::Array(flat)) = items.get(5) {
            for pair in flat.chunks(2) {
                set.insert(string_at(pair, 0)?, string_at(pair, 1)?);
            }
        }
        let mut priorities = std::collections::BTreeMap::new();
        let mut problems = std::collections::BTreeMap::new();
        for (id, _) in &members {
            let (priority, problem) = set
                .get(id)
                .map_or((crate::config::DEFAULT_PRIORITY, None), |v| {
                    priority_and_problem(v)
                });
            priorities.insert(id.clone(), priority);
            if let Some(problem) = problem {
                problems.insert(id.clone(), problem);
            }
        }
        Ok(GroupState {
            holder,
            term: uint_at(&items, 1)?,
            lease_pttl_ms: (pttl >= 0).then_some(pttl as u64),
            members,
            priorities,
            problems,
            preferred: match items.get(6) {
                Some(Value::BulkString(b)) => Some(
                    String::from_utf8_lossy(b)
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect(),
                ),
                _ => None,
            },
            now_ms: uint_at(&items, 3)?,
        })
    }

    // ---- nodes ----

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
    use super::reply::{holder_id, split_lease};

    #[test]
    fn holder_id_strips_the_incarnation() {
        assert_eq!(holder_id("ns/pod-0#ab12#7"), "ns/pod-0");
        assert_eq!(holder_id("plain"), "plain");
        assert_eq!(split_lease("ns/a#f00#12"), ("ns/a", "f00", "12"));
    }
}
