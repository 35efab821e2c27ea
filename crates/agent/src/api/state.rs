//! What every handler of the agent's API shares: the agent's state, the
//! step-down request the node's owner answers, and the JSON answer and
//! `{"error": ...}` shapes.

use std::sync::Arc;

use leasehold_daemon::http::{error_json, Response};
use leasehold_engine::{Group, Node, Store};
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::mailbox::Mailbox;
use crate::metrics::AgentMetrics;

pub(crate) struct State {
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
}

/// A step-down asked for through the API, answered by the task owning the node.
pub(crate) struct StepDown {
    pub group: String,
    pub reply: tokio::sync::oneshot::Sender<Result<bool, leasehold_engine::Error>>,
}

pub(crate) fn json(status: u16, value: &impl Serialize) -> Response {
    Response::json(
        status,
        serde_json::to_string(value).unwrap_or_else(|_| "{}".into()) + "\n",
    )
}

pub(crate) fn error(status: u16, message: impl Into<String>) -> Response {
    error_json(status, message)
}
