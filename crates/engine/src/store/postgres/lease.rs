//! The election's half of the PostgreSQL store: claim, renew and release of
//! a group's lease, its state, the timings and term an operator sets, and
//! the settings that weaken the guarantees. The rules are the functions of
//! sql/v1.sql; each call here is one round trip.
//!
//! Why each compare-and-set is safe at READ COMMITTED: `claim` and `renew`
//! lock the group's row (`SELECT ... FOR UPDATE`, after `INSERT ... ON
//! CONFLICT DO NOTHING` made sure it exists) before they read the clock and
//! decide, so two claims of one group run one after the other and the
//! second sees the first's commit; `claim` also locks the store's one row
//! when it changes the store's birth, epoch or history. `release` is one
//! `UPDATE` whose `WHERE` is checked again on the newest row version after
//! a concurrent writer commits.

use super::handle::{failed, Answer, PgStore};
use super::session::Op;
use crate::config::ElectionConfig;
use crate::store::candidacy::Candidacy;
use crate::store::outcome::{
    adopted_timings, deferral, Claim, GroupState, Handover, Renewal, SpecVote,
};
use crate::store::safety::SettingWarning;
use crate::store::StoreError;

/// A u64 from the engine as PostgreSQL's bigint.
pub(super) fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A bigint column of `row` (a term, a time, a count) as the engine's u64.
pub(super) fn count(row: &Answer, column: &str) -> Result<u64, StoreError> {
    Ok(row.get::<i64>(column)?.max(0) as u64)
}

/// A text column of `row` that only some outcomes set ("" when NULL).
pub(super) fn text(row: &Answer, column: &str) -> Result<String, StoreError> {
    Ok(row.get::<Option<String>>(column)?.unwrap_or_default())
}

/// A priority as PostgreSQL's int (at most MAX_PRIORITY, so it fits).
fn priority(p: u32) -> i32 {
    i32::try_from(p).unwrap_or(i32::MAX)
}

/// The group's timings in a row of `claim` or `renew`, when set and valid.
fn timings(row: &Answer) -> Result<Option<ElectionConfig>, StoreError> {
    let ms = |column| -> Result<_, StoreError> {
        Ok(row
            .get::<Option<i64>>(column)?
            .and_then(|n| u64::try_from(n).ok()))
    };
    Ok(adopted_timings(
        ms("o_ttl_ms")?,
        ms("o_renew_interval_ms")?,
        ms("o_retry_interval_ms")?,
    ))
}

