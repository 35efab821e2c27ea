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
    let store: &Store = &shared.store;
    let inbox = store.keys().inbox(&shared.id);
    let commands = store.keys().commands(&shared.id);
    let mut after = "0-0".to_owned();
    let mut after_command = "0-0".to_owned();
    let mut conn = None;
    let mut backoff = Backoff::default();
    let mut watch = Watch {
        threshold: config.lag_threshold,
        lagging: false,
        dropped: 0,
    };
    let buffered = |tx: &mpsc::Sender<Delivery>| (INBOX_BUFFER - tx.capacity()) as u64;
    loop {
        // With the buffer full (or the application's inbox dropped), read
        // commands only: wait for room, and on every lag-check tick read the
        // command stream without blocking and report the backlog.
        let full = tx.is_closed() || tx.capacity() == 0;
        if full {
            tokio::select! {
                permit = tx.reserve(), if !tx.is_closed() => {
                    if let Ok(permit) = permit {
                        drop(permit);
                        continue;
                    }
                }
                _ = tokio::time::sleep(LAG_CHECK_INTERVAL) => {}
            }
        }
        if conn.is_none() {
            match bounded(INBOX_BLOCK, store.reader_connection()).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    report(&shared, &e);
                    backoff.wait().await;
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let room = if full {
            COMMANDS_MAX as usize
        } else {
            tx.capacity().min(INBOX_BATCH)
        };
        let block = (!full).then(|| INBOX_BLOCK.as_millis() as u64);
        let both = [
            (commands.as_str(), after_command.as_str()),
            (inbox.as_str(), after.as_str()),
        ];
        let streams = if full { &both[..1] } else { &both[..] };
        let read = bounded(
            INBOX_BLOCK + Duration::from_secs(5),
            Store::read_streams(c, streams, room, block),
        )
        .await;
        let entries = match read {
            Ok(entries) => entries,
            Err(e) => {
                conn = None;
                report(&shared, &e);
                backoff.wait().await;
                continue;
            }
        };
        backoff.reset();
        let (mut read_commands, mut read_inbox) = (false, false);
        for (stream, e) in entries {
            let id = e.stream_id.clone();
            if stream == 0 {
                after_command = id;
                read_commands = true;
            } else {
                after = id;
                read_inbox = true;
            }
            match entry(e) {
                // Fails only once the application dropped its inbox: then
                // its messages have nobody to go to, and commands still do.
                Entry::Deliver(d) => {
                    let _ = tx.send(d).await;
                }
                Entry::Command { from, payload } => {
                    let _ = shared.commands.send((from, payload));
                }
            }
        }
        if read_commands {
            if let Err(e) = bounded(
                INBOX_BLOCK,
                store.ack_commands(&shared.id, &next_stream_id(&after_command)),
            )
            .await
            {
                report(&shared, &e);
            }
        }
        if read_inbox {
            match bounded(
                INBOX_BLOCK,
                store.ack_inbox(&shared.id, &next_stream_id(&after)),
            )
            .await
            {
                Ok((backlog, dropped)) => watch.observe(&shared, backlog + buffered(&tx), dropped),
                Err(e) => report(&shared, &e),
            }
        } else if full {
            if let Ok((backlog, dropped)) =
                bounded(LAG_CHECK_INTERVAL * 10, store.inbox_state(&shared.id)).await
            {
                watch.observe(&shared, backlog + buffered(&tx), dropped);
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
