//! What an operator process sets for a group from outside its nodes: the
//! timings the nodes adopt, the members it prefers, and a term that Redis
//! lost.

use super::reply::{Flag, Votes};
use super::{scripts, RedisStore};
use crate::config::ElectionConfig;
use crate::store::{SpecVote, StoreError};

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

    /// The preferred members, space-separated in the `preferred` field of
    /// the group's config hash (node ids hold no spaces), which claim.lua
    /// reads only when the seat is free. Written only when it changed.
    pub async fn write_preferred(
        &self,
        group: &str,
        preferred: Option<&[String]>,
    ) -> Result<(), StoreError> {
        let key = self.keys().group(group).config;
        let wanted = preferred.map(|p| p.join(" "));
        let current: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("preferred")
            .query_async(&mut self.conn().await?)
            .await?;
        if current == wanted {
            return Ok(());
        }
        let cmd = match &wanted {
            Some(list) => {
                let mut c = redis::cmd("HSET");
                c.arg(&key).arg("preferred").arg(list);
                c
            }
            None => {
                let mut c = redis::cmd("HDEL");
                c.arg(&key).arg("preferred");
                c
            }
        };
        let _: i64 = cmd.query_async(&mut self.conn().await?).await?;
        Ok(())
    }

    /// Cluster `cluster`'s timings for `group` (vote_spec.lua), and every
    /// cluster's.
    pub async fn vote_spec(
        &self,
        group: &str,
        cluster: &str,
        config: &ElectionConfig,
        refresh_ms: u64,
    ) -> Result<Vec<SpecVote>, StoreError> {
        let key = self.keys().group(group).specs;
        self.run(
            "vote_spec.lua",
            scripts::VOTE_SPEC
                .key(key)
                .arg(cluster)
                .arg(config.ttl_ms)
                .arg(config.renew_interval_ms)
                .arg(config.retry_interval_ms)
                .arg(refresh_ms),
        )
        .await
        .map(|Votes(v)| v)
    }

    pub async fn withdraw_spec(&self, group: &str, cluster: &str) -> Result<(), StoreError> {
        let key = self.keys().group(group).specs;
        let cmd = redis::cmd("HDEL").arg(&key).arg(cluster).clone();
        let _: i64 = cmd.query_async(&mut self.conn().await?).await?;
        Ok(())
    }

    pub async fn restore_term(&self, group: &str, term: u64) -> Result<bool, StoreError> {
        let key = self.keys().group(group).term;
        self.run("restore_term.lua", scripts::RESTORE_TERM.key(key).arg(term))
            .await
            .map(|Flag(raised)| raised)
    }
}
