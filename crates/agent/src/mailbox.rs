//! The agent's mailbox: the node's inbox, handed to the application over
//! the local API (an event stream and a long-poll, see `api/messaging.rs`).
//!
//! Nothing is read from the inbox unless a client is waiting for the next
//! item: while no client reads, messages stay in the store, where the inbox's
//! length limit drops the oldest and counts them, and the lag threshold is
//! reported. What was read is kept in a short log, so that a client that
//! reconnects with the cursor it last saw gets what followed (if the log
//! still has it) and several clients can read one stream. The log is
//! bounded by count and by bytes; a client that falls behind its start is
//! told how many items it missed. So the agent's memory is bounded whatever
//! its clients do: the log, plus the engine's local buffer of the inbox.
//!
//! The inbox's own notices travel in the same order: `recovered` (the
//! node's lease had expired; what was published meanwhile is lost) before
//! every newer message, and `lag` and `dropped` as the engine reports them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_engine::sync::locked;
use leasehold_engine::{Delivery, Event, Inbox, Message};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::config::{MAILBOX_LOG_BYTES, MAILBOX_LOG_ITEMS};
use crate::invalid::Invalid;

/// One item of the stream a client reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Message(Message),
    /// The node came back after its registration had expired.
    Recovered,
    /// The unread backlog in the store crossed the lag threshold.
    Lag {
        backlog: u64,
    },
    /// The inbox was full: `count` of its oldest messages were dropped
    /// (`total` since the node registered).
    Dropped {
        count: u64,
        total: u64,
    },
}

impl Item {
    /// The event name in the stream, and `type` in the long-poll's JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            Item::Message(_) => "message",
            Item::Recovered => "recovered",
            Item::Lag { .. } => "lag",
            Item::Dropped { .. } => "dropped",
        }
    }

    fn size(&self) -> usize {
        match self {
            Item::Message(m) => {
                m.payload.len() + m.from.len() + m.topic.as_ref().map_or(0, String::len) + 64
            }
            _ => 64,
        }
    }

    /// The item as JSON (see its `Serialize`).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// The item as the API's JSON: an object whose keys come in alphabetical
/// order (clients that compare answers as text see one order), its payload
/// as [`crate::payload::entry`] writes it. Written straight to text for the
/// event stream, with no map in between. Nothing in it can fail to
/// serialize: every key is a string.
impl Serialize for Item {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Item::Message(m) => {
                let mut map = s.serialize_map(Some(5))?;
                map.serialize_entry("from", &m.from)?;
                map.serialize_entry("id", &m.id)?;
                crate::payload::entry(&mut map, &m.payload)?;
                map.serialize_entry("retained", &m.retained)?;
                map.serialize_entry("topic", &m.topic)?;
                map.end()
            }
            Item::Recovered => s.serialize_map(Some(0))?.end(),
            Item::Lag { backlog } => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("backlog", backlog)?;
                map.end()
            }
            Item::Dropped { count, total } => {
                let mut map = s.serialize_map(Some(2))?;
                map.serialize_entry("count", count)?;
                map.serialize_entry("total", total)?;
                map.end()
            }
        }
    }
}

/// Where a client is in the stream: after the item with this sequence
/// number, in this run of the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor(pub u64);

/// What one read returns.
#[derive(Debug, Default)]
pub struct Read {
    /// `(sequence number, item)`, in order; shared with the log, so that
    /// every client's read of a message is no copy of it.
    pub items: Vec<(u64, Arc<Item>)>,
    /// Items that left the log before this client read them.
    pub missed: u64,
}

struct Log {
    /// `(sequence number, item)`; numbers are consecutive.
    items: VecDeque<(u64, Arc<Item>)>,
    bytes: usize,
    /// The number the next item gets; the first is 1.
    next: u64,
}

impl Log {
    fn push(&mut self, item: Item) {
        self.bytes += item.size();
        self.items.push_back((self.next, Arc::new(item)));
        self.next += 1;
        while self.items.len() > MAILBOX_LOG_ITEMS
            || (self.bytes > MAILBOX_LOG_BYTES && self.items.len() > 1)
        {
            if let Some((_, old)) = self.items.pop_front() {
                self.bytes -= old.size();
            }
        }
    }

