//! Leadership as the API reports it: `/v1/status`, a group's leader, and
//! step-down. Every answer comes from the group's local lease view
//! ([`Group::leadership`]), the same check the library gives embedded
//! users: an agent whose lease ran out locally says so at once, even before
//! its campaign task has noticed, and a leader's view says how many
//! milliseconds it has left, so an application can bound a critical
//! section by them.

use std::collections::BTreeMap;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::header::ORIGIN;
use axum::http::HeaderMap;
use leasehold_daemon::http::{json, Refusal, Response, StatusCode};
use leasehold_engine::{Group, Role};
use serde::Serialize;

use super::state::{AgentState, Params, StepDown};

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
    /// While this pod leads: how long its local view of the lease still
    /// holds, in milliseconds, as of the answer. Work that must not outlive
    /// the lease ends within this (less the time the answer took to read).
    #[serde(
        rename = "leaseRemainingMs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub lease_remaining_ms: Option<u64>,
    /// The priority this pod campaigns with (0: it never leads).
    #[serde(default = "default_priority")]
    pub priority: u32,
    /// Why this pod leaves the free seat to another member right now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferring: Option<DeferView>,
    /// Why this pod does not take the lead: its application is unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

fn default_priority() -> u32 {
    leasehold_engine::DEFAULT_PRIORITY
}

/// Whom a candidate leaves the free seat to, and why: `neverLeads`
/// (priority 0), `priority` (a live member of higher priority),
/// `preferred` (one the controller prefers, during a rollout) or
/// `successor` (the member a handover named).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DeferView {
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub to: String,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Status {
    pub node: String,
    pub namespace: String,
    /// By LeaderGroup name.
    pub groups: BTreeMap<String, GroupView>,
    pub inbox: InboxView,
    /// The application's health, when the agent checks it
    /// (`--health-url`, `--health-command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::health::HealthView>,
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
        lease_remaining_ms: None,
        priority: default_priority(),
        deferring: None,
        problem: None,
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

fn group_view(state: &AgentState, group: &Group) -> GroupView {
    let role = group.role().borrow().clone();
    let lease = group.leadership();
    let mut v = view(group.name(), &role, lease.map(|l| l.term), &state.node_id);
    v.lease_remaining_ms = lease.map(|l| l.remaining().as_millis() as u64);
    v.priority = group.priority();
    v.problem = group.problem();
    v.deferring = group
        .deferral()
        .filter(|_| v.role == "candidate")
        .map(|d| DeferView {
            reason: d.reason.as_str().to_owned(),
            to: d.to,
        });
    v
}

/// `GET /v1/status`.
pub(super) async fn status(State(state): State<Arc<AgentState>>) -> Response {
    let groups = state
        .groups
        .iter()
        .map(|(name, g)| (name.clone(), group_view(&state, g)))
        .collect();
    let (received, recoveries) = state.mailbox.counts();
    let status = Status {
        node: state.node_id.clone(),
        namespace: state.namespace.clone(),
        groups,
        inbox: InboxView {
            received,
            recoveries,
        },
        health: state.health.as_ref().map(|h| h.view()),
    };
    json(StatusCode::OK, &status)
}

/// `GET /v1/groups/{name}/leader`: the group's view, 200 while this agent
/// leads it and 503 otherwise (a readiness probe that only the leader passes).
pub(super) async fn leader(
    State(state): State<Arc<AgentState>>,
    Path(name): Path<String>,
) -> Result<Response, Refusal> {
    let view = group_view(&state, state.group(&name)?);
    let status = if view.role == "leader" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Ok(json(status, &view))
}

/// The answer of a step-down.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SteppedDown<'a> {
    group: &'a str,
    was_leader: bool,
    /// The member the group was handed to, when one was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    to: Option<String>,
}

/// The query of a step-down: `?to=POD` (a pod of this namespace) or
/// `?to=NAMESPACE/POD` (a node id).
#[derive(serde::Deserialize)]
pub(super) struct StepDownQuery {
    to: Option<String>,
}

/// `POST /v1/groups/{name}/step-down[?to=POD]`, answered by the task that
/// owns the node once the lease is released (or handed to `to`). A
/// handover that cannot happen is refused and the leader leads on: 409
/// when this agent does not lead the group, 422 when `to` is no live
/// member that may lead, 400 when it is no valid name.
pub(super) async fn step_down(
    State(state): State<Arc<AgentState>>,
    Path(name): Path<String>,
    Params(query): Params<StepDownQuery>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let group = state.group(&name)?;
    let to = query.to.filter(|t| !t.is_empty()).map(|t| {
        if t.contains('/') {
            t
        } else {
            format!("{}/{t}", state.namespace)
        }
    });
    if headers.contains_key(ORIGIN) {
        return Err(Refusal::new(
            403,
            "a request with an Origin header (sent by a browser) may not step down",
        ));
    }
    let shutting_down = || Refusal::new(503, "the agent is shutting down");
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = StepDown {
        group: name.clone(),
        to: to.clone(),
        reply,
    };
    state
        .step_downs
        .send(request)
        .await
        .map_err(|_| shutting_down())?;
    let was_leader = answer
        .await
        .map_err(|_| shutting_down())?
        .map_err(|e| Refusal::new(refusal_status(&e), e.to_string()))?;
    Ok(json(
        StatusCode::OK,
        &SteppedDown {
            group: group.name(),
            was_leader,
            to,
        },
    ))
}

/// The status of a step-down the engine refused.
fn refusal_status(e: &leasehold_engine::Error) -> u16 {
    use leasehold_engine::{Error, SuccessorRefusal};
    match e {
        Error::Successor {
            reason: SuccessorRefusal::NotLeader,
            ..
        } => 409,
        Error::Successor { .. } => 422,
        Error::Config(_) => 400,
        _ => 503,
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
