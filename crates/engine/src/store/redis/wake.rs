//! Wake-ups on Redis: one RESP3 pub/sub connection per process, subscribed
//! to the release channel (`P:g:{G}:released`) of every group the process
//! follows, on the current primary. A release, a config change, a renewal's
//! hint and the confirmation of a (re)subscription become [`Wakeup`]s; a disconnection
//! is [`Wakeup::Lost`] until the connection manager has resubscribed.

use std::collections::HashSet;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::{Keys, RedisStore};
use crate::backoff::Backoff;
use crate::config::SENTINEL_RECHECK;
use crate::store::wakeup::{Interest, Wakeup};

impl RedisStore {
    pub async fn listen(&self, interest: Interest, sink: mpsc::UnboundedSender<Wakeup>) {
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        tokio::select! {
            () = translate(push_rx, sink, self.keys.clone()) => {}
            () = keep_subscribed(self, push_tx, interest) => {}
        }
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// How renew.lua's hint to the followers starts (`renewed TERM TTL`). No
/// release carries it: it publishes the holder's id, and ids hold no spaces.
const RENEWAL_HINT: &str = "renewed ";

/// A renewal's hint on `group`'s release channel, read now; `None` for any
/// other message.
fn renewal_hint(group: &str, message: &str) -> Option<Wakeup> {
    let (term, ttl_ms) = message.strip_prefix(RENEWAL_HINT)?.split_once(' ')?;
    Some(Wakeup::Renewed {
        group: group.to_owned(),
        term: term.parse().ok()?,
        ttl_ms: ttl_ms.parse().ok()?,
        received: tokio::time::Instant::now(),
    })
}

/// How handover.lua's message starts (`handover SUCCESSOR`).
const HANDOVER: &str = "handover ";

/// A handover to a named successor on `group`'s release channel.
fn handover(group: &str, message: &str) -> Option<Wakeup> {
    Some(Wakeup::HandedTo {
        group: group.to_owned(),
        to: message.strip_prefix(HANDOVER)?.to_owned(),
    })
}

/// The pushes of the pub/sub connection as wake-ups.
async fn translate(
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    sink: mpsc::UnboundedSender<Wakeup>,
    keys: std::sync::Arc<Keys>,
) {
    while let Some(push) = pushes.recv().await {
        let wakeup = match push.kind {
            PushKind::Disconnection => Wakeup::Lost,
            PushKind::Message | PushKind::Subscribe => {
                // [channel, message] ([channel, count] for a subscription).
                let mut data = push.data.iter();
                let (channel, message) = (data.next(), data.next());
                let Some(group) = channel
                    .and_then(text)
                    .and_then(|channel| keys.released_group(&channel).map(str::to_owned))
                else {
                    continue;
                };
                if push.kind == PushKind::Subscribe {
                    Wakeup::Listening(Some(group))
                } else {
                    // A release carries the holder's id and a timings
                    // change "config": both wake the followers.
                    match message.and_then(text) {
                        Some(message) => renewal_hint(&group, &message)
                            .or_else(|| handover(&group, &message))
                            .unwrap_or(Wakeup::Group(group)),
                        None => Wakeup::Group(group),
                    }
                }
            }
            _ => continue,
        };
        if sink.send(wakeup).is_err() {
            return;
        }
    }
}

/// Keeps a connection subscribed to exactly the release channels of the
/// groups of `interest`, on the current primary (a new one after the store
/// found another). A failed (un)subscribe is retried; once subscribed, the
/// connection manager resubscribes by itself after reconnecting.
async fn keep_subscribed(
    store: &RedisStore,
    sink: mpsc::UnboundedSender<PushInfo>,
    mut interest: Interest,
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
                    if sink.send(lost()).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no pub/sub connection yet: followers wake on their retry tick");
                    backoff.wait().await;
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let wanted: HashSet<String> = interest
            .groups()
            .iter()
            .map(|g| store.keys.released(g))
            .collect();
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
            // Until the groups change or the store finds another primary.
            loop {
                tokio::select! {
                    change = interest.changed() => match change {
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
            if sink.send(lost()).is_err() {
                return;
            }
            tracing::debug!(backoff = ?backoff.current(), "pub/sub (un)subscribe failed, retrying");
            backoff.wait().await;
        }
    }
}

/// A disconnection as the push channel carries it, so that it is ordered
/// with the confirmations that follow it.
fn lost() -> PushInfo {
    PushInfo {
        kind: PushKind::Disconnection,
        data: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_hint_is_told_from_a_release_and_a_timings_change() {
        let Some(Wakeup::Renewed {
            group,
            term,
            ttl_ms,
            ..
        }) = renewal_hint("ns/g", "renewed 4001 15000")
        else {
            panic!("not read as a renewal's hint");
        };
        assert_eq!((group.as_str(), term, ttl_ms), ("ns/g", 4001, 15000));
        assert_eq!(renewal_hint("ns/g", "ns/pod-0"), None);
        assert_eq!(renewal_hint("ns/g", "config"), None);
        assert_eq!(renewal_hint("ns/g", "renewed x 15000"), None);
    }
}
