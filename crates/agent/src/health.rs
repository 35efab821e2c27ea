//! The application's health, when the agent is told how to check it
//! (`--health-url` or `--health-command`): checked once at start and then
//! every retry interval, each check bounded by `--health-timeout-ms`.
//!
//! - Until the first check passes, and from any failed check until one
//!   passes, this pod campaigns with priority 0 and the reason
//!   ([`Group::set_problem`]): it never takes a free seat, and the store
//!   shows the reason to the controller (the member's `unhealthy`).
//! - A leader whose application fails `--health-failures` checks in a row
//!   steps down: the group's name goes to the task that owns the node,
//!   which steps down as for the API (exec mode stops its command first).
//!
//! A check is an HTTP GET (any status from 200 to 399 passes, as a
//! Kubernetes probe's) or a shell command (exit 0 passes). What the last
//! check said shows in `/v1/status` and the metrics.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use leasehold_engine::sync::locked;
use leasehold_engine::Group;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::metrics::AgentMetrics;

/// Longest `--health-timeout-ms`, and the default.
pub const MAX_HEALTH_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_HEALTH_TIMEOUT_MS: u64 = 1_000;
/// Most `--health-failures`, and the default.
pub const MAX_HEALTH_FAILURES: u32 = 100;
pub const DEFAULT_HEALTH_FAILURES: u32 = 3;

/// How the application's health is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// `GET path` on `authority` (`host:port`), plain HTTP.
    Url { authority: String, path: String },
    /// A command run by `sh -c`.
    Command(String),
}

/// Why a `--health-url` is refused.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("--health-url {text:?} is not a URL: {source}")]
    NotAUrl {
        text: String,
        #[source]
        source: hyper::http::uri::InvalidUri,
    },
    #[error(
        "--health-url {text:?} must be an http:// URL (the check is of this pod's own application)"
    )]
    NotHttp { text: String },
    #[error("--health-url {text:?} names no host")]
    NoHost { text: String },
}

/// Why a check failed. Its text is the reason `/v1/status`, the logs and
/// the member's `unhealthy` in the store give.
#[derive(Debug, thiserror::Error)]
pub enum Unhealthy {
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    #[error("could not run the health command: {0}")]
    Spawn(#[source] std::io::Error),
    /// The command's exit code and the first line it wrote to stderr.
    #[error("the health command exited with {code}{}", .said.as_deref().map_or(String::new(), |s| format!(": {s}")))]
    Exited { code: i32, said: Option<String> },
    #[error("the health command was killed by a signal")]
    Killed,
    #[error("GET {url}: {source}")]
    Request {
        url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("GET {url} answered {status}")]
    Status {
        url: String,
        status: hyper::StatusCode,
    },
}

impl Check {
    /// A `--health-url`: `http://HOST:PORT/PATH`. Plain HTTP only: the check
    /// is of the pod's own application, on its loopback or pod address.
    pub fn url(text: &str) -> Result<Self, UrlError> {
        let uri: hyper::Uri = text.parse().map_err(|source| UrlError::NotAUrl {
            text: text.to_owned(),
            source,
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(UrlError::NotHttp {
                text: text.to_owned(),
            });
        }
        let Some(authority) = uri.authority() else {
            return Err(UrlError::NoHost {
                text: text.to_owned(),
            });
        };
        let authority = if authority.port_u16().is_some() {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), ToString::to_string);
        Ok(Self::Url { authority, path })
    }
}

/// The check's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSettings {
    pub check: Check,
    pub timeout: Duration,
    /// Failed checks in a row after which a leader steps down.
    pub failures: u32,
}

/// What the last check said, for `/v1/status` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthView {
    /// Whether a check has run yet.
    pub checked: bool,
    pub healthy: bool,
    /// Failed checks in a row.
    pub failures: u32,
    /// Why the last check failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Checks run and failed since the agent started.
    pub checks: u64,
    pub failed: u64,
}

/// Runs one check.
pub async fn check(check: &Check, timeout: Duration) -> Result<(), Unhealthy> {
    match tokio::time::timeout(timeout, run(check)).await {
        Ok(result) => result,
        Err(_) => Err(Unhealthy::Timeout(timeout)),
    }
}

async fn run(check: &Check) -> Result<(), Unhealthy> {
    match check {
        Check::Url { authority, path } => get(authority, path).await,
        Check::Command(line) => {
            let out = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(line)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output()
                .await
                .map_err(Unhealthy::Spawn)?;
            if out.status.success() {
                return Ok(());
            }
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.lines().next().unwrap_or("").trim();
            Err(match out.status.code() {
                Some(code) => Unhealthy::Exited {
                    code,
                    said: (!said.is_empty()).then(|| said.to_owned()),
                },
                None => Unhealthy::Killed,
            })
        }
    }
}

