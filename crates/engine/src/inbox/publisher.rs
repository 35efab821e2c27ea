//! The publisher: one task per node through which every publish and send
//! goes. Publishes that are waiting while the previous batch is in the store go
//! together in the next one, so a busy publisher pays the script's fixed
//! costs once per batch instead of once per message; a lone publish goes at
//! once. One task also keeps one publisher's messages in order.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::config::{PUBLISH_BATCH, PUBLISH_BATCH_BYTES, REQUEST_TIMEOUT};
use crate::incarnation::Incarnation;
use crate::store::messaging::{Outgoing, PublishOutcome};
use crate::store::{bounded, StoreError};

pub(crate) struct Request {
    pub message: Outgoing,
    pub reply: oneshot::Sender<Result<PublishOutcome, StoreError>>,
}

pub(crate) async fn run(shared: Arc<Incarnation>, mut requests: mpsc::Receiver<Request>) {
    let mut messages: Vec<Outgoing> = Vec::with_capacity(PUBLISH_BATCH);
    let mut replies = Vec::with_capacity(PUBLISH_BATCH);
    while let Some(first) = requests.recv().await {
        let mut bytes = first.message.payload.len();
        messages.push(first.message);
        replies.push(first.reply);
        while messages.len() < PUBLISH_BATCH && bytes < PUBLISH_BATCH_BYTES {
            match requests.try_recv() {
                Ok(next) => {
                    bytes += next.message.payload.len();
                    messages.push(next.message);
                    replies.push(next.reply);
                }
                Err(_) => break,
            }
        }
        let result = bounded(REQUEST_TIMEOUT, shared.store.publish(&shared.id, &messages)).await;
        messages.clear();
        match result {
            Ok(outcomes) => {
                for (reply, outcome) in replies.drain(..).zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                for reply in replies.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}
