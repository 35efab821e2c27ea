//! The schema leasehold keeps in PostgreSQL, created and migrated by
//! leasehold itself: one transaction under an advisory lock held for that
//! transaction only, so processes starting together migrate once and the
//! others find the result. The version is a row of `meta`; a schema newer
//! than this build is refused, never downgraded.
//!
//! Every table is LOGGED: an UNLOGGED table is emptied by a crash and not
//! replicated, which would hand out terms again after either.

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel, Transaction};

use super::error::{reason, PgStartError, Target};

/// The version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 3;

/// Version `i + 1` is `MIGRATIONS[i]`, run as [`render`] makes it.
const MIGRATIONS: &[&str] = &[
    include_str!("sql/v1.sql"),
    include_str!("sql/v2.sql"),
    include_str!("sql/v3.sql"),
];

/// A migration for `schema`: `{s}` the quoted schema, `{c}` the prefix of
/// its notification channels, and the constants of the term rule and the
/// queues written once, in term.rs and config.rs.
fn render(migration: &str, schema: &str) -> String {
    use crate::{config, term};
    migration
        .replace("{s}", &ident(schema))
        .replace("{c}", &schema.replace('\'', "''"))
        .replace("{SPAN}", &term::TERM_EPOCH_SPAN.to_string())
        .replace("{EPOCH_MS}", &term::TERM_EPOCH_MS.to_string())
        .replace("{ANCHOR}", &term::TERM_EPOCH_ANCHOR_MS.to_string())
        .replace("{HOLD}", &term::TERM_EPOCH_HOLD_MS.to_string())
        .replace("{MAX_RETAIN}", &config::MAX_RETAIN_MS.to_string())
        .replace("{COMMANDS_MAX}", &config::COMMANDS_MAX.to_string())
        .replace(
            "{DEFAULT_INBOX}",
            &config::DEFAULT_INBOX_MAX_LENGTH.to_string(),
        )
        .replace("{DEFAULT_PRIORITY}", &config::DEFAULT_PRIORITY.to_string())
}

/// Migration `version` (from 1) as it runs for `schema`, for tests that
/// build an older schema and upgrade it.
#[cfg(feature = "test-hooks")]
pub fn rendered(version: usize, schema: &str) -> Option<String> {
    MIGRATIONS
        .get(version.checked_sub(1)?)
        .map(|m| render(m, schema))
}

/// Where a migration runs, for its errors.
struct At<'a> {
    target: &'a Target,
    schema: &'a str,
}

impl At<'_> {
    fn query(&self, source: tokio_postgres::Error) -> PgStartError {
        PgStartError::Query {
            target: self.target.clone(),
            source,
        }
    }

    /// A statement that creates something: refused for want of privilege,
    /// or failed.
    fn refused(&self, source: tokio_postgres::Error) -> PgStartError {
        match source.code() {
            Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => PgStartError::Privilege {
                target: self.target.clone(),
                schema: self.schema.to_owned(),
                reason: reason(&source),
            },
            _ => self.query(source),
        }
    }
}

/// Creates the schema (when missing) and brings it to [`SCHEMA_VERSION`].
pub(super) async fn migrate(
    client: &mut Client,
    target: &Target,
    schema: &str,
) -> Result<(), PgStartError> {
    let at = At { target, schema };
    let s = ident(schema);
    // READ COMMITTED whatever the role's default: a statement after the
    // lock wait must see what the process before it committed.
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await
        .map_err(|e| at.query(e))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&format!("leasehold schema {schema}")],
    )
    .await
    .map_err(|e| at.query(e))?;
    create_missing(&tx, &at, &s).await?;
    let found = version(&tx, &at, &s).await?;
    for migration in &MIGRATIONS[found as usize..] {
        tx.batch_execute(&render(migration, schema))
            .await
            .map_err(|e| at.refused(e))?;
    }
    tx.execute(
        &format!(
            "INSERT INTO {s}.meta (key, value) VALUES ('schema_version', $1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        ),
        &[&SCHEMA_VERSION.to_string()],
    )
    .await
    .map_err(|e| at.query(e))?;
    tx.commit().await.map_err(|e| at.query(e))
}

/// The schema and its `meta` table, each created only when missing: one
/// made for leasehold by an administrator needs no CREATE on the database,
/// and a role with only USAGE on it none on the schema.
async fn create_missing(tx: &Transaction<'_>, at: &At<'_>, s: &str) -> Result<(), PgStartError> {
    let exists = tx
        .query_opt(
            "SELECT 1 FROM pg_namespace WHERE nspname = $1",
            &[&at.schema],
        )
        .await
        .map_err(|e| at.query(e))?
        .is_some();
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA {s}"))
            .await
            .map_err(|e| at.refused(e))?;
    }
    let has_meta = tx
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL AS has_meta",
            &[&format!("{s}.meta")],
        )
        .await
        .and_then(|row| row.try_get::<_, bool>("has_meta"))
        .map_err(|e| at.query(e))?;
    if !has_meta {
        tx.batch_execute(&format!(
            "CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)"
        ))
        .await
        .map_err(|e| at.refused(e))?;
    }
    Ok(())
}

/// The schema's version (0: new), or the refusal of one this build did
/// not write or cannot read.
async fn version(tx: &Transaction<'_>, at: &At<'_>, s: &str) -> Result<i32, PgStartError> {
    let text: Option<String> = tx
        .query_opt(
            &format!("SELECT value FROM {s}.meta WHERE key = 'schema_version'"),
            &[],
        )
        .await
        .and_then(|row| row.map(|row| row.try_get("value")).transpose())
        .map_err(|e| at.query(e))?;
    let found = match text.as_deref().map(str::parse::<i32>) {
        None => 0,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            return Err(PgStartError::BadSchemaVersion {
                target: at.target.clone(),
                schema: at.schema.to_owned(),
                found: text.unwrap_or_default(),
            })
        }
    };
    if found > SCHEMA_VERSION {
        return Err(PgStartError::NewerSchema {
            target: at.target.clone(),
            schema: at.schema.to_owned(),
            found,
            ours: SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// `name` as a quoted SQL identifier (any prefix the engine accepts is a
/// valid schema name once quoted).
pub(super) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn there_is_one_migration_per_version() {
        assert_eq!(MIGRATIONS.len(), SCHEMA_VERSION as usize);
        for m in MIGRATIONS {
            assert!(!m.contains("UNLOGGED"), "leases must survive a crash");
            let sql = render(m, "lh");
            for placeholder in [
                "{s}",
                "{c}",
                "{SPAN}",
                "{EPOCH_MS}",
                "{ANCHOR}",
                "{HOLD}",
                "{MAX_RETAIN}",
                "{COMMANDS_MAX}",
                "{DEFAULT_INBOX}",
                "{DEFAULT_PRIORITY}",
            ] {
                assert!(!sql.contains(placeholder), "{placeholder} left in");
            }
        }
    }
}
