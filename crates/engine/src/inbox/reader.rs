//! The inbox reader: one task per node that waits on the node's inbox in
//! the store, on a reader of its own, and hands entries to the node's
//! [`Inbox`].
//!
//! It only reads as many entries as the local buffer has room for, so a slow
//! consumer's backlog stays in the store (where it is bounded and counted),
//! and after handing entries over it acknowledges them, which removes them:
//! the inbox in the store is exactly the unread backlog. The same read takes
//! the node's command queue (engine commands such as a step-down). While the buffer is full,
//! or the application dropped its inbox, it waits for room and, every
//! [`LAG_CHECK_INTERVAL`], reads the command queue without waiting and
//! re-checks the backlog to report lag: an application that stops draining
//! its inbox still steps down when the controller asks.
//!
//! [`Inbox`]: super::Inbox

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::message::Delivery;
use crate::backoff::Backoff;
use crate::config::{
    InboxConfig, COMMANDS_MAX, INBOX_BATCH, INBOX_BLOCK, INBOX_BUFFER, LAG_CHECK_INTERVAL,
};
use crate::events::{Event, Operation};
use crate::incarnation::Incarnation;
use crate::store::inbox::{Cursors, Entry, Queue, Read};
use crate::store::InboxReader;
use crate::store::{bounded, StoreError};

/// Lag and drop reporting: lag once per crossing of the threshold.
struct Watch {
    threshold: u64,
    lagging: bool,
    dropped: u64,
}

impl Watch {
    fn observe(&mut self, shared: &Incarnation, backlog: u64, dropped: u64) {
        shared.events.observe_backlog(backlog);
        if dropped > self.dropped {
            shared.events.emit(Event::Dropped {
                node: shared.id.clone(),
                count: dropped - self.dropped,
                total: dropped,
            });
        }
        // An ack may take drops back off the store's count (entries dropped
        // after the reader took them): what was reported stays reported.
        self.dropped = self.dropped.max(dropped);
        if backlog > self.threshold && !self.lagging {
            shared.events.emit(Event::Lag {
                node: shared.id.clone(),
                backlog,
            });
        }
        self.lagging = backlog > self.threshold;
    }
}

pub(crate) async fn run(shared: Arc<Incarnation>, config: InboxConfig, tx: mpsc::Sender<Delivery>) {
    let mut reader = Reader {
        after: Cursors::default(),
        unacked: 0,
        conn: None,
        backoff: Backoff::default(),
        watch: Watch {
            threshold: config.lag_threshold,
            lagging: false,
            dropped: 0,
        },
        shared,
        tx,
    };
    loop {
        // With the buffer full (or the application's inbox dropped), read
        // commands only: wait for room, and on every lag-check tick read the
        // command stream without blocking and report the backlog.
        let full = reader.tx.is_closed() || reader.tx.capacity() == 0;
        if full && reader.room_came().await {
            continue;
        }
        let entries = match reader.read(full).await {
            Ok(entries) => entries,
            Err(e) => {
                reader.conn = None;
                report(&reader.shared, &e);
                reader.backoff.wait().await;
                continue;
            }
        };
        reader.backoff.reset();
        let (read_commands, read_inbox) = reader.dispatch(entries).await;
        reader.ack(read_commands, read_inbox, full).await;
    }
}

/// The reader's state between two reads: where each queue was read up
/// to, its connection, and what was last reported of the backlog.
struct Reader {
    shared: Arc<Incarnation>,
    tx: mpsc::Sender<Delivery>,
    /// The last entries read.
    after: Cursors,
    /// Inbox entries read since the last ack: the store takes those that
    /// a publisher dropped meanwhile off the drop count.
    unacked: u64,
    conn: Option<InboxReader>,
    backoff: Backoff,
    watch: Watch,
}

impl Reader {
    /// Messages read but not yet taken by the application.
    fn buffered(&self) -> u64 {
        (INBOX_BUFFER - self.tx.capacity()) as u64
    }

    /// With the buffer full, waits for room or a lag-check tick; true if
    /// room came (read everything again).
    async fn room_came(&self) -> bool {
        tokio::select! {
            permit = self.tx.reserve(), if !self.tx.is_closed() => permit.is_ok(),
            _ = tokio::time::sleep(LAG_CHECK_INTERVAL) => false,
        }
    }

    /// One read of the command queue and, unless the buffer is full, the
    /// inbox, waiting up to [`INBOX_BLOCK`] for the first entry.
    async fn read(&mut self, full: bool) -> Result<Vec<Read>, StoreError> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => {
                let store = &self.shared.store;
                bounded(INBOX_BLOCK, store.inbox_reader(&self.shared.id)).await?
            }
        };
        let conn = self.conn.insert(conn);
        let room = if full {
            COMMANDS_MAX as usize
        } else {
            self.tx.capacity().min(INBOX_BATCH)
        };
        let block = (!full).then_some(INBOX_BLOCK);
        bounded(
            INBOX_BLOCK + Duration::from_secs(5),
            conn.read(&self.after, room, block, full),
        )
        .await
    }

    /// Hands each entry on: messages to the application, commands to the
    /// command task. Returns whether commands and messages were read.
    async fn dispatch(&mut self, entries: Vec<Read>) -> (bool, bool) {
        let (mut read_commands, mut read_inbox) = (false, false);
        for read in entries {
            match read.queue {
                Queue::Commands => {
                    self.after.commands = read.cursor;
                    read_commands = true;
                }
                Queue::Inbox => {
                    self.after.inbox = read.cursor;
                    self.unacked += 1;
                    read_inbox = true;
                }
            }
            let delivery = match read.entry {
                Entry::Recovered => Delivery::Recovered,
                Entry::Message(m) => Delivery::Message(m),
                Entry::Command { from, payload } => {
                    let _ = self.shared.commands.send((from, payload));
                    continue;
                }
            };
            // Fails only once the application dropped its inbox: then
            // its messages have nobody to go to, and commands still do.
            let _ = self.tx.send(delivery).await;
        }
        (read_commands, read_inbox)
    }

    /// Acknowledges what was read, and reports the backlog (also when the
    /// buffer is full and nothing of the inbox was read).
    async fn ack(&mut self, read_commands: bool, read_inbox: bool, full: bool) {
        let (shared, store) = (&self.shared, &self.shared.store);
        if read_commands {
            let read = &self.after.commands;
            if let Err(e) = bounded(INBOX_BLOCK, store.ack_commands(&shared.id, read)).await {
                report(shared, &e);
            }
        }
        if read_inbox {
            let read = &self.after.inbox;
            // Forgotten also when the ack fails: one that took effect
            // unanswered must not count its entries twice (a drop counted
            // that was none is the safer mistake).
            let taken = std::mem::take(&mut self.unacked);
            match bounded(INBOX_BLOCK, store.ack_inbox(&shared.id, read, taken)).await {
                Ok((backlog, dropped)) => {
                    let buffered = self.buffered();
                    self.watch.observe(shared, backlog + buffered, dropped);
                }
                Err(e) => report(shared, &e),
            }
        } else if full {
            if let Ok((backlog, dropped)) =
                bounded(LAG_CHECK_INTERVAL * 10, store.inbox_state(&shared.id)).await
            {
                let buffered = self.buffered();
                self.watch.observe(shared, backlog + buffered, dropped);
            }
        }
    }
}

fn report(shared: &Incarnation, e: &StoreError) {
    tracing::warn!(error = %e, "inbox read failed, retrying");
    shared.events.emit(Event::StoreError {
        node: shared.id.clone(),
        during: Operation::InboxRead,
        message: e.to_string(),
    });
}
