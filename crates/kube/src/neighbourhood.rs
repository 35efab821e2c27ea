//! A namespace as a reconcile reads it: the LeaderGroups and the pods'
//! metadata, indexed once per change of either, so a reconcile costs what
//! its own group's pods cost and not what the namespace's do.
//!
//! Without an index, a resync at rest of 1,000 groups of three pods in one
//! namespace costs 1,000 times O(4,000). The index is rebuilt lazily: the
//! watches mark every change in its namespace ([`Neighbours::changed_in`])
//! and the next reconcile of that namespace rebuilds; at rest nothing
//! changes and every reconcile reuses it.
//!
//! What it answers is exactly what [`PodsRead`] and the plan would decide
//! on the whole namespace (the pods a plan needs, and the other groups that
//! select any of them); `plan_tests.rs` checks both against the long way.
//!
//! [`PodsRead`]: crate::plan::PodsRead

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::crd::LeaderGroup;
use crate::plan::{self, named_pods, OtherGroup, PodView, StoreView};
use crate::selector::{PodSelector, SelectorIndex};
use leasehold_engine::sync::locked;

/// The groups and pods of one namespace, indexed.
#[derive(Debug, Default)]
pub struct Neighbourhood {
    /// Every group of the namespace not being deleted, this one included.
    groups: Vec<OtherGroup>,
    /// Per role label key, the selectors of the groups writing it, and
    /// which of `groups` each is.
    by_key: HashMap<String, (SelectorIndex, Vec<usize>)>,
    pods: Vec<PodView>,
    by_name: HashMap<String, usize>,
    /// Pods by each of their labels (key, then value).
    by_label: HashMap<String, HashMap<String, Vec<usize>>>,
    /// Per role label key, the pods carrying it as `leader` or `follower`
    /// that no group writing that key selects: every such group cleans
    /// them up, so every one of them reads them.
    orphans: HashMap<String, Vec<usize>>,
}

impl Neighbourhood {
    pub fn new(groups: Vec<OtherGroup>, pods: Vec<PodView>) -> Self {
        let mut by_key: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, g) in groups.iter().enumerate() {
            by_key.entry(g.role_label.clone()).or_default().push(i);
        }
        let by_key: HashMap<String, (SelectorIndex, Vec<usize>)> = by_key
            .into_iter()
            .map(|(key, members)| {
                let index = SelectorIndex::new(members.iter().map(|&i| &groups[i].selector));
                (key, (index, members))
            })
            .collect();
        let mut by_name = HashMap::with_capacity(pods.len());
        let mut by_label: HashMap<String, HashMap<String, Vec<usize>>> = HashMap::new();
        let mut orphans: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, pod) in pods.iter().enumerate() {
            by_name.insert(pod.name.clone(), i);
            for (key, value) in &pod.labels {
                by_label
                    .entry(key.clone())
                    .or_default()
                    .entry(value.clone())
                    .or_default()
                    .push(i);
            }
            for (key, (index, _)) in &by_key {
                if carries_a_role(&pod.labels, key) && !index.any_matches(&pod.labels) {
                    orphans.entry(key.clone()).or_default().push(i);
                }
            }
        }
        Self {
            groups,
            by_key,
            pods,
            by_name,
            by_label,
            orphans,
        }
    }

    /// The pods the plan of `group` needs: those it selects, those the store
    /// names as its members or holder, and those carrying its label key
    /// that no other group with that key selects (see [`PodsRead`]).
    ///
    /// [`PodsRead`]: crate::plan::PodsRead
    pub fn pods_for(
        &self,
        group: &LeaderGroup,
        store: &StoreView,
        cluster: Option<&str>,
    ) -> Vec<PodView> {
        let namespace = group.metadata.namespace.as_deref().unwrap_or_default();
        let name = group.metadata.name.as_deref().unwrap_or_default();
        let key = &group.spec.role_label;
        let own = PodSelector::new(&group.spec.selector);
        let named = named_pods(&plan::Locality { cluster, namespace }, store);
        let mut candidates: BTreeSet<usize> = named
            .iter()
            .filter_map(|pod| self.by_name.get(pod).copied())
            .collect();
        match SelectorIndex::filed_under(&group.spec.selector) {
            Some((k, v)) => candidates.extend(
                self.by_label
                    .get(k)
                    .and_then(|values| values.get(v))
                    .into_iter()
                    .flatten(),
            ),
            None => candidates.extend(0..self.pods.len()),
        }
        if self.by_key.contains_key(key) {
            candidates.extend(self.orphans.get(key).into_iter().flatten());
        } else {
            // A group the cache does not show yet: its orphans were not
            // worked out.
            candidates.extend(0..self.pods.len());
        }
        candidates
            .into_iter()
            .map(|i| &self.pods[i])
            .filter(|pod| {
                named.contains(&pod.name)
                    || own.matches(&pod.labels)
                    || (carries_a_role(&pod.labels, key)
                        && !self.selected_by_another(name, key, &pod.labels))
            })
            .cloned()
            .collect()
    }

    /// The other groups writing `group`'s label key that select any of
    /// `pods`: the only ones the plan's decisions on `pods` depend on.
    pub fn others_for(&self, group: &LeaderGroup, pods: &[PodView]) -> Vec<OtherGroup> {
        let name = group.metadata.name.as_deref().unwrap_or_default();
        let Some((index, members)) = self.by_key.get(&group.spec.role_label) else {
            return Vec::new();
        };
        let picked: BTreeSet<usize> = pods
            .iter()
            .flat_map(|pod| index.matching(&pod.labels))
            .map(|i| members[i])
            .filter(|&i| self.groups[i].name != name)
            .collect();
        picked.into_iter().map(|i| self.groups[i].clone()).collect()
    }

    fn selected_by_another(
        &self,
        name: &str,
        key: &str,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        self.by_key.get(key).is_some_and(|(index, members)| {
            index
                .matching(labels)
                .any(|i| self.groups[members[i]].name != name)
        })
    }
}

