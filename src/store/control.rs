//! What the controller writes for a group: its timings from the custom
//! resource, and a term that Redis lost.

use super::{as_int, scripts, Store, StoreError};
use crate::config::ElectionConfig;

impl Store {
    /// Writes a group's timings; nodes apply them at their next claim or
    /// renewal.
    pub async fn write_group_config(
        &self,
        group: &str,
        config: &ElectionConfig,
    ) -> Result<(), StoreError> {
        let key = self.keys().group(group).config;
        let _: i64 = redis::cmd("HSET")
            .arg(key)
            .arg("ttlMs")
            .arg(config.ttl_ms)
            .arg("renewIntervalMs")
            .arg(config.renew_interval_ms)
            .arg("retryIntervalMs")
            .arg(config.retry_interval_ms)
            .query_async(&mut self.conn())
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
