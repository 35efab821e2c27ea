//! The `LeaderGroup` custom resource (`leasehold.dev/v1alpha1`): a set of
//! pods, picked by a label selector, of which exactly one leads.
//!
//! The schema carries the same bounds as [`leasehold_engine::config`] (OpenAPI minimum
//! and maximum, and CEL rules such as `renewIntervalMs < ttlMs`), so the API
//! server refuses a bad spec at `kubectl apply`. Servers older than 1.25 do
//! not run CEL; the controller checks the same rules (see
//! [`LeaderGroupSpec::election_config`]) and reports a violation as a
//! condition, so those clusters are covered too.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use leasehold_engine::config::{ConfigError, ElectionConfig};

/// Label key put on member pods when the spec names none.
pub const DEFAULT_ROLE_LABEL: &str = "leasehold.dev/role";

/// Annotation whose new values ask the current leader to step down.
pub const STEP_DOWN_ANNOTATION: &str = "leasehold.dev/step-down";

/// Annotation whose new values ask the current leader to hand over to the
/// pod named (a pod of the group's namespace).
pub const STEP_DOWN_TO_ANNOTATION: &str = "leasehold.dev/step-down-to";

/// Default and bounds of `spec.placement.stableSeconds`.
pub const DEFAULT_STABLE_SECONDS: i64 = 60;
pub const MAX_STABLE_SECONDS: i64 = 86_400;

fn default_ttl_ms() -> i64 {
    ElectionConfig::default().ttl_ms as i64
}
fn default_renew_interval_ms() -> i64 {
    ElectionConfig::default().renew_interval_ms as i64
}
fn default_retry_interval_ms() -> i64 {
    ElectionConfig::default().retry_interval_ms as i64
}
fn default_role_label() -> String {
    DEFAULT_ROLE_LABEL.to_owned()
}
fn default_true() -> bool {
    true
}
fn default_stable_seconds() -> i64 {
    DEFAULT_STABLE_SECONDS
}

/// A group of pods of which exactly one leads. The leader pod is labelled
/// `<roleLabel>=leader` and the other live members `<roleLabel>=follower`,
/// so a Service selecting `<roleLabel>: leader` reaches the leader only.
// Each printcolumn(...) repeats the same keys, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "leasehold.dev",
    version = "v1alpha1",
    kind = "LeaderGroup",
    plural = "leadergroups",
    shortname = "lg",
    namespaced,
    status = "LeaderGroupStatus",
    derive = "PartialEq",
    doc = "A group of pods of which exactly one leads, elected through leasehold.",
    printcolumn(
        name = "Leader",
        type_ = "string",
        json_path = ".status.leader",
        description = "The leader pod"
    ),
    printcolumn(
        name = "Term",
        type_ = "integer",
        json_path = ".status.term",
        description = "Fencing term of the current lease"
    ),
    printcolumn(
        name = "Live",
        type_ = "integer",
        json_path = ".status.liveMembers",
        description = "Members with a live candidacy"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "A leader is elected and labelled, and its pod is Ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Since",
        type_ = "date",
        json_path = ".status.leaderSince",
        priority = 1,
        description = "How long the current leader has led"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".status.endpoint.address",
        priority = 1,
        description = "The address the leader Service's EndpointSlice holds (spec.service)"
    ),
    printcolumn(
        name = "Preferred",
        type_ = "string",
        json_path = ".status.preferred",
        priority = 1,
        description = "The member placement would have lead: highest priority, then on the updated revision during a rollout"
    )
)]
#[x_kube(validation = Rule::new("self.renewIntervalMs < self.ttlMs").message("renewIntervalMs must be less than ttlMs"))]
#[x_kube(validation = Rule::new("!has(self.selector.matchLabels) || !(self.roleLabel in self.selector.matchLabels)").message("roleLabel must not be a key of selector.matchLabels: relabelling would take the pods out of their own selector"))]
// A key of selector.matchExpressions is checked by the controller only: a
// rule over an unbounded list would exceed the API server's CEL cost budget.
#[serde(rename_all = "camelCase")]
pub struct LeaderGroupSpec {
    /// Pods that may be members. A member whose pod does not match is
    /// reported in the status and never labelled.
    #[x_kube(validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)").message("selector must not be empty: it would select every pod"))]
    pub selector: LabelSelector,
    /// How long a lease lasts without renewal, ms.
    #[serde(default = "default_ttl_ms")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub ttl_ms: i64,
    /// How often the leader renews, ms; less than ttlMs.
    #[serde(default = "default_renew_interval_ms")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub renew_interval_ms: i64,
    /// How often followers try to claim at the latest, ms.
    #[serde(default = "default_retry_interval_ms")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub retry_interval_ms: i64,
    /// The label key set on member pods (values `leader` and `follower`): a
    /// Kubernetes label key, and not a key of the selector (relabelling
    /// would take the pods out of their own selector).
    #[serde(default = "default_role_label")]
    #[schemars(length(min = 1, max = 317))]
    #[x_kube(validation = Rule::new("self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')").message("roleLabel must be a label key: an optional DNS prefix and '/', then 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"))]
    pub role_label: String,
    /// Who should lead, beyond the members' own priorities (the agent's
    /// `--priority`).
    #[serde(default)]
    pub placement: Placement,
    /// A Service that reaches the leader through an EndpointSlice the
    /// controller writes itself, as soon as a leader is elected, instead of
    /// through the role label and the endpoints controller (needs the
    /// chart's `leaderEndpoints.enabled`). The role labels are written as
    /// before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<LeaderService>,
}

