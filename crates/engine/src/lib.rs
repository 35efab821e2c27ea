//! leasehold's engine: leader election and a live-node registry on Redis.
//!
//! This crate knows nothing of Kubernetes, command lines or the process it
//! runs in, and builds on any platform Tokio and redis-rs support:
//! a [`Node`] registers itself in Redis, keeps its registration alive, sweeps
//! dead nodes, and campaigns for the groups it joins. The operator's
//! controller and the agent sidecar are built on it, and a Rust service can
//! embed it directly:
//!
//! ```no_run
//! # async fn demo() -> Result<(), leasehold_engine::Error> {
//! use leasehold_engine::{ElectionConfig, Node, NodeConfig, Store};
//! let store = Store::connect("redis://127.0.0.1:6379", "leasehold")?;
//! let node = Node::start(store, "default/worker-0", NodeConfig::default()).await?;
//! let group = node.join("default/reports", ElectionConfig::default())?;
//! if let Some(term) = group.leader_term() {
//!     // leader-only work, fenced by `term`
//! }
//! node.close().await?;
//! # Ok(()) }
//! ```

mod backoff;
pub mod config;
pub mod election;
pub mod events;
pub mod inbox;
mod incarnation;
pub mod node;
pub mod store;
pub mod term;

mod task;

/// The engine's one policy for a poisoned mutex: go on with the data. Every
/// critical section leaves it consistent (plain assignments), so a panic in
/// another task must not take the node down with it.
pub(crate) fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
#[cfg(feature = "test-hooks")]
pub mod test_hooks;

pub use config::{ConfigError, ElectionConfig, InboxConfig, NodeConfig};
pub use election::{Group, Role};
pub use events::{Event, LostReason, Observer, Operation};
pub use inbox::topic::TopicError;
pub use inbox::{
    Delivery, Inbox, Message, Outbound, Overflow, PublishOptions, Published, Retain, To,
};
pub use node::{Node, NodeOptions, StepDownRequest};
pub use store::{
    ConnectError, ConnectOptions, NodeInfo, ReplicaAcks, SettingWarning, Store, StoreError,
};
pub use term::{CLOCK_STEP_BACK_MS, TERM_EPOCH_HOLD_MS};

/// Every error the engine's API returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("group {0:?} is already joined by this node")]
    AlreadyJoined(String),
    #[error("group {0:?} is not joined by this node")]
    NotJoined(String),
    #[error("another live process took over this node id; this node no longer campaigns")]
    Displaced,
    /// Covers both `InvalidTopic` and `InvalidPattern`.
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error("node {0:?} is not a live registered node")]
    NodeNotRegistered(String),
    #[error("payload of {size} bytes is larger than max_message_size = {max}")]
    DataTooLarge { size: u64, max: u64 },
    #[error("the inbox of node {0:?} is full; the publish was refused and nothing was written")]
    InboxFull(String),
    /// A message of a batch ([`Node::publish_all`]) is invalid; nothing of
    /// the batch was published.
    #[error("message {index} of the batch (counting from 0): {source}")]
    InBatch {
        /// From 0.
        index: usize,
        source: Box<Error>,
    },
}
