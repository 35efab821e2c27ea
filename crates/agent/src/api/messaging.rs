//! The messaging half of the agent's API: publishing (one message, or a
//! batch), direct sends and subscriptions through the node, and the mailbox
//! read as an event stream (Server-Sent Events) or by long-poll. A single
//! publish takes the request body as the payload, raw bytes; a batch and
//! every read carry payloads in JSON as [`crate::payload`] spells them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use leasehold_daemon::http::{json, Refusal, Response, StatusCode};
use leasehold_engine::{Error, Outbound, Overflow, PublishOptions, Published, Retain, To};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::state::{AgentState, Params};
use crate::config::{
    BATCH_MAX_MESSAGES, EVENT_STREAM_BATCH, EVENT_STREAM_CHUNK_BYTES, EVENT_STREAM_KEEPALIVE,
    LONG_POLL_DEFAULT_MAX, LONG_POLL_DEFAULT_WAIT_MS, LONG_POLL_MAX_BYTES, LONG_POLL_MAX_ITEMS,
    LONG_POLL_MAX_WAIT_MS,
};
use crate::invalid::Invalid;
use crate::mailbox::{Cursor, Item, Read};
use crate::payload;

/// The refusal of an engine error: the status says whose fault it is, the
/// body names the limit or the value at fault.
fn refusal(e: &Error) -> Refusal {
    let text = e.to_string();
    match e {
        Error::DataTooLarge { size, max } => Refusal::new(413, text)
            .with("size", *size)
            .with("max", *max),
        Error::InBatch { index, source } => {
            let mut inner = refusal(source);
            inner.body["error"] = json!(format!("messages[{index}]: {source}"));
            inner.with("index", *index)
        }
        Error::InboxFull(_) => Refusal::new(429, text),
        Error::NodeNotRegistered(_) => Refusal::new(404, text),
        Error::Topic(_) | Error::Config(_) => Refusal::new(400, text),
        // The store did not answer, or this node was displaced.
        _ => Refusal::new(503, text),
    }
}

/// A whole-number query parameter within `min..=max`, or the 400 that names it.
fn number(
    name: &str,
    text: Option<&str>,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, Refusal> {
    let Some(text) = text else {
        return Ok(default);
    };
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(Refusal::new(
            400,
            format!(
                "{name} = {text:?} is out of range: it must be a whole number from {min} to {max}"
            ),
        )),
    }
}

