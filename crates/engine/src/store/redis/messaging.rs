//! The messaging half of the Redis store: subscriptions in both
//! directions, publishing into inboxes (streams), the inbox reader's
//! `XREAD`s and trims, and introspection of nodes and their inboxes.

use redis::{AsyncConnectionConfig, Value};

use super::reply::{read, Flag, Int, Nodes, Published, Uint};
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
        let Int(delivered) = self
            .run(
                "subscribe.lua",
                scripts::SUBSCRIBE
                    .key(self.keys.inbox(node))
                    .arg(self.keys.prefix())
                    .arg(node)
                    .arg(subscription)
                    .arg(inbox_max),
            )
            .await?;
        Ok(delivered.max(0) as u64)
    }

    pub async fn unsubscribe(&self, node: &str, subscription: &str) -> Result<bool, StoreError> {
        self.run(
            "unsubscribe.lua",
            scripts::UNSUBSCRIBE
                .arg(self.keys.prefix())
                .arg(node)
                .arg(subscription),
        )
        .await
        .map(|Flag(was)| was)
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
        let reply = self.evalsha(&scripts::PUBLISH, &evalsha).await?;
        let Published(outcomes) = read("publish.lua", reply)?;
        if outcomes.len() != messages.len() {
            return Err(StoreError::Reply(format!(
                "publish.lua: {} outcomes for {} messages",
                outcomes.len(),
                messages.len()
            )));
        }
        Ok(outcomes)
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
        let (Uint(backlog), Uint(dropped)) = self
            .run(
                "ack.lua",
                scripts::ACK
                    .key(self.keys.inbox(node))
                    .key(self.keys.node(node))
                    .arg(next_stream_id(&read.0))
                    .arg(taken),
            )
            .await?;
        Ok((backlog, dropped))
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
        let Nodes(nodes) = self
            .run(
                "list_nodes.lua",
                scripts::LIST_NODES
                    .key(self.keys.nodes())
                    .arg(self.keys.prefix()),
            )
            .await?;
        Ok(nodes)
    }
}
