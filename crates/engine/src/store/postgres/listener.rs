//! Wake-ups on PostgreSQL: one connection per process that LISTENs on the
//! schema's three channels (`PREFIX.release`: a group's lease released or
//! its timings changed; `PREFIX.inbox`: entries for a node; `PREFIX.events`:
//! engine events) and hands each notification to whoever follows it in
//! this process. Notifications are hints and the tables the truth: one
//! sent while this connection was down is lost, so after every (re)connect
//! it LISTENs first and then tells everyone to look again
//! ([`Wakeup::Listening`]`(None)`, and a poke to every inbox reader).
//!
//! The connection is checked with `SELECT 1` every [`CHECK_EVERY`]: a
//! server that vanished without closing the socket must not leave the
//! followers sleeping on hints that never come. While it is down they
//! claim at their retry interval ([`Wakeup::Lost`]), and inbox readers
//! look every [`POLL_WHILE_DOWN`].
//!
//! A pooler in transaction mode (PgBouncer's `pool_mode = transaction`)
//! cannot carry LISTEN: the store must reach PostgreSQL directly or through
//! a pooler in session mode (docs/postgres.md). A process refuses one at
//! start ([`notifications_arrive`]: one notification from the command
//! connection to a second one). The listener tells too: after LISTEN it
//! notifies itself, and a notification that does not come back within
//! [`ECHO_TIMEOUT`] is reported as an error naming the pooler, and the
//! followers poll as while the listener is down. (Its own notification can
//! come back through such a pooler when the pool hands it the same server
//! session twice; the start check's, sent by another client, cannot.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_postgres::{AsyncMessage, Notification};
use tokio_util::task::AbortOnDropHandle;

use super::endpoint::Endpoint;
use super::schema::ident;
use crate::backoff::Backoff;
use crate::store::wakeup::Wakeup;
use crate::sync::locked;

/// How often the listener's connection is checked. A lost listener costs
/// only speed (followers still claim when the lease they saw runs out), so
/// the check is rare enough to keep an idle node's statements low; TCP
/// keepalives (10 s idle) catch a dead peer sooner.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(30);

/// How long the listener waits for its own notification after LISTEN.
const ECHO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a check may take before the connection counts as lost.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an inbox reader waits for a hint while the listener is down,
/// before it looks anyway.
pub(super) const POLL_WHILE_DOWN: Duration = Duration::from_millis(250);

/// The listener of one store handle (and its clones): who follows what,
/// and the task, started at the first follower.
pub(super) struct Listener {
    channels: Arc<Channels>,
    routes: Arc<Mutex<Routes>>,
    task: OnceLock<AbortOnDropHandle<()>>,
}

/// The channel names of one schema.
struct Channels {
    release: String,
    inbox: String,
    events: String,
}

#[derive(Default)]
struct Routes {
    /// Whether the connection is up and LISTENing now.
    listening: bool,
    /// Counts the connections that LISTENed: a reader that saw the same
    /// one throughout a quiet wait missed no hint.
    generation: u64,
    wakeups: Vec<mpsc::UnboundedSender<Wakeup>>,
    inboxes: HashMap<String, Vec<Weak<Notify>>>,
    events: Vec<mpsc::UnboundedSender<Vec<u8>>>,
}

impl Routes {
    /// Everyone looks again: hints sent meanwhile are lost.
    fn look_again(&mut self) {
        self.wakeups
            .retain(|s| s.send(Wakeup::Listening(None)).is_ok());
        for notifies in self.inboxes.values() {
            for notify in notifies.iter().filter_map(Weak::upgrade) {
                notify.notify_one();
            }
        }
    }

    /// Hints may be missed from now on: the followers claim at their retry
    /// interval, and inbox readers wake to poll.
    fn lost(&mut self) {
        self.listening = false;
        self.wakeups.retain(|s| s.send(Wakeup::Lost).is_ok());
        for notifies in self.inboxes.values() {
            for notify in notifies.iter().filter_map(Weak::upgrade) {
                notify.notify_one();
            }
        }
    }
}

