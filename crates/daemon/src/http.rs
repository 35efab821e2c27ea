//! The HTTP server behind the controller's probes and metrics and the
//! agent's local API, on hyper: one request per connection, with a bound on
//! the time a client may take to send its request head and on the number of
//! open connections, so idle or slow clients cannot hold the process's
//! memory or file descriptors. A request that arrived is answered however
//! long its handler takes (an exec-mode step-down waits for the command's
//! grace period). Also the small client the bench and the tests ask agents
//! with.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::{HTTP_ACCEPT_BACKOFF, HTTP_HEADER_TIMEOUT, HTTP_MAX_CONNECTIONS};

/// A response: status code, content type, body.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: body.into(),
        }
    }

    pub fn with_type(status: u16, content_type: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type,
            body: body.into(),
        }
    }

    fn into_hyper(self) -> hyper::Response<Full<Bytes>> {
        let mut response = hyper::Response::new(Full::new(Bytes::from(self.body)));
        *response.status_mut() = hyper::StatusCode::from_u16(self.status)
            .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(self.content_type),
        );
        response
    }
}

/// What a handler is told of a request: no body is read (no endpoint takes
/// one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The `Origin` header. Browsers send it with every cross-origin
    /// request (and with same-origin POSTs); command-line clients and
    /// sidecars do not. An endpoint that changes something refuses a request
    /// that has one, so no web page can make a browser trigger it.
    pub origin: Option<String>,
}

/// `/readyz` of a process whose work needs Redis: ready while Redis answers
/// a PING within a second.
pub async fn readiness(store: &leasehold_engine::Store) -> Response {
    match tokio::time::timeout(Duration::from_secs(1), store.ping()).await {
        Ok(Ok(())) => Response::text(200, "ready\n"),
        Ok(Err(e)) => Response::text(503, format!("{e}\n")),
        Err(_) => Response::text(503, "redis did not answer a PING within 1s\n"),
    }
}

/// Binds `addr`, with an error that names the address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, crate::error::StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| crate::error::StartError::Listen { addr, source })
}

/// Serves `handler(head)` on `listener` until `stop`
/// resolves; then the connections still open are closed and it returns, so
/// nothing of the server outlives its owner.
pub async fn serve<H, F>(listener: TcpListener, handler: H, stop: impl Future<Output = ()>)
where
    H: Fn(Head) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let handler = Arc::new(handler);
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
        let handler = handler.clone();
        connections.spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request: hyper::Request<Incoming>| {
                let handler = handler.clone();
                async move {
                    let head = Head {
                        method: request.method().as_str().to_owned(),
                        path: request
                            .uri()
                            .path_and_query()
                            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
                        origin: request
                            .headers()
                            .get(hyper::header::ORIGIN)
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
                    };
                    Ok::<_, Infallible>(handler(head).await.into_hyper())
                }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HTTP_HEADER_TIMEOUT)
                .keep_alive(false)
                // A client that shuts its side after the request still
                // gets the answer.
                .half_close(true)
                .serve_connection(TokioIo::new(socket), service);
            let _ = connection.await;
        });
    }
    connections.shutdown().await;
}

/// One request as a client (the bench and the tests ask agents with it):
/// `(status, body)`, or an error if nothing answered within `limit`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    limit: Duration,
) -> Result<(u16, String), String> {
    let failed = |e: &dyn std::fmt::Display| format!("{method} http://{addr}{path}: {e}");
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| failed(&e))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(&e))?;
        // Aborted however this future ends, a timeout included.
        let driver = AbortOnDrop(tokio::spawn(connection));
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|e| failed(&e))?;
        let answer = async {
            let response = sender.send_request(request).await.map_err(|e| failed(&e))?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| failed(&e))?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        }
        .await;
        drop(driver);
        answer
    };
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| format!("{addr} did not answer {method} {path} within {limit:?}"))?
}

/// A spawned task that ends with its handle.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
