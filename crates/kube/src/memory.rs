//! What the controller remembers between reconciles, of its groups and of
//! what they read (their Services, namespaces and pods), and the one way any
//! of it is forgotten: a deleted group's at its Delete ([`Memory::forget`]),
//! what the deletion watch missed (a deletion made while it relisted comes
//! as no event) at the next look at the caches ([`Memory::keep_only`]). Both
//! go through one `keep`, which names every memory once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::ResourceExt;

use crate::crd::{LeaderGroup, LeaderGroupStatus};
use crate::endpoint_writer::{service_key, EndpointWriter};
use crate::label_writes::LabelWrites;
use crate::metrics::ControllerMetrics;
use crate::neighbourhood::Neighbours;
use crate::pod_status::PodStatuses;
use leasehold_engine::sync::locked;

/// What one group's reconciles remember of each other (kept unless empty).
#[derive(Debug, Default, PartialEq)]
pub struct GroupMemory {
    /// Refused label patches in a row, for the back-off of
    /// `reconcile::refusal_delay`; a reconcile that completes clears it.
    pub refusals: u32,
    /// Since when (ms, store clock) the group has been without the holder
    /// its status names: the plan waits a moment for the successor
    /// (`plan::SUCCESSOR_GRACE_MS`) before it reports it leaderless.
    pub holder_gone_since_ms: Option<u64>,
    /// Across clusters only: when (ms, local clock) the lease last read
    /// from the store must have run out (`plan::Observed::lease_seen_until_ms`).
    pub lease_seen_until_ms: Option<u64>,
    /// Across clusters only: the `lease_seen_until_ms` whose lapse this
    /// replica acted on while active (it took the leader off): once it is
    /// a standby, it does not act on the same lapse again.
    pub acted_on_ms: Option<u64>,
    /// The status this replica last wrote, with the resourceVersion the
    /// group had when it was written. A reconcile triggered before the
    /// watch brings that write back would otherwise plan from the older
    /// status and write the same change (and its Event) again.
    pub last_written: Option<(String, LeaderGroupStatus)>,
}

pub struct Memory {
    /// By group (`NAMESPACE/NAME`).
    groups: Mutex<HashMap<String, GroupMemory>>,
    /// The controller's series; each group's go with the group.
    pub metrics: Arc<ControllerMetrics>,
    /// The leader endpoints' writer, with what it wrote by `NAMESPACE/SERVICE`.
    pub endpoints: EndpointWriter,
    /// Each namespace's groups and pods, indexed once per change.
    pub neighbours: Neighbours,
    /// Pods' IPs and readiness, by version (see `pod_status`).
    pub pod_statuses: PodStatuses,
    /// Role labels this replica wrote that the pod cache may not show yet,
    /// laid over the cache by every read of it (see `label_writes`).
    pub label_writes: Mutex<LabelWrites>,
}

/// `NAMESPACE/NAME` of the group, and `NAMESPACE/SERVICE` of its Service.
fn keys_of(group: &LeaderGroup) -> (String, Option<String>) {
    let service = group.spec.service.as_ref();
    let service = service.map(|s| service_key(group, &s.name));
    let namespace = group.namespace().unwrap_or_default();
    (format!("{namespace}/{}", group.name_any()), service)
}

impl Memory {
    /// `leader_endpoints`: the endpoint writer may write (the flag).
    pub fn new(metrics: Arc<ControllerMetrics>, leader_endpoints: bool) -> Self {
        Self {
            groups: Mutex::default(),
            metrics,
            endpoints: EndpointWriter::new(leader_endpoints),
            neighbours: Neighbours::default(),
            pod_statuses: PodStatuses::default(),
            label_writes: Mutex::default(),
        }
    }

    /// `f` of group `NAMESPACE/NAME`'s memory, kept while it holds anything: a read files none.
    pub fn of<T>(&self, group: &str, f: impl FnOnce(&mut GroupMemory) -> T) -> T {
        let mut groups = locked(&self.groups);
        let mut memory = groups.remove(group).unwrap_or_default();
        let result = f(&mut memory);
        (memory != GroupMemory::default()).then(|| groups.insert(group.to_owned(), memory));
        result
    }

    /// Drops what is remembered of a deleted group: its own memory, its
    /// series, and what was written into its Service's slice (the Service
    /// and the slice go with the group: owner references). A reconcile
    /// still running at the deletion can file some of it again; the next
    /// resync's [`Memory::keep_only`] drops that.
    pub fn forget(&self, group: &LeaderGroup) {
        let (key, service) = keys_of(group);
        let (other_group, other_service) =
            (|g: &str| g != key, |s: &str| Some(s) != service.as_deref());
        self.keep(&other_group, &other_service, None, None);
    }

