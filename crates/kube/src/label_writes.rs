//! The role labels this controller wrote that its pod cache may not show
//! yet. The cache is a watch; a watch can lag, and while the API server is
//! away, or refuses the watch for a moment after a restart, it can lag by
//! many seconds. A plan made from a cache that misses a leader label this
//! controller gave would give the label to the next leader without taking
//! it from the last: two pods labelled leader (seen in tests/kubernetes/apiserver.rs:
//! for 15 s after an API server restart). So every label write is laid over
//! the cache until the cache has caught up with it.
//!
//! Whether the cache has caught up is read from the pods' resourceVersions,
//! compared as numbers: the API server's are etcd revisions. Where one does
//! not parse as a number, a write counts as seen once the cache shows any
//! other version than the one the write was planned from.

use std::collections::HashMap;

use crate::plan::PodView;

/// One label write: what the pod's version was when it was planned, and
/// what it became (unknown when the request failed: it may or may not have
/// been applied).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Write {
    key: String,
    value: Option<String>,
    planned_from: Option<String>,
    written_as: Option<String>,
}

#[derive(Debug, Default)]
pub struct LabelWrites {
    /// By `NAMESPACE/POD`; later writes of the same key replace earlier ones.
    writes: HashMap<String, Vec<Write>>,
}

fn number(version: &str) -> Option<u64> {
    version.parse().ok()
}

impl Write {
    /// Whether a cache at `cached` already holds this write.
    fn seen_at(&self, cached: Option<&str>) -> bool {
        let (Some(cached), Some(from)) = (cached, self.planned_from.as_deref()) else {
            // Nothing to compare: believe the cache once it has a version.
            return cached.is_some() && self.planned_from.is_none();
        };
        match (
            number(cached),
            self.written_as.as_deref().and_then(number),
            number(from),
        ) {
            (Some(c), Some(w), _) => c >= w,
            // The outcome is unknown: any later version holds it, if it happened.
            (Some(c), None, Some(f)) => c > f,
            _ => cached != from,
        }
    }
}

impl LabelWrites {
    /// A label write that succeeded (`written_as`: the pod's version after
    /// it) or whose outcome is unknown (`None`), sent with `planned_from`
    /// as its precondition. A write the API server refused, a conflict on
    /// that version above all, changed nothing and is not recorded.
    pub fn record(
        &mut self,
        pod: &str,
        key: &str,
        value: Option<&str>,
        planned_from: Option<String>,
        written_as: Option<String>,
    ) {
        let writes = self.writes.entry(pod.to_owned()).or_default();
        writes.retain(|w| w.key != key);
        writes.push(Write {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            planned_from,
            written_as,
        });
    }

    /// Lays the writes the cache does not show yet over `view` (the cached
    /// pod `NAMESPACE/POD` at version `cached`), and forgets those it shows.
    /// The view then stands at the version the newest of them made, where
    /// that is known: each write was sent with the version it was planned
    /// from as its precondition, so the pod at that version is the cached
    /// one with these writes on it, and a patch planned from the view may
    /// name it. Where it is not known, the view keeps the cached version: a
    /// patch at it is refused if the write did happen, and is right if not.
    pub fn overlay(&mut self, pod: &str, cached: Option<&str>, view: &mut PodView) {
        let Some(writes) = self.writes.get_mut(pod) else {
            return;
        };
        writes.retain(|w| !w.seen_at(cached));
        for w in writes.iter() {
            match &w.value {
                Some(v) => view.labels.insert(w.key.clone(), v.clone()),
                None => view.labels.remove(&w.key),
            };
        }
        if let Some(made) = writes.iter().rev().find_map(|w| w.written_as.clone()) {
            view.version = Some(made);
        }
        if writes.is_empty() {
            self.writes.remove(pod);
        }
    }

    /// Forgets the writes of pods that are no longer in the cache.
    pub fn retain_pods(&mut self, present: impl Fn(&str) -> bool) {
        self.writes.retain(|pod, _| present(pod));
    }