/// The selector-less Service of a group's leader endpoint. The controller
/// creates it (owned by the LeaderGroup, so it goes with it) and writes its
/// one EndpointSlice: the leader pod's address, or none while no one leads.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LeaderService {
    /// The Service's name, in the group's namespace: a DNS label (lowercase
    /// letters, digits and '-', starting with a letter), at most 63 bytes.
    /// A Service of that name that this group does not own is left alone
    /// and reported.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("service.name must be a DNS label: lowercase letters, digits and '-', starting with a letter and ending with a letter or digit"))]
    pub name: String,
    /// The Service's ports, 1 to 100; names are required when there are
    /// several.
    #[schemars(length(min = 1, max = 100))]
    pub ports: Vec<LeaderServicePort>,
}

/// One port of the leader Service.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LeaderServicePort {
    /// The port's name (an IANA service name: at most 15 lowercase letters,
    /// digits and '-', with a letter, no '-' at either end, no '--');
    /// unique, and checked by the controller (`SpecValid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub name: Option<String>,
    /// The Service's port, 1 to 65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The leader pod's port, 1 to 65535; `port` when absent. A number
    /// only: the controller does not read the pod's container ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub target_port: Option<i32>,
    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default)]
    pub protocol: Protocol,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

impl LeaderGroupStatus {
    /// The condition of type `type_`, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<Condition> {
        self.conditions.iter().find(|c| c.type_ == type_).cloned()
    }
}

