//! Which pods a LeaderGroup's selector picks: kube-core's label [`Selector`]
//! (the API server's semantics), plus one rule of our own: an empty
//! selector picks nothing. A group that would select every pod is refused
//! by the schema; the controller must not label every pod of a namespace
//! when that check is missing (API servers without CEL).

use std::collections::BTreeMap;

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
