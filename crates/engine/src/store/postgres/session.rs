//! The store's command connection: one pipelined tokio-postgres client per
//! process, made on the first call and made again after it failed. Each
//! connection is checked and the schema migrated as at start, and reads the
//! store's history: a restart or a failover ends every connection, so the
//! history a connection read is the one its claims run in. Statements are
//! prepared once per connection, so every call is one round trip.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};
use tokio_util::task::AbortOnDropHandle;

use super::endpoint::Endpoint;
use super::error::{reason, PgStartError, Target};
use super::history::History;
use super::schema::{self, ident};
use crate::sync::locked;

/// The oldest server accepted: 14 (13 and older are past their end of life).
pub const MIN_SERVER_VERSION: i32 = 14_00_00;

/// The statements of the store, one per operation; `{s}` is the quoted
/// schema, `{c}` the prefix of the notification channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Time,
    Ping,
    Claim,
    Renew,
    Release,
    HandOver,
    GroupState,
    WriteConfig,
    WritePreferred,
    RestoreTerm,
    VoteSpec,
    WithdrawSpec,
    Register,
    Heartbeat,
    SetField,
    Sweep,
    Unregister,
    Subscribe,
    Unsubscribe,
    Publish,
    Read,
    AckInbox,
    AckCommands,
    InboxState,
    Subscriptions,
    ListNodes,
    Notify,
    Settings,
}

impl Op {
    const ALL: usize = Op::Settings as usize + 1;

    // A table, one arm per statement: its length is the number of statements.
    #[allow(clippy::too_many_lines)]
    fn sql(self) -> &'static str {
        match self {
            Op::Time => "SELECT {s}.now_ms() AS now_ms",
            Op::Ping => "SELECT 1",
            Op::Claim => {
                "SELECT * FROM {s}.claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
            }
            Op::Renew => "SELECT * FROM {s}.renew($1, $2, $3, $4, $5, $6, $7, $8)",
            Op::Release => "SELECT {s}.release($1, $2, $3, $4, $5) AS released",
            Op::HandOver => "SELECT {s}.hand_over($1, $2, $3, $4, $5, $6) AS outcome",
            Op::GroupState => "SELECT * FROM {s}.group_state($1)",
            // One statement: the timings change only when they differ, and
            // only a change wakes the group's followers.
            Op::WriteConfig => {
                "WITH up AS (
                    INSERT INTO {s}.groups AS g (name, ttl_ms, renew_interval_ms, retry_interval_ms)
                    VALUES ($1, $2, $3, $4)
                    ON CONFLICT (name) DO UPDATE SET ttl_ms = excluded.ttl_ms,
                        renew_interval_ms = excluded.renew_interval_ms,
                        retry_interval_ms = excluded.retry_interval_ms
                    WHERE (g.ttl_ms, g.renew_interval_ms, g.retry_interval_ms)
                        IS DISTINCT FROM (excluded.ttl_ms, excluded.renew_interval_ms, excluded.retry_interval_ms)
                    RETURNING name)
                 SELECT pg_notify('{c}.release', name) FROM up"
            }
            // Only when it changed; the row made if the group has none yet.
            Op::WritePreferred => {
                "INSERT INTO {s}.groups AS g (name, preferred) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET preferred = excluded.preferred
                 WHERE g.preferred IS DISTINCT FROM excluded.preferred"
            }
            Op::RestoreTerm => {
                "INSERT INTO {s}.groups AS g (name, counter) SELECT $1::text, $2::bigint WHERE $2::bigint > 0
                 ON CONFLICT (name) DO UPDATE SET counter = excluded.counter
                 WHERE g.counter < excluded.counter
                 RETURNING 1"
            }
            Op::VoteSpec => "SELECT * FROM {s}.vote_spec($1, $2, $3, $4, $5, $6)",
            Op::WithdrawSpec => "DELETE FROM {s}.specs WHERE grp = $1 AND cluster = $2",
            Op::Register => "SELECT {s}.register($1, $2, $3, $4, $5, $6::text::jsonb) AS previous",
            Op::Heartbeat => "SELECT * FROM {s}.heartbeat($1, $2, $3)",
            Op::SetField => {
                "UPDATE {s}.nodes SET fields = fields || jsonb_build_object($3::text, $4::text),
                    inbox_max = CASE WHEN $3::text = 'inbox_max' THEN $4::text::bigint ELSE inbox_max END
                 WHERE id = $1 AND incarnation = $2"
            }
            Op::Sweep => "SELECT * FROM {s}.sweep($1)",
            Op::Unregister => "SELECT {s}.unregister($1, $2) AS removed",
            Op::Subscribe => "SELECT {s}.subscribe($1, $2, $3) AS delivered",
            Op::Unsubscribe => "DELETE FROM {s}.subscriptions WHERE node = $1 AND pattern = $2",
            Op::Publish => "SELECT * FROM {s}.publish($1, $2, $3, $4, $5, $6)",
            // At most $4 of each queue; the commands only when $5.
            Op::Read => {
                "(SELECT queue, seq, kind, msg_id, topic, sender, payload, retained FROM {s}.inbox
                   WHERE node = $1 AND queue = 0 AND seq > $2 ORDER BY seq LIMIT $4)
                 UNION ALL
                 (SELECT queue, seq, kind, msg_id, topic, sender, payload, retained FROM {s}.inbox
                   WHERE node = $1 AND queue = 1 AND seq > $3 AND NOT $5 ORDER BY seq LIMIT $4)"
            }
            Op::AckInbox => "SELECT * FROM {s}.ack_inbox($1, $2, $3)",
            Op::AckCommands => "SELECT {s}.ack_commands($1, $2)",
            Op::InboxState => {
                "SELECT greatest(q.inbox_len - t.inbox, 0) AS backlog, greatest(q.dropped - t.dropped_after_read, 0) AS dropped
                 FROM {s}.queues q JOIN {s}.takes t ON t.node = q.node WHERE q.node = $1"
            }
            Op::Subscriptions => {
                "SELECT pattern FROM {s}.subscriptions WHERE node = $1 ORDER BY pattern"
            }
            Op::ListNodes => {
                "SELECT n.id, n.lease_until_ms, n.registered_at_ms, n.heartbeat_at_ms,
                        coalesce(greatest(q.inbox_len - t.inbox, 0), 0) AS backlog,
                        coalesce(greatest(q.dropped - t.dropped_after_read, 0), 0) AS dropped,
                        coalesce(n.fields ->> 'groups', '') AS groups, {s}.now_ms() AS now_ms
                 FROM {s}.nodes n
                 LEFT JOIN {s}.queues q ON q.node = n.id
                 LEFT JOIN {s}.takes t ON t.node = n.id
                 ORDER BY n.lease_until_ms, n.id"
            }
            Op::Notify => "SELECT pg_notify($1, $2)",
            Op::Settings => {
                "SELECT current_setting('fsync') AS fsync,
                        (SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit') AS synchronous_commit,
                        current_setting('synchronous_standby_names') AS standby_names,
                        (SELECT count(*) FROM pg_stat_replication) AS standbys"
            }
        }
    }
}