/// Whether `labels` carry `key` as a role this controller writes.
fn carries_a_role(labels: &BTreeMap<String, String>, key: &str) -> bool {
    plan::carries_a_role(labels.get(key).map(String::as_str))
}

/// Each watched namespace's [`Neighbourhood`], rebuilt at its first read
/// after a change of one of its groups or pods (or a relist of either).
///
/// Changes are numbered from one sequence, so a namespace's mark is always
/// above the number any of its neighbourhoods was built at: the controller's
/// own status writes and label patches in one namespace leave the others'
/// neighbourhoods standing.
#[derive(Debug, Default)]
pub struct Neighbours {
    sequence: AtomicU64,
    /// The last change of every namespace at once (a relist).
    everywhere: AtomicU64,
    /// The last change per namespace.
    marks: Mutex<HashMap<String, u64>>,
    built: Mutex<HashMap<String, (u64, Arc<Neighbourhood>)>>,
}

impl Neighbours {
    /// A group or a pod of `namespace` changed: called by the watches
    /// after the caches have taken the change in.
    pub fn changed_in(&self, namespace: &str) {
        let mark = self.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        locked(&self.marks).insert(namespace.to_owned(), mark);
    }

    /// A watch relisted: every namespace may have changed.
    pub fn changed_everywhere(&self) {
        let mark = self.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        self.everywhere.store(mark, Ordering::SeqCst);
    }

    fn mark(&self, namespace: &str) -> u64 {
        let own = locked(&self.marks).get(namespace).copied();
        own.unwrap_or(0).max(self.everywhere.load(Ordering::SeqCst))
    }

    /// `namespace`'s neighbourhood, from `build` when it changed since it
    /// was last built. The mark is read before the caches are, so a change
    /// that lands meanwhile is built again at the next read.
    pub fn of(&self, namespace: &str, build: impl FnOnce() -> Neighbourhood) -> Arc<Neighbourhood> {
        let mark = self.mark(namespace);
        if let Some((at, built)) = locked(&self.built).get(namespace) {
            if *at == mark {
                return built.clone();
            }
        }
        let built = Arc::new(build());
        locked(&self.built).insert(namespace.to_owned(), (mark, built.clone()));
        built
    }

    /// Forgets namespaces no group is in any more. A namespace forgotten
    /// and seen again is built anew: its mark falls, and never to the
    /// number it was built at.
    pub fn retain(&self, namespaces: &BTreeSet<String>) {
        locked(&self.built).retain(|ns, _| namespaces.contains(ns));
        locked(&self.marks).retain(|ns, _| namespaces.contains(ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_count(neighbours: &Neighbours, namespace: &str, builds: &mut u32) {
        neighbours.of(namespace, || {
            *builds += 1;
            Neighbourhood::default()
        });
    }

    #[test]
    fn a_neighbourhood_is_rebuilt_only_after_a_change_it_could_see() {
        let neighbours = Neighbours::default();
        let (mut shop, mut ops) = (0, 0);
        build_count(&neighbours, "shop", &mut shop);
        build_count(&neighbours, "ops", &mut ops);
        build_count(&neighbours, "shop", &mut shop);
        assert_eq!((shop, ops), (1, 1), "nothing changed: reused");
        neighbours.changed_in("shop");
        build_count(&neighbours, "shop", &mut shop);
        build_count(&neighbours, "ops", &mut ops);
        assert_eq!((shop, ops), (2, 1), "a change in shop leaves ops standing");
        neighbours.changed_everywhere();
        build_count(&neighbours, "shop", &mut shop);
        build_count(&neighbours, "ops", &mut ops);
        assert_eq!((shop, ops), (3, 2), "a relist rebuilds both");
        // Forgotten, then changed and seen again: built anew.
        neighbours.changed_in("shop");
        neighbours.retain(&BTreeSet::from(["ops".to_owned()]));
        build_count(&neighbours, "shop", &mut shop);
        assert_eq!(shop, 4);
        build_count(&neighbours, "shop", &mut shop);
        assert_eq!(shop, 4);
    }
}
