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
use redis::{FromRedisValue, IntoConnectionInfo, ProtocolVersion, Value};

pub(crate) use keys::{GroupKeys, Keys};
pub use replication::ReplicaAcks;
use replication::Replication;
use reply::{read, Flag, Int, Text};
use route::{check_ca, manager_config, tcp_settings, CA_WITHOUT_TLS};
use route::{Route, Topology};
pub(crate) use stream::StreamReader;

use crate::store::candidacy::Candidacy;
use crate::store::options::ConnectOptions;
use crate::store::outcome::{Claim, GroupState, Handover, Heartbeat, Renewal, Sweep};
use crate::store::{ConnectError, StoreError};

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

    /// Runs `invocation` of `script` (its file name, for a reply error).
    async fn run<T: FromRedisValue>(
        &self,
        script: &str,
        invocation: &mut redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn().await?;
        let reply = invocation.invoke_async(&mut conn).await.map_err(Into::into);
        read(script, self.noted(reply)?)
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

    /// A claim or renewal (`call`, an invocation of `script`, whose file is
    /// `name`) with the `WAIT` for the replicas in the same request (see
    /// [`ReplicaAcks`]), given up after `within`. An outcome that `took` the
    /// lease counts only once the replicas in sync have the lease too.
    async fn write_lease<T: FromRedisValue>(
        &self,
        (name, script): (&str, &redis::Script),
        call: &redis::ScriptInvocation<'_>,
        within: Duration,
        took: fn(&T) -> bool,
    ) -> Result<T, StoreError> {
        let mut primary = self.route.primary().await?;
        let result = self
            .replication
            .write(&mut primary.conn, primary.generation, script, call, within)
            .await;
        let (reply, confirmation) = self.noted(result)?;
        let outcome = read(name, reply)?;
        if took(&outcome) {
            self.noted(confirmation.check())?;
        }
        Ok(outcome)
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
        let won = |c: &Claim| matches!(c, Claim::Won { .. });
        (self.write_lease(("claim.lua", &scripts::CLAIM), &call, within, won)).await
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
        let renewed = |r: &Renewal| matches!(r, Renewal::Renewed { .. });
        (self.write_lease(("renew.lua", &scripts::RENEW), &call, within, renewed)).await
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
        self.run(
            "release.lua",
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
        .await
        .map(|Flag(released)| released)
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
        let Int(code) = self
            .run(
                "handover.lua",
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
        Ok(Handover::from_code(code))
    }

    pub async fn group_state(&self, group: &str) -> Result<GroupState, StoreError> {
        let keys = self.keys.group(group);
        self.run(
            "group_state.lua",
            scripts::GROUP_STATE
                .key(&keys.lease)
                .key(&keys.term)
                .key(&keys.members)
                .key(&keys.priorities)
                .key(&keys.config),
        )
        .await
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
        let (_now, Text(previous)): (Value, Text) =
            self.run("register.lua", &mut invocation).await?;
        Ok((!previous.is_empty() && previous != incarnation).then_some(previous))
    }

    pub(crate) async fn heartbeat(
        &self,
        id: &str,
        incarnation: &str,
        lease_ms: u64,
    ) -> Result<Heartbeat, StoreError> {
        self.run(
            "heartbeat.lua",
            scripts::HEARTBEAT
                .key(self.keys.nodes())
                .key(self.keys.node(id))
                .arg(id)
                .arg(incarnation)
                .arg(lease_ms),
        )
        .await
    }

    pub(crate) async fn set_node_field(
        &self,
        id: &str,
        incarnation: &str,
        field: &str,
        value: &str,
    ) -> Result<bool, StoreError> {
        self.run(
            "set_field.lua",
            scripts::SET_FIELD
                .key(self.keys.node(id))
                .arg(incarnation)
                .arg(field)
                .arg(value),
        )
        .await
        .map(|Flag(written)| written)
    }

    pub(crate) async fn sweep(&self, batch: usize) -> Result<Sweep, StoreError> {
        self.run(
            "sweep.lua",
            scripts::SWEEP
                .key(self.keys.nodes())
                .arg(self.keys.prefix())
                .arg(batch),
        )
        .await
    }

    pub(crate) async fn unregister(&self, id: &str, incarnation: &str) -> Result<bool, StoreError> {
        self.run(
            "unregister.lua",
            scripts::UNREGISTER
                .key(self.keys.node(id))
                .arg(self.keys.prefix())
                .arg(id)
                .arg(incarnation),
        )
        .await
        .map(|Flag(removed)| removed)
    }
}