impl PgStore {
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim(
        &self,
        group: &str,
        id: &str,
        incarnation: &str,
        ttl_ms: u64,
        seen_term: u64,
        candidacy: &Candidacy,
        _within: std::time::Duration,
    ) -> Result<Claim, StoreError> {
        let session = self.session().await.map_err(failed)?;
        let history = &session.history_key;
        let started_ms = session.history.started_us / 1000;
        let rows = self
            .query_on(
                &session,
                Op::Claim,
                &[
                    &group,
                    &id,
                    &incarnation,
                    &big(ttl_ms),
                    &big(seen_term),
                    &big(candidacy.ms),
                    &history,
                    &started_ms,
                    &priority(candidacy.priority),
                    &big(candidacy.defer_ms),
                    &candidacy.problem,
                ],
            )
            .await?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Reply("claim: no row".into()))?;
        let term = count(&row, "o_term")?;
        let config = timings(&row)?;
        Ok(if row.get("o_won")? {
            Claim::Won {
                term,
                fresh: row.get("o_fresh")?,
                config,
            }
        } else {
            Claim::Lost {
                term,
                pttl_ms: row.get("o_wait_ms")?,
                holder: text(&row, "o_holder")?,
                config,
                deferred: match row.get::<Option<String>>("o_defer")? {
                    Some(reason) => Some(deferral(&reason, text(&row, "o_defer_to")?)?),
                    None => None,
                },
            }
        })
    }

    /// A renewal on PostgreSQL never hints the followers (`_hint`): on
    /// PostgreSQL 15 (to 18, by our reading) every NOTIFY wakes every
    /// listening backend of the database, whatever its channel, and each
    /// reads the queue in a transaction of its own, so a hint would cost one
    /// transaction per leasehold process connected, not per follower of the
    /// group: more than the claims it spares (docs/postgres.md).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn renew(
        &self,
        group: &str,
        id: &str,
        incarnation: &str,
        term: u64,
        ttl_ms: u64,
        candidacy: &Candidacy,
        _hint: bool,
        _within: std::time::Duration,
    ) -> Result<Renewal, StoreError> {
        let row = self
            .query_one(
                Op::Renew,
                &[
                    &group,
                    &id,
                    &incarnation,
                    &big(term),
                    &big(ttl_ms),
                    &big(candidacy.ms),
                    &priority(candidacy.priority),
                    &candidacy.problem,
                ],
            )
            .await?;
        Ok(match row.get::<i32>("o_status")? {
            1 => Renewal::Renewed {
                term: count(&row, "o_term")?,
                config: timings(&row)?,
            },
            0 => Renewal::Gone,
            _ => Renewal::Replaced {
                holder: text(&row, "o_holder")?,
                incarnation: text(&row, "o_incarnation")?,
            },
        })
    }

    pub(crate) async fn release(
        &self,
        group: &str,
        id: &str,
        incarnation: &str,
        term: Option<u64>,
        withdraw: bool,
    ) -> Result<bool, StoreError> {
        // Term 0 is never issued, so it matches no lease.
        let term = big(term.unwrap_or(0));
        let row = self
            .query_one(Op::Release, &[&group, &id, &incarnation, &term, &withdraw])
            .await?;
        row.get("released")
    }

    /// A release to a named successor (sql/v2.sql's hand_over).
    pub(crate) async fn hand_over(
        &self,
        group: &str,
        id: &str,
        incarnation: &str,
        term: u64,
        successor: &str,
        window_ms: u64,
    ) -> Result<Handover, StoreError> {
        let row = self
            .query_one(
                Op::HandOver,
                &[
                    &group,
                    &id,
                    &incarnation,
                    &big(term),
                    &successor,
                    &big(window_ms),
                ],
            )
            .await?;
        Ok(Handover::from_code(i64::from(row.get::<i32>("outcome")?)))
    }

    pub(crate) async fn write_preferred(
        &self,
        group: &str,
        preferred: Option<&[String]>,
    ) -> Result<(), StoreError> {
        self.query(Op::WritePreferred, &[&group, &preferred])
            .await
            .map(drop)
    }

    pub(crate) async fn group_state(&self, group: &str) -> Result<GroupState, StoreError> {
        let row = self.query_one(Op::GroupState, &[&group]).await?;
        let ids: Vec<String> = row.get("o_members")?;
        let until: Vec<i64> = row.get("o_until")?;
        let priorities: Vec<i32> = row.get("o_priorities")?;
        let problems: Vec<String> = row.get("o_problems")?;
        let preferred: Option<Vec<String>> = row.get("o_preferred")?;
        let pttl: Option<i64> = row.get("o_pttl")?;
        Ok(GroupState {
            holder: row.get("o_holder")?,
            term: count(&row, "o_term")?,
            lease_pttl_ms: pttl.map(|ms| ms.max(0) as u64),
            priorities: ids
                .iter()
                .cloned()
                .zip(priorities)
                .map(|(id, p)| (id, p.max(0) as u32))
                .collect(),
            problems: ids
                .iter()
                .cloned()
                .zip(problems)
                .filter(|(_, p)| !p.is_empty())
                .collect(),
            preferred: preferred.filter(|p| !p.is_empty()),
            members: ids
                .into_iter()
                .zip(until)
                .map(|(id, ms)| (id, ms.max(0) as u64))
                .collect(),
            now_ms: count(&row, "o_now")?,
        })
    }

    pub(crate) async fn write_group_config(
        &self,
        group: &str,
        config: &ElectionConfig,
    ) -> Result<(), StoreError> {
        self.query(
            Op::WriteConfig,
            &[
                &group,
                &big(config.ttl_ms),
                &big(config.renew_interval_ms),
                &big(config.retry_interval_ms),
            ],
        )
        .await
        .map(drop)
    }

    pub(crate) async fn withdraw_spec(&self, group: &str, cluster: &str) -> Result<(), StoreError> {
        self.query(Op::WithdrawSpec, &[&group, &cluster])
            .await
            .map(drop)
    }

    /// Cluster `cluster`'s timings for `group`, and every cluster's
    /// (sql/v3.sql's `vote_spec`).
    pub(crate) async fn vote_spec(
        &self,
        group: &str,
        cluster: &str,
        config: &ElectionConfig,
        refresh_ms: u64,
    ) -> Result<Vec<SpecVote>, StoreError> {
        let rows = self
            .query(
                Op::VoteSpec,
                &[
                    &group,
                    &cluster,
                    &big(config.ttl_ms),
                    &big(config.renew_interval_ms),
                    &big(config.retry_interval_ms),
                    &big(refresh_ms),
                ],
            )
            .await?;
        let vote = |row: &Answer| -> Result<SpecVote, StoreError> {
            let ms = |column| count(row, column).map(Some);
            Ok(SpecVote {
                cluster: row.get("o_cluster")?,
                config: adopted_timings(
                    ms("o_ttl_ms")?,
                    ms("o_renew_interval_ms")?,
                    ms("o_retry_interval_ms")?,
                ),
                age_ms: count(row, "o_age_ms")?,
            })
        };
        rows.iter().map(vote).collect()
    }

    pub(crate) async fn restore_term(&self, group: &str, term: u64) -> Result<bool, StoreError> {
        let rows = self.query(Op::RestoreTerm, &[&group, &big(term)]).await?;
        Ok(!rows.is_empty())
    }

    pub(crate) async fn setting_warnings(&self) -> Result<Vec<SettingWarning>, StoreError> {
        let row = self.query_one(Op::Settings, &[]).await?;
        Ok(warnings(
            &row.get::<String>("fsync")?,
            &text(&row, "synchronous_commit")?,
            &row.get::<String>("standby_names")?,
            row.get::<i64>("standbys")?,
        ))
    }
}