fn required(value: Option<String>, name: &str, what: &str) -> Result<String, Refusal> {
    value.filter(|v| !v.is_empty()).ok_or_else(|| {
        Refusal::new(
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

/// The query of `POST /v1/publish`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PublishQuery {
    topic: Option<String>,
    retain: Option<String>,
    retain_ttl_ms: Option<String>,
    overflow: Option<String>,
}

impl PublishQuery {
    fn options(&self) -> Result<PublishOptions, Refusal> {
        let retain = match self.retain.as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(Refusal::new(
                    400,
                    format!("retain = {other:?} is invalid: it must be true or false"),
                ))
            }
        };
        let max_ttl = leasehold_engine::config::MAX_RETAIN_MS;
        let ttl = match self.retain_ttl_ms.as_deref() {
            None => None,
            text => Some(number("retainTtlMs", text, 0, 1, max_ttl)?),
        };
        options_from("", "retain=true", retain, ttl, self.overflow.as_deref())
            .map_err(|e| Refusal::new(400, e.0))
    }
}

/// The answer to a batch (keys in alphabetical order, as they came when it
/// was built as a `serde_json` map).
#[derive(Serialize)]
struct BatchAnswer {
    /// Only when a message failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    failed: usize,
    results: Vec<Outcome>,
}

/// One message's result in a batch's answer.
#[derive(Serialize)]
#[serde(untagged)]
enum Outcome {
    Sent(Sent),
    /// The refusal's body, with the status it would have had alone.
    Failed(serde_json::Value),
}

/// What a publish or a send answers.
#[derive(Serialize)]
struct Sent {
    id: u64,
    reached: u64,
}

impl From<Published> for Sent {
    fn from(p: Published) -> Self {
        Self {
            id: p.id,
            reached: p.reached,
        }
    }
}

/// `POST /v1/publish?topic=T[&retain=true[&retainTtlMs=N]][&overflow=refuse]`.
pub(super) async fn publish(
    State(state): State<Arc<AgentState>>,
    Params(mut query): Params<PublishQuery>,
    body: Bytes,
) -> Result<Response, Refusal> {
    let topic = required(query.topic.take(), "topic", "topic to publish to")?;
    let options = query.options()?;
    let published = state.node.publish_with(&topic, &body, options).await;
    Ok(json(
        StatusCode::OK,
        &Sent::from(published.map_err(|e| refusal(&e))?),
    ))
}

/// What is wrong with a batch's body that serde's errors, which carry
/// only text, cannot say: which message, or how many there were.
#[derive(Debug)]
enum BatchFault {
    /// `messages[index]` did not read as a message: the text says why.
    At(usize, String),
    /// More than `BATCH_MAX_MESSAGES` messages: this many.
    TooMany(usize),
}

/// The body of `POST /v1/publish/batch`, `{"messages": [...]}`, read in one
/// pass: each message straight into a [`BatchMessage`] (no `Value` first,
/// the agent's per-message cost on its busiest path). A fault serde cannot
/// describe is left in `fault`.
struct BatchBody<'a> {
    fault: &'a std::cell::Cell<Option<BatchFault>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for BatchBody<'_> {
    type Value = Vec<BatchMessage>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_struct("Batch", &["messages"], self)
    }
}

impl<'de> serde::de::Visitor<'de> for BatchBody<'_> {
    type Value = Vec<BatchMessage>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a batch ({\"messages\": [...]})")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error as _;
        let mut messages = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key != "messages" {
                return Err(A::Error::unknown_field(&key, &["messages"]));
            }
            if messages.is_some() {
                return Err(A::Error::duplicate_field("messages"));
            }
            messages = Some(map.next_value_seed(Messages { fault: self.fault })?);
        }
        messages.ok_or_else(|| A::Error::missing_field("messages"))
    }
}

/// The `messages` array of a batch.
struct Messages<'a> {
    fault: &'a std::cell::Cell<Option<BatchFault>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Messages<'_> {
    type Value = Vec<BatchMessage>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Messages<'_> {
    type Value = Vec<BatchMessage>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of messages")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error as _;
        let mut messages = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(BATCH_MAX_MESSAGES));
        loop {
            let index = messages.len();
            if index == BATCH_MAX_MESSAGES {
                // Counted to the end, so that the refusal says how many.
                let mut count = index;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    count += 1;
                }
                if count > index {
                    self.fault.set(Some(BatchFault::TooMany(count)));
                    return Err(A::Error::custom("too many messages"));
                }
                return Ok(messages);
            }
            match seq.next_element::<BatchMessage>() {
                Ok(Some(m)) => messages.push(m),
                Ok(None) => return Ok(messages),
                Err(e) => {
                    self.fault.set(Some(BatchFault::At(index, e.to_string())));
                    return Err(e);
                }
            }
        }
    }
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
pub(super) async fn publish_batch(
    State(state): State<Arc<AgentState>>,
    body: Bytes,
) -> Result<Response, Refusal> {
    let fault = std::cell::Cell::new(None);
    let mut reader = serde_json::Deserializer::from_slice(&body);
    let read = serde::de::DeserializeSeed::deserialize(BatchBody { fault: &fault }, &mut reader)
        .and_then(|messages| reader.end().map(|()| messages));
    let messages = read.map_err(|e| match fault.take() {
        Some(BatchFault::At(index, text)) => {
            Refusal::new(400, format!("messages[{index}]: {text}")).with("index", index)
        }
        Some(BatchFault::TooMany(count)) => Refusal::new(
            400,
            format!("messages has {count} entries: a batch holds at most {BATCH_MAX_MESSAGES}"),
        ),
        None => Refusal::new(
            400,
            format!("the body is not a batch ({{\"messages\": [...]}}): {e}"),
        ),
    })?;
    let mut outbound = Vec::with_capacity(messages.len());
    for (index, m) in messages.into_iter().enumerate() {
        let checked = m.outbound(&format!("messages[{index}]"));
        outbound
            .push(checked.map_err(|Invalid(text)| Refusal::new(400, text).with("index", index))?);
    }
    let results = state
        .node
        .publish_all(outbound)
        .await
        .map_err(|e| refusal(&e))?;
    let total = results.len();
    let mut first_failure = None;
    let mut failed = 0;
    let results: Vec<Outcome> = results
        .into_iter()
        .enumerate()
        .map(|(index, r)| match r {
            Ok(p) => Outcome::Sent(Sent::from(p)),
            Err(e) => {
                failed += 1;
                let refused = refusal(&e);
                let status = refused.status;
                first_failure.get_or_insert((status, index, e.to_string()));
                Outcome::Failed(refused.with("status", status.as_u16()).body)
            }
        })
        .collect();
    // Refused as a whole only when every message failed, with the first's status.
    let status = match &first_failure {
        Some((status, ..)) if failed == total => *status,
        _ => StatusCode::OK,
    };
    let error = first_failure.map(|(_, index, text)| {
        format!("{failed} of {total} messages failed; the first, messages[{index}]: {text}")
    });
    let answer = BatchAnswer {
        error,
        failed,
        results,
    };
    Ok(json(status, &answer))
}

