//! What an inbox yields.

/// A message as delivered to its recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Id shared by every copy of one publish, increasing per Redis.
    pub id: u64,
    /// The topic it was published to; `None` for a direct message.
    pub topic: Option<String>,
    /// Node id of the publisher.
    pub from: String,
    pub payload: Vec<u8>,
    /// Delivered because the node subscribed and this was the topic's
    /// retained message.
    pub retained: bool,
}

/// What a node's inbox yields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Message(Message),
    /// The node's lease had expired and it registered again: messages
    /// published while it was gone are lost, resynchronize. Comes before
    /// every message published after the recovery.
    Recovered,
}
