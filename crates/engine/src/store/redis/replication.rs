//! Lease writes confirmed by the replicas. Redis replicates asynchronously,
//! so a replica promoted by a failover may miss the last lease write: a
//! claim the old primary granted would be granted again, under the same
//! term, to another node. A claim or renewal therefore counts only once
//! `WAIT` says the write reached the replicas it must reach; an unconfirmed
//! one is a store error (a claim does not lead, a renewal demotes).
//!
//! `WAIT` goes in the same request as the script, on the same connection,
//! so it covers that write and costs no round trip of its own; had it gone
//! apart, a reconnection in between would have run it on a fresh
//! connection that made no write, and it would have confirmed nothing as
//! if it were the write. With no replica (the default policy,
//! [`ReplicaAcks::All`], on a lone Redis) nothing is waited for.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{Cmd, Script, ScriptInvocation, Value};

use crate::config::{REPLICA_COUNT_REFRESH, REPLICA_LOSS_GRACE, REPLICA_WAIT};
use crate::store::StoreError;

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
    known: Mutex<Option<Replicas>>,
}

/// What one primary said of its replicas.
#[derive(Debug, Clone, Copy)]
struct Replicas {
    /// Which primary (the route's count of primaries found when read).
    primary: u64,
    read_at: Instant,
    connected: u64,
    /// The most this primary had, and when it last had that many: fewer
    /// count only after [`REPLICA_LOSS_GRACE`].
    most: u64,
    most_at: Instant,
    /// The replicas the primary before this one had, and when this one was
    /// first read: a claim waits for as many for [`REPLICA_LOSS_GRACE`].
    inherited: u64,
    inherited_at: Instant,
}

/// What a lease write is expected to be, for how many replicas its `WAIT`
/// waits: a claim may hand out a new term, a renewal (or a claim that
/// expects to find its own confirmed lease standing) only extends a lease
/// already confirmed. What it turned out to be is checked after
/// ([`Confirmation::check`], [`Confirmation::check_kept`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    Claim,
    Renewal,
}

impl Replicas {
    fn first(primary: u64, now: Instant, connected: u64) -> Self {
        Self {
            primary,
            read_at: now,
            connected,
            most: connected,
            most_at: now,
            inherited: 0,
            inherited_at: now,
        }
    }

    /// The first reading of another primary (a failover, or a Cluster slot
    /// moved) after `self`, the last primary's: the replicas that primary
    /// had are still wanted by claims for the grace. A promoted replica has
    /// none at first, until the others (and the old primary, restarted)
    /// attach; a claim it alone confirmed would be lost if it failed in
    /// turn, and its first reading, taken as the truth, made it so (a term
    /// was confirmed by a primary whose one replica was not attached, and
    /// handed out again after the next failover). Renewals go by the new
    /// primary's own count: a leader keeps its lease through a graceful
    /// failover, and a renewal lost with the new primary is covered by the
    /// hold-back of the store born again after it.
    fn after(self, primary: u64, now: Instant, connected: u64) -> Self {
        Self {
            inherited: self.wanted(Write::Claim),
            ..Self::first(primary, now, connected)
        }
    }

    /// The next reading of the same primary.
    fn then(self, now: Instant, connected: u64) -> Self {
        let (most, most_at) =
            if connected >= self.most || now.duration_since(self.most_at) >= REPLICA_LOSS_GRACE {
                (connected, now)
            } else {
                (self.most, self.most_at)
            };
        let inherited = if now.duration_since(self.inherited_at) >= REPLICA_LOSS_GRACE {
            0
        } else {
            self.inherited
        };
        Self {
            read_at: now,
            connected,
            most,
            most_at,
            inherited,
            ..self
        }
    }

    /// How many replicas a write must reach.
    fn wanted(&self, write: Write) -> u64 {
        let own = self.connected.max(self.most);
        match write {
            Write::Claim => own.max(self.inherited),
            Write::Renewal => own,
        }
    }
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

