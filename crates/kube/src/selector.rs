//! Which pods a LeaderGroup's selector picks: kube-core's label [`Selector`]
//! (the API server's semantics), plus one rule of our own: an empty
//! selector picks nothing. A group that would select every pod is refused
//! by the schema; the controller must not label every pod of a namespace
//! when that check is missing (API servers without CEL).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

/// A group's selector, parsed once for matching many pods.
#[derive(Debug, Clone)]
pub struct PodSelector(Option<Selector>);

impl PodSelector {
    /// A selector the API server would refuse (an unknown operator, or `In`
    /// or `NotIn` without values) picks nothing: labelling on a guess could
    /// move the leader label.
    pub fn new(selector: &LabelSelector) -> Self {
        Self(
            Selector::try_from(selector.clone())
                .ok()
                .filter(|s| !s.selects_all()),
        )
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.as_ref().is_some_and(|s| s.matches(labels))
    }
}

/// The selectors of many groups, for asking of many pods whether any of
/// them selects the pod. A selector of `matchLabels` only is filed under
/// one of its pairs, so a pod is matched against the selectors filed under
/// its own labels (and the few with expressions), not against every group
/// of the namespace: with 1,000 groups sharing a label key, every
/// reconcile asks this of every labelled pod.
#[derive(Debug, Default)]
pub struct SelectorIndex {
    /// Each selector with its position among those the index was built of.
    by_label: HashMap<String, HashMap<String, Vec<(usize, PodSelector)>>>,
    rest: Vec<(usize, PodSelector)>,
}

impl SelectorIndex {
    pub fn new<'a>(selectors: impl IntoIterator<Item = &'a LabelSelector>) -> Self {
        let mut index = Self::default();
        for (i, selector) in selectors.into_iter().enumerate() {
            let parsed = (i, PodSelector::new(selector));
            match Self::filed_under(selector) {
                Some((key, value)) => index
                    .by_label
                    .entry(key.to_owned())
                    .or_default()
                    .entry(value.to_owned())
                    .or_default()
                    .push(parsed),
                None => index.rest.push(parsed),
            }
        }
        index
    }

    /// The label a selector of `matchLabels` only is filed under: a pod
    /// without it is never selected.
    pub fn filed_under(selector: &LabelSelector) -> Option<(&str, &str)> {
        let plain = selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty());
        let first = selector.match_labels.as_ref().and_then(|m| m.iter().next());
        first
            .filter(|_| plain)
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }

    /// Whether any of the selectors picks a pod with these labels.
    pub fn any_matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matching(labels).next().is_some()
    }

    /// The positions of the selectors that pick a pod with these labels.
    pub fn matching<'a>(
        &'a self,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = usize> + 'a {
        let filed = labels.iter().flat_map(move |(key, value)| {
            self.by_label
                .get(key)
                .and_then(|values| values.get(value))
                .into_iter()
                .flatten()
        });
        filed
            .chain(self.rest.iter())
            .filter(move |(_, s)| s.matches(labels))
            .map(|(i, _)| *i)
    }
}

/// Whether `labels` satisfy `selector` (see [`PodSelector`]).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    PodSelector::new(selector).matches(labels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn an_index_of_selectors_answers_as_each_of_them_would() {
        let plain = |pairs: &[(&str, &str)]| LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        };
        let with_expression = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![expr("tier", "In", &["db"])]),
        };
        let selectors = [
            plain(&[("app", "web"), ("zone", "a")]),
            plain(&[("app", "api")]),
            with_expression.clone(),
            LabelSelector::default(),
        ];
        let index = SelectorIndex::new(&selectors);
        let pods = [
            labels(&[("app", "web"), ("zone", "a")]),
            labels(&[("app", "web"), ("zone", "b")]),
            labels(&[("app", "api")]),
            labels(&[("tier", "db")]),
            labels(&[("app", "other")]),
            labels(&[]),
        ];
        for pod in &pods {
            let one_by_one = selectors.iter().any(|s| matches(s, pod));
            assert_eq!(index.any_matches(pod), one_by_one, "{pod:?}");
            let mut which: Vec<usize> = index.matching(pod).collect();
            which.sort_unstable();
            let each: Vec<usize> = (0..selectors.len())
                .filter(|&i| matches(&selectors[i], pod))
                .collect();
            assert_eq!(which, each, "{pod:?}");
        }
        assert_eq!(
            pods.iter()
                .map(|p| index.any_matches(p))
                .collect::<Vec<_>>(),
            [true, false, true, true, false, false]
        );
    }

    #[test]
    fn match_labels_must_all_be_present() {
        let s = LabelSelector {
            match_labels: Some(labels(&[("app", "web"), ("tier", "db")])),
            match_expressions: None,
        };
        assert!(matches(
            &s,
            &labels(&[("app", "web"), ("tier", "db"), ("x", "y")])
        ));
        assert!(!matches(&s, &labels(&[("app", "web")])));
        assert!(!matches(&s, &labels(&[("app", "web"), ("tier", "cache")])));
    }

    #[test]
    fn expressions_follow_the_api_semantics() {
        let s = |e| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![e]),
        };
        let pod = labels(&[("app", "web")]);
        assert!(matches(&s(expr("app", "In", &["web", "api"])), &pod));
        assert!(!matches(&s(expr("app", "In", &["api"])), &pod));
        assert!(matches(&s(expr("app", "NotIn", &["api"])), &pod));
        assert!(matches(&s(expr("tier", "NotIn", &["db"])), &pod));
        assert!(matches(&s(expr("app", "Exists", &[])), &pod));
        assert!(!matches(&s(expr("app", "DoesNotExist", &[])), &pod));
        assert!(!matches(&s(expr("app", "Bogus", &[])), &pod));
    }

    #[test]
    fn a_selector_the_api_server_would_refuse_selects_nothing() {
        let s = |e| LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![e]),
        };
        let pod = labels(&[("app", "web")]);
        assert!(!matches(&s(expr("tier", "NotIn", &[])), &pod));
        assert!(!matches(&s(expr("tier", "In", &[])), &pod));
        assert!(matches(&s(expr("tier", "NotIn", &["db"])), &pod));
    }

    #[test]
    fn an_empty_selector_selects_nothing() {
        assert!(!matches(
            &LabelSelector::default(),
            &labels(&[("app", "web")])
        ));
    }
}