    /// Whether writes to pods of `namespace` wait for the cache: a write
    /// left in one namespace keeps the others on their fast path.
    pub fn pending_in(&self, namespace: &str) -> bool {
        self.writes
            .keys()
            .any(|pod| pod.split_once('/').is_some_and(|(ns, _)| ns == namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "leasehold.dev/role";

    fn view(role: Option<&str>) -> PodView {
        PodView {
            name: "web-0".into(),
            labels: role
                .map(|r| [(KEY.to_owned(), r.to_owned())].into())
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    fn role(v: &PodView) -> Option<&str> {
        v.labels.get(KEY).map(String::as_str)
    }

    #[test]
    fn a_write_is_laid_over_the_cache_until_the_cache_shows_it() {
        let mut writes = LabelWrites::default();
        writes.record(
            "shop/web-0",
            KEY,
            Some("leader"),
            Some("203".into()),
            Some("210".into()),
        );
        // Pending in its namespace only ("shop-2" shares the prefix).
        assert!(writes.pending_in("shop"));
        assert!(!writes.pending_in("shop-2") && !writes.pending_in("sho"));
        // The cache still at the version the write was planned from.
        let mut v = view(None);
        writes.overlay("shop/web-0", Some("203"), &mut v);
        assert_eq!(role(&v), Some("leader"));
        // Still behind (another pod's change moved nothing here).
        let mut v = view(None);
        writes.overlay("shop/web-0", Some("205"), &mut v);
        assert_eq!(role(&v), Some("leader"));
        // Caught up: the cache is believed, and the write forgotten.
        let mut v = view(Some("leader"));
        writes.overlay("shop/web-0", Some("210"), &mut v);
        assert_eq!(role(&v), Some("leader"));
        assert!(writes.writes.is_empty());
        assert!(!writes.pending_in("shop"));
        // Later changes by others are then the cache's to tell.
        let mut v = view(None);
        writes.overlay("shop/web-0", Some("230"), &mut v);
        assert_eq!(role(&v), None);
    }

    #[test]
    fn a_view_stands_at_the_version_the_newest_known_write_made() {
        let mut writes = LabelWrites::default();
        let cached = |writes: &mut LabelWrites, at: &str| {
            let mut v = view(None);
            v.version = Some(at.into());
            writes.overlay("shop/web-0", Some(at), &mut v);
            v.version
        };
        assert_eq!(cached(&mut writes, "203"), Some("203".into()), "no write");
        writes.record(
            "shop/web-0",
            KEY,
            Some("leader"),
            Some("203".into()),
            Some("210".into()),
        );
        // The next patch of the pod, planned while the cache lags, is sent
        // at the version the write made, not refused for the cache's lag.
        assert_eq!(cached(&mut writes, "203"), Some("210".into()));
        // A write of another key with no answer: the view stays at the
        // last version known to hold both (a patch there is refused if
        // the second did happen).
        writes.record("shop/web-0", "other", Some("x"), Some("210".into()), None);
        assert_eq!(cached(&mut writes, "203"), Some("210".into()));
        // The cache caught up with both: its own version again.
        assert_eq!(cached(&mut writes, "212"), Some("212".into()));
        assert!(writes.writes.is_empty());
    }

    #[test]
    fn a_write_with_an_unknown_outcome_counts_until_any_later_version() {
        let mut writes = LabelWrites::default();
        writes.record("shop/web-0", KEY, Some("leader"), Some("203".into()), None);
        let mut v = view(None);
        writes.overlay("shop/web-0", Some("203"), &mut v);
        assert_eq!(role(&v), Some("leader"), "it may have been applied");
        let mut v = view(None);
        writes.overlay("shop/web-0", Some("204"), &mut v);
        assert_eq!(role(&v), None, "a later version holds it if it happened");
        assert!(writes.writes.is_empty());
    }

    #[test]
    fn a_removal_is_laid_over_too_and_the_last_write_of_a_key_wins() {
        let mut writes = LabelWrites::default();
        writes.record(
            "shop/web-0",
            KEY,
            Some("leader"),
            Some("7".into()),
            Some("8".into()),
        );
        writes.record("shop/web-0", KEY, None, Some("8".into()), Some("9".into()));
        let mut v = view(Some("leader"));
        writes.overlay("shop/web-0", Some("8"), &mut v);
        assert_eq!(role(&v), None);
        assert_eq!(writes.writes.len(), 1);
    }

    #[test]
    fn versions_that_are_not_numbers_count_as_seen_once_they_change() {
        let mut writes = LabelWrites::default();
        writes.record(
            "shop/web-0",
            KEY,
            Some("leader"),
            Some("a".into()),
            Some("b".into()),
        );
        let mut v = view(None);
        writes.overlay("shop/web-0", Some("a"), &mut v);
        assert_eq!(role(&v), Some("leader"));
        let mut v = view(Some("leader"));
        writes.overlay("shop/web-0", Some("b"), &mut v);
        assert!(writes.writes.is_empty());
    }

    #[test]
    fn writes_of_pods_gone_from_the_cache_are_forgotten() {
        let mut writes = LabelWrites::default();
        writes.record(
            "shop/web-0",
            KEY,
            Some("leader"),
            Some("1".into()),
            Some("2".into()),
        );
        writes.record(
            "shop/web-1",
            KEY,
            Some("follower"),
            Some("1".into()),
            Some("3".into()),
        );
        writes.retain_pods(|p| p == "shop/web-1");
        assert_eq!(writes.writes.len(), 1);
    }
}
