//! [`PgStore`], the PostgreSQL store's handle: what a URL and a prefix make
//! (without connecting), the shared command connection and listener behind
//! it, and the one way every operation runs a statement.

use std::sync::Arc;

use tokio_postgres::types::FromSql;
use tokio_postgres::Config;

use super::endpoint::{self, Endpoint};
use super::error::{causes, PgStartError, Target, MAX_PREFIX_BYTES};
use super::history::History;
use super::listener;
use super::session::{Op, Session, Slot};

use crate::store::StoreError;

/// How long a connection attempt may take unless the URL says
/// (`connect_timeout`): a black-holed host must not hold a start for the
/// kernel's TCP timeout.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A handle on one database and the schema (the prefix) in it: cheap to
/// clone, shared by every loop of a process.
#[derive(Clone)]
pub struct PgStore {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    pub endpoint: Endpoint,
    pub target: Target,
    pub schema: String,
    pub slot: Slot,
    pub listener: listener::Listener,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.shared.target)
            .field("schema", &self.shared.schema)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Prepares a store on `url` (`postgres://` or `postgresql://`, or
    /// libpq's `key=value` form) and the schema `prefix`, without
    /// connecting: the first call connects (see [`PgStore::open`] to do it
    /// now). `password` wins over one in the URL.
    pub fn new(url: &str, prefix: &str, password: Option<&str>) -> Result<Self, PgStartError> {
        Self::with_ca(url, prefix, password, None)
    }

    /// Like [`PgStore::new`], with the PEM of the CA that signed the
    /// server's certificate (it wins over the URL's `sslrootcert`; see
    /// endpoint.rs for what each `sslmode` checks).
    pub fn with_ca(
        url: &str,
        prefix: &str,
        password: Option<&str>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, PgStartError> {
        check_userinfo(url)?;
        let tls = endpoint::take_from(url);
        // The parser's cause names the option at fault, never its value.
        let mut config: Config = tls
            .url
            .parse()
            .map_err(|e: tokio_postgres::Error| PgStartError::Url(causes(&e)))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.keepalives_idle(crate::config::TCP_KEEPALIVE);
        if let Some(password) = password {
            config.password(password);
        }
        if config.get_application_name().is_none() {
            config.application_name("leasehold");
        }
        let target = Target::of(&config);
        let tls_error = |source| PgStartError::Tls {
            target: target.clone(),
            source,
        };
        let root_cert = match (ca_pem, &tls.sslrootcert) {
            (None, Some(path)) => Some(std::fs::read(path).map_err(|e| {
                tls_error(endpoint::TlsError::RootCert {
                    path: path.clone(),
                    reason: e.to_string(),
                })
            })?),
            _ => None,
        };
        let ca = ca_pem.or(root_cert.as_deref());
        let (check, required) =
            endpoint::check_for(tls.sslmode.as_deref(), ca.is_some()).map_err(tls_error)?;
        if required {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        let endpoint = Endpoint {
            tls: endpoint::connector(check, ca).map_err(tls_error)?,
            config,
        };
        if prefix.len() > MAX_PREFIX_BYTES {
            return Err(PgStartError::LongPrefix {
                target,
                schema: prefix.to_owned(),
            });
        }
        Ok(Self {
            shared: Arc::new(Shared {
                listener: listener::Listener::new(prefix),
                slot: Slot::default(),
                endpoint,
                target,
                schema: prefix.to_owned(),
            }),
        })
    }

    /// Connects to `url`, checks the server, and creates or migrates the
    /// schema `prefix`: what a process does at start, to refuse a database
    /// that cannot serve before it does anything else.
    pub async fn open(url: &str, prefix: &str) -> Result<Self, PgStartError> {
        let store = Self::new(url, prefix, None)?;
        store.session().await?;
        Ok(store)
    }

    /// Connects now if not connected (see [`PgStore::open`]).
    pub async fn check(&self) -> Result<(), PgStartError> {
        self.session().await.map(drop)
    }

    /// Why this database cannot serve, if it says so: a refusal a retry
    /// will not cure (credentials, privileges, version, a standby, the
    /// schema, notifications that never arrive), as opposed to a server
    /// that does not answer yet. The last is checked with one notification
    /// from the command connection to a second one (up to 5 s when none
    /// comes).
    pub async fn refusal(&self) -> Option<PgStartError> {
        match self.check().await {
            Err(e) if !matches!(e, PgStartError::Connect { .. } | PgStartError::Query { .. }) => {
                return Some(e)
            }
            Err(_) => return None,
            Ok(()) => {}
        }
        let session = self.session().await.ok()?;
        let arrive = listener::notifications_arrive(
            &self.shared.endpoint,
            self.shared.listener.inbox_channel(),
            &session.client,
        )
        .await;
        (arrive.ok() == Some(false)).then(|| PgStartError::NoNotifications {
            target: self.shared.target.clone(),
        })
    }

    /// The store's history as read by the current connection.
    pub async fn history(&self) -> Result<History, PgStartError> {
        Ok(self.session().await?.history.clone())
    }

    /// Reads the history again, on the current connection.
    pub async fn read_history(&self) -> Result<History, PgStartError> {
        let session = self.session().await?;
        History::read(&session.client, &self.shared.schema)
            .await
            .map_err(|source| PgStartError::Query {
                target: self.shared.target.clone(),
                source,
            })
    }

    pub fn target(&self) -> &Target {
        &self.shared.target
    }

    /// Lease writes wait for the synchronous standbys
    /// (`synchronous_commit = remote_apply`, the default) unless `acks` is
    /// off (`local`). PostgreSQL counts its standbys itself
    /// (`synchronous_standby_names`), so `AtLeast(n)` waits as `All` does.
    pub(crate) fn with_replica_acks(self, acks: crate::store::ReplicaAcks) -> Self {
        self.shared
            .slot
            .set_acks_off(matches!(acks, crate::store::ReplicaAcks::Off));
        self
    }

    /// How many times the store found a server of another history
    /// (a promoted standby, a restarted server): the moment to look at
    /// its settings again.
    pub fn primaries_found(&self) -> u64 {
        self.shared.slot.histories_seen()
    }

    pub(super) async fn session(&self) -> Result<Arc<Session>, PgStartError> {
        self.shared
            .slot
            .get(
                &self.shared.endpoint,
                &self.shared.target,
                &self.shared.schema,
            )
            .await
    }

    /// Runs `op` with `params`, returning its rows.
    pub(super) async fn query(
        &self,
        op: Op,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Answer>, StoreError> {
        let session = self.session().await.map_err(failed)?;
        self.query_on(&session, op, params).await
    }

    /// Runs `op` on `session` (a claim runs on the connection whose
    /// history it passes).
    pub(super) async fn query_on(
        &self,
        session: &Arc<Session>,
        op: Op,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Answer>, StoreError> {
        let result = session.query(op, &self.shared.schema, params).await;
        let rows = result.map_err(|e| {
            self.shared.slot.failed(session, &e);
            statement_failed(e)
        })?;
        Ok(rows.into_iter().map(|row| Answer { op, row }).collect())
    }

    /// Runs `op`, returning how many rows it changed.
    pub(super) async fn execute(
        &self,
        op: Op,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let session = self.session().await.map_err(failed)?;
        let result = session.execute(op, &self.shared.schema, params).await;
        result.map_err(|e| {
            self.shared.slot.failed(&session, &e);
            statement_failed(e)
        })
    }

    /// Runs `op`, which answers one row.
    pub(super) async fn query_one(
        &self,
        op: Op,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Answer, StoreError> {
        self.query(op, params)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Reply(format!("{op:?}: no row")))
    }

    /// The database's clock, in ms since the epoch.
    pub async fn time_ms(&self) -> Result<u64, StoreError> {
        let row = self.query_one(Op::Time, &[]).await?;
        Ok(row.get::<i64>("now_ms")?.max(0) as u64)
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.query(Op::Ping, &[]).await.map(drop)
    }
}

/// A row of `op`'s answer, read by column name: a column that is missing
/// or of another type is a [`StoreError::Reply`] naming both, not a panic.
pub(super) struct Answer {
    op: Op,
    row: tokio_postgres::Row,
}

impl Answer {
    pub(super) fn get<'a, T: FromSql<'a>>(&'a self, column: &str) -> Result<T, StoreError> {
        let value = self.row.try_get(column);
        value.map_err(|e| StoreError::Reply(format!("{:?}: column {column}: {e}", self.op)))
    }
}

/// A store error from PostgreSQL's.
pub(super) fn failed(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Failed {
        store: "postgres",
        source: Arc::new(e),
    }
}

/// A store error from a failed statement, in words that say what failed:
/// tokio-postgres's own text is only the kind ("db error"), the server's
/// message ("deadlock detected", say) is its cause.
pub(super) fn statement_failed(e: tokio_postgres::Error) -> StoreError {
    failed(Described {
        text: causes(&e),
        source: e,
    })
}

#[derive(Debug, thiserror::Error)]
#[error("{text}")]
struct Described {
    text: String,
    #[source]
    source: tokio_postgres::Error,
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

/// Whether `url` names a PostgreSQL server.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}
