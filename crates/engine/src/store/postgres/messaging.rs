//! The messaging half of the PostgreSQL store: subscriptions, publishing
//! into inboxes (rows of `inbox`, numbered under the lock of the node's
//! `queues` row), the inbox reader, acknowledgements, introspection of
//! nodes, engine events and the followers' wake-ups. An inbox cursor is the
//! number of the last entry taken.
//!
//! The locks that make it safe at READ COMMITTED (sql/v1.sql): everything
//! that appends to a node's queues locks its `queues` row first
//! (publishers lock all their receivers' rows in id order, before they
//! write), so entries commit in the order they are numbered; an ack locks
//! only the node's `takes` row, which a publisher locks (shared) only to
//! count a queue it finds full exactly, so acks and publishers do not
//! queue for each other, nor heartbeats for either (the node's own row,
//! which a subscribe holds only KEY SHARE); a sweep removes its batch in
//! id order, the publishers' order;
//! a batch writes its retained copies last, in topic order, so two batches
//! never wait for each other's rows; and a subscribe takes an advisory lock that
//! a batch that retains holds shared from before it reads who subscribes
//! until it commits, so a subscribe meeting a retained publish either is
//! seen by it or sees its retained copy. Expired retained copies go with
//! the sweep, a batch a pass.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use super::handle::PgStore;
use super::lease::{big, count};
use super::listener::POLL_WHILE_DOWN;
use super::session::Op;
use crate::store::inbox::{Cursors, Entry, InboxCursor, Message, Queue, Read};
use crate::store::messaging::{Destination, NodeInfo, Outgoing, PublishOutcome};
use crate::store::wakeup::{Interest, Wakeup};
use crate::store::StoreError;

/// A cursor's entry number (0: none taken yet).
fn seq(cursor: &InboxCursor) -> i64 {
    cursor.0.parse().unwrap_or(0)
}

impl PgStore {
    pub(crate) async fn subscribe(
        &self,
        node: &str,
        subscription: &str,
        inbox_max: u64,
    ) -> Result<u64, StoreError> {
        let row = self
            .query_one(Op::Subscribe, &[&node, &subscription, &big(inbox_max)])
            .await?;
        count(&row, "delivered")
    }

    pub(crate) async fn unsubscribe(
        &self,
        node: &str,
        subscription: &str,
    ) -> Result<bool, StoreError> {
        Ok(self
            .execute(Op::Unsubscribe, &[&node, &subscription])
            .await?
            == 1)
    }

    /// Publishes a batch in one call (`publish` in sql/v1.sql).
    pub(crate) async fn publish(
        &self,
        from: &str,
        messages: &[Outgoing],
    ) -> Result<Vec<PublishOutcome>, StoreError> {
        let mut modes = Vec::with_capacity(messages.len());
        let mut targets = Vec::with_capacity(messages.len());
        let mut payloads = Vec::with_capacity(messages.len());
        let mut refuse = Vec::with_capacity(messages.len());
        let mut retain = Vec::with_capacity(messages.len());
        for m in messages {
            let (mode, name) = match &m.destination {
                Destination::Topic(t) => ("topic", t.as_str()),
                Destination::Node(n) => ("direct", n.as_str()),
                Destination::Command(n) => ("command", n.as_str()),
            };
            modes.push(mode);
            targets.push(name);
            payloads.push(m.payload.as_slice());
            refuse.push(m.refuse_when_full);
            retain.push(m.retain_ms.map_or(-1, big));
        }
        let rows = self
            .query(
                Op::Publish,
                &[&from, &modes, &targets, &payloads, &refuse, &retain],
            )
            .await?;
        if rows.len() != messages.len() {
            return Err(StoreError::Reply(format!(
                "publish: {} outcomes for {} messages",
                rows.len(),
                messages.len()
            )));
        }
        rows.iter()
            .map(|row| {
                let node: String = row.get("o_node")?;
                Ok(match row.get::<i64>("o_code")? {
                    -1 => PublishOutcome::InboxFull { node },
                    -2 => PublishOutcome::NotLive { node },
                    id => PublishOutcome::Delivered {
                        id: u64::try_from(id)
                            .map_err(|_| StoreError::Reply(format!("publish: {id}")))?,
                        reached: node
                            .parse()
                            .map_err(|_| StoreError::Reply(format!("publish: {node}")))?,
                    },
                })
            })
            .collect()
    }

    /// A reader of `node`'s queues. Reads are quick statements on the
    /// shared connection; the wait for new entries is a hint from the
    /// listener.
    pub(crate) async fn inbox_reader(&self, node: &str) -> Result<PgReader, StoreError> {
        let notify = self
            .shared
            .listener
            .follow_inbox(&self.shared.endpoint, node);
        Ok(PgReader {
            store: self.clone(),
            node: node.to_owned(),
            notify,
            quiet: None,
        })
    }

    pub(crate) async fn ack_commands(
        &self,
        node: &str,
        read: &InboxCursor,
    ) -> Result<(), StoreError> {
        self.query(Op::AckCommands, &[&node, &seq(read)])
            .await
            .map(drop)
    }

    pub(crate) async fn ack_inbox(
        &self,
        node: &str,
        read: &InboxCursor,
        taken: u64,
    ) -> Result<(u64, u64), StoreError> {
        let row = self
            .query_one(Op::AckInbox, &[&node, &seq(read), &big(taken)])
            .await?;
        Ok((count(&row, "o_backlog")?, count(&row, "o_dropped")?))
    }

    pub(crate) async fn inbox_state(&self, node: &str) -> Result<(u64, u64), StoreError> {
        let rows = self.query(Op::InboxState, &[&node]).await?;
        match rows.first() {
            Some(row) => Ok((count(row, "backlog")?, count(row, "dropped")?)),
            None => Ok((0, 0)),
        }
    }

