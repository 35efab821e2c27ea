//! The schema leasehold keeps in PostgreSQL, created and migrated by
//! leasehold itself: one transaction under an advisory lock held for that
//! transaction only, so processes starting together migrate once and the
//! others find the result. The version is a row of `meta`; a schema newer
//! than this build is refused, never downgraded.
//!
//! Every table is LOGGED: an UNLOGGED table is emptied by a crash and not
//! replicated, which would hand out terms again after either.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::{ident, reason, PgStartError, Target};

/// The version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// Version `i + 1` is `MIGRATIONS[i]`, run with `{s}` the quoted schema.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE {s}.groups (
    name text PRIMARY KEY,
    holder text,
    incarnation text,
    term bigint NOT NULL DEFAULT 0,
    expires_at timestamptz,
    ttl_ms bigint,
    renew_interval_ms bigint,
    retry_interval_ms bigint
);
CREATE TABLE {s}.nodes (
    id text PRIMARY KEY,
    incarnation text NOT NULL,
    lease_until timestamptz NOT NULL,
    registered_at timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}',
    inbox_max bigint NOT NULL,
    next_seq bigint NOT NULL DEFAULT 0,
    dropped bigint NOT NULL DEFAULT 0
);
CREATE INDEX nodes_lease_until ON {s}.nodes (lease_until);
CREATE TABLE {s}.members (
    grp text NOT NULL,
    node text NOT NULL REFERENCES {s}.nodes (id) ON DELETE CASCADE,
    PRIMARY KEY (grp, node)
);
CREATE TABLE {s}.subscriptions (
    node text NOT NULL REFERENCES {s}.nodes (id) ON DELETE CASCADE,
    pattern text NOT NULL,
    PRIMARY KEY (node, pattern)
);
CREATE TABLE {s}.inbox (
    node text NOT NULL REFERENCES {s}.nodes (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    kind text NOT NULL,
    sender text,
    payload bytea NOT NULL,
    PRIMARY KEY (node, seq)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
CREATE TABLE {s}.retained (
    topic text PRIMARY KEY,
    payload bytea NOT NULL,
    expires_at timestamptz
);
"#];

/// Creates the schema (when missing) and brings it to [`SCHEMA_VERSION`].
pub(super) async fn migrate(
    client: &mut Client,
    target: &Target,
    schema: &str,
) -> Result<(), PgStartError> {
    let query = |source| PgStartError::Query {
        target: target.clone(),
        source,
    };
    let refused = |source: tokio_postgres::Error| match source.code() {
        Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => PgStartError::Privilege {
            target: target.clone(),
            schema: schema.to_owned(),
            reason: reason(&source),
        },
        _ => PgStartError::Query {
            target: target.clone(),
            source,
        },
    };
    let s = ident(schema);
    let tx = client.transaction().await.map_err(query)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&format!("leasehold schema {schema}")],
    )
    .await
    .map_err(query)?;
    // Looked up first: a schema created for leasehold by an administrator
    // needs no CREATE on the database.
    let exists = tx
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
        .await
        .map_err(query)?
        .is_some();
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA {s}"))
            .await
            .map_err(refused)?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL)"
    ))
    .await
    .map_err(refused)?;
    let found: i32 = tx
        .query_opt(
            &format!("SELECT value FROM {s}.meta WHERE key = 'schema_version'"),
            &[],
        )
        .await
        .map_err(query)?
        .and_then(|row| row.get::<_, String>(0).parse().ok())
        .unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(PgStartError::NewerSchema {
            target: target.clone(),
            schema: schema.to_owned(),
            found,
        });
    }
    for migration in &MIGRATIONS[found as usize..] {
        tx.batch_execute(&migration.replace("{s}", &s))
            .await
            .map_err(refused)?;
    }
    tx.execute(
        &format!(
            "INSERT INTO {s}.meta (key, value) VALUES ('schema_version', $1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        ),
        &[&SCHEMA_VERSION.to_string()],
    )
    .await
    .map_err(query)?;
    tx.commit().await.map_err(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn there_is_one_migration_per_version() {
        assert_eq!(MIGRATIONS.len(), SCHEMA_VERSION as usize);
        for m in MIGRATIONS {
            assert!(!m.contains("UNLOGGED"), "leases must survive a crash");
        }
    }
}
