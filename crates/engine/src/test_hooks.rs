//! Raw store calls for leasehold's own tests (feature `test-hooks`): states
//! no public call makes, such as a node registered with no process reading
//! its inbox, or a sweep run by hand. Not part of the API.

use crate::{Store, StoreError};

/// Registers `id` under `incarnation` with no process behind it.
pub async fn register_node(
    store: &Store,
    id: &str,
    incarnation: &str,
    lease_ms: u64,
    metadata: &[(String, String)],
) -> Result<(), StoreError> {
    store
        .register(id, incarnation, lease_ms, false, &[], metadata)
        .await
        .map(drop)
}

/// Subscribes the node `id` as its own engine would.
pub async fn subscribe_node(
    store: &Store,
    id: &str,
    subscription: &str,
    inbox_max: u64,
) -> Result<u64, StoreError> {
    store.subscribe(id, subscription, inbox_max).await
}

/// One sweep pass of at most `batch` expired nodes; the ids it removed.
pub async fn sweep(store: &Store, batch: usize) -> Result<Vec<String>, StoreError> {
    Ok(store.sweep(batch).await?.swept)
}

/// Claims this node has sent, in all its groups: what a follower at rest
/// costs its store, counted alike on either store.
pub fn claims_sent(node: &crate::Node) -> u64 {
    node.claims_sent()
}
