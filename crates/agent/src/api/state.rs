//! What every handler of the agent's API shares: the agent's state, the
//! step-down request the node's owner answers, and the query extractor
//! whose refusal reads like every other (`{"error": ...}`).

use std::sync::Arc;

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use leasehold_daemon::http::Refusal;
use leasehold_engine::{Group, Node, Store};
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;

use crate::mailbox::Mailbox;
use crate::metrics::AgentMetrics;

pub(crate) struct AgentState {
    pub node_id: String,
    pub namespace: String,
    /// `(LeaderGroup name, handle)`.
    pub groups: Vec<(String, Group)>,
    pub store: Store,
    pub step_downs: tokio::sync::mpsc::Sender<StepDown>,
    /// For publishing, sending and subscribing.
    pub node: Arc<Node>,
    pub mailbox: Arc<Mailbox>,
    pub registry: Arc<Registry>,
    pub metrics: Arc<AgentMetrics>,
    /// The application's health, when the agent checks it.
    pub health: Option<Arc<crate::health::Health>>,
}

impl AgentState {
    /// The group this agent campaigns for under LeaderGroup name `name`.
    pub fn group(&self, name: &str) -> Result<&Group, Refusal> {
        self.groups
            .iter()
            .find_map(|(n, group)| (n == name).then_some(group))
            .ok_or_else(|| {
                Refusal::new(
                    404,
                    format!("this agent does not campaign for group {name:?}"),
                )
            })
    }
}

/// A step-down asked for through the API, answered by the task owning the node.
pub(crate) struct StepDown {
    pub group: String,
    /// The node to hand the group to (`?to=`), as a node id.
    pub to: Option<String>,
    pub reply: tokio::sync::oneshot::Sender<Result<bool, leasehold_engine::Error>>,
}

/// The query string as `T`, percent-decoded; a query that is not `T` is a
/// 400 [`Refusal`]. The parameters' types are strings, checked by the
/// handler, so a refusal can name the value and the range allowed.
pub(crate) struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Refusal> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(params)) => Ok(Self(params)),
            Err(e) => Err(Refusal::new(400, e.body_text())),
        }
    }
}
