//! The messaging half of the agent's API: publishing (one message, or a
//! batch), direct sends and subscriptions through the node, and the mailbox
//! read as an event stream (Server-Sent Events) or by long-poll. A single
//! publish takes the request body as the payload, raw bytes; a batch and
//! every read carry payloads in JSON as [`crate::payload`] spells them.

use std::time::Duration;

use bytes::Bytes;
use leasehold_daemon::http::{Head, Response};
use leasehold_engine::{Error, Outbound, Overflow, PublishOptions, Retain, To};
use serde::Deserialize;
use serde_json::json;

use super::state::{error, json, State};
use crate::config::{
    BATCH_MAX_MESSAGES, EVENT_STREAM_BATCH, EVENT_STREAM_CHUNK_BYTES, EVENT_STREAM_KEEPALIVE,
    LONG_POLL_DEFAULT_MAX, LONG_POLL_DEFAULT_WAIT_MS, LONG_POLL_MAX_BYTES, LONG_POLL_MAX_ITEMS,
    LONG_POLL_MAX_WAIT_MS,
};
use crate::invalid::Invalid;
use crate::mailbox::{Cursor, Item, Read};
use crate::payload;

/// The answer for an engine error: the status says whose fault it is, the
/// body names the limit or the value at fault.
fn refused(e: Error) -> Response {
    let (status, body) = refusal(&e);
    json(status, &body)
}

fn refusal(e: &Error) -> (u16, serde_json::Value) {
    let text = e.to_string();
    match e {
        Error::DataTooLarge { size, max } => {
            (413, json!({ "error": text, "size": size, "max": max }))
        }
        Error::InBatch { index, source } => {
            let (status, mut body) = refusal(source);
            body["error"] = json!(format!("messages[{index}]: {source}"));
            body["index"] = json!(index);
            (status, body)
        }
        Error::InboxFull(_) => (429, json!({ "error": text })),
        Error::NodeNotRegistered(_) => (404, json!({ "error": text })),
        Error::Topic(_) | Error::Config(_) => (400, json!({ "error": text })),
        // Redis did not answer, or this node was displaced.
        _ => (503, json!({ "error": text })),
    }
}

/// A whole-number query parameter within `min..=max`, or the 400 that names it.
fn number(head: &Head, name: &str, default: u64, min: u64, max: u64) -> Result<u64, Response> {
    let Some(text) = head.query(name) else {
        return Ok(default);
    };
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(error(
            400,
            format!(
                "{name} = {text:?} is out of range: it must be a whole number from {min} to {max}"
            ),
        )),
    }
}

fn required(head: &Head, name: &str, what: &str) -> Result<String, Response> {
    head.query(name).filter(|v| !v.is_empty()).ok_or_else(|| {
        error(
            400,
            format!("the query parameter {name} (the {what}) is missing"),
        )
    })
}

/// Publish options from their parts, or what is wrong with them, naming the
/// field as `at` spells it (`` for query parameters, `messages[3].` in a
/// batch) and saying how retain is turned on there (`retain_on`).
fn options_from(
    at: &str,
    retain_on: &str,
    retain: bool,
    retain_ttl_ms: Option<u64>,
    overflow: Option<&str>,
) -> Result<PublishOptions, Invalid> {
    let max_ttl = leasehold_engine::config::MAX_RETAIN_MS;
    let retain = match (retain, retain_ttl_ms) {
        (false, None) => Retain::No,
        (false, Some(_)) => return Err(Invalid(format!("{at}retainTtlMs needs {retain_on}"))),
        (true, None) => Retain::Forever,
        (true, Some(ms)) if (1..=max_ttl).contains(&ms) => Retain::For(Duration::from_millis(ms)),
        (true, Some(ms)) => {
            return Err(Invalid(format!(
            "{at}retainTtlMs = {ms} is out of range: it must be a whole number from 1 to {max_ttl}"
        )))
        }
    };
    let overflow = match overflow {
        None | Some("dropOldest") => Overflow::DropOldest,
        Some("refuse") => Overflow::Refuse,
        Some(other) => {
            return Err(Invalid(format!(
                "{at}overflow = {other:?} is invalid: it must be dropOldest or refuse"
            )))
        }
    };
    Ok(PublishOptions { retain, overflow })
}

fn options(head: &Head) -> Result<PublishOptions, Response> {
    let retain = match head.query("retain").as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(error(
                400,
                format!("retain = {other:?} is invalid: it must be true or false"),
            ))
        }
    };
    let ttl = match head.query("retainTtlMs") {
        None => None,
        Some(_) => Some(number(
            head,
            "retainTtlMs",
            0,
            1,
            leasehold_engine::config::MAX_RETAIN_MS,
        )?),
    };
    options_from(
        "",
        "retain=true",
        retain,
        ttl,
        head.query("overflow").as_deref(),
    )
    .map_err(|e| error(400, e.0))
}

