//! Engine events on Redis: every node publishes them as JSON on one
//! pub/sub channel, `P:events`, and followers (the controller) subscribe to
//! it on a connection of their own, on whichever primary is current.

use super::RedisStore;
use crate::config;
use crate::store::StoreError;

impl RedisStore {
    /// Publishes one event on the events channel.
    pub async fn emit_event(&self, json: &str) -> Result<(), StoreError> {
        self.publish_raw(&self.keys().events(), json).await
    }
}

impl RedisStore {
    /// Follows the engine events every node publishes on `P:events`.
    pub fn follow_events(&self) -> tokio::sync::mpsc::UnboundedReceiver<Vec<u8>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (push_tx, mut pushes) = tokio::sync::mpsc::unbounded_channel();
        let store = self.clone();
        let channel = self.keys().events();
        tokio::spawn(async move {
            let mut backoff = crate::backoff::Backoff::default();
            // Once per primary: behind Sentinel or in a Cluster the events
            // are published on whichever is current.
            'primary: loop {
                let primaries = store.primaries_found();
                let conn = loop {
                    match store.subscriber(push_tx.clone()).await {
                        Ok(conn) => break conn,
                        Err(_) if tx.is_closed() => return,
                        Err(_) => backoff.wait().await,
                    }
                };
                let mut conn = conn;
                while conn.subscribe(&channel).await.is_err() {
                    if tx.is_closed() {
                        return;
                    }
                    backoff.wait().await;
                    if store.primaries_found() != primaries {
                        continue 'primary;
                    }
                }
                backoff.reset();
                let mut recheck = tokio::time::interval(config::SENTINEL_RECHECK);
                // Ends as soon as the receiver is dropped, not at the next event.
                loop {
                    let push = tokio::select! {
                        _ = tx.closed() => return,
                        _ = recheck.tick() => {
                            if store.primaries_found() != primaries {
                                continue 'primary;
                            }
                            continue;
                        }
                        push = pushes.recv() => match push {
                            Some(push) => push,
                            None => return,
                        },
                    };
                    if push.kind != redis::PushKind::Message {
                        continue;
                    }
                    let Some(redis::Value::BulkString(payload)) = push.data.into_iter().nth(1)
                    else {
                        continue;
                    };
                    if tx.send(payload).is_err() {
                        return;
                    }
                }
            }
        });
        rx
    }
}