    /// Up to `max` items after `after`, and about `max_bytes` of them (at
    /// least one), and how many were lost to eviction.
    fn after(&self, after: u64, max: usize, max_bytes: usize) -> Read {
        let first = self.items.front().map_or(self.next, |(seq, _)| *seq);
        let missed = first.saturating_sub(after + 1);
        // Numbers are consecutive: the first item after `after` is found
        // by its number, not by a walk over the log.
        let skip = usize::try_from((after + 1).saturating_sub(first)).unwrap_or(usize::MAX);
        let mut bytes = 0;
        let items = self
            .items
            .iter()
            .skip(skip)
            .take(max)
            .take_while(|(_, item)| {
                let fits = bytes == 0 || bytes + item.size() <= max_bytes;
                bytes += item.size();
                fits
            })
            .cloned()
            .collect();
        Read { items, missed }
    }
}

/// See the module docs.
pub struct Mailbox {
    inbox: tokio::sync::Mutex<Option<Inbox>>,
    log: Mutex<Log>,
    /// The sequence number of the last item logged.
    grew: watch::Sender<u64>,
    /// Messages and recoveries taken from the inbox (`GET /v1/status`).
    received: AtomicU64,
    recoveries: AtomicU64,
    /// This run of the agent (its start, ms since the epoch): a cursor
    /// from another run points into a log that no longer exists.
    run: u64,
}

impl Mailbox {
    pub fn new(inbox: Option<Inbox>) -> Self {
        let run = leasehold_engine::sync::wall_clock_ms();
        Self {
            inbox: tokio::sync::Mutex::new(inbox),
            log: Mutex::new(Log {
                items: VecDeque::new(),
                bytes: 0,
                next: 1,
            }),
            grew: watch::channel(0).0,
            received: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            run,
        }
    }

    /// A cursor as clients see it: `RUN-SEQ`.
    pub fn cursor_text(&self, seq: u64) -> String {
        format!("{}-{seq}", self.run)
    }

    /// Where a client that sent `text` starts: after that item if it is
    /// from this run, else after the last item logged (only what comes
    /// next). `Err` names what is wrong with a malformed cursor.
    pub fn cursor(&self, text: Option<&str>) -> Result<Cursor, Invalid> {
        let now = Cursor(*self.grew.borrow());
        let Some(text) = text.filter(|t| !t.is_empty()) else {
            return Ok(now);
        };
        let parsed = text
            .split_once('-')
            .and_then(|(run, seq)| Some((run.parse::<u64>().ok()?, seq.parse::<u64>().ok()?)));
        match parsed {
            Some((run, seq)) if run == self.run && seq <= now.0 => Ok(Cursor(seq)),
            Some(_) => Ok(now),
            None => Err(Invalid(format!(
                "cursor {text:?} is not one this agent gave out (RUN-SEQ, two whole numbers)"
            ))),
        }
    }