impl LeaderService {
    /// Why the Service cannot be written, by the schema's rules, for API
    /// servers that do not enforce CEL (and for what the schema cannot
    /// say: unique, required port names).
    pub fn error(&self) -> Option<String> {
        let label = |s: &str| dns_label(s) && s.len() <= 63 && s.as_bytes()[0].is_ascii_lowercase();
        // An IANA service name, as Kubernetes checks a port's name.
        let port_name = |s: &str| {
            dns_label(s)
                && s.len() <= 15
                && s.bytes().any(|c| c.is_ascii_lowercase())
                && !s.contains("--")
        };
        if !label(&self.name) {
            return Some(format!("service.name {:?} is not a DNS label: 1 to 63 lowercase letters, digits and '-', starting with a letter and ending with a letter or digit", self.name));
        }
        if self.ports.is_empty() || self.ports.len() > 100 {
            return Some(format!(
                "service.ports has {} entries; 1 to 100 are allowed",
                self.ports.len()
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        let mut numbers = std::collections::BTreeSet::new();
        for (i, p) in self.ports.iter().enumerate() {
            if !numbers.insert((p.port, p.protocol.as_str())) {
                return Some(format!(
                    "service.ports[{i}] repeats port {} {}; each port and protocol once",
                    p.port,
                    p.protocol.as_str()
                ));
            }
            for (field, v) in [("port", Some(p.port)), ("targetPort", p.target_port)] {
                if let Some(v) = v.filter(|v| !(1..=65535).contains(v)) {
                    return Some(format!(
                        "service.ports[{i}].{field} is {v}; 1 to 65535 are allowed"
                    ));
                }
            }
            match &p.name {
                Some(n) if !port_name(n) => {
                    return Some(format!("service.ports[{i}].name {n:?} is not a port name: 1 to 15 lowercase letters, digits and '-', with at least one letter, not starting or ending with '-' and without '--'"));
                }
                Some(n) if !names.insert(n.as_str()) => {
                    return Some(format!("service.ports[{i}].name {n:?} is used twice"));
                }
                None if self.ports.len() > 1 => {
                    return Some(format!(
                        "service.ports[{i}].name is missing; every port needs a name when there are several"
                    ));
                }
                _ => {}
            }
        }
        None
    }
}

/// Who should lead: the controller's part of the choice. The engine's
/// rules (a free seat goes to the live member of highest priority) hold
/// without it; placement adds what only the cluster knows.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// During a rollout (member pods on more than one revision), live
    /// members on the updated revision (ready, or in their pod's first
    /// minute) come first among equal priorities when the seat is free, and a leader on an old revision hands over
    /// once to one of them whose pod is ready (of at least its priority),
    /// before its own pod is replaced.
    #[serde(default = "default_true")]
    pub prefer_updated: bool,
    /// Whether a leader hands over to a member of higher priority that has
    /// been live for `stableSeconds`. `Never` by default: an automatic
    /// failback moves the leader twice per incident, and flaps with a
    /// member that comes and goes.
    #[serde(default)]
    pub failback: Failback,
    /// How long a member of higher priority must have been live before a
    /// failback to it, seconds.
    #[serde(default = "default_stable_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub stable_seconds: i64,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            prefer_updated: true,
            failback: Failback::Never,
            stable_seconds: DEFAULT_STABLE_SECONDS,
        }
    }
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Failback {
    #[default]
    Never,
    AfterStable,
}

/// A member's role, as its pod's label value says it.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub enum MemberRole {
    Leader,
    Follower,
}

impl MemberRole {
    /// The value of the role label.
    pub fn label_value(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Follower => "follower",
        }
    }
}

/// Why a member's pod is not labelled.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberProblem {
    /// The node id names a pod of this namespace that does not exist.
    PodNotFound,
    /// The pod does not match spec.selector.
    NotSelected,
    /// The node id is not a pod of this namespace.
    OtherNamespace,
    /// A group whose name sorts first labels this pod with the same key.
    LabelConflict,
}

/// One node that campaigns for the group, as the status shows it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Node id: `NAMESPACE/POD`, or `CLUSTER/NAMESPACE/POD` once the
    /// clusters that share the store are named.
    pub node: String,
    /// The member's cluster, once clusters are named: this one's, or
    /// another's (whose controller labels its pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The pod, when the node id names a pod of this namespace (in this
    /// cluster or in `cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub role: MemberRole,
    /// Why the pod is not labelled, if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<MemberProblem>,
    /// The priority the member campaigns with (0: it never leads).
    #[serde(default = "default_priority")]
    pub priority: i64,
    /// When the controller first saw the member live (for a failback's
    /// stability window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_since: Option<Time>,
    /// The pod's revision (`controller-revision-hash` or
    /// `pod-template-hash`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Why the member's application is unhealthy, as its agent's health
    /// check says (`--health-url`, `--health-command`): it does not take
    /// the lead meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<String>,
}

