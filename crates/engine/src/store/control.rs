//! What an operator process sets for a group from outside its nodes: the
//! timings the nodes adopt, and a term that Redis lost (restored from a
//! record kept elsewhere, such as a custom resource's status).

use super::error::StoreError;
use super::reply::as_int;
use super::{scripts, Store};
use crate::config::{self, ElectionConfig};

impl Store {
    /// Writes a group's timings; nodes apply them at their next claim or
    /// renewal. A change also wakes the group's followers (on its release
    /// channel): they sleep until the lease they saw runs out, and a shorter
    /// ttl can make the real lease run out sooner than that.
    pub async fn write_group_config(
        &self,
        group: &str,
        config: &ElectionConfig,
    ) -> Result<(), StoreError> {
        let keys = self.keys().group(group);
        let current: Vec<Option<u64>> = redis::cmd("HMGET")
            .arg(&keys.config)
            .arg("ttlMs")
            .arg("renewIntervalMs")
            .arg("retryIntervalMs")
            .query_async(&mut self.conn().await?)
            .await?;
        let wanted = [
            config.ttl_ms,
            config.renew_interval_ms,
            config.retry_interval_ms,
        ];
        if current.iter().zip(wanted).all(|(c, w)| *c == Some(w)) {
            return Ok(());
        }
        let _: i64 = redis::cmd("HSET")
            .arg(&keys.config)
            .arg("ttlMs")
            .arg(config.ttl_ms)
            .arg("renewIntervalMs")
            .arg(config.renew_interval_ms)
            .arg("retryIntervalMs")
            .arg(config.retry_interval_ms)
            .query_async(&mut self.conn().await?)
            .await?;
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&keys.released)
            .arg("config")
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(())
    }

    /// Raises a group's term counter to `term` if it is lower (Redis lost
    /// it); never lowers it. Returns whether it was raised.
    pub async fn restore_term(&self, group: &str, term: u64) -> Result<bool, StoreError> {
        let key = self.keys().group(group).term;
        let reply = self.run(scripts::RESTORE_TERM.key(key).arg(term)).await?;
        Ok(as_int(&reply)? == 1)
    }
}

impl Store {
    /// Follows the engine events every node publishes on `P:events`. An
    /// event this version cannot read (from a newer node) is skipped. The
    /// subscription is kept (and renewed after reconnects)
    /// until the receiver is dropped; events published while it is down are
    /// missed, so a follower that must not miss a change also re-reads the
    /// state now and then.
    pub fn follow_events(&self) -> tokio::sync::mpsc::UnboundedReceiver<crate::Event> {
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
                    let Some(redis::Value::BulkString(payload)) = push.data.get(1) else {
                        continue;
                    };
                    match serde_json::from_slice::<crate::Event>(payload) {
                        Ok(event) => {
                            if tx.send(event).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "skipped an event this version cannot read")
                        }
                    }
                }
            }
        });
        rx
    }
}
