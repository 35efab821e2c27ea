//! The inbox reader: one task per node that blocks on the node's inbox stream
//! on a dedicated connection and hands entries to the node's [`Inbox`].
//!
//! It only reads as many entries as the local buffer has room for, so a slow
//! consumer's backlog stays in Redis (where it is bounded and counted), and
//! after handing entries over it trims them from the stream: the stream is
//! exactly the unread backlog. The same read takes the node's command
//! stream (engine commands such as a step-down). While the buffer is full,
//! or the application dropped its inbox, it waits for room and, every
//! [`LAG_CHECK_INTERVAL`], reads the command stream without blocking and
//! re-checks the backlog to report lag: an application that stops draining
//! its inbox still steps down when the controller asks.
//!
//! [`Inbox`]: super::Inbox

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::message::{Delivery, Message};
use crate::backoff::Backoff;
use crate::config::{
    InboxConfig, COMMANDS_MAX, INBOX_BATCH, INBOX_BLOCK, INBOX_BUFFER, LAG_CHECK_INTERVAL,
};
use crate::events::{Event, Operation};
use crate::incarnation::Incarnation;
use crate::store::messaging::InboxEntry;
use crate::store::{bounded, Store, StoreError};

/// The id just after `id` (`ms-seq` -> `ms-(seq+1)`): the exclusive lower
/// bound that trims everything up to and including `id`.
fn next_stream_id(id: &str) -> String {
    match id
        .split_once('-')
        .and_then(|(ms, seq)| Some((ms, seq.parse::<u64>().ok()?)))
    {
        Some((ms, seq)) => format!("{ms}-{}", seq + 1),
        None => id.to_owned(),
    }
}

fn text(bytes: Option<&[u8]>) -> String {
    bytes
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// What an inbox entry is for.
enum Entry {
    /// For the application, through its [`super::Inbox`].
    Deliver(Delivery),
    /// For the engine itself.
    Command { from: String, payload: Vec<u8> },
}

fn entry(entry: InboxEntry) -> Entry {
    match entry.get("k") {
        Some(b"recovered") => return Entry::Deliver(Delivery::Recovered),
        Some(b"command") => {
            let from = text(entry.get("f"));
            let payload = entry.get("p").map(<[u8]>::to_vec).unwrap_or_default();
            return Entry::Command { from, payload };
        }
        _ => {}
    }
    let topic = text(entry.get("t"));
    Entry::Deliver(Delivery::Message(Message {
        id: text(entry.get("i")).parse().unwrap_or_default(),
        topic: (!topic.is_empty()).then_some(topic),
        from: text(entry.get("f")),
        retained: entry.get("r").is_some(),
        payload: entry
            .fields
            .into_iter()
            .find(|(name, _)| name == b"p")
            .map(|(_, value)| value)
            .unwrap_or_default(),
    }))
}

#[cfg(test)]
fn delivery(e: InboxEntry) -> Delivery {
    match entry(e) {
        Entry::Deliver(d) => d,
        Entry::Command { .. } => panic!("a command"),
    }
}

/// Lag and drop reporting: lag once per crossing of the threshold.
struct Watch {
    threshold: u64,
    lagging: bool,
    dropped: u64,
}

impl Watch {
    fn observe(&mut self, shared: &Incarnation, backlog: u64, dropped: u64) {
        if dropped > self.dropped {
            shared.events.emit(Event::Dropped {
                node: shared.id.clone(),
                count: dropped - self.dropped,
                total: dropped,
            });
        }
        self.dropped = dropped;
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
        inbox: shared.store.keys().inbox(&shared.id),
        commands: shared.store.keys().commands(&shared.id),
        after: "0-0".to_owned(),
        after_command: "0-0".to_owned(),
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

/// The reader's state between two reads: where each stream was read up
/// to, its connection, and what was last reported of the backlog.
struct Reader {
    shared: Arc<Incarnation>,
    tx: mpsc::Sender<Delivery>,
    inbox: String,
    commands: String,
    /// The last inbox entry read.
    after: String,
    /// The last command entry read.
    after_command: String,
    conn: Option<redis::aio::MultiplexedConnection>,
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

    /// One read of the command stream and, unless the buffer is full, the
    /// inbox, blocking up to [`INBOX_BLOCK`] for the first entry.
    async fn read(&mut self, full: bool) -> Result<Vec<(usize, InboxEntry)>, StoreError> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => bounded(INBOX_BLOCK, self.shared.store.reader_connection()).await?,
        };
        let conn = self.conn.insert(conn);
        let room = if full {
            COMMANDS_MAX as usize
        } else {
            self.tx.capacity().min(INBOX_BATCH)
        };
        let block = (!full).then(|| INBOX_BLOCK.as_millis() as u64);
        let both = [
            (self.commands.as_str(), self.after_command.as_str()),
            (self.inbox.as_str(), self.after.as_str()),
        ];
        let streams = if full { &both[..1] } else { &both[..] };
        bounded(
            INBOX_BLOCK + Duration::from_secs(5),
            Store::read_streams(conn, streams, room, block),
        )
        .await
    }

    /// Hands each entry on: messages to the application, commands to the
    /// command task. Returns whether commands and messages were read.
    async fn dispatch(&mut self, entries: Vec<(usize, InboxEntry)>) -> (bool, bool) {
        let (mut read_commands, mut read_inbox) = (false, false);
        for (stream, e) in entries {
            let id = e.stream_id.clone();
            if stream == 0 {
                self.after_command = id;
                read_commands = true;
            } else {
                self.after = id;
                read_inbox = true;
            }
            match entry(e) {
                // Fails only once the application dropped its inbox: then
                // its messages have nobody to go to, and commands still do.
                Entry::Deliver(d) => {
                    let _ = self.tx.send(d).await;
                }
                Entry::Command { from, payload } => {
                    let _ = self.shared.commands.send((from, payload));
                }
            }
        }
        (read_commands, read_inbox)
    }

    /// Acknowledges what was read, and reports the backlog (also when the
    /// buffer is full and nothing of the inbox was read).
    async fn ack(&mut self, read_commands: bool, read_inbox: bool, full: bool) {
        let (shared, store) = (&self.shared, &self.shared.store);
        if read_commands {
            let up_to = next_stream_id(&self.after_command);
            if let Err(e) = bounded(INBOX_BLOCK, store.ack_commands(&shared.id, &up_to)).await {
                report(shared, &e);
            }
        }
        if read_inbox {
            let up_to = next_stream_id(&self.after);
            match bounded(INBOX_BLOCK, store.ack_inbox(&shared.id, &up_to)).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_stream_id_bounds_the_trim() {
        assert_eq!(next_stream_id("1700000000000-0"), "1700000000000-1");
        assert_eq!(next_stream_id("5-41"), "5-42");
    }

    #[test]
    fn entries_become_deliveries() {
        let marker = InboxEntry {
            stream_id: "1-0".into(),
            fields: vec![(b"k".to_vec(), b"recovered".to_vec())],
        };
        assert_eq!(delivery(marker), Delivery::Recovered);
        let fields = [("i", "7"), ("t", ""), ("f", "ns/a"), ("p", "hi")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        let direct = InboxEntry {
            stream_id: "1-1".into(),
            fields,
        };
        assert_eq!(
            delivery(direct),
            Delivery::Message(Message {
                id: 7,
                topic: None,
                from: "ns/a".into(),
                payload: b"hi".to_vec(),
                retained: false
            })
        );
    }
}