/// `POST /v1/publish?topic=T[&retain=true[&retainTtlMs=N]][&overflow=refuse]`.
pub(crate) async fn publish(state: &State, head: &Head) -> Response {
    let (topic, options) = match required(head, "topic", "topic to publish to")
        .and_then(|t| Ok((t, options(head)?)))
    {
        Ok(v) => v,
        Err(response) => return response,
    };
    match state.node.publish_with(&topic, &head.body, options).await {
        Ok(p) => json(200, &json!({ "id": p.id, "reached": p.reached })),
        Err(e) => refused(e),
    }
}

/// The body of `POST /v1/publish/batch`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    /// Each read on its own after the count is checked, so that an error
    /// names its index.
    messages: Vec<serde_json::Value>,
}

/// One message of a batch: to a `topic` (with the options of
/// `/v1/publish`) or to one `node`, its payload as `payload` or
/// `payloadBase64`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BatchMessage {
    topic: Option<String>,
    node: Option<String>,
    payload: Option<String>,
    payload_base64: Option<String>,
    #[serde(default)]
    retain: bool,
    retain_ttl_ms: Option<u64>,
    overflow: Option<String>,
}

impl BatchMessage {
    fn outbound(self, at: &str) -> Result<Outbound, Invalid> {
        let payload = payload::get(at, self.payload, self.payload_base64.as_deref())?;
        let to = match (self.topic, self.node) {
            (Some(topic), None) => To::Topic(
                topic,
                options_from(
                    &format!("{at}."),
                    &format!("\"retain\": true in {at}"),
                    self.retain,
                    self.retain_ttl_ms,
                    self.overflow.as_deref(),
                )?,
            ),
            (None, Some(node)) => {
                if self.retain || self.retain_ttl_ms.is_some() || self.overflow.is_some() {
                    return Err(Invalid(format!(
                        "{at} goes to a node: retain, retainTtlMs and overflow apply to topics only"
                    )));
                }
                To::Node(node)
            }
            (None, None) => {
                return Err(Invalid(format!(
                    "{at} has no destination: give topic or node"
                )))
            }
            (Some(_), Some(_)) => {
                return Err(Invalid(format!("{at} has both topic and node: give one")))
            }
        };
        Ok(Outbound { to, payload })
    }
}

/// `POST /v1/publish/batch` with `{"messages": [...]}`: many messages in
/// one request, published in order (see [`leasehold_engine::Node::publish_all`]).
/// A batch with an invalid message is refused whole (400 or 413, naming
/// `messages[i]`). Otherwise the answer has a result per message and
/// `failed`, the number that failed. Its status is 200 when at least one
/// message was published, so that retry middleware which resends on 429
/// or 503 does not publish the others twice; when none was, it is the
/// first failure's, and resending is as safe as for one publish.
pub(crate) async fn publish_batch(state: &State, head: &Head) -> Response {
    let batch: Batch = match serde_json::from_slice(&head.body) {
        Ok(batch) => batch,
        Err(e) => {
            return error(
                400,
                format!("the body is not a batch ({{\"messages\": [...]}}): {e}"),
            )
        }
    };
    if batch.messages.len() > BATCH_MAX_MESSAGES {
        return error(
            400,
            format!(
                "messages has {} entries: a batch holds at most {BATCH_MAX_MESSAGES}",
                batch.messages.len()
            ),
        );
    }
    let mut outbound = Vec::with_capacity(batch.messages.len());
    for (index, m) in batch.messages.into_iter().enumerate() {
        let at = format!("messages[{index}]");
        let checked = serde_json::from_value::<BatchMessage>(m)
            .map_err(|e| Invalid(format!("{at}: {e}")))
            .and_then(|m| m.outbound(&at));
        match checked {
            Ok(o) => outbound.push(o),
            Err(Invalid(text)) => return json(400, &json!({ "error": text, "index": index })),
        }
    }
    let results = match state.node.publish_all(outbound).await {
        Ok(results) => results,
        Err(e) => return refused(e),
    };
    let total = results.len();
    let mut first_failure = None;
    let mut failed = 0;
    let results: Vec<serde_json::Value> = results
        .into_iter()
        .enumerate()
        .map(|(index, r)| match r {
            Ok(p) => json!({ "id": p.id, "reached": p.reached }),
            Err(e) => {
                failed += 1;
                let (status, mut body) = refusal(&e);
                body["status"] = json!(status);
                first_failure.get_or_insert((status, index, e.to_string()));
                body
            }
        })
        .collect();
    match first_failure {
        None => json(200, &json!({ "results": results, "failed": 0 })),
        Some((status, index, text)) => json(
            if failed < total { 200 } else { status },
            &json!({
                "error": format!(
                    "{failed} of {total} messages failed; the first, messages[{index}]: {text}"
                ),
                "failed": failed,
                "results": results,
            }),
        ),
    }
}

/// `POST /v1/send?node=NODE`: to one live node's inbox.
pub(crate) async fn send(state: &State, head: &Head) -> Response {
    let node = match required(head, "node", "id of the node to send to") {
        Ok(n) => n,
        Err(response) => return response,
    };
    match state.node.send(&node, &head.body).await {
        Ok(p) => json(200, &json!({ "id": p.id, "reached": p.reached })),
        Err(e) => refused(e),
    }
}

