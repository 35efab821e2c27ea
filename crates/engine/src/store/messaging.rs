//! The messaging half of the store: subscriptions in both directions,
//! publishing into inboxes, the inbox reader's reads and acknowledgements,
//! and introspection of nodes and their inboxes.

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};

use super::error::StoreError;
use super::reply::{array, as_int, as_string, string_at, uint_at};
use super::{scripts, Store};
use crate::config;

/// What a publish achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// Written into `reached` inboxes under message id `id`.
    Delivered { id: u64, reached: u64 },
    /// Refused, nothing written: this node's inbox is full (only when the
    /// publisher asked for a bounded backlog).
    InboxFull { node: String },
    /// A direct message's target is not a live node; nothing written.
    NotLive { node: String },
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Every live subscriber of this topic (including pattern subscribers).
    Topic(String),
    /// One live node.
    Node(String),
    /// One live node's engine, which acts on it itself (e.g. a step-down
    /// command from the controller) instead of handing it to the inbox.
    Command(String),
}

/// One message to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub destination: Destination,
    pub payload: Vec<u8>,
    /// Refuse this message (nothing written) when an inbox is at its limit,
    /// instead of dropping that inbox's oldest messages.
    pub refuse_when_full: bool,
    /// `None` does not retain; `Some(0)` retains without expiry.
    pub retain_ms: Option<u64>,
}

/// One inbox entry as read from Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEntry {
    pub stream_id: String,
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl InboxEntry {
    /// The value of field `name` (entries have a handful of fields).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }
}

fn into_bytes(v: Value) -> Result<Vec<u8>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        other => Err(StoreError::Reply(format!("inbox field: {other:?}"))),
    }
}

/// A registered node as seen in Redis, for operators and dashboards.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeInfo {
    pub id: String,
    /// Lease expiry, ms since the epoch on the Redis clock.
    pub lease_until_ms: u64,
    pub registered_at_ms: u64,
    pub last_heartbeat_ms: u64,
    /// Unread messages in its inbox.
    pub backlog: u64,
    /// Messages dropped from its inbox because it was full.
    pub dropped: u64,
    pub groups: Vec<String>,
    /// Whether the lease is still valid (Redis clock).
    pub live: bool,
}