    /// Runs `call` (an invocation of `script`) followed, in the same
    /// request, by a `WAIT` for the replicas the policy asks for; returns
    /// the script's reply and what `WAIT` said.
    /// `primary` says which primary `conn` leads to (see
    /// `Store::primaries_found`).
    pub async fn write(
        &self,
        conn: &mut ConnectionManager,
        primary: u64,
        write: Write,
        script: &Script,
        call: &ScriptInvocation<'_>,
    ) -> Result<(Value, Confirmation), StoreError> {
        let (new_term, kept) = match self.acks {
            ReplicaAcks::Off => (0, 0),
            ReplicaAcks::AtLeast(n) => (u64::from(n), u64::from(n)),
            ReplicaAcks::All => {
                let known = self.known(conn, primary).await?;
                (known.wanted(Write::Claim), known.wanted(Write::Renewal))
            }
        };
        let wanted = match write {
            Write::Claim => new_term,
            Write::Renewal => kept,
        };
        let mut loaded = false;
        loop {
            let result = if wanted == 0 {
                Cmd::invoke_script(call)
                    .query_async::<Value>(conn)
                    .await
                    .map(|v| (v, 0))
            } else {
                redis::pipe()
                    .invoke_script(call)
                    .cmd("WAIT")
                    .arg(wanted)
                    .arg(self.wait.as_millis() as u64)
                    .query_async::<(Value, u64)>(conn)
                    .await
            };
            match result {
                // After a restart or a failover the server may not have the
                // script yet.
                Err(e)
                    if !loaded
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.load_async(conn).await?;
                    loaded = true;
                }
                Err(e) => return Err(e.into()),
                Ok((reply, acked)) => {
                    return Ok((
                        reply,
                        Confirmation {
                            new_term,
                            kept,
                            acked,
                        },
                    ))
                }
            }
        }
    }

    /// The replicas to wait for: those the primary last said are
    /// connected (re-read once a second), or as many as it had before if it
    /// lost some less than [`REPLICA_LOSS_GRACE`] ago. On another primary,
    /// claims want the last one's count for that long (see
    /// [`Replicas::after`]).
    async fn known(
        &self,
        conn: &mut ConnectionManager,
        primary: u64,
    ) -> Result<Replicas, StoreError> {
        let now = Instant::now();
        let (known, before) = {
            let mut stored = crate::sync::locked(&self.known);
            let before = stored.filter(|k| k.primary != primary);
            let known = stored.filter(|k| k.primary == primary);
            if let Some(k) = known {
                if now.duration_since(k.read_at) < REPLICA_COUNT_REFRESH {
                    return Ok(k);
                }
                // This call reads the count again; the calls meanwhile use
                // the last one, so the leases renewed together cost one
                // INFO, not one each. (A failed read leaves the old count
                // for another refresh interval.)
                *stored = Some(Replicas { read_at: now, ..k });
            }
            (known, before)
        };
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
        let next = match (known, before) {
            (Some(k), _) => k.then(now, count),
            (None, Some(b)) => b.after(primary, now, count),
            (None, None) => Replicas::first(primary, now, count),
        };
        if next.wanted(Write::Claim) > count {
            tracing::debug!(
                connected = count,
                before = next.most,
                "the primary lost replicas: lease writes wait for as many as before for a while"
            );
        }
        *crate::sync::locked(&self.known) = Some(next);
        Ok(next)
    }
}

/// What `WAIT` said after a lease write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Confirmation {
    /// What a write that hands out a new term needs.
    pub new_term: u64,
    /// What a write that keeps a lease already confirmed (a renewal, a
    /// claim of a lease still standing) needs: the primary's own count.
    pub kept: u64,
    pub acked: u64,
}

impl Confirmation {
    /// Whether a write that handed out a new term counts:
    /// [`StoreError::Unconfirmed`] if too few replicas have it.
    pub fn check(self) -> Result<(), StoreError> {
        Self::enough(self.acked, self.new_term)
    }

    /// Whether a write that kept a lease already confirmed counts.
    pub fn check_kept(self) -> Result<(), StoreError> {
        Self::enough(self.acked, self.kept)
    }

    fn enough(acked: u64, wanted: u64) -> Result<(), StoreError> {
        if acked < wanted {
            return Err(StoreError::Unconfirmed { acked, wanted });
        }
        Ok(())
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
    fn fewer_replicas_count_only_after_the_grace() {
        let t0 = Instant::now();
        let r = Replicas::first(1, t0, 2);
        assert_eq!(r.wanted(Write::Renewal), 2);
        // One gone: still two wanted, until the grace has passed since two
        // were last seen.
        let r = r.then(t0 + Duration::from_secs(1), 1);
        assert_eq!(r.wanted(Write::Renewal), 2);
        let r = r.then(t0 + REPLICA_LOSS_GRACE - Duration::from_millis(1), 0);
        assert_eq!(r.wanted(Write::Renewal), 2);
        let r = r.then(t0 + REPLICA_LOSS_GRACE, 0);
        assert_eq!(r.wanted(Write::Renewal), 0);
        // More count at once.
        let r = r.then(t0 + REPLICA_LOSS_GRACE + Duration::from_secs(1), 3);
        assert_eq!(r.wanted(Write::Renewal), 3);
    }

    #[test]
    fn a_new_primary_inherits_the_last_ones_replicas_for_claims_for_the_grace() {
        let t0 = Instant::now();
        let old = Replicas::first(1, t0, 2).then(t0 + Duration::from_secs(10), 2);
        // Promoted, none attached yet: claims still want two; renewals go
        // by what the new primary has.
        let t1 = t0 + Duration::from_secs(20);
        let new = old.after(2, t1, 0);
        assert_eq!(new.primary, 2);
        assert_eq!(new.wanted(Write::Claim), 2);
        assert_eq!(new.wanted(Write::Renewal), 0);
        let new = new.then(t1 + Duration::from_secs(1), 1);
        assert_eq!(new.wanted(Write::Claim), 2);
        assert_eq!(new.wanted(Write::Renewal), 1);
        // After the grace the new primary's own count holds.
        let new = new.then(t1 + REPLICA_LOSS_GRACE, 1);
        assert_eq!(new.wanted(Write::Claim), 1);
        // A new primary with more replicas: all of them, at once.
        assert_eq!(old.after(3, t1, 3).wanted(Write::Claim), 3);
        // A new primary after one that had none wants none.
        let alone = Replicas::first(1, t0, 0);
        assert_eq!(alone.after(2, t1, 0).wanted(Write::Claim), 0);
    }

    #[test]
    fn the_replica_count_is_read_from_info_replication() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=1,state=online\r\n";
        assert_eq!(connected_replicas(info), 2);
        assert_eq!(connected_replicas("# Replication\r\nrole:master\r\n"), 0);
    }
}
