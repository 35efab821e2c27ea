//! Who should lead, as far as the cluster can tell: the controller's part
//! of the choice, beside the members' own priorities that the engine
//! applies to every free seat. Pure, like `plan.rs`, which calls it:
//!
//! - during a rollout (the member pods are on more than one revision), the
//!   live members on the updated revision (ready, or in their pod's first
//!   minute) are written to the store as preferred, so a free seat goes to one
//!   of them among equal priorities;
//!   and a leader on an old revision is asked, once per term, to hand over
//!   to the best of them whose pod is ready (of at least its own
//!   priority), so a rollout moves the leader once, onto the new revision,
//!   instead of each time its pod is replaced;
//! - with `failback: AfterStable`, a leader that has led for
//!   `stableSeconds` is asked, once per term, to hand over to a member of
//!   higher priority that has been live for `stableSeconds` (so neither a
//!   member that comes and goes nor a handover just made is undone at
//!   once);
//! - each new value of the `leasehold.dev/step-down-to` annotation asks
//!   the leader to hand over to that pod, when it is a live member that
//!   may lead; otherwise the request is refused and reported.
//!
//! The updated revision is the one whose oldest member pod is the newest: a
//! rollout creates the first pod of its revision after every pod of the
//! revisions before. It needs no read of the StatefulSet or Deployment (nor
//! the RBAC for it). Members from two workloads on different revisions look
//! like a rollout that never ends: placement then prefers the younger
//! workload's pods among equals.

use crate::crd::{Failback, Handover, Member, Placement, Rollout};
use crate::pods::{time_of, Locality, PodView};

/// How long after its creation an updated pod that is not ready yet is
/// preferred: the time from its agent's join to its readiness in a rollout
/// is a few seconds; a minute leaves room for a slow start.
pub const UNREADY_PREFERRED_MS: u64 = 60_000;

/// Why a handover was asked for, as the status and the Events name it.
pub mod reasons {
    pub const ROLLOUT: &str = "Rollout";
    pub const FAILBACK: &str = "Failback";
    pub const REQUESTED: &str = "Requested";
}

/// What placement decided for one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The pod (or node) placement would have lead.
    pub preferred: Option<String>,
    pub rollout: Option<Rollout>,
    /// A handover to ask of the leader now.
    pub hand_over: Option<Handover>,
    /// When to look again (ms from now): a failback that waits for its
    /// stability window, which no watch event would wake.
    pub look_again_ms: Option<u64>,
}

/// The group as placement sees it.
pub struct Seat<'a> {
    pub placement: &'a Placement,
    /// The cluster and namespace whose pods this controller sees.
    pub locality: Locality<'a>,
    /// The live holder and its term.
    pub holder: Option<&'a str>,
    pub term: u64,
    /// The live members, with their priority, revision and first sight.
    pub members: &'a [Member],
    pub pods: &'a [PodView],
    /// The last handover asked for.
    pub previous: Option<&'a Handover>,
    /// When the holder won the seat (ms), as the status last said.
    pub leader_since_ms: Option<u64>,
    pub now_ms: u64,
}

impl Seat<'_> {
    /// The member's pod, when it is one of this cluster's (another
    /// cluster's pods are not seen: not on the updated revision, not ready).
    fn pod(&self, member: &Member) -> Option<&PodView> {
        let name = self.locality.pod(&member.node)?;
        self.pods.iter().find(|p| p.name == name)
    }

    fn holder(&self) -> Option<&Member> {
        let holder = self.holder?;
        self.members.iter().find(|m| m.node == holder)
    }

    /// The updated revision, when the member pods are on more than one.
    fn updated_revision(&self) -> Option<&str> {
        let pods: Vec<&PodView> = self.members.iter().filter_map(|m| self.pod(m)).collect();
        let first = pods.iter().find_map(|p| p.revision.as_deref())?;
        if pods
            .iter()
            .all(|p| p.revision.as_deref().is_none_or(|r| r == first))
        {
            return None;
        }
        // Each revision's oldest pod: the rollout's revision is the one
        // whose oldest pod is the newest. (Not simply the newest pod's: a
        // Deployment's old ReplicaSet replaces an evicted pod on the old
        // revision during a rollout.)
        let mut oldest: std::collections::BTreeMap<&str, u64> = Default::default();
        for p in &pods {
            if let Some(r) = p.revision.as_deref() {
                let at = oldest.entry(r).or_insert(p.created_ms);
                *at = (*at).min(p.created_ms);
            }
        }
        oldest
            .into_iter()
            .max_by_key(|(r, at)| (*at, *r))
            .map(|(r, _)| r)
    }

    /// Whether a handover was already asked of this holder in this term.
    fn asked_this_term(&self) -> bool {
        self.previous
            .is_some_and(|h| Some(h.from.as_str()) == self.holder && h.term == self.term as i64)
    }

    fn ask(&self, to: &Member, reason: &str) -> Option<Handover> {
        Some(Handover {
            from: self.holder?.to_owned(),
            term: self.term as i64,
            to: to.node.clone(),
            reason: reason.to_owned(),
            time: time_of(self.now_ms),
        })
    }
}

