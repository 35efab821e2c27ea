//! The HTTP server behind the controller's probes and metrics and the
//! agent's local API, on hyper: connections kept alive between requests,
//! with a bound on the time a client may take to send a request head (the
//! first, or the next on a kept-alive connection) and its body, and on the
//! number of open connections, so idle or slow clients cannot hold the
//! process's memory or file descriptors. A request that arrived is answered however
//! long its handler takes (an exec-mode step-down waits for the command's
//! grace period). Also the small client the bench and the tests ask agents
//! with.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use axum::http::Uri;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::config::{
    HTTP_ACCEPT_BACKOFF, HTTP_BODY_TIMEOUT, HTTP_HEADER_TIMEOUT, HTTP_MAX_BODY,
    HTTP_MAX_CONNECTIONS,
};

/// What a handler answers: axum's response, so handlers return anything
/// that is [`IntoResponse`].
pub use axum::http::StatusCode;
pub use axum::response::Response;

/// A refusal: `{"error": TEXT, ...}` with its status, the one shape every
/// error of the agent's API and of this server has. Extra fields (`size`,
/// `max`, `index`) name the limit or the value at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: StatusCode,
    pub body: serde_json::Value,
}

impl Refusal {
    /// `status` must be a valid code (100-999); an invalid one is a 500.
    pub fn new(status: u16, text: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body: serde_json::json!({ "error": text.into() }),
        }
    }

    /// The refusal with one more field in its body.
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.body[key] = value.into();
        self
    }

    pub fn text(&self) -> &str {
        self.body["error"].as_str().unwrap_or_default()
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        json(self.status, &self.body)
    }
}

/// A JSON answer, one line ending in a newline (as `curl` users expect).
pub fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    let mut body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    body.push(b'\n');
    (status, [(CONTENT_TYPE, "application/json")], body).into_response()
}

/// A plain-text answer.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

