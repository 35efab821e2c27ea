//! The store interface: every operation the engine asks of the database
//! that holds leases, nodes and inboxes, and the outcomes it gets back, with
//! nothing of Redis or PostgreSQL in them. [`Store`] is the engine's handle
//! (cheap to clone, shared by every loop of a process); each of its calls
//! goes to the implementation the URL chose: `redis/` or `postgres/`.
//!
//! The contract each implementation keeps: every read-compare-write is one
//! round trip that is atomic on the server (a script, a statement, a
//! function call), and every expiry is computed from the store's own clock
//! inside it, so machines whose clocks disagree still agree on who holds
//! what. Calls are never retried here and never wait forever: the caller
//! bounds each one with [`bounded`] (the engine's loops know how long they
//! can afford to wait) and retries on its own schedule; an implementation
//! reconnects in the background, so a retried call finds a fresh
//! connection.
//!
//! Why an enum rather than a trait object: the callers are async and a
//! `dyn` async method would box every call; a match per call keeps `Store`
//! one concrete type in every public signature. The match in each method is
//! also the contract the compiler checks: an implementation that lacks an
//! operation, or answers it with another type, does not build.

pub(crate) mod candidacy;
mod error;
pub(crate) mod inbox;
pub(crate) mod messaging;
mod options;
mod outcome;
pub mod postgres;
mod redis;
pub(crate) mod safety;
pub(crate) mod wakeup;

use std::collections::BTreeMap;
use std::time::Duration;

use self::postgres::{PgReader, PgStore};
pub use self::redis::ReplicaAcks;
use self::redis::{GroupKeys, RedisStore};
use candidacy::Candidacy;
pub use error::{bounded, ConnectError, StoreError};
use inbox::{Cursors, InboxCursor, Read};
use messaging::{NodeInfo, Outgoing, PublishOutcome};
pub use options::ConnectOptions;
pub(crate) use outcome::{Claim, Handover, Heartbeat, Renewal, Sweep};
pub use outcome::{DeferReason, Deferral, GroupState, SpecVote};
use safety::SettingWarning;

use crate::config::{self, ElectionConfig};

use self::redis::StreamReader;

/// A group as the store addresses it, made once per campaign so that a
/// renewal does not build its names again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupRef {
    Redis(GroupKeys),
    Postgres(String),
}

/// The engine's handle on its store: cheap to clone, shared by every loop
/// of a process.
#[derive(Clone)]
pub struct Store {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Redis(RedisStore),
    Postgres(PgStore),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Redis(s) => std::fmt::Debug::fmt(s, f),
            Inner::Postgres(s) => std::fmt::Debug::fmt(s, f),
        }
    }
}

/// Runs `$call` on whichever implementation `$store` is, bound to `$s`.
macro_rules! on {
    ($store:expr, $s:ident => $call:expr) => {
        match &$store.inner {
            Inner::Redis($s) => $call,
            Inner::Postgres($s) => $call,
        }
    };
}

/// Like `on!`, for a call about `$group`, bound to `$g` as that
/// implementation addresses it (key names on Redis, the name on
/// PostgreSQL).
macro_rules! on_group {
    ($store:expr, $group:expr, $s:ident, $g:ident => $call:expr) => {
        match (&$store.inner, $group) {
            (Inner::Redis($s), GroupRef::Redis($g)) => $call,
            (Inner::Postgres($s), GroupRef::Postgres($g)) => $call,
            // A group made by one store handed to another: a bug of the caller.
            _ => Err(StoreError::Reply("a group of another store".into())),
        }
    };
}

impl Store {
    /// Prepares a connection to `url` (`redis://`, or `rediss://` for TLS
    /// checked against the system's root certificates, or the file named by
    /// `SSL_CERT_FILE`; a password in the URL is used for AUTH). The
    /// connection is made lazily: a store that is down at start is normal
    /// weather, and the first calls fail and are retried like any other.
    pub fn connect(url: &str, prefix: &str) -> Result<Self, ConnectError> {
        Self::connect_with_options(url, prefix, ConnectOptions::default())
    }

