//! What an inbox yields.

pub use crate::store::inbox::Message;

/// What a node's inbox yields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Message(Message),
    /// The node's lease had expired and it registered again: messages
    /// published while it was gone are lost, resynchronize. Comes before
    /// every message published after the recovery.
    Recovered,
}