fn default_priority() -> i64 {
    i64::from(leasehold_engine::DEFAULT_PRIORITY)
}

/// A rollout as the controller sees it: the member pods are on more than
/// one revision.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// The updated revision: the revision of the newest member pod.
    pub revision: String,
    /// The members preferred in the store: the live ones on the updated
    /// revision that are ready or in their pod's first minute (with
    /// `placement.preferUpdated`).
    #[serde(default)]
    pub preferred: Vec<String>,
}

/// A handover the controller asked of a leader.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// The node asked to hand over, and the term it led under.
    pub from: String,
    pub term: i64,
    /// The node it was asked to hand over to.
    pub to: String,
    /// `Rollout`, `Failback` or `Requested` (the step-down-to annotation).
    pub reason: String,
    pub time: Time,
}

/// The last sweep of expired nodes that touched this group.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LastSweep {
    /// When the sweep removed the nodes.
    pub time: Time,
    /// The node ids it removed that were members of this group.
    pub nodes: Vec<String>,
}

/// What the controller last saw of the group.
///
/// Nothing here moves while a group is at rest: a renewal is not a change,
/// so the lease's and the members' expiry times are not shown (they cost
/// one API write per group per resync, for a value stale a second later).
/// `leasehold groups` reads them live from the store.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaderGroupStatus {
    /// The leader pod: `CLUSTER/POD` once clusters are named, whichever
    /// cluster it runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// The lease holder's node id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Fencing term of the current (or last) lease; never goes backwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<i64>,
    /// When the current holder won the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_since: Option<Time>,
    #[serde(default)]
    pub members: Vec<Member>,
    #[serde(default)]
    pub live_members: i64,
    /// Changes of leader seen by the controller.
    #[serde(default)]
    pub transitions: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sweep: Option<LastSweep>,
    /// `SpecValid`, `StoreAvailable`, `LeaderElected`, `LabelConflict` and
    /// `Ready`.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last `leasehold.dev/step-down` annotation value acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_step_down: Option<String>,
    /// The last `leasehold.dev/step-down-to` annotation value acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_step_down_to: Option<String>,
    /// The pod (or node) placement would have lead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred: Option<String>,
    /// The rollout in progress, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// The last handover the controller asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<Handover>,
    /// What the leader Service's EndpointSlice holds (`spec.service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointStatus>,
}

/// The leader endpoint as the controller last wrote it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    /// The Service.
    pub service: String,
    /// The leader pod's address; absent while no one leads (the slice is
    /// then empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The term the slice was written for.
    pub term: i64,
}

impl LeaderGroupSpec {
    /// The timings as engine configuration, checked by the same rules as the
    /// schema's, for API servers that do not enforce CEL.
    pub fn election_config(&self) -> Result<ElectionConfig, ConfigError> {
        // A negative value is as out of range as zero; report it as given.
        let ms = |option: &'static str, v: i64| {
            u64::try_from(v).map_err(|_| ConfigError::Negative { option, value: v })
        };
        let config = ElectionConfig {
            ttl_ms: ms("ttl_ms", self.ttl_ms)?,
            renew_interval_ms: ms("renew_interval_ms", self.renew_interval_ms)?,
            retry_interval_ms: ms("retry_interval_ms", self.retry_interval_ms)?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Why `roleLabel` cannot be used, by the schema's rules, for API
    /// servers that do not enforce CEL: it must be a label key, and not a
    /// key the selector matches on.
    pub fn role_label_error(&self) -> Option<String> {
        let key = &self.role_label;
        if let Some(why) = label_key_error(key) {
            return Some(format!("roleLabel {key:?} is not a label key: {why}"));
        }
        let in_labels = self
            .selector
            .match_labels
            .as_ref()
            .is_some_and(|m| m.contains_key(key));
        let in_expressions = self
            .selector
            .match_expressions
            .as_ref()
            .is_some_and(|e| e.iter().any(|r| &r.key == key));
        (in_labels || in_expressions).then(|| {
            format!("roleLabel {key:?} is a key of the selector: relabelling would take the pods out of their own selector")
        })
    }
}

/// Why `key` is not a Kubernetes label key: `[prefix/]name`, the prefix a
/// DNS subdomain of at most 253 bytes, the name 1 to 63 bytes of letters,
/// digits, '-', '_' and '.', starting and ending with a letter or digit.
fn label_key_error(key: &str) -> Option<&'static str> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    if name.is_empty() || name.len() > 63 {
        return Some("the name part must be 1 to 63 bytes");
    }
    let bytes = name.as_bytes();
    if !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return Some("the name part must start and end with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|&b| alnum(b) || matches!(b, b'-' | b'_' | b'.'))
    {
        return Some("the name part may hold only letters, digits, '-', '_' and '.'");
    }
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(dns_label) {
            return Some(
                "the prefix must be a DNS subdomain (lowercase letters, digits, '-' and '.')",
            );
        }
    }
    None
}