/// The query of `POST /v1/send`.
#[derive(Deserialize)]
pub(super) struct SendQuery {
    node: Option<String>,
}

/// `POST /v1/send?node=NODE`: to one live node's inbox.
pub(super) async fn send(
    State(state): State<Arc<AgentState>>,
    Params(query): Params<SendQuery>,
    body: Bytes,
) -> Result<Response, Refusal> {
    let node = required(query.node, "node", "id of the node to send to")?;
    let sent = state
        .node
        .send(&node, &body)
        .await
        .map_err(|e| refusal(&e))?;
    Ok(json(StatusCode::OK, &Sent::from(sent)))
}

/// The subscriptions of this node.
#[derive(Serialize)]
struct Subscriptions {
    subscriptions: Vec<String>,
}

pub(super) async fn subscriptions(State(state): State<Arc<AgentState>>) -> Response {
    let subscriptions = state.node.subscriptions();
    json(StatusCode::OK, &Subscriptions { subscriptions })
}

/// The query of `/v1/subscriptions`.
#[derive(Deserialize)]
pub(super) struct PatternQuery {
    pattern: Option<String>,
}

/// `POST /v1/subscriptions?pattern=P`. Kept by the node across its
/// recoveries, as every subscription is.
pub(super) async fn subscribe(
    state: State<Arc<AgentState>>,
    params: Params<PatternQuery>,
) -> Result<Response, Refusal> {
    change_subscription(state, params, true).await
}

/// `DELETE /v1/subscriptions?pattern=P`.
pub(super) async fn unsubscribe(
    state: State<Arc<AgentState>>,
    params: Params<PatternQuery>,
) -> Result<Response, Refusal> {
    change_subscription(state, params, false).await
}

/// Subscribes (`on`) or unsubscribes, and answers the subscriptions now.
async fn change_subscription(
    State(state): State<Arc<AgentState>>,
    Params(query): Params<PatternQuery>,
    on: bool,
) -> Result<Response, Refusal> {
    let pattern = required(query.pattern, "pattern", "topic or pattern")?;
    let changed = if on {
        state.node.subscribe(&pattern).await
    } else {
        state.node.unsubscribe(&pattern).await
    };
    changed.map_err(|e| refusal(&e))?;
    Ok(subscriptions(State(state)).await)
}

