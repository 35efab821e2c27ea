//! Reading a node's inbox and command queue: what one read gives, and the
//! opaque cursor that says how far it got. The inbox reader
//! (the `reader` of the inbox module) owns the loop; this is only the
//! store's half.

/// How far a queue was read: the last entry taken (empty: none yet). Its
/// form is the store's own (a stream id on Redis); the engine only passes
/// it back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct InboxCursor(pub(super) String);

/// A message as delivered to its recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Id shared by every copy of one publish, increasing per store.
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

/// Which of a node's two queues an entry is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queue {
    /// Commands for the node's engine (a step-down from the controller), in
    /// a queue of their own so they never wait behind, or are dropped for,
    /// the application's unread messages.
    Commands,
    /// Messages for the application.
    Inbox,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The node's registration lapsed and was renewed here: what came
    /// before may be lost (see the node module).
    Recovered,
    /// For the engine itself.
    Command { from: String, payload: Vec<u8> },
    /// For the application.
    Message(Message),
}

/// One entry read, with where it came from and its cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    pub queue: Queue,
    pub cursor: InboxCursor,
    pub entry: Entry,
}

/// How far each queue was read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cursors {
    pub commands: InboxCursor,
    pub inbox: InboxCursor,
}
