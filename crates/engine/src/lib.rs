//! leasehold's engine: leader election and a live-node registry on a store.
//!
//! This crate knows nothing of Kubernetes, command lines or the process it
//! runs in, and builds on any platform Tokio and the stores' clients support:
//! a [`Node`] registers itself in the store, keeps its registration alive, sweeps
//! dead nodes, and campaigns for the groups it joins. The operator's
//! controller and the agent sidecar are built on it, and a Rust service can
//! embed it directly:
//!
//! ```no_run
//! # async fn demo(url: &str) -> Result<(), leasehold_engine::Error> {
//! use leasehold_engine::{ElectionConfig, Node, NodeConfig, Store};
//! let store = Store::connect(url, "leasehold")?;
//! let node = Node::start(store, "default/worker-0", NodeConfig::default()).await?;
//! let group = node.join("default/reports", ElectionConfig::default())?;
//! if let Some(term) = group.leader_term() {
//!     // leader-only work, fenced by `term`
//! }
//! node.close().await?;
//! # Ok(()) }
//! ```
// Production code only (clippy.toml sets the length); a test reads as one scenario.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod backoff;
pub mod config;
pub mod election;
pub mod events;
pub mod inbox;
mod incarnation;
pub mod node;
pub mod store;
pub mod term;

mod error;
pub mod sync;
mod task;

#[cfg(feature = "test-hooks")]
pub mod test_hooks;

pub use config::{
    ConfigError, ElectionConfig, InboxConfig, NodeConfig, DEFAULT_PRIORITY, MAX_PRIORITY,
};
pub use election::{Group, Leadership, Role};
pub use error::{Error, SuccessorRefusal};
pub use events::{Event, LostReason, Observer, Operation};
pub use inbox::topic::TopicError;
pub use inbox::{
    Delivery, Inbox, Message, Outbound, Overflow, PublishOptions, Published, Retain, To,
};
pub use node::{Node, NodeOptions, StepDownRequest};
pub use store::messaging::NodeInfo;
pub use store::safety::SettingWarning;
pub use store::{
    ConnectError, ConnectOptions, DeferReason, Deferral, ReplicaAcks, Store, StoreError,
};
pub use term::{CLOCK_STEP_BACK_MS, TERM_EPOCH_HOLD_MS};