/// Whether a notification sent by `sender` (another connection: the
/// command session) reaches a connection that LISTENs, as every wake-up
/// must. Behind a pooler in transaction or statement mode it does not:
/// the server session that ran LISTEN went back to the pool.
pub(super) async fn notifications_arrive(
    endpoint: &Endpoint,
    channel: &str,
    sender: &tokio_postgres::Client,
) -> Result<bool, tokio_postgres::Error> {
    let (client, mut connection) = endpoint.connect().await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _pump = AbortOnDropHandle::new(tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(n) = message {
                if tx.send(n).is_err() {
                    return;
                }
            }
        }
    }));
    client
        .batch_execute(&format!(
            "SET synchronous_commit = local; LISTEN {}",
            ident(channel)
        ))
        .await?;
    // A payload no node has as its id: the other listeners ignore it. Its
    // commit waits for no standby (a stalled synchronous one is not a
    // pooler).
    let token = format!("?probe {:016x}", fastrand::u64(..));
    let literal = |text: &str| format!("'{}'", text.replace('\'', "''"));
    sender
        .batch_execute(&format!(
            "BEGIN; SET LOCAL synchronous_commit = local; SELECT pg_notify({}, {}); COMMIT",
            literal(channel),
            literal(&token)
        ))
        .await?;
    let echo = tokio::time::timeout(ECHO_TIMEOUT, async {
        while let Some(n) = rx.recv().await {
            if n.payload() == token {
                return true;
            }
        }
        false
    })
    .await;
    Ok(echo == Ok(true))
}

impl Listener {
    pub fn new(schema: &str) -> Self {
        Self {
            channels: Arc::new(Channels {
                release: format!("{schema}.release"),
                inbox: format!("{schema}.inbox"),
                events: format!("{schema}.events"),
            }),
            routes: Arc::default(),
            task: OnceLock::new(),
        }
    }

    /// The name of the inbox channel (a probe's).
    pub fn inbox_channel(&self) -> &str {
        &self.channels.inbox
    }

    /// The name of the events channel (for `pg_notify`).
    pub fn events_channel(&self) -> &str {
        &self.channels.events
    }

    fn start(&self, endpoint: &Endpoint) {
        self.task.get_or_init(|| {
            AbortOnDropHandle::new(tokio::spawn(run(
                endpoint.clone(),
                self.channels.clone(),
                self.routes.clone(),
            )))
        });
    }

    /// Passes group wake-ups to `sink` until the returned guard is
    /// dropped; `sink` hears at once if the listener is up now.
    pub fn follow_groups(&self, endpoint: &Endpoint, sink: mpsc::UnboundedSender<Wakeup>) {
        self.start(endpoint);
        let mut routes = locked(&self.routes);
        if routes.listening {
            let _ = sink.send(Wakeup::Listening(None));
        }
        routes.wakeups.push(sink);
    }

    pub fn unfollow_groups(&self, sink: &mpsc::UnboundedSender<Wakeup>) {
        locked(&self.routes)
            .wakeups
            .retain(|s| !s.same_channel(sink) && !s.is_closed());
    }

    /// A poke for each hint of entries for `node`, for as long as the
    /// returned `Notify` is kept.
    pub fn follow_inbox(&self, endpoint: &Endpoint, node: &str) -> Arc<Notify> {
        self.start(endpoint);
        let notify = Arc::new(Notify::new());
        let mut routes = locked(&self.routes);
        let list = routes.inboxes.entry(node.to_owned()).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&notify));
        notify
    }

    /// The connection hints arrive on now, if any: its generation.
    pub fn listening(&self) -> Option<u64> {
        let routes = locked(&self.routes);
        routes.listening.then_some(routes.generation)
    }

    pub fn follow_events(&self, endpoint: &Endpoint) -> mpsc::UnboundedReceiver<Vec<u8>> {
        self.start(endpoint);
        let (tx, rx) = mpsc::unbounded_channel();
        locked(&self.routes).events.push(tx);
        rx
    }
}

