//! The messaging half of the Redis store: subscriptions in both
//! directions, publishing into inboxes (streams), the inbox reader's
//! `XREAD`s and trims, and introspection of nodes and their inboxes.

use redis::{AsyncConnectionConfig, Value};

use super::reply::{array, as_int, as_string, string_at, uint_at};
use super::stream::{next_stream_id, StreamReader};
use super::{scripts, RedisStore};
use crate::config;
use crate::store::inbox::InboxCursor;
use crate::store::messaging::{Destination, NodeInfo, Outgoing, PublishOutcome};
use crate::store::StoreError;

impl RedisStore {
    pub async fn subscribe(
        &self,
        node: &str,
        subscription: &str,
        inbox_max: u64,
    ) -> Result<u64, StoreError> {
        let reply = self
            .run(
                scripts::SUBSCRIBE
                    .key(self.keys.inbox(node))
                    .arg(self.keys.prefix())
                    .arg(node)
                    .arg(subscription)
                    .arg(inbox_max),
            )
            .await?;
        Ok(as_int(&reply)?.max(0) as u64)
    }

    pub async fn unsubscribe(&self, node: &str, subscription: &str) -> Result<bool, StoreError> {
        let reply = self
            .run(
                scripts::UNSUBSCRIBE
                    .arg(self.keys.prefix())
                    .arg(node)
                    .arg(subscription),
            )
            .await?;
        Ok(as_int(&reply)? == 1)
    }

    /// Publishes a batch in one script (publish.lua). The call is one
    /// `EVALSHA` built in place: a script invocation would copy each of the
    /// five arguments per message into a vector of its own first.
    pub async fn publish(
        &self,
        from: &str,
        messages: &[Outgoing],
    ) -> Result<Vec<PublishOutcome>, StoreError> {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(scripts::PUBLISH.get_hash())
            .arg(0)
            .arg(self.keys.prefix())
            .arg(from);
        for m in messages {
            let (mode, name) = match &m.destination {
                Destination::Topic(t) => ("topic", t),
                Destination::Node(n) => ("direct", n),
                Destination::Command(n) => ("command", n),
            };
            let retain = m.retain_ms.map_or(-1, |ms| ms.min(i64::MAX as u64) as i64);
            evalsha
                .arg(mode)
                .arg(name)
                .arg(&m.payload[..])
                .arg(if m.refuse_when_full { "refuse" } else { "drop" })
                .arg(retain);
        }
        let reply = as_string(&self.evalsha(&scripts::PUBLISH, &evalsha).await?)?;
        let words: Vec<&str> = reply.split(' ').filter(|w| !w.is_empty()).collect();
        if words.len() != messages.len() * 2 {
            return Err(StoreError::Reply(format!(
                "publish: {} words for {} messages",
                words.len(),
                messages.len()
            )));
        }
        let bad = |word: &str| StoreError::Reply(format!("publish: {word:?} is no number"));
        words
            .chunks(2)
            .map(|pair| {
                let (first, second) = (pair[0], pair[1]);
                Ok(match first {
                    "-1" => PublishOutcome::InboxFull {
                        node: second.to_owned(),
                    },
                    "-2" => PublishOutcome::NotLive {
                        node: second.to_owned(),
                    },
                    id => PublishOutcome::Delivered {
                        id: id.parse().map_err(|_| bad(id))?,
                        reached: second.parse().map_err(|_| bad(second))?,
                    },
                })
            })
            .collect()
    }

    /// A reader on a connection of its own: a blocked `XREAD` must never
    /// hold up the shared command connection.
    pub async fn inbox_reader(&self, node: &str) -> Result<StreamReader, StoreError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config::CONNECT_TIMEOUT))
            .set_response_timeout(None);
        let conn = self
            .client()
            .await?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(StreamReader::new(
            conn,
            self.keys.commands(node),
            self.keys.inbox(node),
        ))
    }

    /// Trims a node's command stream up to and including `read`.
    pub async fn ack_commands(&self, node: &str, read: &InboxCursor) -> Result<(), StoreError> {
        let _: Value = redis::cmd("XTRIM")
            .arg(self.keys.commands(node))
            .arg("MINID")
            .arg(next_stream_id(&read.0))
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(())
    }

    /// Trims the inbox up to and including `read`; returns (backlog,
    /// dropped so far).
    pub async fn ack_inbox(
        &self,
        node: &str,
        read: &InboxCursor,
        taken: u64,
    ) -> Result<(u64, u64), StoreError> {
        let reply = self
            .run(
                scripts::ACK
                    .key(self.keys.inbox(node))
                    .key(self.keys.node(node))
                    .arg(next_stream_id(&read.0))
                    .arg(taken),
            )
            .await?;
        let items = array(reply)?;
        Ok((uint_at(&items, 0)?, uint_at(&items, 1)?))
    }

    pub async fn inbox_state(&self, node: &str) -> Result<(u64, u64), StoreError> {
        let (backlog, dropped): (u64, Option<u64>) = redis::pipe()
            .cmd("XLEN")
            .arg(self.keys.inbox(node))
            .cmd("HGET")
            .arg(self.keys.node(node))
            .arg("dropped")
            .query_async(&mut self.conn().await?)
            .await?;
        Ok((backlog, dropped.unwrap_or(0)))
    }

    pub async fn subscriptions(&self, node: &str) -> Result<Vec<String>, StoreError> {
        let mut subs: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys.node_subs(node))
            .query_async(&mut self.conn().await?)
            .await?;
        subs.sort();
        Ok(subs)
    }

    pub async fn list_nodes(&self) -> Result<Vec<NodeInfo>, StoreError> {
        let reply = self
            .run(
                scripts::LIST_NODES
                    .key(self.keys.nodes())
                    .arg(self.keys.prefix()),
            )
            .await?;
        let items = array(reply)?;
        let now = uint_at(&items, 0)?;
        let rows = match items.get(1) {
            Some(Value::Array(rows)) => rows.clone(),
            _ => Vec::new(),
        };
        let mut nodes = Vec::with_capacity(rows.len());
        for row in rows {
            let row = array(row)?;
            let lease_until_ms = uint_at(&row, 1)?;
            let groups = string_at(&row, 6)?;
            nodes.push(NodeInfo {
                id: string_at(&row, 0)?,
                lease_until_ms,
                registered_at_ms: uint_at(&row, 2)?,
                last_heartbeat_ms: uint_at(&row, 3)?,
                backlog: uint_at(&row, 4)?,
                dropped: uint_at(&row, 5)?,
                groups: groups
                    .split(',')
                    .filter(|g| !g.is_empty())
                    .map(str::to_owned)
                    .collect(),
                live: lease_until_ms > now,
            });
        }
        Ok(nodes)
    }
}
