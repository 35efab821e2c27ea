//! What the messaging calls of the store take and give: messages to
//! publish and where they go, what a publish achieved, and the registry's
//! view of a node.

/// What a publish achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// Written into `reached` inboxes under message id `id`.
    Delivered { id: u64, reached: u64 },
    /// Refused, nothing written: this node's inbox is full (only when the
    /// publisher asked for a bounded backlog).
    InboxFull { node: String },
    /// A direct message's target is not a live node; nothing written.
    NotLive { node: String },
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Every live subscriber of this topic (including pattern subscribers).
    Topic(String),
    /// One live node.
    Node(String),
    /// One live node's engine, which acts on it itself (e.g. a step-down
    /// command from the controller) instead of handing it to the inbox.
    Command(String),
}

/// One message to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub destination: Destination,
    pub payload: Vec<u8>,
    /// Refuse this message (nothing written) when an inbox is at its limit,
    /// instead of dropping that inbox's oldest messages.
    pub refuse_when_full: bool,
    /// `None` does not retain; `Some(0)` retains without expiry.
    pub retain_ms: Option<u64>,
}

/// A registered node as the store sees it, for operators and dashboards.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeInfo {
    pub id: String,
    /// Lease expiry, ms since the epoch on the store's clock.
    pub lease_until_ms: u64,
    pub registered_at_ms: u64,
    pub last_heartbeat_ms: u64,
    /// Unread messages in its inbox.
    pub backlog: u64,
    /// Messages dropped from its inbox because it was full.
    pub dropped: u64,
    pub groups: Vec<String>,
    /// Whether the lease is still valid (store clock).
    pub live: bool,
}
