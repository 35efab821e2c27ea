//! Lease writes confirmed by the replicas. Redis replicates asynchronously,
//! so a replica promoted by a failover may miss the last lease write: a
//! claim the old primary granted would be granted again, under the same
//! term, to another node. A claim or renewal therefore counts only once
//! `WAIT` says the write reached the replicas it must reach; an unconfirmed
//! one is a store error (a claim does not lead, a renewal demotes).
//!
//! The replicas it must reach are those in sync (`state=online` in `INFO
//! replication`). A replica still in its full sync (waiting for the
//! diskless delay, loading the snapshot) acknowledges nothing until the
//! sync is over, 5 s or more on Redis's defaults: waiting for it would hold
//! every claim for that long after each failover, when the old primary
//! rejoins. It has none of the writes yet, and a promotion of it is a new
//! replication history, which the claim script meets as a store born again
//! (docs/redis.md, "Waiting for replicas"). Its loss still counts, as the
//! loss of one in sync does: a primary whose replica (synced or syncing)
//! went away confirms nothing alone for [`REPLICA_LOSS_GRACE`], since the
//! replica may have been promoted while this primary still takes writes.
//!
//! `WAIT` goes in the same request as the script, on the same connection,
//! so it covers that write and costs no round trip of its own; had it gone
//! apart, a reconnection in between would have run it on a fresh
//! connection that made no write, and it would have confirmed nothing as
//! if it were the write. Its own timeout fits in half the caller's bound on
//! the call, so a wait that runs its course is still answered ("not
//! confirmed") before the caller gives up: an answer, not a silence. With
//! no replica (the default policy, [`ReplicaAcks::All`], on a lone Redis)
//! nothing is waited for.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{Cmd, Script, ScriptInvocation, Value};

use crate::config::{REPLICA_COUNT_REFRESH, REPLICA_LOSS_GRACE, REPLICA_WAIT};
use crate::store::StoreError;

/// How many replicas a lease write must reach before it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaAcks {
    /// Every replica the primary reports in sync (`state=online` in `INFO
    /// replication`, re-read at most once a second): safe when replicas
    /// exist, free when there are none. The default.
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
    /// How long one `WAIT` may block at most (`--redis-replica-wait-ms`);
    /// less when the caller's bound on the call is shorter (see
    /// [`Replication::write`]).
    pub wait: Duration,
    known: Mutex<Option<Replicas>>,
}

/// What one primary said of its replicas.
#[derive(Debug, Clone, Copy)]
struct Replicas {
    /// Which primary (the route's count of primaries found when read).
    primary: u64,
    read_at: Instant,
    /// Replicas in sync (`state=online`).
    online: u64,
    /// The most this primary had in sync, and when it last had that many:
    /// fewer count only after [`REPLICA_LOSS_GRACE`].
    most_online: u64,
    most_online_at: Instant,
    /// Replicas attached in any state (`connected_slaves`: in sync or in
    /// their full sync), and the most within the grace, likewise.
    attached: u64,
    most_attached: u64,
    most_attached_at: Instant,
}

/// One reading of `INFO replication`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Count {
    online: u64,
    attached: u64,
}

/// `(count, when)`: the new count if it is no smaller, or the grace since
/// the larger one has passed; else the larger one kept.
fn most_within_grace(most: u64, at: Instant, count: u64, now: Instant) -> (u64, Instant) {
    if count >= most || now.duration_since(at) >= REPLICA_LOSS_GRACE {
        (count, now)
    } else {
        (most, at)
    }
}

impl Replicas {
    /// The first reading of a primary: a new one (a failover, a Cluster
    /// slot moved) goes by its own count from the start. A promoted replica
    /// has none in sync at first; what it confirms alone and then loses
    /// with it is covered by the store born again after the next promotion
    /// (a new replication history: no lease for one ttl, a new term epoch),
    /// as docs/redis.md says, not by waiting for replicas it does not have.
    fn first(primary: u64, now: Instant, count: Count) -> Self {
        Self {
            primary,
            read_at: now,
            online: count.online,
            most_online: count.online,
            most_online_at: now,
            attached: count.attached,
            most_attached: count.attached,
            most_attached_at: now,
        }
    }

