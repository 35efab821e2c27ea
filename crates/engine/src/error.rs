//! The one error type of the engine's API.

use crate::config::ConfigError;
use crate::inbox::topic::TopicError;
use crate::store::{ConnectError, StoreError};

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
