//! What a store call can fail with, and the bound on how long it may take.
//! The errors are the engine's own, whichever store answered; the store's
//! own error stays reachable as the `source()`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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
