//! What a store call can fail with, and the bound on how long it may take.

use std::future::Future;
use std::time::Duration;

/// A failed Redis call. Never fatal: loops report it and try again.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
    #[error(
        "the lease write reached {acked} of the {wanted} replicas it must reach (WAIT timed out)"
    )]
    Unconfirmed { acked: u64, wanted: u64 },
    /// No primary to talk to: the sentinels do not agree on one, or no
    /// cluster node answers.
    #[error("{0}")]
    Topology(String),
}

/// Runs one store call, giving up after `limit`. A hung connection (a paused
/// Redis, a black-holed network) must never wedge a loop or a shutdown.
pub async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Timeout(limit)),
    }
}