    /// Drops what is remembered of groups, Services, namespaces and pods
    /// the caches no longer hold (`pods`: `None` while the pod cache is
    /// not filled, which leaves the pods' memories alone).
    pub fn keep_only(
        &self,
        groups: &[Arc<LeaderGroup>],
        pods: Option<&[Arc<PartialObjectMeta<Pod>>]>,
    ) {
        let (mut present, mut services) = (HashSet::new(), HashSet::new());
        for group in groups {
            let (key, service) = keys_of(group);
            present.insert(key);
            services.extend(service);
        }
        let namespaces = groups.iter().filter_map(|g| g.namespace()).collect();
        let pod_key = |p: &Arc<PartialObjectMeta<Pod>>| {
            format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
        };
        let pods: Option<HashSet<String>> = pods.map(|pods| pods.iter().map(pod_key).collect());
        let (group, service) = (
            |g: &str| present.contains(g),
            |s: &str| services.contains(s),
        );
        self.keep(&group, &service, Some(&namespaces), pods.as_ref());
    }

    /// Every memory, each once: what is not kept, by the key it is filed
    /// under (`namespaces`, `pods`: `None` keeps all), goes.
    fn keep(
        &self,
        group: &dyn Fn(&str) -> bool,
        service: &dyn Fn(&str) -> bool,
        namespaces: Option<&BTreeSet<String>>,
        pods: Option<&HashSet<String>>,
    ) {
        locked(&self.groups).retain(|g, _| group(g));
        self.metrics.retain_groups(group);
        self.endpoints.retain(service);
        if let Some(namespaces) = namespaces {
            self.neighbours.retain(namespaces);
        }
        if let Some(pods) = pods {
            self.pod_statuses.retain(|p| pods.contains(p));
            locked(&self.label_writes).retain_pods(|p| pods.contains(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::LeaderGroupSpec;
    use crate::endpoint::{Address, LeaderEndpoint};
    use crate::metrics::GroupFigures;
    use crate::neighbourhood::Neighbourhood;
    use crate::plan::PodView;
    use crate::pod_status::Known;

    fn group(name: &str) -> Arc<LeaderGroup> {
        let spec: LeaderGroupSpec = serde_json::from_value(serde_json::json!({
            "selector": { "matchLabels": { "app": name } },
            "service": { "name": format!("{name}-leader"), "ports": [{ "port": 80 }] },
        }))
        .unwrap();
        let mut g = LeaderGroup::new(name, spec);
        g.metadata.namespace = Some("shop".into());
        g.metadata.uid = Some(format!("uid-{name}"));
        Arc::new(g)
    }

    fn pod(name: &str) -> Arc<PartialObjectMeta<Pod>> {
        let meta = serde_json::json!({ "metadata": { "name": name, "namespace": "shop" } });
        Arc::new(serde_json::from_value(meta).unwrap())
    }

    /// What a reconcile of `group` leaves in every memory, with its pod's.
    fn remember(memory: &Memory, group: &LeaderGroup, pod: &str) {
        let (key, service) = keys_of(group);
        let service = service.unwrap();
        memory.of(&key, |m| {
            m.refusals = 2;
            m.holder_gone_since_ms = Some(1_000);
            m.last_written = Some(("7".into(), LeaderGroupStatus::default()));
        });
        let figures = GroupFigures::of(&LeaderGroupStatus::default(), None);
        memory
            .metrics
            .observe_group("shop", &group.name_any(), &figures, 1.0);
        let spec = group.spec.service.clone().unwrap();
        let leader = Some(Address {
            pod: pod.into(),
            ip: "10.0.0.5".into(),
            ready: true,
        });
        let endpoint = LeaderEndpoint {
            service: spec.clone(),
            term: 3,
            leader,
            unconfirmed: false,
        };
        memory
            .endpoints
            .remember(&service, group, None, "IPv4", &endpoint);
        let uid = group.metadata.uid.clone().unwrap();
        locked(&memory.endpoints.services).insert(service, (uid, spec));
        let pod = format!("shop/{pod}");
        let known = Known {
            version: Some("9".into()),
            ip: None,
            ready: true,
        };
        memory.pod_statuses.record(&pod, known);
        let written = (Some("8".into()), Some("9".into()));
        locked(&memory.label_writes).record(&pod, "role", Some("leader"), written.0, written.1);
    }

    /// The memories that hold anything of `group`, or of `pod`.
    fn holding(
        memory: &Memory,
        registry: &str,
        group: &LeaderGroup,
        pod: &str,
    ) -> Vec<&'static str> {
        let (key, service) = keys_of(group);
        let pod = format!("shop/{pod}");
        let mut view = PodView::default();
        locked(&memory.label_writes).overlay(&pod, Some("8"), &mut view);
        [
            ("group", locked(&memory.groups).contains_key(&key)),
            (
                "series",
                registry.contains(&format!("group=\"{}\"", group.name_any())),
            ),
            (
                "endpoint slice",
                locked(&memory.endpoints.slices).contains_key(service.as_ref().unwrap()),
            ),
            (
                "endpoint service",
                locked(&memory.endpoints.services).contains_key(&service.unwrap()),
            ),
            (
                "pod status",
                memory.pod_statuses.at(&pod, Some("9")).is_some(),
            ),
            ("label write", !view.labels.is_empty()),
        ]
        .into_iter()
        .filter_map(|(memory, holds)| holds.then_some(memory))
        .collect()
    }

    /// Whether `namespace`'s neighbourhood is built anew at its next read.
    fn rebuilt(memory: &Memory, namespace: &str) -> bool {
        let mut built = false;
        memory.neighbours.of(namespace, || {
            built = true;
            Neighbourhood::default()
        });
        built
    }

    fn filled() -> (Memory, prometheus_client::registry::Registry) {
        let mut registry = leasehold_daemon::metrics::new_registry();
        let metrics = ControllerMetrics::register(&mut registry);
        metrics.set_active(true);
        let memory = Memory::new(metrics, true);
        remember(&memory, &group("web"), "web-0");
        remember(&memory, &group("db"), "db-0");
        for namespace in ["shop", "ops"] {
            assert!(rebuilt(&memory, namespace));
        }
        (memory, registry)
    }

    const ALL: [&str; 6] = [
        "group",
        "series",
        "endpoint slice",
        "endpoint service",
        "pod status",
        "label write",
    ];

    #[test]
    fn a_deleted_group_leaves_nothing_of_it_in_any_memory_and_the_rest_stays() {
        let (memory, registry) = filled();
        let text = || leasehold_daemon::metrics::render(&registry);
        assert_eq!(holding(&memory, &text(), &group("web"), "web-0"), ALL);
        memory.forget(&group("web"));
        // Its pod is not the group's: the pod watch forgets it.
        let left = holding(&memory, &text(), &group("web"), "web-0");
        assert_eq!(left, ["pod status", "label write"]);
        assert_eq!(holding(&memory, &text(), &group("db"), "db-0"), ALL);
        assert!(!rebuilt(&memory, "shop"), "the namespace still has db");
    }

    #[test]
    fn what_the_caches_no_longer_hold_is_forgotten_and_the_rest_stays() {
        let (memory, registry) = filled();
        let text = || leasehold_daemon::metrics::render(&registry);
        memory.keep_only(&[group("db")], None);
        let left = holding(&memory, &text(), &group("web"), "web-0");
        assert_eq!(left, ["pod status", "label write"], "pods not cached yet");
        memory.keep_only(&[group("db")], Some(&[pod("db-0")]));
        assert!(holding(&memory, &text(), &group("web"), "web-0").is_empty());
        assert_eq!(holding(&memory, &text(), &group("db"), "db-0"), ALL);
        assert!(!rebuilt(&memory, "shop"));
        assert!(rebuilt(&memory, "ops"), "no group is in ops any more");
    }

    #[test]
    fn a_read_keeps_nothing_and_a_memory_cleared_is_dropped() {
        let (memory, _registry) = filled();
        let kept = |key: &str| locked(&memory.groups).contains_key(key);
        memory.forget(&group("web"));
        // What a reconcile that ends after the Delete reads and writes back.
        let since = memory.of("shop/web", |m| m.holder_gone_since_ms);
        memory.of("shop/web", |m| {
            (m.holder_gone_since_ms, m.refusals) = (since, 0)
        });
        assert_eq!(since, None);
        assert!(!kept("shop/web"), "a forgotten group stays forgotten");
        memory.of("shop/db", |m| {
            m.refusals = 0;
            m.holder_gone_since_ms = None;
        });
        assert!(kept("shop/db"), "its last written status is still held");
        memory.of("shop/db", |m| m.last_written = None);
        assert!(!kept("shop/db"));
        memory.of("shop/db", |m| m.refusals = 1);
        assert!(kept("shop/db"));
    }
}
