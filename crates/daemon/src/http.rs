//! The HTTP server behind the controller's probes and metrics and the
//! agent's local API, on hyper: connections kept alive between requests,
//! with a bound on the time a client may take to send a request head (the
//! first, or the next on a kept-alive connection) and its body, and on the
//! number of open connections, so idle or slow clients cannot hold the
//! process's memory or file descriptors. A request that arrived is answered however
//! long its handler takes (an exec-mode step-down waits for the command's
//! grace period). The client the tests and the bench ask agents with is
//! in `leasehold-testkit`.

use std::error::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::ServiceExt;
use tower_http::normalize_path::NormalizePath;
use tower_http::timeout::{RequestBodyDeadline, TimeoutError};

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
            get_only(|| async { text(StatusCode::OK, "ok\n") }),
        )
        .route("/readyz", get_only(move || readiness(store.clone())))
        .route("/metrics", get_only(metrics))
}

/// The 405 of a path served on `GET` only.
pub async fn use_get() -> Refusal {
    Refusal::new(405, "use GET")
}

/// A route answered on `GET` only: `HEAD` too is refused (axum would run
/// the `GET` handler for it, a long-poll's wait included, and drop the
/// body), as is every other method, with [`use_get`].
pub fn get_only<H, T, S>(handler: H) -> axum::routing::MethodRouter<S>
where
    H: axum::handler::Handler<T, S>,
    T: 'static,
    S: Clone + Send + Sync + 'static,
{
    get(handler).head(use_get).fallback(use_get)
}

/// `/readyz` of a process whose work needs the store: ready while the store
/// answers a PING within a second.
pub async fn readiness(store: leasehold_engine::Store) -> Response {
    match tokio::time::timeout(Duration::from_secs(1), store.ping()).await {
        Ok(Ok(())) => text(StatusCode::OK, "ready\n"),
        Ok(Err(e)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        Err(_) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer a PING within 1s\n",
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
/// the connection cap and the header timeout; the rest is [`layered`].
pub async fn serve(listener: TcpListener, app: Router, stop: impl Future<Output = ()>) {
    let app = layered(app);
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
            let service = service_fn(move |request| app.clone().oneshot(request));
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

/// `app` as the server runs it: the path's extra slashes trimmed
/// (`/healthz/` is `/healthz`), and every body read by [`read_whole`]
/// within [`HTTP_BODY_TIMEOUT`] of the request's arrival and no larger
/// than [`HTTP_MAX_BODY`].
fn layered(app: Router) -> NormalizePath<RequestBodyDeadline<Router>> {
    let app = app.layer(axum::middleware::from_fn(read_whole));
    let app = app.layer(DefaultBodyLimit::max(HTTP_MAX_BODY));
    NormalizePath::trim_trailing_slash(RequestBodyDeadline::new(app, HTTP_BODY_TIMEOUT))
}

/// Every request's body read whole before its route runs (a handler takes
/// it as `Bytes`), one that takes none too: 413 past [`HTTP_MAX_BODY`], 408
/// when it has not arrived within [`HTTP_BODY_TIMEOUT`], in the one shape.
async fn read_whole(request: Request, next: axum::middleware::Next) -> Result<Response, Refusal> {
    let (parts, body) = request.into_parts();
    let failed = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(body) => return Ok(next.run(Request::from_parts(parts, body.into())).await),
        Err(failed) => failed,
    };
    let mut causes = std::iter::successors(Some(&failed as &dyn Error), |e| (*e).source());
    Err(if failed.status() == StatusCode::PAYLOAD_TOO_LARGE {
        let max = HTTP_MAX_BODY;
        let text = format!("the request body is over {max} bytes, the most this server reads");
        Refusal::new(413, text)
    } else if causes.any(|e| e.is::<TimeoutError>()) {
        let secs = HTTP_BODY_TIMEOUT.as_secs();
        let text = format!("the request body did not arrive within {secs} s");
        Refusal::new(408, text)
    } else {
        let text = format!("reading the request body failed: {}", failed.body_text());
        Refusal::new(400, text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Status and body of `app`'s answer to a request, through the layers.
    async fn ask(app: &Router, method: &str, path: &str, body: axum::body::Body) -> (u16, String) {
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .body(body)
            .unwrap();
        let answer = layered(app.clone()).oneshot(request).await.unwrap();
        let status = answer.status().as_u16();
        let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_probes_answer_get_with_or_without_slashes_and_nothing_else() {
        // No I/O for /healthz and /metrics: the store is never asked.
        let store = leasehold_engine::Store::connect("redis://127.0.0.1:1", "probe").unwrap();
        let app = probes(store, Arc::new(crate::metrics::new_registry()), || ());
        let status = |method, path| {
            let app = app.clone();
            async move { ask(&app, method, path, axum::body::Body::empty()).await.0 }
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
        assert_eq!(status("HEAD", "/healthz").await, 405, "HEAD is not GET");
        for path in ["/other", "/"] {
            assert_eq!(status("GET", path).await, 404, "{path}");
        }
    }

    #[tokio::test]
    async fn extra_slashes_are_trimmed_and_the_query_kept() {
        let app = Router::new().fallback(|uri: axum::http::Uri| async move { uri.to_string() });
        for (path, seen) in [
            ("/v1/status", "/v1/status"),
            ("/", "/"),
            ("//v1/status/?a=%2F", "/v1/status?a=%2F"),
            ("/healthz/", "/healthz"),
        ] {
            let empty = axum::body::Body::empty();
            assert_eq!(
                ask(&app, "GET", path, empty).await,
                (200, seen.into()),
                "{path}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_past_the_limit_is_a_413_and_one_that_never_arrives_a_408() {
        let app = Router::new().route(
            "/",
            axum::routing::post(|body: Bytes| async move { body.len().to_string() }),
        );
        let bytes = |n| axum::body::Body::from(vec![b'x'; n]);
        let at_limit = ask(&app, "POST", "/", bytes(HTTP_MAX_BODY)).await;
        assert_eq!(at_limit, (200, HTTP_MAX_BODY.to_string()));
        let (status, over) = ask(&app, "POST", "/", bytes(HTTP_MAX_BODY + 1)).await;
        assert_eq!(status, 413, "{over}");
        assert!(
            over.contains("the request body is over 1048576 bytes"),
            "{over}"
        );
        let never = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        let started = tokio::time::Instant::now();
        let (status, late) = ask(&app, "POST", "/", axum::body::Body::from_stream(never)).await;
        assert_eq!(status, 408, "{late}");
        assert!(late.contains("did not arrive within 10 s"), "{late}");
        assert_eq!(started.elapsed(), HTTP_BODY_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_that_takes_no_body_refuses_one_too_large_or_too_slow_all_the_same() {
        let app = Router::new().route("/", axum::routing::post(|| async { "done" }));
        let bytes = |n| axum::body::Body::from(vec![b'x'; n]);
        assert_eq!(
            ask(&app, "POST", "/", bytes(10)).await,
            (200, "done".into())
        );
        let (status, over) = ask(&app, "POST", "/", bytes(HTTP_MAX_BODY + 1)).await;
        assert_eq!(status, 413, "{over}");
        assert!(over.contains("over 1048576 bytes"), "{over}");
        let never = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        let (status, late) = ask(&app, "POST", "/", axum::body::Body::from_stream(never)).await;
        assert_eq!(status, 408, "{late}");
    }
}
