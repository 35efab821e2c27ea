//! What the controller's watch of pods does not say: a pod's IP and
//! whether it is Ready. The watch keeps metadata only (a tenth of the
//! memory of whole pods), so these are read with a GET, and kept with the
//! pod's resourceVersion: while the cache shows the same version, nothing
//! changed and nothing is read again. A label patch answers with the whole
//! pod, which refreshes the entry for free, so a leader change costs no
//! read when the new leader's pod was last seen in a patch.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use leasehold_engine::sync::locked;

/// A pod's IP and readiness, at the version they were read from (by
/// default: a pod gone, not ready).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    pub version: Option<String>,
    pub ip: Option<String>,
    pub ready: bool,
}

impl Known {
    pub fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        Self {
            version: pod.metadata.resource_version.clone(),
            ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            ready: is_ready(pod),
        }
    }
}

/// Whether the pod's `Ready` condition is true, and it is not terminating.
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// By `NAMESPACE/POD`.
#[derive(Debug, Default)]
pub struct PodStatuses {
    known: Mutex<HashMap<String, Known>>,
}

impl PodStatuses {
    /// What is known of `pod` at `version` (the cache's), if anything.
    pub fn at(&self, pod: &str, version: Option<&str>) -> Option<Known> {
        locked(&self.known)
            .get(pod)
            .filter(|k| version.is_some() && k.version.as_deref() == version)
            .cloned()
    }

    pub fn record(&self, pod: &str, known: Known) {
        locked(&self.known).insert(pod.to_owned(), known);
    }

    pub fn forget(&self, pod: &str) {
        locked(&self.known).remove(pod);
    }

    /// Forgets the pods `present` does not keep (gone from the cache).
    pub fn retain(&self, present: impl Fn(&str) -> bool) {
        locked(&self.known).retain(|pod, _| present(pod));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(version: &str, ip: Option<&str>, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "web-0", "resourceVersion": version },
            "status": {
                "podIP": ip,
                "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn what_was_read_is_used_only_at_the_same_version() {
        let statuses = PodStatuses::default();
        statuses.record("shop/web-0", Known::of(&pod("7", Some("10.0.0.5"), true)));
        let known = statuses.at("shop/web-0", Some("7")).unwrap();
        assert_eq!(known.ip.as_deref(), Some("10.0.0.5"));
        assert!(known.ready);
        assert_eq!(statuses.at("shop/web-0", Some("8")), None, "changed since");
        assert_eq!(statuses.at("shop/web-0", None), None);
        assert_eq!(statuses.at("shop/web-1", Some("7")), None);
        statuses.retain(|p| p != "shop/web-0");
        assert_eq!(statuses.at("shop/web-0", Some("7")), None, "gone");
    }

    #[test]
    fn a_terminating_or_unready_pod_is_not_ready_and_an_empty_ip_is_none() {
        assert!(!Known::of(&pod("1", Some(""), false)).ready);
        assert_eq!(Known::of(&pod("1", Some(""), true)).ip, None);
        let mut leaving = pod("1", Some("10.0.0.5"), true);
        leaving.metadata.deletion_timestamp = Some(crate::plan::time_of(1_000));
        assert!(!is_ready(&leaving));
    }
}
