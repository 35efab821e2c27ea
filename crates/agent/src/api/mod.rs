//! The agent's local HTTP API: which endpoint answers a request, on which
//! listener, and the refusals every endpoint shares (unknown paths 404,
//! wrong methods 405, browsers 403). The answers themselves live in
//! `status` (leadership) and `messaging` (inboxes and publishing).

mod messaging;
mod state;
mod status;

use std::sync::Arc;

use leasehold_daemon::http::{self, Head, Response};

use state::{error, json};
pub(crate) use state::{State, StepDown};
pub(crate) use status::role_text;
pub use status::{GroupView, InboxView, Status};

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
    if method == "GET" && path.trim_matches('/') == "metrics" {
        state.metrics.update(&state.groups);
    }
    if let Some(answer) = http::probe(&head, &state.store, &state.registry).await {
        return answer;
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("GET", ["v1", "status"]) => status::status(&state),
        (_, ["v1", "groups", name, action]) => {
            let Some((_, group)) = state.groups.iter().find(|(n, _)| n == name) else {
                return error(
                    404,
                    format!("this agent does not campaign for group {name:?}"),
                );
            };
            match (method.as_str(), *action) {
                ("GET", "leader") => {
                    let view = status::group_view(&state, group);
                    json(if view.role == "leader" { 200 } else { 503 }, &view)
                }
                ("POST", "step-down") if head.origin.is_some() => error(
                    403,
                    "a request with an Origin header (sent by a browser) may not step down",
                ),
                ("POST", "step-down") => status::step_down(&state, name, group.name()).await,
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
