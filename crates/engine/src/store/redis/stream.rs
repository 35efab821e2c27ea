//! The inbox reader's half on Redis: a node's command stream and inbox
//! stream read with one `XREAD BLOCK` on a connection of its own, and
//! their entries (fields written by publish.lua) read into the
//! interface's entries.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, Value};

use crate::store::inbox::{Cursors, Entry, InboxCursor, Message, Queue, Read};
use crate::store::StoreError;

/// Reads a node's command stream and inbox stream, `XREAD BLOCK` on a
/// connection of its own.
pub(crate) struct StreamReader {
    conn: MultiplexedConnection,
    commands: String,
    inbox: String,
}

impl StreamReader {
    pub fn new(conn: MultiplexedConnection, commands: String, inbox: String) -> Self {
        Self {
            conn,
            commands,
            inbox,
        }
    }

    pub async fn read(
        &mut self,
        after: &Cursors,
        room: usize,
        block: Option<Duration>,
        commands_only: bool,
    ) -> Result<Vec<Read>, StoreError> {
        let both = [
            (self.commands.as_str(), stream_id(&after.commands)),
            (self.inbox.as_str(), stream_id(&after.inbox)),
        ];
        let streams = if commands_only { &both[..1] } else { &both[..] };
        let block_ms = block.map(|b| b.as_millis() as u64);
        let entries = read_streams(&mut self.conn, streams, room, block_ms).await?;
        Ok(entries
            .into_iter()
            .map(|(index, mut e)| Read {
                queue: if index == 0 {
                    Queue::Commands
                } else {
                    Queue::Inbox
                },
                cursor: InboxCursor(std::mem::take(&mut e.stream_id)),
                entry: entry(e),
            })
            .collect())
    }
}

/// Entries after the given ids in the given streams (`(key, after)`),
/// blocking up to `block_ms` for one if given; each entry comes with the
/// index of its stream.
async fn read_streams(
    conn: &mut MultiplexedConnection,
    streams: &[(&str, &str)],
    count: usize,
    block_ms: Option<u64>,
) -> Result<Vec<(usize, StreamEntry)>, StoreError> {
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
        xread.arg(after);
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
        let name = String::from_redis_value(pair.pop().expect("two items"));
        let name = name.map_err(|_| bad("stream name"))?;
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
            let stream_id = String::from_redis_value(pair.pop().expect("two items"));
            let stream_id = stream_id.map_err(|_| bad("id"))?;
            let mut fields = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(name), Some(value)) = (it.next(), it.next()) {
                fields.push((into_bytes(name)?, into_bytes(value)?));
            }
            entries.push((index, StreamEntry { stream_id, fields }));
        }
    }
    Ok(entries)
}

fn into_bytes(v: Value) -> Result<Vec<u8>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        other => Err(StoreError::Reply(format!("inbox field: {other:?}"))),
    }
}

/// The id `XREAD` reads after: the cursor's, or the start of the stream.
fn stream_id(cursor: &InboxCursor) -> &str {
    if cursor.0.is_empty() {
        "0-0"
    } else {
        &cursor.0
    }
}

/// One stream entry as `XREAD` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StreamEntry {
    stream_id: String,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl StreamEntry {
    /// The value of field `name` (entries have a handful of fields).
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }
}

/// The id just after `id` (`ms-seq` -> `ms-(seq+1)`): the exclusive lower
/// bound that trims everything up to and including `id`.
pub(super) fn next_stream_id(id: &str) -> String {
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

/// An entry's fields (see publish.lua) read into what it is.
fn entry(mut entry: StreamEntry) -> Entry {
    if let [(name, _)] = entry.fields.as_slice() {
        if name == b"m" {
            let (_, packed) = entry.fields.pop().expect("one field");
            return unpack(packed);
        }
    }
    match entry.get("k") {
        Some(b"recovered") => return Entry::Recovered,
        Some(b"command") => {
            let from = text(entry.get("f"));
            let payload = entry.get("p").map(<[u8]>::to_vec).unwrap_or_default();
            return Entry::Command { from, payload };
        }
        _ => {}
    }
    let topic = text(entry.get("t"));
    Entry::Message(Message {
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
    })
}

/// A packed entry, `ID TOPIC SENDER\nPAYLOAD` (publish.lua): the payload
/// stays in the value's buffer (the header is drained off its front).
fn unpack(mut packed: Vec<u8>) -> Entry {
    let header_end = packed
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(packed.len());
    let header = String::from_utf8_lossy(&packed[..header_end]);
    let mut parts = header.splitn(3, ' ');
    let id = parts.next().unwrap_or_default().parse().unwrap_or_default();
    let topic = parts.next().unwrap_or_default();
    let topic = (!topic.is_empty()).then(|| topic.to_owned());
    let from = parts.next().unwrap_or_default().to_owned();
    packed.drain(..(header_end + 1).min(packed.len()));
    Entry::Message(Message {
        id,
        topic,
        from,
        retained: false,
        payload: packed,
    })
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
    fn packed_entries_become_messages() {
        let packed = |value: &[u8]| StreamEntry {
            stream_id: "1-2".into(),
            fields: vec![(b"m".to_vec(), value.to_vec())],
        };
        assert_eq!(
            entry(packed(b"9 orders.created ns/a\nline one\nline two")),
            Entry::Message(Message {
                id: 9,
                topic: Some("orders.created".into()),
                from: "ns/a".into(),
                payload: b"line one\nline two".to_vec(),
                retained: false
            })
        );
        assert_eq!(
            entry(packed(b"10  ns/b\n")),
            Entry::Message(Message {
                id: 10,
                topic: None,
                from: "ns/b".into(),
                payload: Vec::new(),
                retained: false
            })
        );
    }

    #[test]
    fn entries_become_deliveries() {
        let marker = StreamEntry {
            stream_id: "1-0".into(),
            fields: vec![(b"k".to_vec(), b"recovered".to_vec())],
        };
        assert_eq!(entry(marker), Entry::Recovered);
        let fields = [("i", "7"), ("t", ""), ("f", "ns/a"), ("p", "hi")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        let direct = StreamEntry {
            stream_id: "1-1".into(),
            fields,
        };
        assert_eq!(
            entry(direct),
            Entry::Message(Message {
                id: 7,
                topic: None,
                from: "ns/a".into(),
                payload: b"hi".to_vec(),
                retained: false
            })
        );
    }
}
