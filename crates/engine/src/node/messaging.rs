//! A node's messaging API: subscriptions, publishing and direct messages,
//! and its inbox. The machinery is in [`crate::inbox`]; this is the surface.

use std::time::Duration;

use tokio::sync::oneshot;

use super::Node;
use crate::config::{self, validate_name};
use crate::inbox::publisher;
use crate::inbox::topic::{validate_subscription, validate_topic};
use crate::inbox::{Inbox, Outbound, Overflow, PublishOptions, Published, Retain, To};
use crate::store::bounded;
use crate::store::messaging::{Destination, Outgoing, PublishOutcome};
use crate::sync::locked;
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
        let message = self.checked(To::Topic(topic.to_owned(), options), payload.to_vec())?;
        outcome(self.queue(message).await?).await
    }

    /// Sends a message to one node's inbox; it must be live.
    pub async fn send(&self, node: &str, payload: &[u8]) -> Result<Published, Error> {
        let message = self.checked(To::Node(node.to_owned()), payload.to_vec())?;
        outcome(self.queue(message).await?).await
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
            to: None,
        };
        self.send_command(node, &command).await
    }

    /// Asks the live node `node` to hand `group` over to `successor`
    /// ([`Node::hand_over`]), as [`Node::ask_to_step_down`] asks a
    /// step-down. The answer does not come back: a refusal (the successor
    /// is no live member that may lead) is logged by `node`, which leads
    /// on; check [`crate::Store::group_state`] first.
    pub async fn ask_to_hand_over(
        &self,
        node: &str,
        group: &str,
        successor: &str,
    ) -> Result<Published, Error> {
        validate_name("group name", group)?;
        validate_name("successor", successor)?;
        let command = crate::inbox::command::Command::StepDown {
            group: group.to_owned(),
            to: Some(successor.to_owned()),
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
        let message = self.outgoing(
            Destination::Command(node.to_owned()),
            command.encode(),
            PublishOptions::default(),
        )?;
        outcome(self.queue(message).await?).await
    }

    /// Publishes a batch: each message to a topic or to one node, in
    /// order, as one call per message would, but queued at once so the
    /// publisher sends them to the store together. Every message is checked
    /// first; if one is invalid, nothing is published and the error names
    /// its index ([`Error::InBatch`]). After that each message succeeds or
    /// fails on its own (a full inbox with [`Overflow::Refuse`], a node that
    /// is not live, the store), and the answer has one result per message.
    ///
    /// The batch is queued whole by a task of its own: a caller that gives
    /// up waiting (a dropped future) cannot leave it queued only in part.
    pub async fn publish_all(
        &self,
        messages: Vec<Outbound>,
    ) -> Result<Vec<Result<Published, Error>>, Error> {
        let mut requests = Vec::with_capacity(messages.len());
        let mut answers = Vec::with_capacity(messages.len());
        for (index, m) in messages.into_iter().enumerate() {
            let message = self.checked(m.to, m.payload).map_err(|e| Error::InBatch {
                index,
                source: Box::new(e),
            })?;
            let (reply, answer) = oneshot::channel();
            requests.push(publisher::Request { message, reply });
            answers.push(answer);
        }
        let publisher = self.publisher.clone();
        // In order from this one task, so they keep their order. A request
        // that cannot be queued (the node is closing) drops its reply, and
        // its answer below reads as a timeout.
        let queued = tokio::spawn(async move {
            for request in requests {
                if publisher.send(request).await.is_err() {
                    break;
                }
            }
        });
        let _ = queued.await;
        let mut results = Vec::with_capacity(answers.len());
        for answer in answers {
            results.push(outcome(answer).await);
        }
        Ok(results)
    }

    /// A message to a topic or a node, checked (the topic's or the node
    /// id's spelling, the size, the options) and ready to queue.
    fn checked(&self, to: To, payload: Vec<u8>) -> Result<Outgoing, Error> {
        match to {
            To::Topic(topic, options) => {
                validate_topic(&topic)?;
                self.outgoing(Destination::Topic(topic), payload, options)
            }
            To::Node(node) => {
                validate_name("node id", &node)?;
                self.outgoing(Destination::Node(node), payload, PublishOptions::default())
            }
        }
    }

    /// The message as the publisher takes it, once it is checked: everything
    /// is checked before the message is queued, so that a batch in the store
    /// never fails half-way.
    fn outgoing(
        &self,
        destination: Destination,
        payload: Vec<u8>,
        options: PublishOptions,
    ) -> Result<Outgoing, Error> {
        let retain_ms = options.retain.as_ms()?;
        let max = self.inbox_config.max_message_size;
        if payload.len() as u64 > max {
            return Err(Error::DataTooLarge {
                size: payload.len() as u64,
                max,
            });
        }
        Ok(Outgoing {
            destination,
            payload,
            refuse_when_full: options.overflow == Overflow::Refuse,
            retain_ms,
        })
    }

    /// Hands the message to the publisher; the answer comes on the receiver.
    async fn queue(&self, message: Outgoing) -> Result<Answer, Error> {
        let (reply, answer) = oneshot::channel();
        self.publisher
            .send(publisher::Request { message, reply })
            .await
            .map_err(|_| timed_out())?;
        Ok(answer)
    }
}

type Answer = oneshot::Receiver<Result<PublishOutcome, crate::StoreError>>;

fn timed_out() -> Error {
    Error::Store(crate::StoreError::Timeout(config::REQUEST_TIMEOUT))
}

async fn outcome(answer: Answer) -> Result<Published, Error> {
    // No timer of its own: the publisher bounds each call to the store
    // (REQUEST_TIMEOUT) and always answers, and a publisher that is gone
    // (the node closed) drops the reply, which reads as a timeout here.
    let outcome = answer.await.map_err(|_| timed_out())??;
    match outcome {
        PublishOutcome::Delivered { id, reached } => Ok(Published { id, reached }),
        PublishOutcome::InboxFull { node } => Err(Error::InboxFull(node)),
        PublishOutcome::NotLive { node } => Err(Error::NodeNotRegistered(node)),
    }
}