    /// The next reading of the same primary.
    fn then(self, now: Instant, count: Count) -> Self {
        let (most_online, most_online_at) =
            most_within_grace(self.most_online, self.most_online_at, count.online, now);
        let (most_attached, most_attached_at) = most_within_grace(
            self.most_attached,
            self.most_attached_at,
            count.attached,
            now,
        );
        Self {
            read_at: now,
            online: count.online,
            most_online,
            most_online_at,
            attached: count.attached,
            most_attached,
            most_attached_at,
            ..self
        }
    }

    /// How many replicas a write must reach: those in sync, and more while
    /// the primary lost any within the grace. A primary that a failover
    /// deposed loses its replicas at the promotion, and nodes may write to
    /// it for a moment more: it must not confirm alone meanwhile, whether
    /// the replica it lost was in sync (as many as it had in sync are
    /// wanted) or still in its full sync (one more than it has in sync for
    /// each one gone: Sentinel may promote a replica in its full sync).
    fn wanted(&self) -> u64 {
        let gone = self.most_attached.saturating_sub(self.attached);
        self.most_online.max(self.online + gone)
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
    /// the script's reply and what `WAIT` said. The caller gives up on the
    /// call after `within`: the `WAIT` blocks for half of that at most, so
    /// that its "not confirmed" comes back in time.
    /// `primary` says which primary `conn` leads to (see
    /// `Store::primaries_found`).
    pub async fn write(
        &self,
        conn: &mut ConnectionManager,
        primary: u64,
        script: &Script,
        call: &ScriptInvocation<'_>,
        within: Duration,
    ) -> Result<(Value, Confirmation), StoreError> {
        let wanted = match self.acks {
            ReplicaAcks::Off => 0,
            ReplicaAcks::AtLeast(n) => u64::from(n),
            ReplicaAcks::All => self.known(conn, primary).await?.wanted(),
        };
        let wait = self.wait_within(within);
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
                    .arg(wait.as_millis() as u64)
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
                Ok((reply, acked)) => return Ok((reply, Confirmation { wanted, acked })),
            }
        }
    }

    /// `WAIT`'s own timeout for a call the caller bounds by `within`: the
    /// configured wait, or half of `within` if that is shorter (the other
    /// half is for the script and the round trip); at least 1 ms, since 0
    /// would block for ever.
    fn wait_within(&self, within: Duration) -> Duration {
        self.wait.min(within / 2).max(Duration::from_millis(1))
    }

    /// The replicas to wait for: those the primary last said are in sync
    /// (re-read once a second), or as many as it had before if it lost
    /// some less than [`REPLICA_LOSS_GRACE`] ago.
    async fn known(
        &self,
        conn: &mut ConnectionManager,
        primary: u64,
    ) -> Result<Replicas, StoreError> {
        let now = Instant::now();
        let known = {
            let mut stored = crate::sync::locked(&self.known);
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
            known
        };
        let info: redis::RedisResult<String> = redis::cmd("INFO")
            .arg("replication")
            .query_async(conn)
            .await;
        let count = match info {
            Ok(text) => count_replicas(&text),
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
                // A user denied INFO cannot count replicas: say so once a
                // second at most, and confirm with the primary alone.
                tracing::warn!("redis user may not run INFO: lease writes are not confirmed by replicas (set the replica count explicitly)");
                Count {
                    online: 0,
                    attached: 0,
                }
            }
            Err(e) => return Err(e.into()),
        };
        let next = match known {
            Some(k) => k.then(now, count),
            None => Replicas::first(primary, now, count),
        };
        if next.wanted() > count.online {
            tracing::debug!(
                online = count.online,
                attached = count.attached,
                wanted = next.wanted(),
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
    /// How many replicas `WAIT` asked for.
    pub wanted: u64,
    /// How many it said have the write.
    pub acked: u64,
}

impl Confirmation {
    /// Whether a write that took or kept a lease counts:
    /// [`StoreError::Unconfirmed`] if too few replicas have it.
    pub fn check(self) -> Result<(), StoreError> {
        if self.acked < self.wanted {
            return Err(StoreError::Unconfirmed {
                acked: self.acked,
                wanted: self.wanted,
            });
        }
        Ok(())
    }
}

/// What an `INFO replication` answer says of the replicas: how many it
/// lists in sync (`slaveN:...,state=online,...`), and how many are
/// attached in any state (`slaveN:` lines; `connected_slaves` counts the
/// same), the others still in their full sync (`wait_bgsave`,
/// `send_bulk`), which acknowledge nothing yet.
fn count_replicas(info: &str) -> Count {
    let mut count = Count {
        online: 0,
        attached: 0,
    };
    for line in info.lines() {
        let Some((n, fields)) = line
            .trim()
            .strip_prefix("slave")
            .and_then(|r| r.split_once(':'))
        else {
            continue;
        };
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        count.attached += 1;
        if fields.split(',').any(|f| f == "state=online") {
            count.online += 1;
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(online: u64, attached: u64) -> Count {
        Count { online, attached }
    }

    #[test]
    fn fewer_replicas_count_only_after_the_grace() {
        let t0 = Instant::now();
        let r = Replicas::first(1, t0, count(2, 2));
        assert_eq!(r.wanted(), 2);
        // One gone: still two wanted, until the grace has passed since two
        // were last seen.
        let r = r.then(t0 + Duration::from_secs(1), count(1, 1));
        assert_eq!(r.wanted(), 2);
        let r = r.then(
            t0 + REPLICA_LOSS_GRACE - Duration::from_millis(1),
            count(0, 0),
        );
        assert_eq!(r.wanted(), 2);
        let r = r.then(t0 + REPLICA_LOSS_GRACE, count(0, 0));
        assert_eq!(r.wanted(), 0);
        // More count at once.
        let r = r.then(
            t0 + REPLICA_LOSS_GRACE + Duration::from_secs(1),
            count(3, 3),
        );
        assert_eq!(r.wanted(), 3);
    }

    #[test]
    fn a_replica_in_its_full_sync_is_not_waited_for_but_its_loss_is_not_believed_at_once() {
        let t0 = Instant::now();
        // Attached, syncing: nothing to wait for.
        let r = Replicas::first(1, t0, count(0, 1));
        assert_eq!(r.wanted(), 0);
        // It leaves (promoted by a failover while it synced): the primary
        // alone confirms nothing for the grace.
        let r = r.then(t0 + Duration::from_secs(1), count(0, 0));
        assert_eq!(r.wanted(), 1);
        let r = r.then(t0 + REPLICA_LOSS_GRACE, count(0, 0));
        assert_eq!(r.wanted(), 0);
        // One in sync and one syncing; the syncing one goes: one more than
        // the one in sync is wanted.
        let r = Replicas::first(1, t0, count(1, 2)).then(t0 + Duration::from_secs(1), count(1, 1));
        assert_eq!(r.wanted(), 2);
        // It finishes its sync instead: both wanted.
        let r = Replicas::first(1, t0, count(1, 2)).then(t0 + Duration::from_secs(1), count(2, 2));
        assert_eq!(r.wanted(), 2);
    }

    #[test]
    fn a_new_primary_goes_by_its_own_replicas_in_sync() {
        // A promoted replica with none in sync yet confirms alone; the
        // replica that rejoins waits for nothing in its full sync, and
        // counts once its sync is over.
        let t1 = Instant::now();
        let new = Replicas::first(2, t1, count(0, 0));
        assert_eq!(new.wanted(), 0);
        let new = new.then(t1 + Duration::from_secs(1), count(0, 1));
        assert_eq!(new.wanted(), 0);
        let new = new.then(t1 + Duration::from_secs(2), count(1, 1));
        assert_eq!(new.wanted(), 1);
    }

    #[test]
    fn replicas_are_counted_in_sync_and_attached() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=127.0.0.1,port=1,state=online,offset=10,lag=0\r\n\
            slave1:ip=127.0.0.1,port=2,state=wait_bgsave,offset=0,lag=0\r\n\
            slave2:ip=127.0.0.1,port=3,state=send_bulk,offset=0,lag=0\r\n\
            master_failover_state:no-failover\r\n";
        assert_eq!(count_replicas(info), count(1, 3));
        assert_eq!(
            count_replicas("# Replication\r\nrole:master\r\n"),
            count(0, 0)
        );
        // A replica's own INFO names its link, not replicas.
        let replica =
            "role:slave\r\nslave_read_only:1\r\nslave_priority:100\r\nmaster_link_status:up\r\n";
        assert_eq!(count_replicas(replica), count(0, 0));
    }

    #[test]
    fn the_wait_fits_in_half_the_callers_bound() {
        let r = Replication::new(ReplicaAcks::All, Duration::from_millis(250));
        assert_eq!(
            r.wait_within(Duration::from_millis(200)),
            Duration::from_millis(100)
        );
        assert_eq!(
            r.wait_within(Duration::from_secs(2)),
            Duration::from_millis(250)
        );
        assert_eq!(r.wait_within(Duration::ZERO), Duration::from_millis(1));
    }
}
