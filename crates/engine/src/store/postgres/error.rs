//! What the PostgreSQL store says when it cannot start: where the URL
//! points ([`Target`], never the password) and why ([`PgStartError`]).

use std::fmt;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// The longest prefix: a schema name is at most 63 bytes, and the
/// notification channels are named `PREFIX.release`, `PREFIX.inbox` and
/// `PREFIX.events`, identifiers of at most 63 bytes too.
pub const MAX_PREFIX_BYTES: usize = 63 - ".release".len();

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
    pub(super) fn of(config: &Config) -> Self {
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
    #[error("{target}: cannot connect: {}", causes(source))]
    Connect {
        target: Target,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{target} refused user {user:?}: {reason} (check the user, the password or its file, and the server's pg_hba.conf)", user = target.user)]
    Credentials { target: Target, reason: String },
    #[error("{target} runs PostgreSQL {found}; leasehold needs {needed} or later")]
    Version {
        target: Target,
        found: String,
        needed: i32,
    },
    #[error("{target} is a standby (read-only): give the primary, or list every host with target_session_attrs=read-write")]
    Standby { target: Target },
    #[error("{target}: user {user:?} may not create schema {schema:?} ({reason}): grant it CREATE on the database, or create the schema for it and grant it that", user = target.user)]
    Privilege {
        target: Target,
        schema: String,
        reason: String,
    },
    #[error("{target}: schema {schema:?} is at version {found}, newer than this leasehold's {ours}: run the newer leasehold, or give another --prefix")]
    NewerSchema {
        target: Target,
        schema: String,
        found: i32,
        ours: i32,
    },
    #[error("{target}: the prefix {schema:?} is over {max} bytes: PostgreSQL keeps names of at most 63, and the store's notification channels add \".release\" to it", max = MAX_PREFIX_BYTES)]
    LongPrefix { target: Target, schema: String },
    #[error("{target}: schema {schema:?} holds schema version {found:?}, which is not a version leasehold wrote: give another --prefix, or repair its meta table")]
    BadSchemaVersion {
        target: Target,
        schema: String,
        found: String,
    },
    #[error("{target}: a notification sent on one connection never reached another that LISTENs: a pooler in transaction or statement mode (PgBouncer's pool_mode = transaction) is in between; connect to PostgreSQL directly, or through a pooler in session mode")]
    NoNotifications { target: Target },
    #[error("{target}: {reason}: give the CA that signed it (--store-ca-file or sslrootcert), and a host name it was made for (or sslmode=verify-ca)")]
    Certificate { target: Target, reason: String },
    #[error("{target}: {source}")]
    Tls {
        target: Target,
        #[source]
        source: super::endpoint::TlsError,
    },
    #[error("{target}: {}", causes(source))]
    Query {
        target: Target,
        #[source]
        source: tokio_postgres::Error,
    },
}

impl From<PgStartError> for crate::store::ConnectError {
    /// A CA that is no CA, or one given with `sslmode=disable`, is the CA's fault.
    fn from(e: PgStartError) -> Self {
        use super::endpoint::TlsError::{CaWithoutTls, InvalidCa};
        let ca = matches!(
            &e,
            PgStartError::Tls {
                source: InvalidCa(_) | CaWithoutTls,
                ..
            }
        );
        let wrap = if ca { Self::Ca } else { Self::Refused };
        wrap(Box::new(e))
    }
}

/// An error and its causes, as one line: tokio-postgres's own text is only
/// its kind ("error connecting to server", "db error").
pub(super) fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

/// The server's own words for a refusal.
pub(super) fn reason(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |db| db.message().to_owned())
}
