//! The agent's local HTTP API: which endpoint answers a request, on which
//! listener, and the refusals every endpoint shares (unknown paths 404,
//! wrong methods 405, browsers 403). The answers themselves live in
//! `status` (leadership) and `messaging` (inboxes and publishing).

mod messaging;
mod state;
mod status;

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::header::ORIGIN;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use leasehold_daemon::http::{self, get_only, Refusal};

pub(crate) use state::{AgentState, StepDown};
pub(crate) use status::role_text;
pub use status::{DeferView, GroupView, InboxView, Status};

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Surface {
    /// Everything, step-down included (`--listen`, loopback by default).
    Api,
    /// `/healthz`, `/readyz` and `/metrics` only (`--probe-listen`), to be
    /// reachable by the kubelet and Prometheus without exposing step-down.
    Probes,
}

/// The routes of one listener. Unknown paths are 404, known paths with the
/// wrong method 405; a step-down, a publish or an inbox read from a browser
/// (a request with `Origin`) is 403.
pub(crate) fn router(state: Arc<AgentState>, surface: Surface) -> Router {
    let probes = {
        let state = state.clone();
        http::probes(state.store.clone(), state.registry.clone(), move || {
            state.metrics.update(&state.groups);
        })
    };
    if surface == Surface::Probes {
        return probes.fallback(|| async {
            Refusal::new(
                404,
                "this listener (--probe-listen) serves /healthz, /readyz and /metrics only",
            )
        });
    }
    // Refused whatever the method (the layer wraps each route's 405 too).
    let messaging = Router::new()
        .route("/v1/publish", post(messaging::publish).fallback(use_post))
        .route(
            "/v1/publish/batch",
            post(messaging::publish_batch).fallback(use_post),
        )
        .route("/v1/send", post(messaging::send).fallback(use_post))
        .route(
            "/v1/subscriptions",
            get(messaging::subscriptions)
                .post(messaging::subscribe)
                .delete(messaging::unsubscribe)
                .head(use_get_post_delete)
                .fallback(use_get_post_delete),
        )
        .route("/v1/inbox", get_only(messaging::long_poll))
        .route("/v1/inbox/events", get_only(messaging::event_stream))
        .route_layer(middleware::from_fn(refuse_browsers));
    // A group this agent does not campaign for is a 404 whatever the method.
    let groups = Router::new()
        .route("/v1/groups/{name}/leader", get_only(status::leader))
        .route(
            "/v1/groups/{name}/step-down",
            post(status::step_down).fallback(use_post),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            campaigned_for,
        ));
    Router::new()
        .route("/v1/status", get_only(status::status))
        .merge(groups)
        .merge(messaging)
        .with_state(state)
        .merge(probes)
        .fallback(|| async { Refusal::new(404, "not found") })
}

async fn use_post() -> Refusal {
    Refusal::new(405, "use POST")
}

async fn use_get_post_delete() -> Refusal {
    Refusal::new(405, "use GET, POST or DELETE")
}

/// Lets a request about a group through only if this agent campaigns for it.
async fn campaigned_for(
    State(state): State<Arc<AgentState>>,
    Path(name): Path<String>,
    request: Request,
    next: Next,
) -> Response {
    match state.group(&name) {
        Ok(_) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

async fn refuse_browsers(request: Request, next: Next) -> Response {
    if request.headers().contains_key(ORIGIN) {
        return Refusal::new(
            403,
            "a request with an Origin header (sent by a browser) may not use the inbox or publish",
        )
        .into_response();
    }
    next.run(request).await
}
