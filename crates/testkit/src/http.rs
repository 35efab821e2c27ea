//! An HTTP client for the agent's API and the probes, on hyper: one
//! request, a connection kept open for many, and an event-stream
//! (`text/event-stream`) reader with its parser. The tests and the bench ask
//! agents with it; the product has no use for it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// Why a client's request got no answer; its text names the request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{request}: {reason}")]
    Failed { request: String, reason: String },
    #[error("{addr} did not answer {request} within {limit:?}")]
    Timeout {
        addr: SocketAddr,
        request: String,
        limit: Duration,
    },
}

/// A client connection kept open for many requests, one at a time (the
/// bench publishes through an agent with one per worker, as an application
/// with a keep-alive HTTP client would).
pub struct Connection {
    addr: SocketAddr,
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    _driver: tokio_util::task::AbortOnDropHandle<()>,
}

impl Connection {
    pub async fn open(addr: SocketAddr) -> Result<Self, ClientError> {
        let failed = |e: &dyn std::fmt::Display| ClientError::Failed {
            request: format!("connecting to {addr}"),
            reason: e.to_string(),
        };
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| failed(&e))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(&e))?;
        let driver = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let _ = connection.await;
        }));
        Ok(Self {
            addr,
            sender,
            _driver: driver,
        })
    }

    /// `(status, body)` of one request on this connection.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Bytes,
    ) -> Result<(u16, String), ClientError> {
        self.request_with(method, path, &[], body).await
    }

    async fn request_with(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<(u16, String), ClientError> {
        let addr = self.addr;
        let failed = |e: &dyn std::fmt::Display| ClientError::Failed {
            request: format!("{method} http://{addr}{path}"),
            reason: e.to_string(),
        };
        let response = self
            .send(method, path, headers, body)
            .await
            .map_err(|e| failed(&e))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| failed(&e))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
        // The reason only: the caller says which request it was.
        self.sender.ready().await?;
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.addr.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body))?;
        Ok(self.sender.send_request(request).await?)
    }
}

/// One request as a client (the bench and the tests ask agents with it):
/// `(status, body)`, or an error if nothing answered within `limit`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    limit: Duration,
) -> Result<(u16, String), ClientError> {
    request_with(addr, method, path, &[], Bytes::new(), limit).await
}

/// A request with headers and a body; see [`request`].
pub async fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    limit: Duration,
) -> Result<(u16, String), ClientError> {
    let exchange = async {
        let mut connection = Connection::open(addr).await?;
        connection.request_with(method, path, headers, body).await
    };
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| ClientError::Timeout {
            addr,
            request: format!("{method} {path}"),
            limit,
        })?
}

/// One Server-Sent Event: its `id`, `event` (empty: the default,
/// "message") and `data` lines (joined by newlines).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerEvent {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// A client of an event stream (`text/event-stream`): the tests and the
/// bench read an agent's inbox with it.
pub struct EventStream {
    body: Incoming,
    parser: EventParser,
    /// Kept open while the stream is read.
    _connection: Connection,
}

impl EventStream {
    /// Opens `path`, resuming after `last_event_id` if given; an error for
    /// any answer but 200.
    pub async fn open(
        addr: SocketAddr,
        path: &str,
        last_event_id: Option<&str>,
    ) -> Result<Self, ClientError> {
        let mut headers = vec![("accept", "text/event-stream")];
        if let Some(id) = last_event_id {
            headers.push(("last-event-id", id));
        }
        let mut connection = Connection::open(addr).await?;
        let response = connection
            .send("GET", path, &headers, Bytes::new())
            .await
            .map_err(|e| ClientError::Failed {
                request: format!("GET http://{addr}{path}"),
                reason: e.to_string(),
            })?;
        if response.status() != 200 {
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(ClientError::Failed {
                request: format!("GET http://{addr}{path}"),
                reason: format!("{status} {}", String::from_utf8_lossy(&body)),
            });
        }
        let parser = EventParser {
            last_id: last_event_id.map(str::to_owned),
            ..Default::default()
        };
        Ok(Self {
            body: response.into_body(),
            parser,
            _connection: connection,
        })
    }