/// The probe endpoints both daemons serve, on `GET` only: `/healthz`,
/// `/readyz` (the store answers) and `/metrics`, rendered after `refresh`
/// (the agent sets its per-group gauges there, from the local lease views).
pub fn probes(
    store: leasehold_engine::Store,
    registry: Arc<prometheus_client::registry::Registry>,
    refresh: impl Fn() + Clone + Send + Sync + 'static,
) -> Router {
    let metrics = move || {
        refresh();
        let body = crate::metrics::render(&registry);
        std::future::ready(([(CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body))
    };
    Router::new()
        .route(
            "/healthz",
            get(|| async { text(StatusCode::OK, "ok\n") }).fallback(use_get),
        )
        .route(
            "/readyz",
            get(move || readiness(store.clone())).fallback(use_get),
        )
        .route("/metrics", get(metrics).fallback(use_get))
}

/// The 405 of a path served on `GET` only.
pub async fn use_get() -> Refusal {
    Refusal::new(405, "use GET")
}

/// `/readyz` of a process whose work needs Redis: ready while Redis answers
/// a PING within a second.
pub async fn readiness(store: leasehold_engine::Store) -> Response {
    match tokio::time::timeout(Duration::from_secs(1), store.ping()).await {
        Ok(Ok(())) => text(StatusCode::OK, "ready\n"),
        Ok(Err(e)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        Err(_) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "redis did not answer a PING within 1s\n",
        ),
    }
}

/// Binds `addr`, with an error that names the address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, crate::error::StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| crate::error::StartError::Listen { addr, source })
}

/// Serves `app` on `listener` until `stop` resolves; then the connections
/// still open are closed and it returns, so nothing of the server outlives
/// its owner. The accept loop is this module's own, not `axum::serve`, for
/// the bounds above; the router sees each request with its body read whole
/// and its path's extra slashes trimmed (`/healthz/` is `/healthz`).
pub async fn serve(listener: TcpListener, app: Router, stop: impl Future<Output = ()>) {
    // A permit per open connection: past the cap, new clients wait in the
    // kernel's backlog instead of costing memory here.
    let permits = Arc::new(Semaphore::new(HTTP_MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            _ = &mut stop => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let socket = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(e) => {
                    // Out of file descriptors, typically: wait instead of
                    // spinning on an accept that fails at once.
                    tracing::warn!(error = %e, "accepting an HTTP connection failed");
                    tokio::time::sleep(HTTP_ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let app = app.clone();
        connections.spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request: hyper::Request<Incoming>| {
                let app = app.clone();
                async move {
                    let (mut parts, body) = request.into_parts();
                    let body = match read_body(body).await {
                        Ok(body) => body,
                        Err(refused) => return Ok::<_, Infallible>(refused.into_response()),
                    };
                    if let Some(uri) = trimmed(&parts.uri) {
                        parts.uri = uri;
                    }
                    let request = hyper::Request::from_parts(parts, axum::body::Body::from(body));
                    app.oneshot(request).await
                }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HTTP_HEADER_TIMEOUT)
                // Kept alive between requests, so a client publishing many
                // messages pays for one connection; the header timeout
                // also closes a connection idle between requests.
                .keep_alive(true)
                // A client that shuts its side after the request still
                // gets the answer.
                .half_close(true)
                .serve_connection(TokioIo::new(socket), service);
            let _ = connection.await;
        });
    }
    connections.shutdown().await;
}

/// The URI with the path's leading and trailing slashes made one leading
/// slash, when there were more; `None` when it is already so.
fn trimmed(uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    let inner = path.trim_matches('/');
    if path.len() == inner.len() + 1 || path == "/" {
        return None;
    }
    let with_query = match uri.query() {
        Some(query) => format!("/{inner}?{query}"),
        None => format!("/{inner}"),
    };
    with_query.parse().ok()
}

/// The whole request body, or the refusal: 413 past [`HTTP_MAX_BODY`], 408
/// when it does not arrive within [`HTTP_BODY_TIMEOUT`].
async fn read_body(body: Incoming) -> Result<Bytes, Refusal> {
    let limited = Limited::new(body, HTTP_MAX_BODY);
    match tokio::time::timeout(HTTP_BODY_TIMEOUT, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(Refusal::new(
            413,
            format!("the request body is over {HTTP_MAX_BODY} bytes, the most this server reads"),
        )),
        Ok(Err(e)) => Err(Refusal::new(
            400,
            format!("reading the request body failed: {e}"),
        )),
        Err(_) => Err(Refusal::new(
            408,
            format!(
                "the request body did not arrive within {} s",
                HTTP_BODY_TIMEOUT.as_secs()
            ),
        )),
    }
}

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

/// A client of an event stream (`text/event-stream`): the tests, the bench
/// and the CLI read an agent's inbox with it.
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

/// A spawned task that ends with its handle.
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

    #[tokio::test]
    async fn the_probes_answer_get_with_or_without_slashes_and_nothing_else() {
        // No I/O for /healthz and /metrics: the store is never asked.
        let store = leasehold_engine::Store::connect("redis://127.0.0.1:1", "probe").unwrap();
        let app = probes(store, Arc::new(crate::metrics::new_registry()), || ());
        let status = |method: &str, path: &str| {
            let uri: Uri = path.parse().unwrap();
            let request = hyper::Request::builder()
                .method(method)
                .uri(trimmed(&uri).unwrap_or(uri))
                .body(axum::body::Body::empty())
                .unwrap();
            let app = app.clone();
            async move { app.oneshot(request).await.unwrap().status().as_u16() }
        };
        for path in [
            "/healthz",
            "/healthz/",
            "//healthz",
            "/healthz?x=1",
            "/metrics/",
        ] {
            assert_eq!(status("GET", path).await, 200, "{path}");
        }
        assert_eq!(status("POST", "/healthz").await, 405);
        for path in ["/other", "/"] {
            assert_eq!(status("GET", path).await, 404, "{path}");
        }
    }

    #[test]
    fn extra_slashes_are_trimmed_and_the_query_kept() {
        let trim = |path: &str| trimmed(&path.parse().unwrap()).map(|u| u.to_string());
        assert_eq!(trim("/v1/status"), None);
        assert_eq!(trim("/"), None);
        assert_eq!(trim("//v1/status/?a=%2F"), Some("/v1/status?a=%2F".into()));
        assert_eq!(trim("/healthz/"), Some("/healthz".into()));
    }
}