    /// Like [`Store::connect`], for any URL form: `redis://` and `rediss://`
    /// name the server; `redis+sentinel://` names sentinels that name the
    /// primary; `redis+cluster://` names nodes of a Redis Cluster, in which
    /// all keys go to one slot: the prefix becomes a hash tag, `{PREFIX}`;
    /// `postgres://` and `postgresql://` name a PostgreSQL database, in
    /// which the prefix names leasehold's schema (libpq's URL, with its
    /// options: several hosts with `target_session_attrs=read-write`,
    /// `connect_timeout`, `sslmode`, `sslrootcert`; the CA of
    /// `options` checks a `rediss://` server's or PostgreSQL's certificate).
    pub fn connect_with_options(
        url: &str,
        prefix: &str,
        options: ConnectOptions<'_>,
    ) -> Result<Self, ConnectError> {
        config::validate_prefix(prefix)?;
        let inner = if postgres::is_postgres_url(url) {
            Inner::Postgres(PgStore::with_ca(
                url,
                prefix,
                options.password,
                options.ca_pem,
            )?)
        } else {
            Inner::Redis(RedisStore::connect(url, prefix, options)?)
        };
        Ok(Self { inner })
    }

    /// Which kind of store this is: "redis" or "postgres".
    pub fn kind(&self) -> &'static str {
        match &self.inner {
            Inner::Redis(_) => "redis",
            Inner::Postgres(_) => "postgres",
        }
    }

    /// What the store says when it refuses to serve for a reason a retry
    /// will not cure (on PostgreSQL: credentials, privileges, version, a
    /// standby, the schema), checked now, as a process does at start; `None`
    /// for a store that serves or does not answer yet (normal weather: the
    /// calls retry). Redis's refusals are the calls' own errors.
    pub async fn refusal(&self) -> Option<String> {
        match &self.inner {
            Inner::Redis(_) => None,
            Inner::Postgres(s) => s.refusal().await.map(|e| e.to_string()),
        }
    }

    /// Connects now and checks that the store can serve: on PostgreSQL,
    /// the credentials, the server's version and role, and the schema
    /// (created or migrated here), each refused with an error that says
    /// what to do; on Redis, a `PING`. A process calls it at start to
    /// refuse a store that cannot serve, rather than retry for ever.
    pub async fn check(&self) -> Result<(), StoreError> {
        match &self.inner {
            Inner::Redis(s) => s.ping().await,
            Inner::Postgres(s) => s.check().await.map_err(|e| StoreError::Failed {
                store: "postgres",
                source: std::sync::Arc::new(e),
            }),
        }
    }

    /// How many replicas a claim or renewal must reach before it counts
    /// (default [`ReplicaAcks::All`]), and how long one wait for them may
    /// block (default [`config::REPLICA_WAIT`]).
    pub fn with_replica_acks(self, acks: ReplicaAcks, wait: Duration) -> Self {
        let inner = match self.inner {
            Inner::Redis(s) => Inner::Redis(s.with_replica_acks(acks, wait)),
            // A commit waits for the synchronous standbys, as long as it
            // takes: the caller's bound on the call is the wait's bound.
            Inner::Postgres(s) => Inner::Postgres(s.with_replica_acks(acks)),
        };
        Self { inner }
    }

    /// The store's clock, in ms since the epoch.
    pub async fn time_ms(&self) -> Result<u64, StoreError> {
        on!(self, s => s.time_ms().await)
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        on!(self, s => s.ping().await)
    }

    /// How many times the store found a new primary (always 0 for a plain
    /// URL): a change is the moment to look at the new primary's settings.
    pub fn primaries_found(&self) -> u64 {
        on!(self, s => s.primaries_found())
    }

    /// What is wrong with the current primary's settings (empty when
    /// nothing is).
    pub async fn setting_warnings(&self) -> Result<Vec<SettingWarning>, StoreError> {
        on!(self, s => s.setting_warnings().await)
    }

    // ---- wake-ups and events ----

    /// Keeps listening for the wake-ups of the groups in `interest` and
    /// passes them to `sink`, until `interest`'s sender is gone.
    pub(crate) async fn listen(
        &self,
        interest: wakeup::Interest,
        sink: tokio::sync::mpsc::UnboundedSender<wakeup::Wakeup>,
    ) {
        on!(self, s => s.listen(interest, sink).await)
    }

    /// Announces one engine event (JSON) to every follower of the events.
    pub(crate) async fn emit_event(&self, json: &str) -> Result<(), StoreError> {
        on!(self, s => s.emit_event(json).await)
    }

    /// The engine events every node announces, as the JSON they were
    /// sent as, for as long as the receiver is kept (see
    /// [`Store::follow_events`], which reads them).
    pub(crate) fn follow_event_payloads(&self) -> tokio::sync::mpsc::UnboundedReceiver<Vec<u8>> {
        on!(self, s => s.follow_events())
    }

    // ---- election ----

    pub(crate) fn group(&self, name: &str) -> GroupRef {
        match &self.inner {
            Inner::Redis(s) => GroupRef::Redis(s.keys().group(name)),
            Inner::Postgres(_) => GroupRef::Postgres(name.to_owned()),
        }
    }

    /// Claims `group`'s lease. The caller gives up on the call after
    /// `within`: a wait for replicas inside the call must answer before
    /// that.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim(
        &self,
        group: &GroupRef,
        id: &str,
        incarnation: &str,
        ttl_ms: u64,
        seen_term: u64,
        candidacy: &Candidacy,
        within: Duration,
    ) -> Result<Claim, StoreError> {
        on_group!(self, group, s, g => s
            .claim(g, id, incarnation, ttl_ms, seen_term, candidacy, within)
            .await)
    }

    /// Compare-and-expire of the lease this incarnation holds under
    /// `term`. With `hint`, a renewal also tells the group's followers how
    /// long the lease now stands ([`Wakeup::Renewed`](wakeup::Wakeup)), so
    /// that they need not claim to learn it. `within` as for a claim.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn renew(
        &self,
        group: &GroupRef,
        id: &str,
        incarnation: &str,
        term: u64,
        ttl_ms: u64,
        candidacy: &Candidacy,
        hint: bool,
        within: Duration,
    ) -> Result<Renewal, StoreError> {
        on_group!(self, group, s, g => s
            .renew(g, id, incarnation, term, ttl_ms, candidacy, hint, within)
            .await)
    }

    /// Compare-and-delete of the lease this incarnation holds under `term`
    /// (`None`: it holds none, only withdraw); `withdraw` also removes the
    /// node from the members. A release wakes the group's followers.
    pub(crate) async fn release(
        &self,
        group: &GroupRef,
        id: &str,
        incarnation: &str,
        term: Option<u64>,
        withdraw: bool,
    ) -> Result<bool, StoreError> {
        on_group!(self, group, s, g => s.release(g, id, incarnation, term, withdraw).await)
    }

    /// Compare-and-delete as [`Store::release`], handing the seat to
    /// `successor`: the release happens only when the successor is a live
    /// member with a priority above 0, and then every other candidate
    /// leaves the free seat to it for `defer_ms` (the handover window).
    pub(crate) async fn hand_over(
        &self,
        group: &GroupRef,
        id: &str,
        incarnation: &str,
        term: u64,
        successor: &str,
        defer_ms: u64,
    ) -> Result<Handover, StoreError> {
        on_group!(self, group, s, g => s
            .hand_over(g, id, incarnation, term, successor, defer_ms)
            .await)
    }

    /// Which members of `group` the controller prefers (during a rollout,
    /// those on the updated revision and ready): a candidate outside the
    /// list leaves a free seat to a live one in it of the same priority,
    /// for the deference bound. `None` (or an empty list) removes the
    /// preference. Advisory: without it the election is as before.
    pub async fn write_preferred(
        &self,
        group: &str,
        preferred: Option<&[String]>,
    ) -> Result<(), StoreError> {
        let preferred = preferred.filter(|p| !p.is_empty());
        on!(self, s => s.write_preferred(group, preferred).await)
    }

    /// Holder, term, lease time left and live members of a group.
    pub async fn group_state(&self, group: &str) -> Result<GroupState, StoreError> {
        on!(self, s => s.group_state(group).await)
    }

    /// Writes a group's timings; nodes apply them at their next claim or
    /// renewal. A change also wakes the group's followers: they sleep until
    /// the lease they saw runs out, and a shorter ttl can make the real
    /// lease run out sooner than that.
    pub async fn write_group_config(
        &self,
        group: &str,
        config: &ElectionConfig,
    ) -> Result<(), StoreError> {
        on!(self, s => s.write_group_config(group, config).await)
    }

    /// Records `config` as cluster `cluster`'s timings for `group` (written
    /// when they changed, or when they were written `refresh_ms` ago or
    /// more, so they stay fresh while nothing changes), and returns every
    /// cluster's: controllers of clusters that share the store compare
    /// them before any writes the group's timings.
    pub async fn vote_spec(
        &self,
        group: &str,
        cluster: &str,
        config: &ElectionConfig,
        refresh_ms: u64,
    ) -> Result<Vec<SpecVote>, StoreError> {
        on!(self, s => s.vote_spec(group, cluster, config, refresh_ms).await)
    }

    /// Removes cluster `cluster`'s record of its timings for `group` (its
    /// LeaderGroup was deleted), so that it no longer counts against the
    /// other clusters' before it would have gone stale.
    pub async fn withdraw_spec(&self, group: &str, cluster: &str) -> Result<(), StoreError> {
        on!(self, s => s.withdraw_spec(group, cluster).await)
    }

    /// Raises a group's term counter to `term` if it is lower (the store
    /// lost it; the term comes from a record kept elsewhere, such as a
    /// custom resource's status); never lowers it. Returns whether it was
    /// raised.
    pub async fn restore_term(&self, group: &str, term: u64) -> Result<bool, StoreError> {
        on!(self, s => s.restore_term(group, term).await)
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
        on!(self, s => s
            .register(id, incarnation, lease_ms, recovery, subscriptions, metadata)
            .await)
    }

    pub(crate) async fn heartbeat(
        &self,
        id: &str,
        incarnation: &str,
        lease_ms: u64,
    ) -> Result<Heartbeat, StoreError> {
        on!(self, s => s.heartbeat(id, incarnation, lease_ms).await)
    }

    /// Sets a field of `id`'s registration (e.g. its groups) while
    /// `incarnation` owns it; returns whether it was written (a swept
    /// node's registration is never recreated by it).
    pub(crate) async fn set_node_field(
        &self,
        id: &str,
        incarnation: &str,
        field: &str,
        value: &str,
    ) -> Result<bool, StoreError> {
        on!(self, s => s.set_node_field(id, incarnation, field, value).await)
    }

    /// Removes at most `batch` expired nodes with everything they own.
    pub(crate) async fn sweep(&self, batch: usize) -> Result<Sweep, StoreError> {
        on!(self, s => s.sweep(batch).await)
    }

    /// Removes a node and what it owns, unless a newer incarnation owns the id.
    pub(crate) async fn unregister(&self, id: &str, incarnation: &str) -> Result<bool, StoreError> {
        on!(self, s => s.unregister(id, incarnation).await)
    }

    // ---- messaging ----

    /// Subscribes `node` to a topic or pattern; retained messages it covers
    /// go to the node's inbox first. Returns how many were delivered.
    pub(crate) async fn subscribe(
        &self,
        node: &str,
        subscription: &str,
        inbox_max: u64,
    ) -> Result<u64, StoreError> {
        on!(self, s => s.subscribe(node, subscription, inbox_max).await)
    }

    /// Returns whether the node was subscribed.
    pub(crate) async fn unsubscribe(
        &self,
        node: &str,
        subscription: &str,
    ) -> Result<bool, StoreError> {
        on!(self, s => s.unsubscribe(node, subscription).await)
    }

    /// Publishes a batch of messages from `from`, in order, in one atomic
    /// step: each message is written into the inbox of every live
    /// subscriber of its topic (or of its one node). Batching shares the
    /// per-call costs; it changes nothing a subscriber can observe.
    pub(crate) async fn publish(
        &self,
        from: &str,
        messages: &[Outgoing],
    ) -> Result<Vec<PublishOutcome>, StoreError> {
        on!(self, s => s.publish(from, messages).await)
    }

    /// A reader of `node`'s inbox and command queue, on a connection of its
    /// own: a read that waits for entries must never hold up other calls.
    pub(crate) async fn inbox_reader(&self, node: &str) -> Result<InboxReader, StoreError> {
        match &self.inner {
            Inner::Redis(s) => Ok(InboxReader::Redis(s.inbox_reader(node).await?)),
            Inner::Postgres(s) => Ok(InboxReader::Postgres(s.inbox_reader(node).await?)),
        }
    }

    /// Drops the node's commands up to and including `read`.
    pub(crate) async fn ack_commands(
        &self,
        node: &str,
        read: &InboxCursor,
    ) -> Result<(), StoreError> {
        on!(self, s => s.ack_commands(node, read).await)
    }

    /// Drops the node's inbox entries up to and including `read`; returns
    /// (backlog, dropped so far). `taken` is how many entries the reader
    /// took since its last ack: those a publisher dropped meanwhile (the
    /// inbox full) were counted as dropped though the node has them, and
    /// the ack takes them off the count again.
    pub(crate) async fn ack_inbox(
        &self,
        node: &str,
        read: &InboxCursor,
        taken: u64,
    ) -> Result<(u64, u64), StoreError> {
        on!(self, s => s.ack_inbox(node, read, taken).await)
    }

    /// Unread messages in a node's inbox and its drop count.
    pub async fn inbox_state(&self, node: &str) -> Result<(u64, u64), StoreError> {
        on!(self, s => s.inbox_state(node).await)
    }

    /// The topics and patterns a node subscribes to, sorted.
    pub async fn subscriptions(&self, node: &str) -> Result<Vec<String>, StoreError> {
        on!(self, s => s.subscriptions(node).await)
    }

    /// Every registered node, earliest lease expiry first.
    pub async fn list_nodes(&self) -> Result<Vec<NodeInfo>, StoreError> {
        on!(self, s => s.list_nodes().await)
    }

    /// Live nodes per group, from the nodes' registrations.
    pub async fn nodes_per_group(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let mut counts = BTreeMap::new();
        for node in self.list_nodes().await?.into_iter().filter(|n| n.live) {
            for group in node.groups {
                *counts.entry(group).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }
}

/// A reader of one node's queues, on a connection of its own.
pub(crate) enum InboxReader {
    Redis(StreamReader),
    Postgres(PgReader),
}

impl InboxReader {
    /// Entries after `after`, at most `room` of each queue (only the
    /// commands when `commands_only`), waiting up to `block` for the first
    /// one when given. Commands come first.
    pub async fn read(
        &mut self,
        after: &Cursors,
        room: usize,
        block: Option<Duration>,
        commands_only: bool,
    ) -> Result<Vec<Read>, StoreError> {
        match self {
            Self::Redis(r) => r.read(after, room, block, commands_only).await,
            Self::Postgres(r) => r.read(after, room, block, commands_only).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_names_the_option() {
        let err = Store::connect("http://nope", "leasehold").unwrap_err();
        assert!(
            err.to_string().starts_with("the store URL is invalid"),
            "{err}"
        );
        assert!(err.to_string().contains("postgres://"), "{err}");
        let err = Store::connect("postgres://a@b@c/d", "leasehold").unwrap_err();
        assert!(err.to_string().contains("%40"), "{err}");
        let err = Store::connect("postgres://h/d", &"p".repeat(60)).unwrap_err();
        assert!(err.to_string().contains("over 55 bytes"), "{err}");
        let err = Store::connect("redis://127.0.0.1:1", "bad prefix").unwrap_err();
        assert!(err.to_string().contains("prefix"), "{err}");
    }
}
