//! The agent's local HTTP API. Every answer about leadership comes from the
//! group's local lease view ([`Group::leader_term`]), the same check the
//! library gives embedded users: an agent whose lease ran out locally says
//! so at once, even before its campaign task has noticed.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::StepDown;
use leasehold_daemon::http::{error_json, Head, Response};
use leasehold_daemon::metrics;
use prometheus_client::registry::Registry;

use crate::mailbox::Mailbox;
use crate::messaging;
use crate::metrics::AgentMetrics;
use leasehold_engine::{Group, Node, Role, Store};

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

/// One group as this agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct GroupView {
    /// The engine's group name, `NAMESPACE/NAME`.
    pub group: String,
    /// `leader`, `follower`, `candidate` or `abstaining`.
    pub role: String,
    /// The leader's term, when one is known.
    pub term: Option<u64>,
    /// The leader's node id, when one is known.
    pub leader: Option<String>,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Status {
    pub node: String,
    pub namespace: String,
    /// By LeaderGroup name.
    pub groups: BTreeMap<String, GroupView>,
    pub inbox: InboxView,
}

/// Messages taken from this node's inbox for the API's readers since the
/// agent started, and the times it came back after its registration had
/// expired (what was sent meanwhile is lost).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct InboxView {
    pub received: u64,
    pub recoveries: u64,
}

/// The view of a group from its role and the local lease check. A role of
/// leader whose local lease already ran out is reported as a candidate: that
/// is what the node is until it renews or loses.
pub fn view(group: &str, role: &Role, leading: Option<u64>, me: &str) -> GroupView {
    let (term, leader) = match (role, leading) {
        (_, Some(term)) => (Some(term), Some(me.to_owned())),
        (Role::Follower { leader, term }, None) => (Some(*term), Some(leader.clone())),
        _ => (None, None),
    };
    GroupView {
        group: group.to_owned(),
        role: role_text(role, leading).to_owned(),
        term,
        leader,
    }
}

/// What the API and the role files call a role. Only a live local lease
/// (`leading`) reads as `leader`; a leader whose lease ran out locally is a
/// `candidate` until it renews or loses.
pub(crate) fn role_text(role: &Role, leading: Option<u64>) -> &'static str {
    match (role, leading) {
        (_, Some(_)) => "leader",
        (Role::Leader { .. } | Role::Candidate, None) => "candidate",
        (Role::Follower { .. }, None) => "follower",
        (Role::Abstaining, None) => "abstaining",
    }
}

