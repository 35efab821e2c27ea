//! What an operator process sets for a group from outside its nodes: the
//! timings the nodes adopt, and a term that Redis lost.

use super::reply::as_int;
use super::{scripts, RedisStore};
use crate::config::ElectionConfig;
use crate::store::StoreError;

impl RedisStore {
    /// Writes a group's timings, and wakes its followers on the release
    /// channel when they changed.
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

    pub async fn restore_term(&self, group: &str, term: u64) -> Result<bool, StoreError> {
        let key = self.keys().group(group).term;
        let reply = self.run(scripts::RESTORE_TERM.key(key).arg(term)).await?;
        Ok(as_int(&reply)? == 1)
    }
}
