//! What a store call can fail with, and the bound on how long it may take.
//! The errors are the engine's own, whichever store answered; the store's
//! own error stays reachable as the `source()`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::ConfigError;

/// The URL forms a store accepts, for the message of a URL it cannot read.
const URL_FORMS: &str = "redis://[user:password@]host[:port][/db], rediss://… for TLS, \
redis+sentinel://[user:password@]host[:port][,host[:port]…]/MASTER[/db], \
redis+cluster://[user:password@]host[:port][,host[:port]…] (rediss+sentinel://, rediss+cluster:// for TLS), \
or for PostgreSQL postgres://[user@]host[:port][,host[:port]…]/database";

/// Why [`crate::Store::connect`] refused to start, as what went wrong, so a
/// caller blames the right setting without knowing the store; the store's
/// own error is the payload.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the store URL is invalid ({0}); expected {URL_FORMS}")]
    Url(Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Prefix(#[from] ConfigError),
    #[error("could not set up the store's connection: {0}")]
    Setup(Box<dyn std::error::Error + Send + Sync>),
    /// The CA checks nothing: it is not PEM, or the URL turns TLS off.
    #[error(transparent)]
    Ca(Box<dyn std::error::Error + Send + Sync>),
    /// The store refuses the URL or the prefix; its error says what to do.
    #[error(transparent)]
    Refused(Box<dyn std::error::Error + Send + Sync>),
}

/// A failed store call. Never fatal: loops report it and try again.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The server or the connection failed the call (`store` names which
    /// kind: "redis", "postgres").
    #[error("{store}: {source}")]
    Failed {
        store: &'static str,
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("unexpected reply from the store: {0}")]
    Reply(String),
    #[error(
        "the lease write reached {acked} of the {wanted} replicas it must reach (the wait for them timed out)"
    )]
    Unconfirmed { acked: u64, wanted: u64 },
    /// No primary to talk to: the sentinels do not agree on one, or no
    /// cluster node answers.
    #[error("{0}")]
    Topology(String),
}

/// Runs one store call, giving up after `limit`. A hung connection (a paused
/// server, a black-holed network) must never wedge a loop or a shutdown.
pub async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Timeout(limit)),
    }
}