/// The best of `members` by priority (then node id, for a stable choice),
/// the holder first among equals.
fn best<'m>(members: impl Iterator<Item = &'m Member>, holder: Option<&str>) -> Option<&'m Member> {
    members.filter(|m| m.priority > 0).min_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then_with(|| (Some(b.node.as_str()) == holder).cmp(&(Some(a.node.as_str()) == holder)))
            .then_with(|| a.node.cmp(&b.node))
    })
}

/// Rules: see the module docs.
pub fn place(seat: &Seat<'_>) -> Placed {
    let updated = seat.updated_revision();
    // Preferred in the store as soon as they are live, not once ready: a
    // StatefulSet deletes the next old pod the moment an updated one is
    // ready, and if that pod leads, its release must already find the
    // updated member preferred, or an old one takes the seat and a second
    // change follows.
    // An unready one only in its pod's first minute, though: one that
    // stays unready (a stalled rollout) must not win a free seat over
    // ready old ones.
    let preferred_nodes: Vec<&Member> = match updated {
        Some(revision) if seat.placement.prefer_updated => seat
            .members
            .iter()
            .filter(|m| m.revision.as_deref() == Some(revision))
            .filter(|m| {
                seat.pod(m).is_some_and(|p| {
                    p.ready == Some(true)
                        || seat.now_ms.saturating_sub(p.created_ms) < UNREADY_PREFERRED_MS
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    // A leader is moved (and placement's choice shown) only onto a ready
    // pod.
    let ready_nodes: Vec<&Member> = preferred_nodes
        .iter()
        .copied()
        .filter(|m| seat.pod(m).is_some_and(|p| p.ready == Some(true)))
        .collect();
    let rollout = updated.map(|revision| Rollout {
        revision: revision.to_owned(),
        preferred: preferred_nodes.iter().map(|m| m.node.clone()).collect(),
    });
    // Placement's choice: the highest priority; among equals a preferred
    // member (during a rollout), then the holder.
    let top = seat
        .members
        .iter()
        .filter(|m| m.priority > 0)
        .map(|m| m.priority)
        .max();
    let at_top = seat.members.iter().filter(|m| Some(m.priority) == top);
    let choice = best(
        at_top
            .clone()
            .filter(|m| ready_nodes.iter().any(|p| p.node == m.node)),
        seat.holder,
    )
    .or_else(|| best(at_top, seat.holder));
    let preferred = choice.map(|m| seat.locality.shown(&m.node).unwrap_or(m.node.clone()));
    let hand_over = hand_over(seat, updated, &ready_nodes);
    Placed {
        preferred,
        rollout,
        look_again_ms: hand_over.is_none().then(|| failback_due_in(seat)).flatten(),
        hand_over,
    }
}

/// With failback on and a member of higher priority than the leader, how
/// long until both it has been live and the leader has led for the
/// window (at least 1 ms, so the caller looks again).
fn failback_due_in(seat: &Seat<'_>) -> Option<u64> {
    if seat.placement.failback != Failback::AfterStable || seat.asked_this_term() {
        return None;
    }
    let holder = seat.holder()?;
    let stable_ms = u64::try_from(seat.placement.stable_seconds.max(1)).unwrap_or(1) * 1000;
    let ms = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        t.0.as_millisecond().max(0) as u64
    };
    let member_due = seat
        .members
        .iter()
        .filter(|m| m.node != holder.node && m.priority > holder.priority)
        .filter_map(|m| m.live_since.as_ref().map(|t| ms(t) + stable_ms))
        .min()?;
    let leader_due = seat.leader_since_ms.unwrap_or(seat.now_ms) + stable_ms;
    // Kubernetes times are whole seconds, cut down: a second more.
    let due = member_due.max(leader_due) + 1000;
    Some(due.saturating_sub(seat.now_ms).max(1))
}

/// Rules: a leader on an old revision hands over to the best ready,
/// updated member of at least its priority (rollout); with failback, a
/// leader hands over to the best member of higher priority live for the
/// stability window. Once per term each, so a refusal is not repeated.
fn hand_over(seat: &Seat<'_>, updated: Option<&str>, preferred: &[&Member]) -> Option<Handover> {
    let holder = seat.holder()?;
    if seat.asked_this_term() {
        return None;
    }
    let on_old_revision =
        updated.is_some_and(|u| holder.revision.as_deref().is_some_and(|r| r != u));
    if seat.placement.prefer_updated && on_old_revision {
        let to = best(
            preferred
                .iter()
                .copied()
                .filter(|m| m.node != holder.node && m.priority >= holder.priority),
            None,
        );
        if let Some(to) = to {
            return seat.ask(to, reasons::ROLLOUT);
        }
    }
    if seat.placement.failback == Failback::AfterStable {
        let stable_ms = u64::try_from(seat.placement.stable_seconds.max(1)).unwrap_or(1) * 1000;
        // The leader, too, must have led for the window: a handover to it
        // (a named one, most of all) is not undone at once.
        // Kubernetes times are whole seconds, cut down: a second more, as
        // in `failback_due_in`.
        let led_long_enough = seat
            .leader_since_ms
            .is_some_and(|since| since + stable_ms + 1000 <= seat.now_ms);
        if !led_long_enough {
            return None;
        }
        let stable = |m: &&Member| {
            m.live_since.as_ref().is_some_and(|since| {
                since
                    .0
                    .as_millisecond()
                    .saturating_add(stable_ms as i64 + 1000)
                    <= seat.now_ms as i64
            })
        };
        let to = best(
            seat.members
                .iter()
                .filter(|m| m.node != holder.node && m.priority > holder.priority)
                .filter(stable),
            None,
        );
        if let Some(to) = to {
            return seat.ask(to, reasons::FAILBACK);
        }
    }
    None
}

/// Why a handover asked for by the step-down-to annotation is refused (the
/// leader leads on). Its text goes into the Handover condition and the
/// `HandoverRefused` event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no leader to hand over to pod {pod:?}")]
    NoLeader { pod: String },
    #[error("pod {pod:?} already leads")]
    AlreadyLeads { pod: String },
    #[error(
        "pod {pod:?} is not a live member of the group (it runs no agent that campaigns for it)"
    )]
    NotAMember { pod: String },
    #[error("pod {pod:?} does not take the lead: {reason}")]
    Unhealthy { pod: String, reason: String },
    #[error("pod {pod:?} campaigns with priority 0: it never leads")]
    NeverLeads { pod: String },
}

/// Rule: a new value of the step-down-to annotation names a pod of the
/// group's namespace (`CLUSTER/POD` for a pod of another cluster, once
/// clusters are named); the leader is asked to hand over to it when it is a
/// live member that may lead, and otherwise the request is refused with
/// the reason (the leader leads on).
pub fn requested(seat: &Seat<'_>, pod: &str) -> Result<Handover, Refusal> {
    let no_leader = || Refusal::NoLeader {
        pod: pod.to_owned(),
    };
    let Some(holder) = seat.holder else {
        return Err(no_leader());
    };
    let node = match (seat.locality.cluster, pod.split_once('/')) {
        (Some(_), Some((cluster, name))) => Locality {
            cluster: Some(cluster),
            ..seat.locality
        }
        .node_id(name),
        _ => seat.locality.node_id(pod),
    };
    if node == holder {
        return Err(Refusal::AlreadyLeads {
            pod: pod.to_owned(),
        });
    }
    let Some(member) = seat.members.iter().find(|m| m.node == node) else {
        return Err(Refusal::NotAMember {
            pod: pod.to_owned(),
        });
    };
    if let Some(reason) = &member.unhealthy {
        return Err(Refusal::Unhealthy {
            pod: pod.to_owned(),
            reason: reason.clone(),
        });
    }
    if member.priority <= 0 {
        return Err(Refusal::NeverLeads {
            pod: pod.to_owned(),
        });
    }
    seat.ask(member, reasons::REQUESTED).ok_or_else(no_leader)
}
