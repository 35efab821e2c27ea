//! The controller's rules, as one pure function: what was observed (the
//! LeaderGroup, the namespace's pods and other groups, the group's state in
//! Redis) goes in; the label changes in the order they must be applied, the
//! status, the events and the commands come out. Reconcile is the I/O around
//! it, so every rule here is tested without a cluster or a Redis.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::crd::{Condition, LeaderGroup, LeaderGroupStatus, Member, STEP_DOWN_ANNOTATION};
use crate::selector;
use leasehold_engine::config::ElectionConfig;
use leasehold_engine::store::GroupState;

pub const LEADER: &str = "leader";
pub const FOLLOWER: &str = "follower";

/// A pod as the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// Another LeaderGroup of the namespace, to detect two groups that would
/// write the same label key on one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct OtherGroup {
    pub name: String,
    pub role_label: String,
    pub selector: LabelSelector,
}

/// The group's state in Redis, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreView {
    Available(GroupState),
    Unavailable(String),
}

pub struct Observed<'a> {
    pub group: &'a LeaderGroup,
    pub pods: &'a [PodView],
    pub others: &'a [OtherGroup],
    pub store: &'a StoreView,
    /// Nodes the controller's sweeper removed recently, with the time (ms).
    pub swept: &'a [(String, u64)],
    /// The local wall clock in ms, used only when Redis's is not at hand.
    pub local_now_ms: u64,
}

/// One label to set (`Some`) or remove (`None`) on one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelChange {
    pub pod: String,
    pub key: String,
    pub value: Option<String>,
}

/// A Kubernetes Event to record on the LeaderGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    pub reason: &'static str,
    pub note: String,
    pub warning: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Applied in this order, stopping at the first failure: every change
    /// that takes `leader` away comes before the one that gives it, so no
    /// selector ever matches two pods.
    pub labels: Vec<LabelChange>,
    pub status: LeaderGroupStatus,
    /// Whether the status differs from the stored one in anything but the
    /// expiry times that move on every renewal (those are refreshed when
    /// stale, or along with any other change).
    pub write_status: bool,
    pub events: Vec<PlannedEvent>,
    /// Node to send a step-down command to.
    pub step_down: Option<String>,
    /// Term to put back into Redis, which lost (part of) its data.
    pub restore_term: Option<u64>,
    /// Timings to write into the group's config in Redis, when valid.
    pub config: Option<ElectionConfig>,
}

/// Milliseconds since the epoch as RFC 3339 (UTC, second precision), the
/// format of Kubernetes timestamps.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The pod a node id names, if it is `NAMESPACE/POD` in `namespace`.
pub fn pod_of<'n>(node: &'n str, namespace: &str) -> Option<&'n str> {
    node.split_once('/')
        .filter(|(ns, pod)| *ns == namespace && !pod.is_empty())
        .map(|(_, pod)| pod)
}

fn condition(type_: &str, ok: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        ..Default::default()
    }
}

/// Status without the fields that move on every renewal.
fn settled(status: &LeaderGroupStatus) -> LeaderGroupStatus {
    let mut s = status.clone();
    s.lease_expires_at = None;
    for m in &mut s.members {
        m.expires_at.clear();
    }
    s
}

