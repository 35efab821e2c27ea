//! One fixture for either store, so that one test body runs against Redis
//! and PostgreSQL ([`StoreServer`]); the engine's suites make one test per
//! store from each body (their `on_both_stores!`). Either store starts
//! with its birth and epoch preset to 0, as [`crate::RedisServer`] does,
//! so that terms count 1, 2, 3 and the first lease is not held back.

use leasehold_engine::store::postgres::PgStore;
use leasehold_engine::Store;

use std::time::Duration;

use crate::postgres::{LocalPostgres, PgDatabase};
use crate::proxy::Proxy;
use crate::{eventually, RedisServer, StoreFixture};

/// One test per store from one body: `on_both_stores! { async fn
/// name(server) { ... } }` makes the module `name` with the tests `redis`
/// and `postgres`, each running the body with a mutable `server`, a
/// [`StoreServer`] of its kind (a PostgreSQL that cannot be had here is a
/// failure, or a skip when it is left out on purpose: [`crate::lacks`]). On PostgreSQL that is a
/// database of its own in the test binary's shared server; a body that
/// stops, kills or replicates its server says so, `async fn name(server:
/// own)`, and gets a server of its own. The calling crate needs tokio.
#[macro_export]
macro_rules! on_both_stores {
    ($(#[doc = $doc:expr])* async fn $name:ident($server:ident) $body:block) => {
        $crate::on_both_stores!(@tests start_or_skip, $name, $server, $body, $(#[doc = $doc])*);
    };
    ($(#[doc = $doc:expr])* async fn $name:ident($server:ident: own) $body:block) => {
        $crate::on_both_stores!(@tests start_own_or_skip, $name, $server, $body, $(#[doc = $doc])*);
    };
    (@tests $start:ident, $name:ident, $server:ident, $body:block, $(#[doc = $doc:expr])*) => {
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[allow(unused_mut)]
            async fn body(mut $server: $crate::store::StoreServer) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                let kind = $crate::store::Kind::Redis;
                if let Some(server) = $crate::store::StoreServer::$start(kind, "redis") {
                    body(server).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let kind = $crate::store::Kind::Postgres;
                if let Some(server) = $crate::store::StoreServer::$start(kind, "postgres") {
                    body(server).await;
                }
            }
        }
    };
}

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Postgres,
}

/// A throwaway server of either kind.
pub enum StoreServer {
    Redis(RedisServer),
    Postgres(PgDatabase),
}

impl StoreFixture for StoreServer {
    fn store(&self) -> Store {
        Store::connect(&self.url(), "lh").expect("store")
    }

    fn url(&self) -> String {
        StoreServer::url(self)
    }
}

impl StoreServer {
    /// A Redis server, or a database in the test binary's shared
    /// PostgreSQL server; or `None` when PostgreSQL is left out ([`crate::lacks`]).
    pub fn start_or_skip(kind: Kind, test: &str) -> Option<Self> {
        match kind {
            Kind::Redis => Some(Self::Redis(RedisServer::start())),
            Kind::Postgres => {
                if let Some(why) = crate::postgres::missing() {
                    crate::lacks(test, crate::Part::Postgres, &why);
                    return None;
                }
                let database = PgDatabase::in_shared().expect("a database in the shared server");
                preset(&database);
                Some(Self::Postgres(database))
            }
        }
    }

    /// A server of its own, for a test that stops, kills or replicates it.
    pub fn start_own_or_skip(kind: Kind, test: &str) -> Option<Self> {
        match kind {
            Kind::Redis => Some(Self::Redis(RedisServer::start())),
            Kind::Postgres => Self::start_postgres_with(&[], test),
        }
    }

    /// A PostgreSQL server of its own with more settings
    /// (`synchronous_commit=off`, say), or `None` when PostgreSQL is left
    /// out ([`crate::lacks`]).
    pub fn start_postgres_with(settings: &[&str], test: &str) -> Option<Self> {
        if let Some(why) = crate::postgres::missing() {
            crate::lacks(test, crate::Part::Postgres, &why);
            return None;
        }
        // Room for a test's hundred nodes, each a process with a command
        // connection and a listener of its own.
        let mut all = vec!["max_connections=300"];
        all.extend_from_slice(settings);
        let pg = LocalPostgres::start_with(&all).expect("postgres starts");
        let database = PgDatabase::own(pg);
        preset(&database);
        Some(Self::Postgres(database))
    }

    pub fn kind(&self) -> Kind {
        match self {
            Self::Redis(_) => Kind::Redis,
            Self::Postgres(_) => Kind::Postgres,
        }
    }

    pub fn url(&self) -> String {
        match self {
            Self::Redis(r) => r.url(),
            Self::Postgres(p) => p.url(),
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        match self {
            Self::Redis(r) => r.port,
            Self::Postgres(p) => p.port(),
        }
    }

    /// The URL of the server as reached on another port of 127.0.0.1 (a
    /// proxy in front of it).
    pub fn url_at(&self, port: u16) -> String {
        self.url()
            .replacen(&format!(":{}", self.port()), &format!(":{port}"), 1)
    }

    /// The worst restart each store has in production: Redis comes back
    /// empty (no persistence); PostgreSQL is killed (-9) and recovers from
    /// its WAL, a new history for the store.
    pub fn crash_restart(&mut self) {
        match self {
            Self::Redis(r) => r.restart(),
            Self::Postgres(p) => p
                .own_server()
                .restart_on_own_data()
                .expect("postgres restarts"),
        }
    }

    /// SIGSTOP: connections stay open, nothing answers.
    pub fn pause(&mut self) {
        match self {
            Self::Redis(r) => r.pause(),
            Self::Postgres(p) => p.own_server().pause().expect("SIGSTOP to postgres"),
        }
    }

    pub fn resume(&mut self) {
        match self {
            Self::Redis(r) => r.resume(),
            Self::Postgres(p) => p.own_server().resume(),
        }
    }

    /// The Redis server, for a check only Redis has.
    pub fn redis(&self) -> Option<&RedisServer> {
        match self {
            Self::Redis(r) => Some(r),
            Self::Postgres(_) => None,
        }
    }

    /// The PostgreSQL server, for a check only PostgreSQL has.
    pub fn postgres(&mut self) -> Option<&mut LocalPostgres> {
        match self {
            Self::Redis(_) => None,
            Self::Postgres(p) => Some(p.own_server()),
        }
    }

    /// A replica of this server that follows it through a proxy the test
    /// can pause (the replica lags) or cut; returns once it is in sync.
    /// On Redis a `REPLICAOF`; on PostgreSQL a standby made by
    /// `pg_basebackup -R`, and the primary's `synchronous_standby_names`
    /// set to `'*'`, so a commit waits for it (the PostgreSQL analogue of a
    /// replica that `WAIT` counts).
    pub async fn replica(&mut self) -> (StoreServer, Proxy) {
        let link = Proxy::start(self.port()).await;
        match self {
            Self::Redis(primary) => {
                let replica = RedisServer::start();
                replica.cli(&["REPLICAOF", "127.0.0.1", &link.port.to_string()]);
                // Redis's defaults: the first full sync waits 5 s
                // (`repl-diskless-sync-delay`) for more replicas to join.
                // In sync as the primary sees it (`state=online`): only then
                // does a lease write wait for it.
                eventually(Duration::from_secs(20), "the replica is in sync", || {
                    primary
                        .cli(&["INFO", "replication"])
                        .contains("state=online")
                        && replica
                            .cli(&["INFO", "replication"])
                            .contains("master_link_status:up")
                })
                .await;
                (Self::Redis(replica), link)
            }
            Self::Postgres(database) => {
                // (Its settings change: a server of its own.)
                let primary = database.own_server();
                let standby =
                    LocalPostgres::standby_through(primary, link.port).expect("a standby starts");
                // (ALTER SYSTEM refuses to run in a transaction block, so
                // one statement per call.)
                primary
                    .psql("ALTER SYSTEM SET synchronous_standby_names = '*'")
                    .expect("synchronous_standby_names");
                primary.psql("SELECT pg_reload_conf()").expect("reload");
                eventually(
                    Duration::from_secs(10),
                    "the standby is synchronous",
                    || {
                        primary
                            .psql("SELECT sync_state FROM pg_stat_replication")
                            .ok()
                            .as_deref()
                            == Some("sync")
                    },
                )
                .await;
                (Self::Postgres(PgDatabase::own(standby)), link)
            }
        }
    }

    /// Makes a replica a primary, as a failover does (`REPLICAOF NO ONE`;
    /// `pg_promote()`, waiting for it to take writes).
    pub fn promote(&self) {
        match self {
            Self::Redis(r) => {
                r.cli(&["REPLICAOF", "NO", "ONE"]);
            }
            Self::Postgres(p) => p.server().promote().expect("pg_promote"),
        }
    }

    /// A group's term counter as the store holds it (0 when it has none).
    pub fn stored_term(&self, group: &str) -> u64 {
        let text = match self {
            Self::Redis(r) => r.cli(&["GET", &format!("lh:g:{{{group}}}:term")]),
            Self::Postgres(p) => p
                .psql(&format!(
                    "SELECT counter FROM lh.groups WHERE name = '{}'",
                    group.replace('\'', "''")
                ))
                .expect("psql"),
        };
        text.trim().parse().unwrap_or(0)
    }
}

/// Reads of the store's data, for a test's checks, in either store's terms.
impl StoreServer {
    fn sql(&self, query: &str) -> String {
        match self {
            Self::Postgres(p) => p.psql(query).expect("psql"),
            Self::Redis(_) => unreachable!("SQL on Redis"),
        }
    }

    /// How many retained messages the store keeps (live or expired but
    /// not yet removed).
    pub fn retained_count(&self) -> u64 {
        match self {
            Self::Redis(r) => r.cli(&["KEYS", "lh:topic:*:retained"]).lines().count() as u64,
            Self::Postgres(_) => self
                .sql("SELECT count(*) FROM lh.retained")
                .parse()
                .unwrap_or(0),
        }
    }

    /// Every node id in the registry (live or not yet swept).
    pub fn registered_ids(&self) -> Vec<String> {
        match self {
            Self::Redis(r) => r
                .cli(&["KEYS", "lh:node:*"])
                .lines()
                .filter(|k| !k.ends_with(":inbox") && !k.ends_with(":subs"))
                .filter_map(|k| k.strip_prefix("lh:node:"))
                .map(str::to_owned)
                .collect(),
            Self::Postgres(_) => self
                .sql("SELECT id FROM lh.nodes")
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }

    /// Whether `id` is in the node registry (live or not yet swept).
    pub fn registered(&self, id: &str) -> bool {
        match self {
            Self::Redis(r) => !r.cli(&["ZSCORE", "lh:nodes", id]).is_empty(),
            Self::Postgres(_) => {
                self.sql(&format!(
                    "SELECT count(*) FROM lh.nodes WHERE id = {}",
                    quote(id)
                )) == "1"
            }
        }
    }

    /// How many nodes the registry holds.
    pub fn registered_count(&self) -> u64 {
        let text = match self {
            Self::Redis(r) => r.cli(&["ZCARD", "lh:nodes"]),
            Self::Postgres(_) => self.sql("SELECT count(*) FROM lh.nodes"),
        };
        text.trim().parse().expect("a count")
    }

    /// A field of a node's registration ("" when missing).
    pub fn node_field(&self, id: &str, field: &str) -> String {
        match self {
            Self::Redis(r) => r.cli(&["HGET", &format!("lh:node:{id}"), field]),
            Self::Postgres(_) if field == "incarnation" => self.sql(&format!(
                "SELECT incarnation FROM lh.nodes WHERE id = {}",
                quote(id)
            )),
            Self::Postgres(_) => self.sql(&format!(
                "SELECT fields ->> {} FROM lh.nodes WHERE id = {}",
                quote(field),
                quote(id)
            )),
        }
    }

    /// Whether `node` is a (lapsed or live) candidate in `group`.
    pub fn is_member(&self, group: &str, node: &str) -> bool {
        match self {
            Self::Redis(r) => !r
                .cli(&["ZSCORE", &format!("lh:g:{{{group}}}:members"), node])
                .is_empty(),
            Self::Postgres(_) => {
                self.sql(&format!(
                    "SELECT count(*) FROM lh.members WHERE grp = {} AND node = {}",
                    quote(group),
                    quote(node)
                )) == "1"
            }
        }
    }

    /// The ttl a group's nodes adopt, as written by the controller ("" when
    /// none is).
    pub fn adopted_ttl_ms(&self, group: &str) -> String {
        match self {
            Self::Redis(r) => r.cli(&["HGET", &format!("lh:g:{{{group}}}:config"), "ttlMs"]),
            Self::Postgres(_) => self.sql(&format!(
                "SELECT ttl_ms FROM lh.groups WHERE name = {}",
                quote(group)
            )),
        }
    }

    /// Whether the store keeps cluster `cluster`'s record of `group`'s
    /// timings (groups across clusters).
    pub fn keeps_timings_of(&self, group: &str, cluster: &str) -> bool {
        match self {
            Self::Redis(r) => {
                r.cli(&["HEXISTS", &format!("lh:g:{{{group}}}:specs"), cluster]) == "1"
            }
            Self::Postgres(_) => {
                self.sql(&format!(
                    "SELECT count(*) FROM lh.specs WHERE grp = {} AND cluster = {}",
                    quote(group),
                    quote(cluster)
                )) == "1"
            }
        }
    }

    /// Whether someone holds `group`'s lease now (store clock).
    pub fn lease_held(&self, group: &str) -> bool {
        match self {
            Self::Redis(r) => r.cli(&["EXISTS", &format!("lh:g:{{{group}}}:lease")]) == "1",
            Self::Postgres(_) => {
                self.sql(&format!(
                    "SELECT count(*) FROM lh.groups WHERE name = {} AND holder IS NOT NULL AND expires_ms > lh.now_ms()",
                    quote(group)
                )) == "1"
            }
        }
    }

    /// Whether the store keeps anything of `node`: its registration, its
    /// subscriptions (either direction), its queues.
    pub fn keeps_anything_of(&self, node: &str) -> bool {
        match self {
            Self::Redis(r) => {
                let base = format!("lh:node:{node}");
                let keys = [
                    base.clone(),
                    format!("{base}:subs"),
                    format!("{base}:inbox"),
                    format!("{base}:commands"),
                ];
                let mut args = vec!["EXISTS"];
                args.extend(keys.iter().map(String::as_str));
                let topics = r.cli(&["KEYS", "lh:topic:*:subs"]);
                r.cli(&args) != "0"
                    || topics
                        .lines()
                        .any(|key| r.cli(&["SISMEMBER", key, node]) == "1")
            }
            Self::Postgres(_) => {
                let id = quote(node);
                self.sql(&format!(
                    "SELECT (SELECT count(*) FROM lh.nodes WHERE id = {id})
                          + (SELECT count(*) FROM lh.subscriptions WHERE node = {id})
                          + (SELECT count(*) FROM lh.inbox WHERE node = {id})"
                )) != "0"
            }
        }
    }
}

/// `text` as an SQL string literal.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Creates the schema `lh` (a throwaway runtime on a thread of its own:
/// the caller may be inside one) and presets the birth and the epoch.
fn preset(pg: &PgDatabase) {
    let url = pg.url();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(PgStore::open(&url, "lh"))
            .expect("the schema is made")
    })
    .join()
    .expect("the schema thread");
    pg.psql("UPDATE lh.store SET born_ms = 0, epoch = 0")
        .expect("preset");
}
