//! The PostgreSQL store, being built (issue 24; the plan is
//! docs/design/postgres-store.md): so far its connection, the checks at
//! start that turn a database that cannot serve into one clear error, the
//! schema it creates and migrates itself, and the store's history. It is
//! not yet behind [`crate::Store`].
//!
//! Every check at start changes nothing when it fails: the credentials,
//! the server's version and role (a standby is refused) are read before the
//! schema is touched, and the schema is created or migrated in one
//! transaction under an advisory lock.

mod error;
mod history;
mod schema;

use std::fmt;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};
use tokio_util::task::AbortOnDropHandle;

use error::{causes, reason};
pub use error::{PgStartError, Target};
pub use history::History;
pub use schema::SCHEMA_VERSION;

/// How long a connection attempt may take unless the URL says
/// (`connect_timeout`): a black-holed host must not hold a start for the
/// kernel's TCP timeout.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The oldest server accepted: 14 (13 and older are past their end of life).
pub const MIN_SERVER_VERSION: i32 = 14_00_00;

/// A connection to one database and the schema (the prefix) in it.
pub struct PgStore {
    client: Client,
    target: Target,
    schema: String,
    history: History,
    _connection: AbortOnDropHandle<()>,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.target)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://` or `postgresql://`, or libpq's
    /// `key=value` form), checks the server, and creates or migrates the
    /// schema `prefix`.
    pub async fn open(url: &str, prefix: &str) -> Result<Self, PgStartError> {
        check_userinfo(url)?;
        // The parser's cause names the option at fault, never its value.
        let mut config: Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| PgStartError::Url(causes(&e)))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let target = Target::of(&config);
        let (mut client, connection) =
            config
                .connect(NoTls)
                .await
                .map_err(|source| match source.code() {
                    Some(code)
                        if *code == SqlState::INVALID_PASSWORD
                            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
                    {
                        PgStartError::Credentials {
                            target: target.clone(),
                            reason: reason(&source),
                        }
                    }
                    _ => PgStartError::Connect {
                        target: target.clone(),
                        source,
                    },
                })?;
        let connection = AbortOnDropHandle::new(tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection ended");
            }
        }));
        let query = |source| PgStartError::Query {
            target: target.clone(),
            source,
        };
        check_server(&client, &target).await?;
        if prefix.len() > 63 {
            return Err(PgStartError::LongPrefix {
                target,
                schema: prefix.to_owned(),
            });
        }
        schema::migrate(&mut client, &target, prefix).await?;
        let history = History::read(&client, prefix).await.map_err(query)?;
        Ok(Self {
            client,
            target,
            schema: prefix.to_owned(),
            history,
            _connection: connection,
        })
    }

    /// The store's history as read at connect.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Reads the history again (a test, or a reconnect, compares it).
    pub async fn read_history(&self) -> Result<History, PgStartError> {
        History::read(&self.client, &self.schema)
            .await
            .map_err(|source| PgStartError::Query {
                target: self.target.clone(),
                source,
            })
    }

    pub fn target(&self) -> &Target {
        &self.target
    }
}

/// The server's version and role: a standby cannot hold leases.
async fn check_server(client: &Client, target: &Target) -> Result<(), PgStartError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'), pg_is_in_recovery()",
            &[],
        )
        .await
        .map_err(|source| PgStartError::Query {
            target: target.clone(),
            source,
        })?;
    let (number, version, standby): (i32, String, bool) = (row.get(0), row.get(1), row.get(2));
    if number < MIN_SERVER_VERSION {
        return Err(PgStartError::Version {
            target: target.clone(),
            found: version,
            needed: MIN_SERVER_VERSION / 10_000,
        });
    }
    if standby {
        return Err(PgStartError::Standby {
            target: target.clone(),
        });
    }
    Ok(())
}

/// A URL whose user or password holds a raw `@` would be split at the
/// first one, and part of the password taken for the host (and printed as
/// such in every error): refused, without echoing it.
fn check_userinfo(url: &str) -> Result<(), PgStartError> {
    let Some((_, rest)) = url.split_once("://") else {
        return Ok(());
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.matches('@').count() > 1 {
        return Err(PgStartError::Url(
            "an '@' in the user or password must be percent-encoded as %40".into(),
        ));
    }
    Ok(())
}
