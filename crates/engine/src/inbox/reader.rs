//! The inbox reader: one task per node that waits on the node's inbox in
//! the store, on a reader of its own, and hands entries to the node's
//! [`Inbox`].
//!
//! It only reads as many entries as the local buffer has room for, so a slow
//! consumer's backlog stays in the store (where it is bounded and counted),
//! and after handing entries over it acknowledges them, which removes them:
//! the inbox in the store is exactly the unread backlog. The acknowledgement
//! goes out together with the next read (on the shared connection, the read
//! on the reader's own), so a busy inbox pays one round trip per read, not
//! two; the read only takes entries after the ones acknowledged, so the two
//! never touch the same entries. The same read takes the node's command
//! queue (engine commands such as a step-down). While the buffer is full,
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
    // What the last read took and is not yet acknowledged.
    let mut taken = Taken::default();
    loop {
        // With the buffer full (or the application's inbox dropped), read
        // commands only: wait for room, and on every lag-check tick read the
        // command stream without blocking and report the backlog.
        let full = reader.tx.is_closed() || reader.tx.capacity() == 0;
        if full {
            // Acknowledged at once: the wait for room may be long.
            reader.acknowledge(std::mem::take(&mut taken)).await;
            if reader.room_came().await {
                continue;
            }
        }
        let entries = match reader.read(full, std::mem::take(&mut taken)).await {
            Ok(entries) => entries,
            Err(e) => {
                reader.conn = None;
                report(&reader.shared, &e);
                reader.backoff.wait().await;
                continue;
            }
        };
        reader.backoff.reset();
        taken = reader.dispatch(entries).await;
        taken.full = full;
    }
}

/// What one read took, to acknowledge with the next.
#[derive(Debug, Default, Clone, Copy)]
struct Taken {
    commands: bool,
    inbox: bool,
    /// The buffer was full: only commands were read, and the backlog is
    /// read for the lag report instead.
    full: bool,
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
    /// With the buffer full, waits for room or a lag-check tick; true if
    /// room came (read everything again).
    async fn room_came(&self) -> bool {
        tokio::select! {
            permit = self.tx.reserve(), if !self.tx.is_closed() => permit.is_ok(),
            _ = tokio::time::sleep(LAG_CHECK_INTERVAL) => false,
        }
    }

    /// One read of the command queue and, unless the buffer is full, the
    /// inbox, waiting up to [`INBOX_BLOCK`] for the first entry; `taken`
    /// (what the previous read took) is acknowledged meanwhile, and its
    /// answer reported as soon as it comes.
    async fn read(&mut self, full: bool, taken: Taken) -> Result<Vec<Read>, StoreError> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => {
                let store = &self.shared.store;
                match bounded(INBOX_BLOCK, store.inbox_reader(&self.shared.id)).await {
                    Ok(conn) => conn,
                    Err(e) => {
                        self.acknowledge(taken).await;
                        return Err(e);
                    }
                }
            }
        };
        let Reader {
            shared,
            tx,
            after,
            unacked,
            conn: slot,
            watch,
            ..
        } = self;
        let conn = slot.insert(conn);
        let room = if full {
            COMMANDS_MAX as usize
        } else {
            tx.capacity().min(INBOX_BATCH)
        };
        let block = (!full).then_some(INBOX_BLOCK);
        // Polled first, so the acknowledgement is sent before the read.
        let acknowledged = acknowledge(shared, tx, after, unacked, watch, taken);
        let read = bounded(
            INBOX_BLOCK + Duration::from_secs(5),
            conn.read(after, room, block, full),
        );
        let ((), entries) = tokio::join!(acknowledged, read);
        entries
    }

    /// Acknowledges `taken` now (see [`acknowledge`]).
    async fn acknowledge(&mut self, taken: Taken) {
        let Reader {
            shared,
            tx,
            after,
            unacked,
            watch,
            ..
        } = self;
        acknowledge(shared, tx, after, unacked, watch, taken).await;
    }

    /// Hands each entry on: messages to the application, commands to the
    /// command task. Returns what was taken from each queue.
    async fn dispatch(&mut self, entries: Vec<Read>) -> Taken {
        let mut taken = Taken::default();
        for read in entries {
            match read.queue {
                Queue::Commands => {
                    self.after.commands = read.cursor;
                    taken.commands = true;
                }
                Queue::Inbox => {
                    self.after.inbox = read.cursor;
                    self.unacked += 1;
                    taken.inbox = true;
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
        taken
    }
}

/// Acknowledges what was taken, and reports the backlog (also when the
/// buffer is full and nothing of the inbox was read). Fields of the
/// [`Reader`], so that the next read can borrow its connection meanwhile.
async fn acknowledge(
    shared: &Incarnation,
    tx: &mpsc::Sender<Delivery>,
    after: &Cursors,
    unacked: &mut u64,
    watch: &mut Watch,
    taken: Taken,
) {
    let store = &shared.store;
    // Messages read but not yet taken by the application.
    let buffered = || (INBOX_BUFFER - tx.capacity()) as u64;
    if taken.commands {
        if let Err(e) = bounded(INBOX_BLOCK, store.ack_commands(&shared.id, &after.commands)).await
        {
            report(shared, &e);
        }
    }
    if taken.inbox {
        // Forgotten also when the ack fails: one that took effect
        // unanswered must not count its entries twice (a drop counted
        // that was none is the safer mistake).
        let count = std::mem::take(unacked);
        match bounded(
            INBOX_BLOCK,
            store.ack_inbox(&shared.id, &after.inbox, count),
        )
        .await
        {
            Ok((backlog, dropped)) => watch.observe(shared, backlog + buffered(), dropped),
            Err(e) => report(shared, &e),
        }
    } else if taken.full {
        if let Ok((backlog, dropped)) =
            bounded(LAG_CHECK_INTERVAL * 10, store.inbox_state(&shared.id)).await
        {
            watch.observe(shared, backlog + buffered(), dropped);
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