/// Keeps one LISTEN connection up, for as long as the store lives.
async fn run(endpoint: Endpoint, channels: Arc<Channels>, routes: Arc<Mutex<Routes>>) {
    let mut backoff = Backoff::default();
    loop {
        match listen(&endpoint, &channels, &routes, &mut backoff).await {
            Ok(()) => tracing::debug!("postgres listener lost its connection"),
            Err(e) => {
                tracing::debug!(error = %e, "postgres listener: no connection; followers poll")
            }
        }
        locked(&routes).lost();
        backoff.wait().await;
    }
}

/// One connection's life: LISTEN, tell everyone to look again, then pass
/// notifications on until the connection fails or a check does.
async fn listen(
    endpoint: &Endpoint,
    channels: &Channels,
    routes: &Mutex<Routes>,
    backoff: &mut Backoff,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = endpoint.connect().await?;
    let (tx, mut notifications) = mpsc::unbounded_channel();
    // Polling the connection for its messages also drives the client's
    // queries on it.
    let _pump = AbortOnDropHandle::new(tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "postgres listener connection failed");
                    return;
                }
                None => return,
            }
        }
    }));
    // Its own notification is a hint that needs no standby: commits here
    // never wait for one (a stalled synchronous standby must not look like
    // a pooler that drops LISTEN).
    client
        .batch_execute(&format!(
            "SET synchronous_commit = local; LISTEN {}; LISTEN {}; LISTEN {}",
            ident(&channels.release),
            ident(&channels.inbox),
            ident(&channels.events)
        ))
        .await?;
    // Its own notification must come back on this connection (an inbox
    // hint for no node: nobody acts on it).
    client
        .execute("SELECT pg_notify($1, '')", &[&channels.inbox])
        .await?;
    let echo = tokio::time::timeout(ECHO_TIMEOUT, async {
        while let Some(n) = notifications.recv().await {
            if n.channel() == channels.inbox && n.payload().is_empty() {
                return true;
            }
            dispatch(channels, routes, n);
        }
        false
    })
    .await;
    if echo != Ok(true) {
        if echo.is_err() {
            tracing::error!(
                "postgres: the listener's own notification did not come back within {ECHO_TIMEOUT:?}: \
                 a pooler in transaction mode (PgBouncer's pool_mode = transaction) drops LISTEN; \
                 connect to PostgreSQL directly or through a pooler in session mode. Followers poll meanwhile"
            );
        }
        return Ok(());
    }
    backoff.reset();
    {
        let mut routes = locked(routes);
        routes.listening = true;
        routes.generation += 1;
        routes.look_again();
    }
    let mut check = tokio::time::interval(CHECK_EVERY);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            n = notifications.recv() => match n {
                Some(n) => dispatch(channels, routes, n),
                None => return Ok(()),
            },
            _ = check.tick() => {
                match tokio::time::timeout(CHECK_TIMEOUT, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Ok(()),
                }
            }
        }
    }
}

fn dispatch(channels: &Channels, routes: &Mutex<Routes>, n: Notification) {
    let mut routes = locked(routes);
    if n.channel() == channels.release {
        // `GROUP`, or `GROUP SUCCESSOR` from a handover (names hold no
        // spaces).
        let wakeup = match n.payload().split_once(' ') {
            Some((group, to)) => Wakeup::HandedTo {
                group: group.to_owned(),
                to: to.to_owned(),
            },
            None => Wakeup::Group(n.payload().to_owned()),
        };
        routes.wakeups.retain(|s| s.send(wakeup.clone()).is_ok());
    } else if n.channel() == channels.inbox {
        if let Some(list) = routes.inboxes.get_mut(n.payload()) {
            list.retain(|w| match w.upgrade() {
                Some(notify) => {
                    notify.notify_one();
                    true
                }
                None => false,
            });
            if list.is_empty() {
                routes.inboxes.remove(n.payload());
            }
        }
    } else if n.channel() == channels.events {
        let payload = n.payload().as_bytes().to_vec();
        routes.events.retain(|s| s.send(payload.clone()).is_ok());
    }
}
