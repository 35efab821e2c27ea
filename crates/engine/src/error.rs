//! The one error type of the engine's API.

use crate::config::ConfigError;
use crate::inbox::topic::TopicError;
use crate::store::{ConnectError, StoreError};

/// Why a handover to a named successor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SuccessorRefusal {
    #[error("it is not a live member of the group (a node that campaigns for it)")]
    NotMember,
    #[error("it campaigns with priority 0, so it never leads")]
    NeverLeads,
    #[error("its application is unhealthy, so it does not take the lead")]
    Unhealthy,
    #[error("it is the leader itself")]
    Itself,
    #[error("this node does not lead the group")]
    NotLeader,
}

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
    /// A handover to a named successor was refused; the leader keeps
    /// leading.
    #[error("cannot hand group {group:?} over to {successor:?}: {reason}")]
    Successor {
        group: String,
        successor: String,
        reason: SuccessorRefusal,
    },
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