/// The query of `GET /v1/inbox` (and `after` of the event stream).
#[derive(Deserialize)]
pub(super) struct InboxQuery {
    after: Option<String>,
    wait: Option<String>,
    max: Option<String>,
}

/// `GET /v1/inbox[?after=CURSOR][&wait=MS][&max=N]`: the items after the
/// cursor, waiting up to `wait` for the first. Answers
/// `{"items": [...], "cursor": C, "missed": N}`; pass `cursor` back as
/// `after` for what follows.
pub(super) async fn long_poll(
    State(state): State<Arc<AgentState>>,
    Params(query): Params<InboxQuery>,
) -> Result<Response, Refusal> {
    let cursor = start(&state, query.after.as_deref())?;
    let wait = number(
        "wait",
        query.wait.as_deref(),
        LONG_POLL_DEFAULT_WAIT_MS,
        0,
        LONG_POLL_MAX_WAIT_MS,
    )?;
    let max = number(
        "max",
        query.max.as_deref(),
        LONG_POLL_DEFAULT_MAX as u64,
        1,
        LONG_POLL_MAX_ITEMS as u64,
    )?;
    let wait = Duration::from_millis(wait);
    let Read { items, missed } = state
        .mailbox
        .read(cursor, max as usize, LONG_POLL_MAX_BYTES, wait)
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
    let cursor = state.mailbox.cursor_text(last);
    Ok(json(
        StatusCode::OK,
        &json!({ "items": items, "cursor": cursor, "missed": missed }),
    ))
}

fn start(state: &AgentState, text: Option<&str>) -> Result<Cursor, Refusal> {
    state
        .mailbox
        .cursor(text)
        .map_err(|e| Refusal::new(400, e.0))
}

/// One event of the stream: `id` (the cursor), `event` (the item's kind)
/// and `data` (its JSON, one line).
fn event(state: &AgentState, seq: u64, item: &Item) -> Event {
    Event::default()
        .id(state.mailbox.cursor_text(seq))
        .event(item.kind())
        .data(serde_json::to_string(item).unwrap_or_default())
}

/// `GET /v1/inbox/events`: Server-Sent Events, from after `Last-Event-ID`
/// (or `?after=`) if this run of the agent gave it out, else from now. A
/// `missed` event says how many items left the log before this client
/// read them. The inbox is read again only when the events of the last
/// read were taken by the connection, so a slow client leaves its backlog
/// in the store.
pub(super) async fn event_stream(
    State(state): State<Arc<AgentState>>,
    Params(query): Params<InboxQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Refusal> {
    let resume = headers
        .get("last-event-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .or(query.after);
    let cursor = start(&state, resume.as_deref())?;
    let reads = stream::unfold((state, cursor), |(state, mut cursor)| async move {
        loop {
            let read = state
                .mailbox
                .read(
                    cursor,
                    EVENT_STREAM_BATCH,
                    EVENT_STREAM_CHUNK_BYTES,
                    EVENT_STREAM_KEEPALIVE,
                )
                .await;
            let mut events = Vec::with_capacity(read.items.len() + 1);
            if read.missed > 0 {
                let count = json!({ "count": read.missed });
                events.push(Event::default().event("missed").data(count.to_string()));
            }
            for (seq, item) in &read.items {
                events.push(event(&state, *seq, item));
                cursor = Cursor(*seq);
            }
            if read.items.is_empty() {
                // Only `missed` (not expected: the log keeps at least one
                // item): go on after what was missed.
                cursor = Cursor(cursor.0 + read.missed);
            }
            if !events.is_empty() {
                let events = stream::iter(events.into_iter().map(Ok));
                return Some((events, (state, cursor)));
            }
        }
    });
    // Clients reconnect a second after the stream breaks.
    let retry = Event::default().retry(Duration::from_secs(1));
    let events = stream::once(std::future::ready(Ok(retry))).chain(reads.flatten());
    let keep_alive = KeepAlive::new()
        .interval(EVENT_STREAM_KEEPALIVE)
        .text("keepalive");
    Ok(Sse::new(events).keep_alive(keep_alive))
}