/// Not empty, lowercase letters, digits and '-' only, no '-' at either
/// end: what every DNS label Kubernetes checks has in common.
fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let allowed = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    !b.is_empty() && b.iter().all(allowed) && b[0] != b'-' && b[b.len() - 1] != b'-'
}

/// A spec error in the resource's own field names (`ttlMs`, not `ttl_ms`),
/// for conditions a user reads next to the YAML they wrote.
pub fn spec_error_message(error: &ConfigError) -> String {
    error
        .to_string()
        .replace("renew_interval_ms", "renewIntervalMs")
        .replace("retry_interval_ms", "retryIntervalMs")
        .replace("ttl_ms", "ttlMs")
}

/// The CRD as YAML, as `leasehold crdgen` prints it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&LeaderGroup::crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(ports: &[(Option<&str>, i32, Option<i32>)]) -> LeaderService {
        LeaderService {
            name: "web-leader".into(),
            ports: ports
                .iter()
                .map(|(name, port, target_port)| LeaderServicePort {
                    name: name.map(str::to_owned),
                    port: *port,
                    target_port: *target_port,
                    protocol: Protocol::Tcp,
                })
                .collect(),
        }
    }

    #[test]
    fn a_bad_leader_service_is_named_by_field_with_what_is_allowed() {
        assert_eq!(service(&[(None, 80, Some(8080))]).error(), None);
        assert_eq!(
            service(&[(Some("http"), 80, None), (Some("grpc-2"), 81, None)]).error(),
            None
        );
        let cases: [(LeaderService, &str); 7] = [
            (
                LeaderService {
                    name: "Web_Leader".into(),
                    ..service(&[(None, 80, None)])
                },
                "service.name \"Web_Leader\" is not a DNS label",
            ),
            (service(&[]), "service.ports has 0 entries; 1 to 100"),
            (
                service(&[(None, 80, Some(0))]),
                "service.ports[0].targetPort is 0; 1 to 65535",
            ),
            (
                service(&[(Some("a"), 80, None), (Some("b"), 80, None)]),
                "service.ports[1] repeats port 80 TCP",
            ),
            (
                service(&[(Some("http"), 80, None), (Some("http"), 81, None)]),
                "service.ports[1].name \"http\" is used twice",
            ),
            (
                service(&[(Some("a--b"), 80, None)]),
                "service.ports[0].name \"a--b\" is not a port name",
            ),
            (
                service(&[(Some("http"), 80, None), (None, 81, None)]),
                "service.ports[1].name is missing",
            ),
        ];
        for (bad, wanted) in cases {
            let error = bad.error().unwrap_or_default();
            assert!(error.contains(wanted), "{error:?} does not say {wanted:?}");
        }
        // A leading digit is an IANA name as long as a letter follows.
        assert_eq!(service(&[(Some("8http"), 80, None)]).error(), None);
        assert!(service(&[(Some("8080"), 80, None)]).error().is_some());
    }
}
