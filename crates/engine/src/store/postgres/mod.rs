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

mod history;
mod schema;

use std::fmt;

use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};
use tokio_util::task::AbortOnDropHandle;

pub use history::History;
pub use schema::SCHEMA_VERSION;

/// The oldest server accepted: 14 (13 and older are past their end of life).
pub const MIN_SERVER_VERSION: i32 = 14_00_00;

/// Where a URL points, for messages: the hosts and the database, never the
/// password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub hosts: String,
    pub dbname: String,
    pub user: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PostgreSQL at {}, database {:?}",
            self.hosts, self.dbname
        )
    }
}

impl Target {
    fn of(config: &Config) -> Self {
        let ports = config.get_ports();
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match host {
                    Host::Tcp(name) => format!("{name}:{port}"),
                    Host::Unix(dir) => format!("{}:{port}", dir.display()),
                }
            })
            .collect();
        let user = config.get_user().unwrap_or_default().to_owned();
        Self {
            hosts: if hosts.is_empty() {
                "localhost:5432".into()
            } else {
                hosts.join(",")
            },
            dbname: config.get_dbname().unwrap_or(&user).to_owned(),
            user,
        }
    }
}

/// Why the store cannot start on this database; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum PgStartError {
    #[error("the store URL is not a PostgreSQL URL ({0}); it looks like postgres://USER@HOST:PORT/DATABASE")]
    Url(String),
    #[error("{target}: cannot connect: {source}")]
    Connect {
        target: Target,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{target} refused user {user:?}: {reason} (check the user, and the password or its file)", user = target.user)]
    Credentials { target: Target, reason: String },
    #[error("{target} runs PostgreSQL {found}; leasehold needs {} or later", MIN_SERVER_VERSION / 10_000)]
    Version { target: Target, found: String },
    #[error("{target} is a standby (read-only): give the primary, or list every host with target_session_attrs=read-write")]
    Standby { target: Target },
    #[error("{target}: user {user:?} may not create schema {schema:?} ({reason}): grant it CREATE on the database, or create the schema for it and grant it that", user = target.user)]
    Privilege {
        target: Target,
        schema: String,
        reason: String,
    },
    #[error("{target}: schema {schema:?} is at version {found}, newer than this leasehold's {SCHEMA_VERSION}: run the newer leasehold, or give another --prefix")]
    NewerSchema {
        target: Target,
        schema: String,
        found: i32,
    },
    #[error("{target}: the prefix {schema:?} is over 63 bytes, the longest schema name PostgreSQL keeps")]
    LongPrefix { target: Target, schema: String },
    #[error("{target}: {source}")]
    Query {
        target: Target,
        #[source]
        source: tokio_postgres::Error,
    },
}

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
        let config: Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| PgStartError::Url(e.to_string()))?;
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
        });
    }
    if standby {
        return Err(PgStartError::Standby {
            target: target.clone(),
        });
    }
    Ok(())
}

/// The server's own words for a refusal.
fn reason(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |db| db.message().to_owned())
}

/// `name` as a quoted SQL identifier (any prefix the engine accepts is a
/// valid schema name once quoted).
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
