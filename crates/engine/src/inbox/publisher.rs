//! The publisher: one task per node through which every publish and send
//! goes. Publishes that are waiting while the previous batch is in Redis go
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
    let mut batch: Vec<Request> = Vec::with_capacity(PUBLISH_BATCH);
    while let Some(first) = requests.recv().await {
        let mut bytes = first.message.payload.len();
        batch.push(first);
        while batch.len() < PUBLISH_BATCH && bytes < PUBLISH_BATCH_BYTES {
            match requests.try_recv() {
                Ok(next) => {
                    bytes += next.message.payload.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let messages: Vec<Outgoing> = batch.iter().map(|r| r.message.clone()).collect();
        let result = bounded(REQUEST_TIMEOUT, shared.store.publish(&shared.id, &messages)).await;
        match result {
            Ok(outcomes) => {
                for (request, outcome) in batch.drain(..).zip(outcomes) {
                    let _ = request.reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(e.clone()));
                }
            }
        }
    }
}