impl Store {
    /// Subscribes `node` to a topic or pattern; retained messages it covers
    /// go to the node's inbox first. Returns how many were delivered.
    pub(crate) async fn subscribe(
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

    /// Returns whether the node was subscribed.
    pub(crate) async fn unsubscribe(
        &self,
        node: &str,
        subscription: &str,
    ) -> Result<bool, StoreError> {
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

    /// Publishes a batch of messages from `from`, in order, in one script:
    /// each message is written into the inbox of every live subscriber of
    /// its topic (or of its one node) atomically. Batching shares the per-call
    /// costs; it changes nothing a subscriber can observe.
    pub(crate) async fn publish(
        &self,
        from: &str,
        messages: &[Outgoing],
    ) -> Result<Vec<PublishOutcome>, StoreError> {
        let mut invocation = scripts::PUBLISH.arg(self.keys.prefix());
        invocation.arg(from);
        for m in messages {
            let (mode, name) = match &m.destination {
                Destination::Topic(t) => ("topic", t),
                Destination::Node(n) => ("direct", n),
                Destination::Command(n) => ("command", n),
            };
            let retain = m.retain_ms.map_or(-1, |ms| ms.min(i64::MAX as u64) as i64);
            invocation
                .arg(mode)
                .arg(name)
                .arg(&m.payload[..])
                .arg(if m.refuse_when_full { "refuse" } else { "drop" })
                .arg(retain);
        }
        let items = array(self.run(&mut invocation).await?)?;
        if items.len() != messages.len() * 2 {
            return Err(StoreError::Reply(format!(
                "publish: {} values for {} messages",
                items.len(),
                messages.len()
            )));
        }
        items
            .chunks(2)
            .map(|pair| {
                Ok(match as_int(super::reply::at(pair, 0)?)? {
                    -1 => PublishOutcome::InboxFull {
                        node: string_at(pair, 1)?,
                    },
                    -2 => PublishOutcome::NotLive {
                        node: string_at(pair, 1)?,
                    },
                    id => PublishOutcome::Delivered {
                        id: u64::try_from(id)
                            .map_err(|_| StoreError::Reply(format!("publish: {id}")))?,
                        reached: uint_at(pair, 1)?,
                    },
                })
            })
            .collect()
    }

    /// A connection of its own for blocking inbox reads: a blocked read must
    /// never hold up the shared command connection.
    pub(crate) async fn reader_connection(&self) -> Result<MultiplexedConnection, StoreError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config::CONNECT_TIMEOUT))
            .set_response_timeout(None);
        Ok(self
            .client()
            .await?
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// Entries after the given ids in the given streams (`(key, after)`),
    /// blocking up to `block_ms` for one if given; each entry comes with the
    /// index of its stream.
    pub(crate) async fn read_streams(
        conn: &mut MultiplexedConnection,
        streams: &[(&str, &str)],
        count: usize,
        block_ms: Option<u64>,
    ) -> Result<Vec<(usize, InboxEntry)>, StoreError> {
        // Parsed by hand from the raw reply: the generic stream types build a
        // map per entry, which is most of the reader's cost at high rates.
        let mut xread = redis::cmd("XREAD");
        xread.arg("COUNT").arg(count);
        if let Some(ms) = block_ms {
            xread.arg("BLOCK").arg(ms);
        }
        xread.arg("STREAMS");
        for (key, _) in streams {
            xread.arg(*key);
        }
        for (_, after) in streams {
            xread.arg(*after);
        }
        let reply: Value = xread.query_async(conn).await?;
        let bad = |what: &str| StoreError::Reply(format!("XREAD reply: {what}"));
        let items = match reply {
            Value::Nil => return Ok(Vec::new()),
            Value::Array(streams) => streams,
            // RESP3 answers with a map of stream name to entries.
            Value::Map(pairs) => pairs
                .into_iter()
                .map(|(k, v)| Value::Array(vec![k, v]))
                .collect(),
            _ => return Err(bad("not an array")),
        };
        let mut entries = Vec::new();
        for item in items {
            // [name, entries] per stream that has any.
            let Value::Array(mut pair) = item else {
                return Err(bad("stream"));
            };
            if pair.len() != 2 {
                return Err(bad("stream shape"));
            }
            let list = pair.pop().expect("two items");
            let name = as_string(&pair.pop().expect("two items"))?;
            let index = streams
                .iter()
                .position(|(key, _)| *key == name)
                .ok_or_else(|| bad("unknown stream"))?;
            let Value::Array(list) = list else {
                return Err(bad("entries"));
            };
            for item in list {
                let Value::Array(mut pair) = item else {
                    return Err(bad("entry"));
                };
                if pair.len() != 2 {
                    return Err(bad("entry shape"));
                }
                let flat = match pair.pop() {
                    Some(Value::Array(flat)) => flat,
                    _ => return Err(bad("fields")),
                };
                let stream_id = match pair.pop() {
                    Some(v) => as_string(&v)?,
                    None => return Err(bad("id")),
                };
                let mut fields = Vec::with_capacity(flat.len() / 2);
                let mut it = flat.into_iter();
                while let (Some(name), Some(value)) = (it.next(), it.next()) {
                    fields.push((into_bytes(name)?, into_bytes(value)?));
                }
                entries.push((index, InboxEntry { stream_id, fields }));
            }
        }
        Ok(entries)
    }

    /// Trims a node's command stream below `first_unread`.
    pub(crate) async fn ack_commands(
        &self,
        node: &str,
        first_unread: &str,
    ) -> Result<(), StoreError> {
        let _: Value = redis::cmd("XTRIM")
            .arg(self.keys.commands(node))
            .arg("MINID")
            .arg(first_unread)
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(())
    }

    /// Trims the inbox below `first_unread`; returns (backlog, dropped so far).
    pub(crate) async fn ack_inbox(
        &self,
        node: &str,
        first_unread: &str,
    ) -> Result<(u64, u64), StoreError> {
        let reply = self
            .run(
                scripts::ACK
                    .key(self.keys.inbox(node))
                    .key(self.keys.node(node))
                    .arg(first_unread),
            )
            .await?;
        let items = array(reply)?;
        Ok((uint_at(&items, 0)?, uint_at(&items, 1)?))
    }

    /// Unread messages in a node's inbox and its drop count.
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

    /// The topics and patterns a node subscribes to, sorted.
    pub async fn subscriptions(&self, node: &str) -> Result<Vec<String>, StoreError> {
        let mut subs: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys.node_subs(node))
            .query_async(&mut self.conn().await?)
            .await?;
        subs.sort();
        Ok(subs)
    }

    /// Every registered node, earliest lease expiry first.
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

    /// Live nodes per group, from the nodes' registrations.
    pub async fn nodes_per_group(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let mut counts = BTreeMap::new();
        for node in self.list_nodes().await?.into_iter().filter(|n| n.live) {
            for group in node.groups {
                *counts.entry(group).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }
}