/// One connection, checked, with its history and prepared statements.
pub(super) struct Session {
    pub client: Client,
    pub history: History,
    /// The history as `claim` compares it: the server's part (`claim`
    /// adds the oid of `meta`, read at each claim). Made once per
    /// connection, not per claim.
    pub history_key: String,
    statements: Vec<OnceCell<Statement>>,
    _connection: AbortOnDropHandle<()>,
}

impl Session {
    /// Connects, checks the server, migrates the schema and reads the
    /// history; changes nothing when a check fails.
    async fn open(
        endpoint: &Endpoint,
        target: &Target,
        schema: &str,
        acks_off: bool,
    ) -> Result<Self, PgStartError> {
        let (mut client, connection) =
            endpoint
                .connect()
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
                    _ => match super::endpoint::refused_certificate(&source) {
                        Some(reason) => PgStartError::Certificate {
                            target: target.clone(),
                            reason,
                        },
                        None => PgStartError::Connect {
                            target: target.clone(),
                            source,
                        },
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
        // The store's own commits are durable, and on the synchronous
        // standbys (the analogue of Redis's WAIT: a claim a promoted standby
        // may lack never counts), whatever the server's default: a crash
        // that reinitialises the server keeps its start time, so lost
        // commits would go unseen. With replica acks off, `local`: durable
        // here, never waiting for a standby (the migration's commit
        // included: a stalled standby must not hold a start with acks off).
        // Without synchronous standbys the two are the same.
        let commit = if acks_off { "local" } else { "remote_apply" };
        client
            .batch_execute(&format!(
                "SET synchronous_commit = {commit}; SET default_transaction_isolation = 'read committed'"
            ))
            .await
            .map_err(query)?;
        check_server(&client, target).await?;
        schema::migrate(&mut client, target, schema).await?;
        let history = History::read(&client, schema).await.map_err(query)?;
        let history_key = format!(
            "{}:{}:{}",
            history.system, history.timeline, history.started_us
        );
        Ok(Self {
            client,
            history,
            history_key,
            statements: (0..Op::ALL).map(|_| OnceCell::new()).collect(),
            _connection: connection,
        })
    }

    /// `op`'s statement, prepared on this connection at its first use.
    async fn statement(&self, op: Op, schema: &str) -> Result<&Statement, tokio_postgres::Error> {
        self.statements[op as usize]
            .get_or_try_init(|| async {
                let sql = op
                    .sql()
                    .replace("{s}", &ident(schema))
                    .replace("{c}", &schema.replace('\'', "''"));
                self.client.prepare(&sql).await
            })
            .await
    }

    /// Runs `op`, returning its rows.
    pub async fn query(
        &self,
        op: Op,
        schema: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.statement(op, schema).await?;
        self.client.query(statement, params).await
    }

    /// Runs `op`, returning how many rows it changed.
    pub async fn execute(
        &self,
        op: Op,
        schema: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.statement(op, schema).await?;
        self.client.execute(statement, params).await
    }
}

/// The current connection, if any, and how to make the next.
#[derive(Default)]
pub(super) struct Slot {
    current: Mutex<Option<Arc<Session>>>,
    /// One connection attempt at a time: callers that find none wait for it.
    connecting: tokio::sync::Mutex<()>,
    /// Replica acks off: commits never wait for a standby.
    acks_off: AtomicBool,
    last_history: Mutex<Option<History>>,
    histories: AtomicU64,
}

impl Slot {
    pub fn set_acks_off(&self, off: bool) {
        self.acks_off.store(off, Ordering::Relaxed);
    }

