//! Lease writes confirmed by the replicas. Redis replicates asynchronously,
//! so a replica promoted by a failover may miss the last lease write: a
//! claim the old primary granted would be granted again, under the same
//! term, to another node. A claim or renewal therefore counts only once
//! `WAIT` says the write reached the replicas it must reach; an unconfirmed
//! one is a store error (a claim does not lead, a renewal demotes).
//!
//! `WAIT` runs on the connection the script ran on, right after it, so it
//! covers that write. With no replica (the default policy, [`ReplicaAcks::All`],
//! on a lone Redis) nothing is waited for.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use super::StoreError;
use crate::config::{REPLICA_COUNT_REFRESH, REPLICA_WAIT};

/// How many replicas a lease write must reach before it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaAcks {
    /// Every replica the primary reports connected (`INFO replication`,
    /// re-read at most once a second): safe when replicas exist, free when
    /// there are none. The default.
    All,
    /// At least this many, whatever the primary reports.
    AtLeast(u32),
    /// Never wait: the primary's word is enough (the behaviour of a lone
    /// Redis, or a Redis whose replicas are never promoted).
    Off,
}

/// A store's confirmation policy and what it knows of the replicas.
#[derive(Debug)]
pub(crate) struct Replication {
    pub acks: ReplicaAcks,
    /// How long one `WAIT` may block (its own timeout; at least 1 ms, since
    /// 0 would block for ever).
    pub wait: Duration,
    /// `(when read, connected replicas)`.
    known: Mutex<Option<(Instant, u64)>>,
}

impl Default for Replication {
    fn default() -> Self {
        Self::new(ReplicaAcks::All, REPLICA_WAIT)
    }
}

impl Replication {
    pub fn new(acks: ReplicaAcks, wait: Duration) -> Self {
        Self {
            acks,
            wait: wait.max(Duration::from_millis(1)),
            known: Mutex::new(None),
        }
    }

    /// Confirms the writes made so far on `conn`: returns once enough
    /// replicas have them, or [`StoreError::Unconfirmed`].
    pub async fn confirm(&self, conn: &mut ConnectionManager) -> Result<(), StoreError> {
        let wanted = match self.acks {
            ReplicaAcks::Off => return Ok(()),
            ReplicaAcks::AtLeast(n) => u64::from(n),
            ReplicaAcks::All => self.connected(conn).await?,
        };
        if wanted == 0 {
            return Ok(());
        }
        let acked: u64 = redis::cmd("WAIT")
            .arg(wanted)
            .arg(self.wait.as_millis() as u64)
            .query_async(conn)
            .await?;
        if acked < wanted {
            return Err(StoreError::Unconfirmed { acked, wanted });
        }
        Ok(())
    }

    /// Connected replicas, as the primary last said (re-read once a second).
    async fn connected(&self, conn: &mut ConnectionManager) -> Result<u64, StoreError> {
        let now = Instant::now();
        if let Some((at, count)) = *crate::locked(&self.known) {
            if now.duration_since(at) < REPLICA_COUNT_REFRESH {
                return Ok(count);
            }
        }
        let info: redis::RedisResult<String> = redis::cmd("INFO")
            .arg("replication")
            .query_async(conn)
            .await;
        let count = match info {
            Ok(text) => connected_replicas(&text),
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
                // A user denied INFO cannot count replicas: say so once a
                // second at most, and confirm with the primary alone.
                tracing::warn!("redis user may not run INFO: lease writes are not confirmed by replicas (set the replica count explicitly)");
                0
            }
            Err(e) => return Err(e.into()),
        };
        *crate::locked(&self.known) = Some((now, count));
        Ok(count)
    }
}

/// `connected_slaves` of an `INFO replication` answer (0 if absent).
fn connected_replicas(info: &str) -> u64 {
    info.lines()
        .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_count_is_read_from_info_replication() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=1,state=online\r\n";
        assert_eq!(connected_replicas(info), 2);
        assert_eq!(connected_replicas("# Replication\r\nrole:master\r\n"), 0);
    }
}