/// The warnings the server's settings call for: `fsync`, the default
/// `synchronous_commit` (the store's own sessions turn it on, but the
/// server's own writes, and other clients', follow the default), and
/// standbys that no commit waits for.
fn warnings(
    fsync: &str,
    synchronous_commit: &str,
    standby_names: &str,
    standbys: i64,
) -> Vec<SettingWarning> {
    let mut out = Vec::new();
    if fsync == "off" {
        out.push(SettingWarning {
            setting: "fsync",
            message: "postgres fsync is off: a crash of the host can lose or corrupt committed leases and terms; set fsync = on".into(),
        });
    }
    if synchronous_commit == "off" {
        out.push(SettingWarning {
            setting: "synchronous_commit",
            message: "postgres synchronous_commit is off by default: leasehold's own sessions commit durably, but a crash loses the last commits of every other session; set synchronous_commit = on".into(),
        });
    }
    if standbys > 0 && standby_names.trim().is_empty() {
        out.push(SettingWarning {
            setting: "synchronous_standby_names",
            message: format!(
                "postgres has {standbys} standby(s) but synchronous_standby_names is empty: a standby promoted while it lags may lack the latest leases (the store is born again then, and no lease is handed out for one ttl); name the standbys in synchronous_standby_names"
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_settings_are_named() {
        assert!(warnings("on", "on", "", 0).is_empty());
        assert!(warnings("on", "on", "ANY 1 (*)", 2).is_empty());
        let all: Vec<_> = warnings("off", "off", "", 1)
            .into_iter()
            .map(|w| w.setting)
            .collect();
        assert_eq!(
            all,
            ["fsync", "synchronous_commit", "synchronous_standby_names"]
        );
        // Each has its gauge (the daemon labels them from SETTINGS).
        assert!(all.iter().all(|s| SettingWarning::SETTINGS.contains(s)));
    }
}