    pub fn histories_seen(&self) -> u64 {
        self.histories.load(Ordering::Relaxed)
    }

    pub async fn get(
        &self,
        endpoint: &Endpoint,
        target: &Target,
        schema: &str,
    ) -> Result<Arc<Session>, PgStartError> {
        if let Some(session) = locked(&self.current).clone() {
            return Ok(session);
        }
        let _one = self.connecting.lock().await;
        if let Some(session) = locked(&self.current).clone() {
            return Ok(session);
        }
        let acks_off = self.acks_off.load(Ordering::Relaxed);
        let session = Arc::new(Session::open(endpoint, target, schema, acks_off).await?);
        {
            let mut last = locked(&self.last_history);
            if last.as_ref().is_some_and(|h| *h != session.history) {
                self.histories.fetch_add(1, Ordering::Relaxed);
            }
            *last = Some(session.history.clone());
        }
        *locked(&self.current) = Some(session.clone());
        Ok(session)
    }

    /// A call on `session` failed with `e`: a closed connection, one to a
    /// server that turned standby, or one whose prepared statements name
    /// what is gone (the schema dropped or restored meanwhile) is dropped,
    /// so the next call connects again (to the primary, with a multi-host
    /// URL), and migrates and reads the history again.
    pub fn failed(&self, session: &Arc<Session>, e: &tokio_postgres::Error) {
        let stale = [
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::UNDEFINED_FUNCTION,
            SqlState::UNDEFINED_TABLE,
            SqlState::INVALID_SCHEMA_NAME,
            SqlState::FEATURE_NOT_SUPPORTED,
        ];
        if session.client.is_closed() || e.code().is_some_and(|c| stale.contains(c)) {
            let mut current = locked(&self.current);
            if current.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)) {
                *current = None;
            }
        }
    }
}

/// The server's version and role: a standby cannot hold leases.
async fn check_server(client: &Client, target: &Target) -> Result<(), PgStartError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int AS number, current_setting('server_version') AS version, pg_is_in_recovery() AS standby",
            &[],
        )
        .await
        .and_then(|row| Ok((row.try_get("version")?, row.try_get("number")?, row.try_get("standby")?)))
        .map_err(|source| PgStartError::Query {
            target: target.clone(),
            source,
        })?;
    let (version, number, standby): (String, i32, bool) = row;
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