    /// Messages and recoveries taken from the inbox so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.received.load(Ordering::Relaxed),
            self.recoveries.load(Ordering::Relaxed),
        )
    }

    fn push(&self, item: Item) {
        self.push_all([item]);
    }

    /// Logs `items` under one lock and announces them once, so that a read
    /// of many wakes the waiting clients once, not per item.
    fn push_all(&self, items: impl IntoIterator<Item = Item>) {
        // Announced under the lock, so `grew` never goes back when two
        // tasks push at once.
        let mut log = locked(&self.log);
        let before = log.next;
        for item in items {
            log.push(item);
        }
        if log.next != before {
            self.grew.send_replace(log.next - 1);
        }
    }

    /// Up to `max` items after `cursor` (and about `max_bytes`, at least
    /// one), waiting up to `wait` for the first when there are none yet.
    /// Reads the inbox only here, for a client that waits; what it takes at
    /// once stays under half the log's bytes, so the log still holds all of
    /// it for this client when it returns.
    pub async fn read(&self, cursor: Cursor, max: usize, max_bytes: usize, wait: Duration) -> Read {
        let deadline = tokio::time::Instant::now() + wait;
        let mut grew = self.grew.subscribe();
        loop {
            // Marked before the log is read: an item logged after the read
            // wakes `changed` below.
            grew.mark_unchanged();
            let read = locked(&self.log).after(cursor.0, max, max_bytes);
            if !read.items.is_empty() || read.missed > 0 {
                return read;
            }
            // One client at a time takes from the inbox; the others see
            // what it took through `grew`. What is ready wins over a
            // deadline that is already due (`wait=0`).
            let mut inbox = tokio::select! {
                biased;
                inbox = self.inbox.lock() => inbox,
                _ = grew.changed() => continue,
                _ = tokio::time::sleep_until(deadline) => return Read::default(),
            };
            // Taken while this client waited for the lock.
            if *self.grew.borrow() > cursor.0 {
                continue;
            }
            let Some(open) = inbox.as_mut() else {
                drop(inbox);
                tokio::time::sleep_until(deadline).await;
                return Read::default();
            };
            tokio::select! {
                biased;
                delivery = open.recv() => {
                    let Some(first) = delivery else {
                        // The node is closing: nothing more will come.
                        drop(inbox);
                        tokio::time::sleep_until(deadline).await;
                        return Read::default();
                    };
                    // What is already here comes along, up to `max` items
                    // and half the log's bytes.
                    let mut bytes = 0;
                    let mut taken = Vec::new();
                    let mut delivery = Some(first);
                    while let Some(d) = delivery {
                        bytes += match &d {
                            Delivery::Message(m) => m.payload.len(),
                            Delivery::Recovered => 0,
                        };
                        taken.push(self.item(d));
                        delivery = if taken.len() < max && bytes < MAILBOX_LOG_BYTES / 2 {
                            open.try_recv()
                        } else {
                            None
                        };
                    }
                    self.push_all(taken);
                }
                _ = grew.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return Read::default(),
            }
        }
    }

    /// The item of a delivery taken from the inbox, counted.
    fn item(&self, delivery: Delivery) -> Item {
        match delivery {
            Delivery::Message(m) => {
                self.received.fetch_add(1, Ordering::Relaxed);
                Item::Message(m)
            }
            Delivery::Recovered => {
                self.recoveries.fetch_add(1, Ordering::Relaxed);
                Item::Recovered
            }
        }
    }

    /// Logs the inbox notices among `events` (this node's lag and drops)
    /// until the node's event stream ends.
    pub async fn follow(self: Arc<Self>, node: String, mut events: broadcast::Receiver<Event>) {
        loop {
            match events.recv().await {
                Ok(Event::Lag { node: n, backlog }) if n == node => {
                    self.push(Item::Lag { backlog })
                }
                Ok(Event::Dropped {
                    node: n,
                    count,
                    total,
                }) if n == node => self.push(Item::Dropped { count, total }),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: u64, payload: &[u8]) -> Item {
        Item::Message(Message {
            id,
            topic: Some("t".into()),
            from: "ns/a".into(),
            payload: payload.to_vec(),
            retained: false,
        })
    }

    #[test]
    fn the_log_is_bounded_and_tells_a_late_reader_what_it_missed() {
        let mut log = Log {
            items: VecDeque::new(),
            bytes: 0,
            next: 1,
        };
        for i in 0..(MAILBOX_LOG_ITEMS as u64 + 10) {
            log.push(message(i, b"x"));
        }
        assert_eq!(log.items.len(), MAILBOX_LOG_ITEMS);
        let read = log.after(0, 5, usize::MAX);
        assert_eq!(read.missed, 10);
        assert_eq!(read.items[0].0, 11);
        let read = log.after(20, 5, usize::MAX);
        assert_eq!((read.missed, read.items[0].0), (0, 21));
        // A byte budget stops a read early, but never before one item.
        let read = log.after(20, 5, 1);
        assert_eq!(read.items.len(), 1);
        // Bytes: big payloads push out old items before the count does.
        log.push(message(0, &vec![0; MAILBOX_LOG_BYTES]));
        assert_eq!(
            log.items.len(),
            1,
            "one item over the byte bound is kept alone"
        );
    }

    #[test]
    fn cursors_from_this_run_resume_and_others_start_at_the_end() {
        let mailbox = Mailbox::new(None);
        mailbox.push(Item::Recovered);
        mailbox.push(Item::Lag { backlog: 3 });
        assert_eq!(mailbox.cursor(None), Ok(Cursor(2)));
        assert_eq!(mailbox.cursor(Some(&mailbox.cursor_text(1))), Ok(Cursor(1)));
        assert_eq!(mailbox.cursor(Some("1-1")), Ok(Cursor(2)), "another run");
        assert!(mailbox.cursor(Some("x")).unwrap_err().0.contains("RUN-SEQ"));
    }
}
