//! One fixture for either store, so that one test body runs against Redis
//! and PostgreSQL ([`StoreServer`]); the engine's suites make one test per
//! store from each body (their `on_both_stores!`). Either store starts
//! with its birth and epoch preset to 0, as [`crate::RedisServer`] does,
//! so that terms count 1, 2, 3 and the first lease is not held back.

use leasehold_engine::store::postgres::PgStore;
use leasehold_engine::Store;

use crate::postgres::LocalPostgres;
use crate::RedisServer;

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Postgres,
}

/// Anything a node can be started on.
pub trait StoreFixture {
    /// A fresh handle on the store, under the prefix `lh`.
    fn store(&self) -> Store;
}

impl StoreFixture for RedisServer {
    fn store(&self) -> Store {
        RedisServer::store(self)
    }
}

/// A throwaway server of either kind.
pub enum StoreServer {
    Redis(RedisServer),
    Postgres(LocalPostgres),
}

impl StoreFixture for StoreServer {
    fn store(&self) -> Store {
        Store::connect(&self.url(), "lh").expect("store")
    }
}

impl StoreServer {
    /// Starts one, or says why it cannot (a skip; fatal under CI).
    pub fn start_or_skip(kind: Kind, test: &str) -> Option<Self> {
        match kind {
            Kind::Redis => Some(Self::Redis(RedisServer::start())),
            Kind::Postgres => {
                if let Some(why) = crate::postgres::missing() {
                    crate::lacks(test, &why);
                    return None;
                }
                let pg = LocalPostgres::start().expect("postgres starts");
                preset(&pg);
                Some(Self::Postgres(pg))
            }
        }
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

    /// SIGSTOP: connections stay open, nothing answers.
    pub fn pause(&mut self) {
        match self {
            Self::Redis(r) => r.pause(),
            Self::Postgres(p) => p.pause().expect("SIGSTOP to postgres"),
        }
    }

    pub fn resume(&mut self) {
        match self {
            Self::Redis(r) => r.resume(),
            Self::Postgres(p) => p.resume(),
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
            Self::Postgres(p) => Some(p),
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

/// Creates the schema `lh` (a throwaway runtime on a thread of its own:
/// the caller may be inside one) and presets the birth and the epoch.
fn preset(pg: &LocalPostgres) {
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
