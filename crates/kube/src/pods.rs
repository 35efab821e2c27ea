//! A pod as the controller's rules see it, and the small conversions they
//! share (a node id's pod, a Kubernetes time): a leaf, so `plan` and
//! `placement` both use it without naming each other.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use leasehold_daemon::names::{NamespacedName, PodId};

/// A pod as the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The pod's revision: its `controller-revision-hash` (StatefulSet,
    /// DaemonSet) or `pod-template-hash` (Deployment) label.
    pub revision: Option<String>,
    /// When the pod was created (ms).
    pub created_ms: u64,
    /// Whether the pod is Ready: known for the leader's pod, and for every
    /// member's during a rollout (`None` otherwise: the metadata the
    /// controller watches does not say).
    pub ready: Option<bool>,
    /// The pod's IP, known with its readiness (`status.podIP`).
    pub ip: Option<String>,
    /// The resourceVersion these labels are the pod's at: the cache's, or
    /// the one this controller's own label write made, while the cache does
    /// not show it yet. A label patch is sent with it as its precondition,
    /// so a patch planned from a pod that has changed since is refused.
    pub version: Option<String>,
}

impl PodView {
    /// A pod's revision from its labels.
    pub fn revision_of(labels: &BTreeMap<String, String>) -> Option<String> {
        labels
            .get("controller-revision-hash")
            .or_else(|| labels.get("pod-template-hash"))
            .cloned()
    }
}

/// Milliseconds since the epoch as a Kubernetes time (second precision, as
/// Kubernetes writes them).
pub fn time_of(ms: u64) -> Time {
    let seconds = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    Time(
        k8s_openapi::jiff::Timestamp::from_second(seconds)
            .unwrap_or(k8s_openapi::jiff::Timestamp::MAX),
    )
}

/// The pod a node id names, if it is `NAMESPACE/POD` in `namespace`.
pub fn pod_of<'n>(node: &'n str, namespace: &str) -> Option<&'n str> {
    NamespacedName::name_in(node, namespace)
}

/// Where a member runs, as the controller of one cluster sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place<'n> {
    /// A pod of this cluster, in the group's namespace: the controller's
    /// own to label.
    Here(&'n str),
    /// A pod of the group's namespace in another cluster that shares the
    /// store: a member, which that cluster's controller labels.
    Elsewhere { cluster: &'n str, pod: &'n str },
    /// No pod of the group's namespace (another namespace, or an id that
    /// names no pod).
    Nowhere,
}

/// The cluster (`--cluster`, `None` while clusters are not named) and
/// namespace a controller reads a group's node ids from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locality<'a> {
    pub cluster: Option<&'a str>,
    pub namespace: &'a str,
}

impl Locality<'_> {
    pub fn place<'n>(&self, node: &'n str) -> Place<'n> {
        let Some(id) = PodId::parse(node, self.cluster.is_some()) else {
            return Place::Nowhere;
        };
        match id.cluster {
            _ if id.namespace != self.namespace => Place::Nowhere,
            cluster if cluster == self.cluster => Place::Here(id.pod),
            Some(cluster) => Place::Elsewhere {
                cluster,
                pod: id.pod,
            },
            None => Place::Nowhere,
        }
    }

    /// The pod of this cluster that `node` is, if it is one.
    pub fn pod<'n>(&self, node: &'n str) -> Option<&'n str> {
        match self.place(node) {
            Place::Here(pod) => Some(pod),
            _ => None,
        }
    }

    /// The node id of this cluster's pod `pod`.
    pub fn node_id(&self, pod: &str) -> String {
        let id = PodId {
            cluster: self.cluster,
            namespace: self.namespace,
            pod,
        };
        id.to_string()
    }

    /// A member's pod as users read it, in any cluster: `POD`, or
    /// `CLUSTER/POD` once clusters are named.
    pub fn shown(&self, node: &str) -> Option<String> {
        match (self.place(node), self.cluster) {
            (Place::Here(pod), None) => Some(pod.to_owned()),
            (Place::Here(pod), Some(cluster)) | (Place::Elsewhere { cluster, pod }, _) => {
                Some(format!("{cluster}/{pod}"))
            }
            (Place::Nowhere, _) => None,
        }
    }
}