    /// The next event with data; `None` when the stream ended.
    pub async fn next(&mut self) -> Option<ServerEvent> {
        loop {
            if let Some(event) = self.parser.next_event() {
                return Some(event);
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(data) = frame.into_data() {
                self.parser.push(&data);
            }
        }
    }

    /// The last `id` the stream set (also by a block without data).
    pub fn last_id(&self) -> Option<&str> {
        self.parser.last_id.as_deref()
    }
}

/// The `text/event-stream` format, fed as it arrives. Line ends may be
/// `\n`, `\r\n` or `\r`; comments, `retry` and id-only blocks are read
/// but not returned.
#[derive(Debug, Default)]
pub struct EventParser {
    /// Received, not yet parsed; line ends already made `\n`.
    pending: Vec<u8>,
    /// How far `pending` was searched for the end of an event.
    scanned: usize,
    /// A `\r` at the end of the last piece, whose meaning (`\r\n` or a
    /// line end of its own) the next piece decides.
    held_cr: bool,
    last_id: Option<String>,
}

impl EventParser {
    pub fn push(&mut self, data: &[u8]) {
        for &b in data {
            match (self.held_cr, b) {
                (true, b'\n') => {
                    self.pending.push(b'\n');
                    self.held_cr = false;
                }
                (true, b'\r') => self.pending.push(b'\n'),
                (true, b) => {
                    self.pending.push(b'\n');
                    self.pending.push(b);
                    self.held_cr = false;
                }
                (false, b'\r') => self.held_cr = true,
                (false, b) => self.pending.push(b),
            }
        }
    }

    /// The next whole event with data among what was pushed.
    pub fn next_event(&mut self) -> Option<ServerEvent> {
        loop {
            let from = self.scanned.saturating_sub(1);
            let Some(at) = self.pending[from..].windows(2).position(|w| w == b"\n\n") else {
                self.scanned = self.pending.len();
                return None;
            };
            let block: Vec<u8> = self.pending.drain(..from + at + 2).collect();
            self.scanned = 0;
            let parsed = parse_event(&String::from_utf8_lossy(&block));
            if let Some(id) = parsed.as_ref().and_then(|e| e.id.clone()) {
                self.last_id = Some(id);
            }
            if let Some(event) = parsed.filter(|e| !e.data.is_empty()) {
                return Some(event);
            }
        }
    }
}

/// One event block; `None` for a block of comments or `retry` only.
fn parse_event(block: &str) -> Option<ServerEvent> {
    let mut event = ServerEvent::default();
    let mut data = Vec::new();
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => event.id = Some(value.to_owned()),
            "event" => event.event = value.to_owned(),
            "data" => data.push(value),
            _ => {}
        }
    }
    if data.is_empty() && event.id.is_none() {
        return None;
    }
    event.data = data.join("\n");
    Some(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed_across_pieces_and_line_ends() {
        let mut parser = EventParser::default();
        parser.push(b"retry: 1000\r\n\r\nid: 1-1\r\nevent: message\r");
        assert_eq!(parser.next_event(), None);
        parser.push(b"\ndata: {\"a\":1}\r\n\r\n: keepalive\n\nid: 1-2\n\n");
        let event = parser.next_event().expect("an event");
        assert_eq!(
            (
                event.id.as_deref(),
                event.event.as_str(),
                event.data.as_str()
            ),
            (Some("1-1"), "message", "{\"a\":1}")
        );
        assert_eq!(
            parser.next_event(),
            None,
            "comments and id-only blocks are not events"
        );
        assert_eq!(
            parser.last_id.as_deref(),
            Some("1-2"),
            "an id-only block still sets the last id"
        );
        // A trailing `\r` waits for the next piece: it may start a `\r\n`.
        parser.push(b"data: x\rdata: y\r\r");
        assert_eq!(parser.next_event(), None);
        parser.push(b"\n");
        assert_eq!(parser.next_event().map(|e| e.data), Some("x\ny".to_owned()));
    }
}