    pub(crate) async fn subscriptions(&self, node: &str) -> Result<Vec<String>, StoreError> {
        let rows = self.query(Op::Subscriptions, &[&node]).await?;
        rows.iter().map(|r| r.get("pattern")).collect()
    }

    pub(crate) async fn list_nodes(&self) -> Result<Vec<NodeInfo>, StoreError> {
        let rows = self.query(Op::ListNodes, &[]).await?;
        rows.iter()
            .map(|row| {
                let lease_until_ms = count(row, "lease_until_ms")?;
                let groups: String = row.get("groups")?;
                Ok(NodeInfo {
                    id: row.get("id")?,
                    lease_until_ms,
                    registered_at_ms: count(row, "registered_at_ms")?,
                    last_heartbeat_ms: count(row, "heartbeat_at_ms")?,
                    backlog: count(row, "backlog")?,
                    dropped: count(row, "dropped")?,
                    groups: groups
                        .split(',')
                        .filter(|g| !g.is_empty())
                        .map(str::to_owned)
                        .collect(),
                    live: lease_until_ms > count(row, "now_ms")?,
                })
            })
            .collect()
    }

    /// Announces one engine event on the events channel.
    pub(crate) async fn emit_event(&self, json: &str) -> Result<(), StoreError> {
        let channel = self.shared.listener.events_channel().to_owned();
        self.query(Op::Notify, &[&channel, &json]).await.map(drop)
    }

    /// The engine events every node announces.
    pub(crate) fn follow_events(&self) -> mpsc::UnboundedReceiver<Vec<u8>> {
        self.shared.listener.follow_events(&self.shared.endpoint)
    }

    /// Passes the groups' wake-ups to `sink` until `interest`'s sender is
    /// gone. Every group's hints come (one channel for all), and the
    /// campaigns not in `interest` ignore theirs.
    pub(crate) async fn listen(&self, mut interest: Interest, sink: mpsc::UnboundedSender<Wakeup>) {
        let listener = &self.shared.listener;
        listener.follow_groups(&self.shared.endpoint, sink.clone());
        while interest.changed().await.is_some() {}
        listener.unfollow_groups(&sink);
    }
}

/// Reads one node's queues; pokes from the listener end its waits.
pub(crate) struct PgReader {
    store: PgStore,
    node: String,
    notify: Arc<Notify>,
    /// After a wait that no poke ended: the cursors read up to and the
    /// listener's generation throughout. A read from the same cursors on
    /// the same listener finds nothing new, and waits without a statement.
    quiet: Option<(String, String, u64)>,
}

impl PgReader {
    pub(crate) async fn read(
        &mut self,
        after: &Cursors,
        room: usize,
        block: Option<Duration>,
        commands_only: bool,
    ) -> Result<Vec<Read>, StoreError> {
        // Armed before the read: a hint that comes between the read and
        // the wait still ends the wait.
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let listening = self.store.shared.listener.listening();
        let quiet = matches!((&self.quiet, listening), (Some((c, i, g)), Some(now))
            if *c == after.commands.0 && *i == after.inbox.0 && *g == now);
        self.quiet = None;
        if !quiet || block.is_none() {
            let reads = self.read_now(after, room, commands_only).await?;
            if !reads.is_empty() || block.is_none() {
                return Ok(reads);
            }
        }
        let block = block.unwrap_or_default();
        let wait = if listening.is_some() {
            block
        } else {
            block.min(POLL_WHILE_DOWN)
        };
        if tokio::time::timeout(wait, notified).await.is_err()
            && listening.is_some()
            && self.store.shared.listener.listening() == listening
        {
            // No poke on a listener that stayed up: nothing came.
            self.quiet = listening.map(|g| (after.commands.0.clone(), after.inbox.0.clone(), g));
            return Ok(Vec::new());
        }
        self.read_now(after, room, commands_only).await
    }

    async fn read_now(
        &self,
        after: &Cursors,
        room: usize,
        commands_only: bool,
    ) -> Result<Vec<Read>, StoreError> {
        let room = i64::try_from(room).unwrap_or(i64::MAX);
        let rows = self
            .store
            .query(
                Op::Read,
                &[
                    &self.node,
                    &seq(&after.commands),
                    &seq(&after.inbox),
                    &room,
                    &commands_only,
                ],
            )
            .await?;
        let mut reads: Vec<(i16, i64, Read)> = rows
            .into_iter()
            .map(|row| {
                let queue: i16 = row.get("queue")?;
                let seq: i64 = row.get("seq")?;
                let entry = match row.get("kind")? {
                    "recovered" => Entry::Recovered,
                    "command" => Entry::Command {
                        from: row.get("sender")?,
                        payload: row.get("payload")?,
                    },
                    _ => {
                        let topic: String = row.get("topic")?;
                        Entry::Message(Message {
                            id: count(&row, "msg_id")?,
                            topic: (!topic.is_empty()).then_some(topic),
                            from: row.get("sender")?,
                            payload: row.get("payload")?,
                            retained: row.get("retained")?,
                        })
                    }
                };
                let read = Read {
                    queue: if queue == 0 {
                        Queue::Commands
                    } else {
                        Queue::Inbox
                    },
                    cursor: InboxCursor(seq.to_string()),
                    entry,
                };
                Ok((queue, seq, read))
            })
            .collect::<Result<_, StoreError>>()?;
        // Commands first, each queue in order.
        reads.sort_by_key(|(queue, seq, _)| (*queue, *seq));
        Ok(reads.into_iter().map(|(_, _, read)| read).collect())
    }
}
