//! Wake-ups for followers: one pub/sub connection per node that listens on
//! the release channel of every joined group and pokes that group's campaign
//! the moment its lease is released. A message lost while the connection was
//! down is followed by a resubscription, which pokes every group too.
//!
//! Because of this, a follower need not poll: while the subscription is
//! confirmed ([`Wake::healthy`]) it sleeps until the lease it saw runs out,
//! about one claim per ttl. While it is not (at start, after a disconnection,
//! until the resubscription is confirmed), followers fall back to claiming
//! every retry interval.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, Notify};

use crate::backoff::Backoff;
use crate::config::SENTINEL_RECHECK;
use crate::store::Store;

type Routes = Arc<Mutex<HashMap<String, Arc<Notify>>>>;

pub(crate) struct Wake {
    routes: Routes,
    healthy: Arc<AtomicBool>,
    changes: mpsc::UnboundedSender<()>,
    _tasks: [crate::task::Task; 2],
}

impl Wake {
    pub fn start(store: &Store) -> Self {
        let routes: Routes = Arc::default();
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        let (changes, changes_rx) = mpsc::unbounded_channel();
        let healthy = Arc::new(AtomicBool::new(false));
        let dispatcher = crate::task::spawn(dispatch(push_rx, routes.clone(), healthy.clone()));
        let subscriber = crate::task::spawn(keep_subscribed(
            store.clone(),
            push_tx,
            routes.clone(),
            changes_rx,
            healthy.clone(),
        ));
        Self {
            routes,
            healthy,
            changes,
            _tasks: [dispatcher, subscriber],
        }
    }

    /// Routes releases announced on `channel` to the returned `Notify`.
    pub fn add(&self, channel: &str) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        lock(&self.routes).insert(channel.to_owned(), notify.clone());
        let _ = self.changes.send(());
        notify
    }

    /// True while release messages are known to arrive: the subscription is
    /// confirmed and no disconnection was seen since.
    pub fn healthy(&self) -> Arc<AtomicBool> {
        self.healthy.clone()
    }

    pub fn remove(&self, channel: &str) {
        lock(&self.routes).remove(channel);
        let _ = self.changes.send(());
    }
}

fn lock(routes: &Routes) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
    crate::sync::locked(routes)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

async fn dispatch(
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    routes: Routes,
    healthy: Arc<AtomicBool>,
) {
    while let Some(push) = pushes.recv().await {
        match push.kind {
            // Releases may be missed from now until the resubscription.
            PushKind::Disconnection => healthy.store(false, Ordering::SeqCst),
            // A release, or a (re)subscription after which a release may have
            // been missed: either way the group should look again now.
            PushKind::Message | PushKind::Subscribe => {
                if push.kind == PushKind::Subscribe {
                    healthy.store(true, Ordering::SeqCst);
                }
                let Some(channel) = push.data.first().and_then(text) else {
                    continue;
                };
                if let Some(notify) = lock(&routes).get(&channel) {
                    notify.notify_one();
                }
            }
            _ => {}
        }
    }
}

/// Keeps a connection subscribed to exactly the routed channels, on the
/// current primary (a new one after the store found another). A failed
/// (un)subscribe is retried; once subscribed, the connection manager
/// resubscribes by itself after reconnecting.
async fn keep_subscribed(
    store: Store,
    sink: mpsc::UnboundedSender<PushInfo>,
    routes: Routes,
    mut changes: mpsc::UnboundedReceiver<()>,
    healthy: Arc<AtomicBool>,
) {
    let mut backoff = Backoff::default();
    // Sets: a process may follow thousands of groups.
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut conn = None;
    // Which primary `conn` is on; read before the connection is made, so a
    // primary found meanwhile is noticed.
    let mut primaries = 0;
    loop {
        let found = store.primaries_found();
        if conn.is_none() || found != primaries {
            // At start, and after a failover behind Sentinel or in a
            // Cluster: releases are published on the current primary.
            match store.subscriber(sink.clone()).await {
                Ok(fresh) => {
                    conn = Some(fresh);
                    primaries = found;
                    subscribed.clear();
                    healthy.store(false, Ordering::SeqCst);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no pub/sub connection yet: followers wake on their retry tick");
                    backoff.wait().await;
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let wanted: HashSet<String> = lock(&routes).keys().cloned().collect();
        let add: Vec<&String> = wanted.difference(&subscribed).collect();
        let drop: Vec<&String> = subscribed.difference(&wanted).collect();
        let mut ok = true;
        if !add.is_empty() {
            ok &= c.subscribe(&add).await.is_ok();
        }
        if ok && !drop.is_empty() {
            ok &= c.unsubscribe(&drop).await.is_ok();
        }
        if ok {
            subscribed = wanted;
            backoff.reset();
            // Until the routes change or the store finds another primary.
            loop {
                tokio::select! {
                    change = changes.recv() => match change {
                        Some(()) => break,
                        None => return,
                    },
                    _ = tokio::time::sleep(SENTINEL_RECHECK) => {
                        if store.primaries_found() != primaries {
                            break;
                        }
                    }
                }
            }
        } else {
            healthy.store(false, Ordering::SeqCst);
            tracing::debug!(backoff = ?backoff.current(), "pub/sub (un)subscribe failed, retrying");
            backoff.wait().await;
        }
        while changes.try_recv().is_ok() {}
    }
}
