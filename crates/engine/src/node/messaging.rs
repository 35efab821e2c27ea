//! A node's messaging API: subscriptions, publishing and direct messages,
//! and its inbox. The machinery is in [`crate::inbox`]; this is the surface.

use std::time::Duration;

use tokio::sync::oneshot;

use super::{locked, Node};
use crate::config::{self, validate_name};
use crate::inbox::publisher;
use crate::inbox::topic::{validate_subscription, validate_topic};
use crate::inbox::{Inbox, Overflow, PublishOptions, Published, Retain};
use crate::store::{bounded, Destination, Outgoing, PublishOutcome};
use crate::Error;

impl Node {
    /// The node's inbox, to take messages from. Only the first call gets it.
    pub fn inbox(&self) -> Option<Inbox> {
        locked(&self.inbox).take().map(|rx| Inbox { rx })
    }

    /// Subscribes to a topic or a pattern (`orders.*.created`, `orders.>`).
    /// Retained messages it covers arrive first.
    pub async fn subscribe(&self, subscription: &str) -> Result<(), Error> {
        validate_subscription(subscription)?;
        locked(&self.subscriptions).insert(subscription.to_owned());
        let s = &self.shared;
        let result = bounded(
            config::REQUEST_TIMEOUT,
            s.store
                .subscribe(&s.id, subscription, self.inbox_config.max_length),
        )
        .await;
        if let Err(e) = result {
            locked(&self.subscriptions).remove(subscription);
            return Err(e.into());
        }
        Ok(())
    }

    pub async fn unsubscribe(&self, subscription: &str) -> Result<(), Error> {
        validate_subscription(subscription)?;
        locked(&self.subscriptions).remove(subscription);
        let s = &self.shared;
        bounded(
            config::REQUEST_TIMEOUT,
            s.store.unsubscribe(&s.id, subscription),
        )
        .await?;
        Ok(())
    }

    /// This node's subscriptions, as it will restore them after a recovery.
    pub fn subscriptions(&self) -> Vec<String> {
        locked(&self.subscriptions).iter().cloned().collect()
    }

    /// Publishes to every live subscriber of `topic`.
    pub async fn publish(&self, topic: &str, payload: &[u8]) -> Result<Published, Error> {
        self.publish_with(topic, payload, PublishOptions::default())
            .await
    }

    /// Publishes and keeps the message as the topic's retained one, for
    /// subscribers to come (`ttl`: how long; `None`: until replaced).
    pub async fn publish_retained(
        &self,
        topic: &str,
        payload: &[u8],
        ttl: Option<Duration>,
    ) -> Result<Published, Error> {
        let retain = ttl.map_or(Retain::Forever, Retain::For);
        let options = PublishOptions {
            retain,
            ..Default::default()
        };
        self.publish_with(topic, payload, options).await
    }

    pub async fn publish_with(
        &self,
        topic: &str,
        payload: &[u8],
        options: PublishOptions,
    ) -> Result<Published, Error> {
        validate_topic(topic)?;
        self.deliver(Destination::Topic(topic.to_owned()), payload, options)
            .await
    }

    /// Sends a message to one node's inbox; it must be live.
    pub async fn send(&self, node: &str, payload: &[u8]) -> Result<Published, Error> {
        validate_name("node id", node)?;
        self.deliver(
            Destination::Node(node.to_owned()),
            payload,
            PublishOptions::default(),
        )
        .await
    }

    /// Asks the live node `node` to step down from `group` (an operator
    /// process that manages the groups uses it). It travels in the node's
    /// command stream, apart from its inbox: the receiving engine steps down
    /// itself and never delivers it as a message, except that a node started
    /// with [`crate::NodeOptions::step_down_requests`] hands it to its
    /// application first.
    pub async fn ask_to_step_down(&self, node: &str, group: &str) -> Result<Published, Error> {
        validate_name("group name", group)?;
        let command = crate::inbox::command::Command::StepDown {
            group: group.to_owned(),
        };
        self.send_command(node, &command).await
    }

    /// Sends a command to another node's engine (see
    /// [`Node::ask_to_step_down`]). The node must be live.
    pub(crate) async fn send_command(
        &self,
        node: &str,
        command: &crate::inbox::command::Command,
    ) -> Result<Published, Error> {
        validate_name("node id", node)?;
        self.deliver(
            Destination::Command(node.to_owned()),
            &command.encode(),
            PublishOptions::default(),
        )
        .await
    }

    async fn deliver(
        &self,
        destination: Destination,
        payload: &[u8],
        options: PublishOptions,
    ) -> Result<Published, Error> {
        // Everything is checked before the message is queued: a batch must
        // not fail half-way in Redis.
        let retain_ms = options.retain.as_ms()?;
        let max = self.inbox_config.max_message_size;
        if payload.len() as u64 > max {
            return Err(Error::DataTooLarge {
                size: payload.len() as u64,
                max,
            });
        }
        let message = Outgoing {
            destination,
            payload: payload.to_vec(),
            refuse_when_full: options.overflow == Overflow::Refuse,
            retain_ms,
        };
        let (reply, answer) = oneshot::channel();
        let timeout = || Error::Store(crate::StoreError::Timeout(config::REQUEST_TIMEOUT));
        self.publisher
            .send(publisher::Request { message, reply })
            .await
            .map_err(|_| timeout())?;
        // The publisher bounds the call itself; this only guards a lost reply.
        let outcome = tokio::time::timeout(config::REQUEST_TIMEOUT * 2, answer)
            .await
            .map_err(|_| timeout())?
            .map_err(|_| timeout())??;
        match outcome {
            PublishOutcome::Delivered { id, reached } => Ok(Published { id, reached }),
            PublishOutcome::InboxFull { node } => Err(Error::InboxFull(node)),
            PublishOutcome::NotLive { node } => Err(Error::NodeNotRegistered(node)),
        }
    }
}