pub(crate) fn subscriptions(state: &State) -> Response {
    json(200, &json!({ "subscriptions": state.node.subscriptions() }))
}

/// `POST` (subscribe) or `DELETE` (unsubscribe) `/v1/subscriptions?pattern=P`.
/// Kept by the node across its recoveries, as every subscription is.
pub(crate) async fn subscribe(state: &State, head: &Head, on: bool) -> Response {
    let pattern = match required(head, "pattern", "topic or pattern") {
        Ok(p) => p,
        Err(response) => return response,
    };
    let result = if on {
        state.node.subscribe(&pattern).await
    } else {
        state.node.unsubscribe(&pattern).await
    };
    match result {
        Ok(()) => subscriptions(state),
        Err(e) => refused(e),
    }
}

fn start(state: &State, text: Option<&str>) -> Result<Cursor, Response> {
    state.mailbox.cursor(text).map_err(|e| error(400, e.0))
}

/// `GET /v1/inbox[?after=CURSOR][&wait=MS][&max=N]`: the items after the
/// cursor, waiting up to `wait` for the first. Answers
/// `{"items": [...], "cursor": C, "missed": N}`; pass `cursor` back as
/// `after` for what follows.
pub(crate) async fn long_poll(state: &State, head: &Head) -> Response {
    let parsed = (|| {
        let cursor = start(state, head.query("after").as_deref())?;
        let wait = number(
            head,
            "wait",
            LONG_POLL_DEFAULT_WAIT_MS,
            0,
            LONG_POLL_MAX_WAIT_MS,
        )?;
        let max = number(
            head,
            "max",
            LONG_POLL_DEFAULT_MAX as u64,
            1,
            LONG_POLL_MAX_ITEMS as u64,
        )?;
        Ok::<_, Response>((cursor, wait, max as usize))
    })();
    let (cursor, wait, max) = match parsed {
        Ok(v) => v,
        Err(response) => return response,
    };
    let Read { items, missed } = state
        .mailbox
        .read(
            cursor,
            max,
            LONG_POLL_MAX_BYTES,
            Duration::from_millis(wait),
        )
        .await;
    let last = items.last().map_or(cursor.0, |(seq, _)| *seq);
    let items: Vec<_> = items
        .iter()
        .map(|(seq, item)| {
            let mut v = item.to_json();
            v["type"] = json!(item.kind());
            v["cursor"] = json!(state.mailbox.cursor_text(*seq));
            v
        })
        .collect();
    json(
        200,
        &json!({ "items": items, "cursor": state.mailbox.cursor_text(last), "missed": missed }),
    )
}

/// One event of the stream: `id` (the cursor), `event` (the item's kind)
/// and `data` (its JSON, one line).
fn event(state: &State, seq: u64, item: &Item) -> Bytes {
    Bytes::from(format!(
        "id: {}\nevent: {}\ndata: {}\n\n",
        state.mailbox.cursor_text(seq),
        item.kind(),
        item.to_json()
    ))
}

/// `GET /v1/inbox/events`: Server-Sent Events, from after `Last-Event-ID`
/// (or `?after=`) if this run of the agent gave it out, else from now. A
/// `missed` event says how many items left the log before this client
/// read them. Each event is read from the inbox only when the previous one
/// was taken by the connection, so a slow client leaves its backlog in
/// Redis.
pub(crate) fn event_stream(state: &std::sync::Arc<State>, head: &Head) -> Response {
    let text = head.last_event_id.clone().or_else(|| head.query("after"));
    let mut cursor = match start(state, text.as_deref()) {
        Ok(c) => c,
        Err(response) => return response,
    };
    // One event in flight: the body's only buffer.
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    let state = state.clone();
    tokio::spawn(async move {
        if tx
            .send(Bytes::from_static(b"retry: 1000\n\n"))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let read = tokio::select! {
                _ = tx.closed() => return,
                read = state.mailbox.read(cursor, EVENT_STREAM_BATCH, EVENT_STREAM_CHUNK_BYTES, EVENT_STREAM_KEEPALIVE) => read,
            };
            if read.missed > 0 {
                let missed = format!(
                    "event: missed\ndata: {}\n\n",
                    json!({ "count": read.missed })
                );
                if tx.send(Bytes::from(missed)).await.is_err() {
                    return;
                }
            }
            if read.items.is_empty() && read.missed == 0 {
                if tx
                    .send(Bytes::from_static(b": keepalive\n\n"))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
            // The items of one read (at most a chunk's bytes) go out as
            // one chunk.
            let mut chunk = Vec::new();
            for (seq, item) in &read.items {
                chunk.extend_from_slice(&event(&state, *seq, item));
                cursor = Cursor(*seq);
            }
            if read.items.is_empty() {
                // Only `missed` (not expected: the log keeps at least one
                // item): go on after what was missed.
                cursor = Cursor(cursor.0 + read.missed);
            }
            drop(read);
            if !chunk.is_empty() && tx.send(Bytes::from(chunk)).await.is_err() {
                return;
            }
        }
    });
    Response::stream("text/event-stream", rx).header("cache-control", "no-cache")
}
