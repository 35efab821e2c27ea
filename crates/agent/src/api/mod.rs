//! The agent's local HTTP API: which endpoint answers a request, on which
//! listener, and the refusals every endpoint shares (unknown paths 404,
//! wrong methods 405, browsers 403). The answers themselves live in
//! `status` (leadership) and `messaging` (inboxes and publishing).

mod messaging;
mod state;
mod status;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header::ORIGIN;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use leasehold_daemon::http::{self, use_get, Refusal};

pub(crate) use state::{AgentState, StepDown};
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
    // Refused before the method is looked at: a page may not even learn
    // which methods these take.
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
                .fallback(|| async { Refusal::new(405, "use GET, POST or DELETE") }),
        )
        .route("/v1/inbox", get(messaging::long_poll).fallback(use_get))
        .route(
            "/v1/inbox/events",
            get(messaging::event_stream).fallback(use_get),
        )
        .route_layer(middleware::from_fn(refuse_browsers));
    Router::new()
        .route("/v1/status", get(status::status).fallback(use_get))
        .route(
            "/v1/groups/{name}/leader",
            get(status::leader).fallback(use_get),
        )
        .route(
            "/v1/groups/{name}/step-down",
            post(status::step_down).fallback(use_post),
        )
        .merge(messaging)
        .with_state(state)
        .merge(probes)
        .fallback(|| async { Refusal::new(404, "not found") })
}

async fn use_post() -> Refusal {
    Refusal::new(405, "use POST")
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
