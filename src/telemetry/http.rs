//! A small HTTP/1.1 server for probes, metrics and (later) the agent's local
//! API: one request per connection, GET and POST, no bodies to speak of.
//! It needs no web framework, which keeps the binary and the build small.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

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
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Serves `handler(method, path)` on `listener` until the task is dropped.
pub async fn serve<H, F>(listener: TcpListener, handler: H)
where
    H: Fn(String, String) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let handler = Arc::new(handler);
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut len = 0;
            // Read the request head (a body, if any, is ignored).
            let head = loop {
                let Ok(n) = socket.read(&mut buf[len..]).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                len += n;
                if let Some(end) = buf[..len].windows(4).position(|w| w == b"\r\n\r\n") {
                    break String::from_utf8_lossy(&buf[..end]).into_owned();
                }
                if len == buf.len() {
                    return;
                }
            };
            let mut first = head.lines().next().unwrap_or_default().split_whitespace();
            let method = first.next().unwrap_or_default().to_owned();
            let path = first.next().unwrap_or_default().to_owned();
            let response = handler(method, path).await;
            let text = format!(
                "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
                response.status,
                reason(response.status),
                response.content_type,
                response.body.len(),
                response.body
            );
            let _ = socket.write_all(text.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

/// Binds `addr`, with an error that names the address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))
}

/// One request as a client (the bench and the tests ask agents with it):
/// `(status, body)`, or an error if nothing answered within `limit`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    limit: std::time::Duration,
) -> Result<(u16, String), String> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\n\r\n");
        s.write_all(head.as_bytes()).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
    };
    let text = tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| format!("{addr} did not answer {method} {path} within {limit:?}"))?
        .map_err(|e| format!("{method} http://{addr}{path}: {e}"))?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{method} http://{addr}{path}: not an HTTP response"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}
