//! Per-node inboxes and messaging between nodes.
//!
//! Every node has an inbox (a stream in the store) that only it reads, on a
//! connection of its own with a blocking read. Publishing to a topic writes
//! the message into the inbox of every *live* subscriber (lease valid on the
//! store's clock) in one atomic script, so a node that is gone receives
//! nothing, and messages from one publisher reach each subscriber in order.
//!
//! No silent loss: an inbox past its limit drops its oldest unread messages
//! and counts every drop (node hash field `dropped`, `Event::Dropped`, and the
//! node listing); a publisher may instead ask for a bounded backlog, and the
//! publish is then refused whole. A backlog past the lag threshold is
//! reported as `Event::Lag`. Retained messages go to new subscribers first,
//! and never again on recovery.

pub(crate) mod command;
mod message;
pub(crate) mod publisher;
mod reader;
pub mod topic;

use std::time::Duration;

use tokio::sync::mpsc;

pub use message::{Delivery, Message};
pub(crate) use reader::run as run_reader;

/// The receiving end of a node's inbox. Take it once with
/// [`crate::Node::inbox`]; while nobody takes messages, the backlog stays in
/// the store, bounded by the inbox limit.
pub struct Inbox {
    pub(crate) rx: mpsc::Receiver<Delivery>,
}

impl Inbox {
    /// The next delivery; `None` once the node is closed.
    pub async fn recv(&mut self) -> Option<Delivery> {
        self.rx.recv().await
    }

    /// The next delivery if one is already here, without waiting.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        self.rx.try_recv().ok()
    }

    /// The next message, skipping recovery notices.
    pub async fn next_message(&mut self) -> Option<Message> {
        loop {
            match self.recv().await? {
                Delivery::Message(m) => return Some(m),
                Delivery::Recovered => continue,
            }
        }
    }
}

/// How a topic's message is kept for later subscribers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Retain {
    #[default]
    No,
    /// Until replaced by the next retained publish.
    Forever,
    /// Until replaced, or for this long.
    For(Duration),
}

/// What happens when a subscriber's inbox is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Overflow {
    /// Its oldest unread messages are dropped (and counted).
    #[default]
    DropOldest,
    /// The whole publish is refused with [`crate::Error::InboxFull`].
    Refuse,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishOptions {
    pub retain: Retain,
    pub overflow: Overflow,
}

/// Where one message of [`crate::Node::publish_all`] goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum To {
    /// Every live subscriber of this topic, as [`crate::Node::publish_with`].
    Topic(String, PublishOptions),
    /// One live node's inbox, as [`crate::Node::send`]: never retained, and
    /// one to a full inbox drops its oldest message.
    Node(String),
}

/// One message of a batch for [`crate::Node::publish_all`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    pub to: To,
    pub payload: Vec<u8>,
}

/// A successful publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub id: u64,
    /// Inboxes written.
    pub reached: u64,
}

impl Retain {
    /// The retain ttl as the publish script takes it (`None`: not retained,
    /// `0`: no expiry), or the error for a ttl longer than
    /// [`MAX_RETAIN_MS`](crate::config::MAX_RETAIN_MS). A ttl under 1 ms is 1 ms.
    pub(crate) fn as_ms(self) -> Result<Option<u64>, crate::ConfigError> {
        match self {
            Retain::No => Ok(None),
            Retain::Forever => Ok(Some(0)),
            Retain::For(d) => {
                let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                if ms > crate::config::MAX_RETAIN_MS {
                    return Err(crate::ConfigError::OutOfBounds {
                        option: "retain ttl (ms)",
                        value: ms,
                        min: 1,
                        max: crate::config::MAX_RETAIN_MS,
                    });
                }
                Ok(Some(ms.max(1)))
            }
        }
    }
}
