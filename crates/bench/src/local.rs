//! The bench's own store when it is given no URL: a throwaway redis-server
//! or PostgreSQL (the testkit's), which the pause scenarios stop and
//! resume.

use leasehold_testkit::postgres::LocalPostgres;
use leasehold_testkit::LocalRedis;

use super::args::StoreKind;

pub enum LocalStore {
    Redis(LocalRedis),
    Postgres(LocalPostgres),
}

impl LocalStore {
    pub fn start(kind: StoreKind) -> anyhow::Result<Self> {
        Ok(match kind {
            StoreKind::Redis => Self::Redis(LocalRedis::start()?),
            // Durable (fsync on, the defaults), with room for the fan-out's
            // hundred subscribers, each a process with two connections.
            StoreKind::Postgres => {
                Self::Postgres(LocalPostgres::start_with(&["max_connections=400"])?)
            }
        })
    }

    pub fn url(&self) -> String {
        match self {
            Self::Redis(r) => r.url(),
            Self::Postgres(p) => p.url(),
        }
    }

    /// SIGSTOP of the whole server.
    pub fn pause(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Redis(r) => r.pause(),
            Self::Postgres(p) => p.pause(),
        }
    }

    pub fn resume(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Redis(r) => r.resume(),
            Self::Postgres(p) => {
                p.resume();
                Ok(())
            }
        }
    }
}

/// The store's name in figures: "Redis" or "PostgreSQL".
pub fn name(url: &str) -> &'static str {
    if leasehold_engine::store::postgres::is_postgres_url(url) {
        "PostgreSQL"
    } else {
        "Redis"
    }
}