fn group_view(state: &State, group: &Group) -> GroupView {
    let role = group.role().borrow().clone();
    view(group.name(), &role, group.leader_term(), &state.node_id)
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

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Surface {
    /// Everything, step-down included (`--listen`, loopback by default).
    Api,
    /// `/healthz`, `/readyz` and `/metrics` only (`--probe-listen`), to be
    /// reachable by the kubelet and Prometheus without exposing step-down.
    Probes,
}

/// Answers one request. Unknown paths are 404, known paths with the wrong
/// method 405; a step-down, a publish or an inbox read from a browser (a
/// request with `Origin`) is 403.
pub(crate) async fn respond(state: Arc<State>, surface: Surface, head: Head) -> Response {
    let method = head.method.clone();
    let path = head.route();
    if surface == Surface::Probes && !matches!(path, "/healthz" | "/readyz" | "/metrics") {
        return error(
            404,
            "this listener (--probe-listen) serves /healthz, /readyz and /metrics only",
        );
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("GET", ["healthz"]) => Response::text(200, "ok\n"),
        ("GET", ["readyz"]) => leasehold_daemon::http::readiness(&state.store).await,
        ("GET", ["metrics"]) => {
            state.metrics.update(&state.groups);
            Response::with_type(200, metrics::CONTENT_TYPE, metrics::render(&state.registry))
        }
        ("GET", ["v1", "status"]) => {
            let groups = state
                .groups
                .iter()
                .map(|(name, g)| (name.clone(), group_view(&state, g)))
                .collect();
            json(
                200,
                &Status {
                    node: state.node_id.clone(),
                    namespace: state.namespace.clone(),
                    groups,
                    inbox: {
                        let (received, recoveries) = state.mailbox.counts();
                        InboxView {
                            received,
                            recoveries,
                        }
                    },
                },
            )
        }
        (_, ["v1", "groups", name, action]) => {
            let Some((_, group)) = state.groups.iter().find(|(n, _)| n == name) else {
                return error(
                    404,
                    format!("this agent does not campaign for group {name:?}"),
                );
            };
            match (method.as_str(), *action) {
                ("GET", "leader") => {
                    let view = group_view(&state, group);
                    json(if view.role == "leader" { 200 } else { 503 }, &view)
                }
                ("POST", "step-down") if head.origin.is_some() => error(
                    403,
                    "a request with an Origin header (sent by a browser) may not step down",
                ),
                ("POST", "step-down") => step_down(&state, name, group.name()).await,
                (_, "leader") => error(405, "use GET"),
                (_, "step-down") => error(405, "use POST"),
                _ => error(404, "not found"),
            }
        }
        (
            _,
            ["v1", "inbox" | "publish" | "send" | "subscriptions"]
            | ["v1", "inbox", "events"]
            | ["v1", "publish", "batch"],
        ) if head.origin.is_some() => error(
            403,
            "a request with an Origin header (sent by a browser) may not use the inbox or publish",
        ),
        ("GET", ["v1", "inbox"]) => messaging::long_poll(&state, &head).await,
        ("GET", ["v1", "inbox", "events"]) => messaging::event_stream(&state, &head),
        ("POST", ["v1", "publish"]) => messaging::publish(&state, &head).await,
        ("POST", ["v1", "publish", "batch"]) => messaging::publish_batch(&state, &head).await,
        ("POST", ["v1", "send"]) => messaging::send(&state, &head).await,
        ("GET", ["v1", "subscriptions"]) => messaging::subscriptions(&state),
        ("POST", ["v1", "subscriptions"]) => messaging::subscribe(&state, &head, true).await,
        ("DELETE", ["v1", "subscriptions"]) => messaging::subscribe(&state, &head, false).await,
        (
            _,
            ["healthz" | "readyz" | "metrics"]
            | ["v1", "status"]
            | ["v1", "inbox"]
            | ["v1", "inbox", "events"],
        ) => error(405, "use GET"),
        (_, ["v1", "publish" | "send"] | ["v1", "publish", "batch"]) => error(405, "use POST"),
        (_, ["v1", "subscriptions"]) => error(405, "use GET, POST or DELETE"),
        _ => error(404, "not found"),
    }
}

async fn step_down(state: &State, name: &str, full: &str) -> Response {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = StepDown {
        group: name.to_owned(),
        reply,
    };
    if state.step_downs.send(request).await.is_err() {
        return error(503, "the agent is shutting down");
    }
    match answer.await {
        Ok(Ok(was_leader)) => json(
            200,
            &serde_json::json!({ "group": full, "wasLeader": was_leader }),
        ),
        Ok(Err(e)) => error(503, e.to_string()),
        Err(_) => error(503, "the agent is shutting down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_that_ran_out_locally_is_not_reported_as_leading() {
        let v = view("ns/g", &Role::Leader { term: 4 }, None, "ns/me");
        assert_eq!(
            (v.role.as_str(), v.term, v.leader),
            ("candidate", None, None)
        );
        let v = view("ns/g", &Role::Leader { term: 4 }, Some(4), "ns/me");
        assert_eq!(
            (v.role.as_str(), v.term, v.leader.as_deref()),
            ("leader", Some(4), Some("ns/me"))
        );
    }

    #[test]
    fn followers_name_the_leader_and_its_term() {
        let role = Role::Follower {
            leader: "ns/other".into(),
            term: 9,
        };
        let v = view("ns/g", &role, None, "ns/me");
        assert_eq!(
            (v.role.as_str(), v.term, v.leader.as_deref()),
            ("follower", Some(9), Some("ns/other"))
        );
        let v = view("ns/g", &Role::Abstaining, None, "ns/me");
        assert_eq!((v.role.as_str(), v.term), ("abstaining", None));
    }
}
