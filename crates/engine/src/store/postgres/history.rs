//! The store's history, as PostgreSQL shows it. Terms must never repeat
//! across a store's histories (docs/guarantees.md); on PostgreSQL a history
//! ends when the cluster is another (a restored dump, a new cluster: the
//! system identifier), when a standby is promoted or a point-in-time
//! recovery forks the WAL (the timeline), when the server restarted, which
//! may have lost commits made with `synchronous_commit = off` (the
//! postmaster's start time), or when leasehold's schema was restored into
//! the same cluster (the oid of its `meta` table). All four are readable
//! by a user without privileges.

use tokio_postgres::Client;

use super::schema::ident;

/// Where the store's data comes from, as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// `pg_control_system().system_identifier`.
    pub system: String,
    /// The current WAL timeline, from the name of the WAL file in use.
    pub timeline: u32,
    /// `pg_postmaster_start_time()`, in microseconds since 1970 (not as
    /// text, which would follow each session's time zone).
    pub started_us: i64,
    /// The oid of the schema's `meta` table.
    pub meta_oid: u32,
}

impl History {
    pub(super) async fn read(client: &Client, schema: &str) -> Result<Self, tokio_postgres::Error> {
        let meta = format!("{}.meta", ident(schema));
        let row = client
            .query_one(
                "SELECT (SELECT system_identifier::text FROM pg_control_system()) AS system,
                        substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) AS timeline,
                        (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint AS started_us,
                        to_regclass($1)::oid::bigint AS meta_oid",
                &[&meta],
            )
            .await?;
        let timeline: String = row.try_get("timeline")?;
        Ok(Self {
            system: row.try_get("system")?,
            // Eight hex digits, by the WAL file naming; a server that named
            // them otherwise reads as timeline 0, another history.
            timeline: u32::from_str_radix(&timeline, 16).unwrap_or(0),
            started_us: row.try_get("started_us")?,
            // The schema's meta table exists: migrate() made it first.
            meta_oid: row.try_get::<_, Option<i64>>("meta_oid")?.unwrap_or(0) as u32,
        })
    }

    /// Whether `later` is the same history as this one: anything else is a
    /// store born again.
    pub fn continues_in(&self, later: &History) -> bool {
        self == later
    }
}
