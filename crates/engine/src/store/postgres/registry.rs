//! The node registry on PostgreSQL: registration, heartbeats, fields of a
//! registration, sweeps of expired nodes and removal. Each is one call of a
//! function of sql/v1.sql that locks the node's row first, so a heartbeat
//! and a sweep of the same node run one after the other; sweepers skip the
//! rows another holds (`FOR UPDATE SKIP LOCKED`) instead of queueing.
//! Publishers and acks never lock the node's row (the queues' counts are
//! rows of their own), so a busy inbox does not hold up a heartbeat.

use super::handle::PgStore;
use super::lease::{big, count, text};
use super::session::Op;
use crate::store::outcome::{Heartbeat, Sweep};
use crate::store::StoreError;

impl PgStore {
    pub(crate) async fn register(
        &self,
        id: &str,
        incarnation: &str,
        lease_ms: u64,
        recovery: bool,
        subscriptions: &[String],
        metadata: &[(String, String)],
    ) -> Result<Option<String>, StoreError> {
        let fields: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        let fields = serde_json::Value::Object(fields).to_string();
        let row = self
            .query_one(
                Op::Register,
                &[
                    &id,
                    &incarnation,
                    &big(lease_ms),
                    &recovery,
                    &subscriptions,
                    &fields,
                ],
            )
            .await?;
        let previous: String = row.get("previous")?;
        Ok((!previous.is_empty() && previous != incarnation).then_some(previous))
    }

    pub(crate) async fn heartbeat(
        &self,
        id: &str,
        incarnation: &str,
        lease_ms: u64,
    ) -> Result<Heartbeat, StoreError> {
        let row = self
            .query_one(Op::Heartbeat, &[&id, &incarnation, &big(lease_ms)])
            .await?;
        Ok(match row.get::<i32>("o_status")? {
            1 => Heartbeat::Extended,
            0 => Heartbeat::Expired,
            _ => Heartbeat::Displaced {
                incarnation: text(&row, "o_incarnation")?,
            },
        })
    }

    pub(crate) async fn set_node_field(
        &self,
        id: &str,
        incarnation: &str,
        field: &str,
        value: &str,
    ) -> Result<bool, StoreError> {
        let n = self
            .execute(Op::SetField, &[&id, &incarnation, &field, &value])
            .await?;
        Ok(n == 1)
    }

    pub(crate) async fn sweep(&self, batch: usize) -> Result<Sweep, StoreError> {
        let batch = i32::try_from(batch).unwrap_or(i32::MAX);
        let row = self.query_one(Op::Sweep, &[&batch]).await?;
        let next: Option<i64> = row.get("o_next")?;
        Ok(Sweep {
            swept: row.get("o_swept")?,
            now_ms: count(&row, "o_now")?,
            next_expiry_ms: next.map(|ms| ms.max(0) as u64),
        })
    }

    pub(crate) async fn unregister(&self, id: &str, incarnation: &str) -> Result<bool, StoreError> {
        let row = self.query_one(Op::Unregister, &[&id, &incarnation]).await?;
        row.get("removed")
    }
}