pub fn plan(observed: &Observed<'_>) -> Plan {
    let group = observed.group;
    let namespace = group.metadata.namespace.clone().unwrap_or_default();
    let name = group.metadata.name.clone().unwrap_or_default();
    let spec = &group.spec;
    let previous = group.status.clone().unwrap_or_default();
    let key = spec.role_label.clone();
    let mut conditions = Vec::new();
    let mut events = Vec::new();

    let config = match spec.election_config() {
        Ok(config) => {
            conditions.push(condition(
                "SpecValid",
                true,
                "Valid",
                "the timings are within their bounds".into(),
            ));
            Some(config)
        }
        Err(e) => {
            conditions.push(condition(
                "SpecValid",
                false,
                "InvalidTimings",
                crate::crd::spec_error_message(&e),
            ));
            None
        }
    };

    let state = match observed.store {
        StoreView::Available(state) => state,
        StoreView::Unavailable(reason) => {
            // Leave every label as it is: a guess could label two pods.
            let mut status = previous.clone();
            let now = rfc3339(observed.local_now_ms);
            conditions.push(condition(
                "StoreAvailable",
                false,
                "RedisUnavailable",
                reason.clone(),
            ));
            conditions.push(condition(
                "Ready",
                false,
                "RedisUnavailable",
                "the group's state cannot be read".into(),
            ));
            if let Some(mut elected) = previous
                .conditions
                .iter()
                .find(|c| c.type_ == "LeaderElected")
                .cloned()
            {
                elected.last_transition_time.clear();
                conditions.push(elected);
            }
            status.conditions = merge_conditions(
                &previous.conditions,
                conditions,
                &now,
                group.metadata.generation,
            );
            status.observed_generation = group.metadata.generation;
            let write_status = settled(&status) != settled(&previous);
            return Plan {
                labels: Vec::new(),
                status,
                write_status,
                events,
                step_down: None,
                restore_term: None,
                config,
            };
        }
    };
    let now_ms = state.now_ms;
    let now = rfc3339(now_ms);

    // Which pods this group may label: selected by it, and not claimed by an
    // earlier-named group that writes the same label key.
    let selected: BTreeSet<&str> = observed
        .pods
        .iter()
        .filter(|p| selector::matches(&spec.selector, &p.labels))
        .map(|p| p.name.as_str())
        .collect();
    let mut conflicts = Vec::new();
    let mut yielded: BTreeSet<&str> = BTreeSet::new();
    for other in observed
        .others
        .iter()
        .filter(|o| o.role_label == key && o.name != name)
    {
        for pod in observed
            .pods
            .iter()
            .filter(|p| selected.contains(p.name.as_str()))
        {
            if selector::matches(&other.selector, &pod.labels) {
                conflicts.push(format!(
                    "pod {} is also selected by group {}",
                    pod.name, other.name
                ));
                if other.name < name {
                    yielded.insert(pod.name.as_str());
                }
            }
        }
    }
    let labellable = |pod: &str| selected.contains(pod) && !yielded.contains(pod);

    // Redis lost the term counter (restarted empty): the status remembers it.
    let previous_term = previous.term.unwrap_or(0).max(0) as u64;
    let restore_term = (state.term < previous_term).then_some(previous_term);
    let term = state.term.max(previous_term);

    let holder = state
        .holder
        .clone()
        .filter(|_| state.lease_pttl_ms.is_some());
    let holder_pod = holder.as_deref().and_then(|h| pod_of(h, &namespace));

    // Members: live candidacies, the holder always among them.
    let mut member_list: Vec<(String, u64)> = state.members.clone();
    if let Some(h) = &holder {
        if !member_list.iter().any(|(n, _)| n == h) {
            member_list.push((h.clone(), now_ms + state.lease_pttl_ms.unwrap_or(0)));
        }
    }
    member_list.sort();
    let pod_exists = |pod: &str| observed.pods.iter().any(|p| p.name == pod);
    let mut desired: BTreeMap<&str, &str> = BTreeMap::new();
    let mut members = Vec::new();
    for (node, expiry) in &member_list {
        let is_leader = holder.as_deref() == Some(node.as_str());
        let pod = pod_of(node, &namespace);
        let problem = match pod {
            None => Some("OtherNamespace"),
            Some(p) if !pod_exists(p) => Some("PodNotFound"),
            Some(p) if !selected.contains(p) => Some("NotSelected"),
            Some(p) if yielded.contains(p) => Some("LabelConflict"),
            Some(_) => None,
        };
        if let (Some(p), None) = (pod, problem) {
            desired.insert(p, if is_leader { LEADER } else { FOLLOWER });
        }
        members.push(Member {
            node: node.clone(),
            pod: pod.map(str::to_owned),
            role: if is_leader { LEADER } else { FOLLOWER }.into(),
            expires_at: rfc3339(*expiry),
            problem: problem.map(str::to_owned),
        });
    }

    // Label changes, in three waves: take `leader` away, then followers and
    // removals, then give `leader`.
    let mut take_leader = Vec::new();
    let mut others_changes = Vec::new();
    let mut give_leader = Vec::new();
    for pod in observed.pods {
        let current = pod.labels.get(&key).map(String::as_str);
        let wanted = if labellable(&pod.name) {
            desired.get(pod.name.as_str()).copied()
        } else {
            // Not ours to label. Clean up our key only where no other group
            // with the same key selects the pod.
            let claimed = observed.others.iter().any(|o| {
                o.role_label == key && o.name != name && selector::matches(&o.selector, &pod.labels)
            });
            if claimed || !matches!(current, Some(LEADER) | Some(FOLLOWER)) {
                continue;
            }
            None
        };
        if current == wanted {
            continue;
        }
        let change = LabelChange {
            pod: pod.name.clone(),
            key: key.clone(),
            value: wanted.map(str::to_owned),
        };
        if current == Some(LEADER) {
            take_leader.push(change);
        } else if wanted == Some(LEADER) {
            give_leader.push(change);
        } else {
            others_changes.push(change);
        }
    }
    let labels: Vec<LabelChange> = take_leader
        .into_iter()
        .chain(others_changes)
        .chain(give_leader)
        .collect();

    // Events for a change of holder.
    if holder != previous.holder {
        if let Some(old) = &previous.holder {
            let reason = if holder.is_some() {
                "replaced"
            } else {
                "expired"
            };
            events.push(PlannedEvent {
                reason: "LeaderLost",
                note: format!("node {old} lost the lease ({reason})"),
                warning: holder.is_none(),
            });
        }
        if let Some(new) = &holder {
            events.push(PlannedEvent {
                reason: "LeaderElected",
                note: format!(
                    "{} leads under term {term}",
                    holder_pod.map_or_else(|| format!("node {new}"), |p| format!("pod {p}"))
                ),
                warning: false,
            });
        }
    }

    // Sweeps that removed nodes this group last listed as members.
    let last_sweep_ms = previous
        .last_sweep
        .as_ref()
        .map(|s| s.time.clone())
        .unwrap_or_default();
    let mut last_sweep = previous.last_sweep.clone();
    let swept_members: Vec<&(String, u64)> = observed
        .swept
        .iter()
        .filter(|(node, at)| {
            rfc3339(*at) > last_sweep_ms && previous.members.iter().any(|m| &m.node == node)
        })
        .collect();
    if let Some(latest) = swept_members.iter().map(|(_, at)| *at).max() {
        let nodes: Vec<String> = swept_members.iter().map(|(n, _)| n.clone()).collect();
        events.push(PlannedEvent {
            reason: "NodesSwept",
            note: format!("expired nodes removed: {}", nodes.join(", ")),
            warning: false,
        });
        last_sweep = Some(crate::crd::LastSweep {
            time: rfc3339(latest),
            nodes,
        });
    }

    // Step-down requested by annotation, once per new value.
    let annotation = group
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STEP_DOWN_ANNOTATION))
        .cloned();
    let mut handled_step_down = previous.handled_step_down.clone();
    let mut step_down = None;
    if annotation.is_some() && annotation != previous.handled_step_down {
        handled_step_down = annotation.clone();
        let note = match &holder {
            Some(h) => {
                step_down = Some(h.clone());
                format!("asked node {h} to step down")
            }
            None => "no leader to step down".to_owned(),
        };
        events.push(PlannedEvent {
            reason: "StepDownRequested",
            note,
            warning: false,
        });
    }

    let leader_pod = holder_pod.filter(|p| pod_exists(p)).map(str::to_owned);
    let elected = holder.is_some();
    conditions.push(condition(
        "StoreAvailable",
        true,
        "RedisReachable",
        "the group's state was read from Redis".into(),
    ));
    conditions.push(match (&holder, &leader_pod) {
        (Some(_), Some(p)) => condition(
            "LeaderElected",
            true,
            "LeaseHeld",
            format!("pod {p} holds the lease under term {term}"),
        ),
        (Some(h), None) => condition(
            "LeaderElected",
            true,
            "LeaseHeldByNodeWithoutPod",
            format!("node {h} holds the lease but is not a pod of this namespace"),
        ),
        (None, _) => condition(
            "LeaderElected",
            false,
            "NoLeader",
            "nobody holds the lease".into(),
        ),
    });
    conflicts.sort();
    conflicts.dedup();
    let conflict_free = conflicts.is_empty();
    conditions.push(if conflict_free {
        condition("LabelConflict", false, "NoConflict", "no other group writes this label key on these pods".into())
    } else {
        condition(
            "LabelConflict",
            true,
            "SameRoleLabel",
            format!("{}; give one group another spec.roleLabel (the group whose name sorts first labels shared pods)", conflicts.join("; ")),
        )
    });
    let ready = elected && config.is_some() && yielded.is_empty();
    conditions.push(condition(
        "Ready",
        ready,
        if ready { "Ready" } else { "NotReady" },
        if ready {
            "a leader is elected and labelled".into()
        } else {
            "see the other conditions".into()
        },
    ));

    let status = LeaderGroupStatus {
        leader: leader_pod,
        holder: holder.clone(),
        term: (term > 0).then_some(term as i64),
        leader_since: match (&holder, &previous.leader_since) {
            (Some(h), Some(since)) if previous.holder.as_ref() == Some(h) => Some(since.clone()),
            (Some(_), _) => Some(now.clone()),
            (None, _) => None,
        },
        lease_expires_at: state
            .lease_pttl_ms
            .filter(|_| elected)
            .map(|pttl| rfc3339(now_ms + pttl)),
        live_members: members.len() as i64,
        members,
        transitions: previous.transitions + i64::from(elected && holder != previous.holder),
        last_sweep,
        conditions: merge_conditions(
            &previous.conditions,
            conditions,
            &now,
            group.metadata.generation,
        ),
        observed_generation: group.metadata.generation,
        handled_step_down,
    };
    let stale = previous
        .lease_expires_at
        .as_deref()
        .is_some_and(|at| at < now.as_str());
    let write_status = settled(&status) != settled(&previous) || stale;
    Plan {
        labels,
        status,
        write_status,
        events,
        step_down,
        restore_term,
        config,
    }
}

/// New conditions keep their previous transition time when their status did
/// not change.
fn merge_conditions(
    previous: &[Condition],
    next: Vec<Condition>,
    now: &str,
    generation: Option<i64>,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = next
        .into_iter()
        .map(|mut c| {
            let before = previous.iter().find(|p| p.type_ == c.type_);
            c.last_transition_time = match before {
                Some(p) if p.status == c.status && !p.last_transition_time.is_empty() => {
                    p.last_transition_time.clone()
                }
                _ => now.to_owned(),
            };
            c.observed_generation = generation;
            c
        })
        .collect();
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