/// One GET over a connection of its own.
async fn get(authority: &str, path: &str) -> Result<(), Unhealthy> {
    let url = format!("http://{authority}{path}");
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| Unhealthy::Request {
        url: url.clone(),
        source,
    };
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| failed(e.into()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| failed(e.into()))?;
    let connection = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::USER_AGENT, "leasehold-agent")
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed(e.into()))?;
    let answer = sender.send_request(request).await;
    connection.abort();
    let status = answer.map_err(|e| failed(e.into()))?.status();
    if (200..400).contains(&status.as_u16()) {
        Ok(())
    } else {
        Err(Unhealthy::Status { url, status })
    }
}

/// The health loop's state, shared with the API and the metrics.
#[derive(Default)]
pub(crate) struct Health {
    view: Mutex<HealthView>,
}

impl Health {
    pub fn view(&self) -> HealthView {
        locked(&self.view).clone()
    }
}

/// Checks now and then every retry interval of the first group (its
/// timings as adopted), until the agent stops. `priority` is the one the
/// groups were joined with 0 for, until the first check passes.
pub(crate) async fn watch(
    settings: HealthSettings,
    groups: Vec<(String, Group)>,
    priority: u32,
    health: Arc<Health>,
    step_downs: mpsc::UnboundedSender<String>,
    metrics: Arc<AgentMetrics>,
) {
    let mut restored = false;
    loop {
        let result = check(&settings.check, settings.timeout).await;
        let failures = {
            let mut view = locked(&health.view);
            view.checked = true;
            view.checks += 1;
            match &result {
                Ok(()) => {
                    view.healthy = true;
                    view.failures = 0;
                    view.reason = None;
                }
                Err(reason) => {
                    view.healthy = false;
                    view.failures += 1;
                    view.failed += 1;
                    view.reason = Some(reason.to_string());
                }
            }
            view.failures
        };
        metrics.health_checked(result.is_ok());
        match &result {
            Ok(()) => {
                for (_, group) in &groups {
                    if !restored {
                        let _ = group.set_priority(priority);
                    }
                    if group.problem().is_some() {
                        tracing::info!(group = %group.name(), "the application is healthy again");
                    }
                    group.set_problem(None);
                }
                restored = true;
            }
            Err(reason) => {
                for (name, group) in &groups {
                    if group.problem().is_none() {
                        tracing::warn!(group = %group.name(), %reason, "the application is unhealthy: this pod does not take the lead");
                    }
                    group.set_problem(Some(&format!("unhealthy: {reason}")));
                    if failures >= settings.failures && group.is_leader() {
                        tracing::warn!(group = %group.name(), failures, %reason, "the application failed its health check {failures} times in a row: stepping down");
                        let _ = step_downs.send(name.clone());
                    }
                }
            }
        }
        let every = groups.first().map_or(Duration::from_secs(2), |(_, g)| {
            g.timings().retry_interval()
        });
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_health_url_is_plain_http_with_a_host() {
        assert_eq!(
            Check::url("http://127.0.0.1:8080/ready?full=1").unwrap(),
            Check::Url {
                authority: "127.0.0.1:8080".into(),
                path: "/ready?full=1".into()
            }
        );
        assert_eq!(
            Check::url("http://localhost").unwrap(),
            Check::Url {
                authority: "localhost:80".into(),
                path: "/".into()
            }
        );
        for bad in ["https://x/ready", "/ready", "not a url"] {
            let e = Check::url(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--health-url {bad:?} ")), "{e}");
        }
    }

    /// A server that answers each connection with `status`, once each.
    async fn answering(statuses: &[&'static str]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let statuses = statuses.to_vec();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            for status in statuses {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        format!("http://{addr}/ready")
    }

    #[tokio::test]
    async fn a_url_passes_from_200_to_399_and_says_what_it_answered() {
        let url = answering(&["200 OK", "302 Found", "503 Service Unavailable"]).await;
        let check_url = Check::url(&url).unwrap();
        let second = Duration::from_secs(5);
        assert!(matches!(check(&check_url, second).await, Ok(())));
        assert!(matches!(check(&check_url, second).await, Ok(())));
        let e = check(&check_url, second).await.unwrap_err().to_string();
        assert_eq!(e, format!("GET {url} answered 503 Service Unavailable"));
        // Nobody listens any more.
        let e = check(&check_url, second).await.unwrap_err().to_string();
        assert!(e.starts_with(&format!("GET {url}: ")), "{e}");
    }

    #[tokio::test]
    async fn a_command_passes_on_exit_0_and_says_why_it_failed() {
        assert!(matches!(
            check(&Check::Command("true".into()), Duration::from_secs(5)).await,
            Ok(())
        ));
        let e = check(
            &Check::Command("echo broken >&2; exit 3".into()),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(e, "the health command exited with 3: broken");
        let e = check(
            &Check::Command("sleep 5".into()),
            Duration::from_millis(100),
        )
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(e, "no answer within 100 ms");
    }
}
