//! Label selector matching, as the API server does it, so the plan can
//! decide in pure code which pods a group may label.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` satisfy `selector`. An empty selector matches nothing
/// here: a group that would select every pod is refused by the schema, and
/// the controller must not label every pod of a namespace if that check is
/// missing (API servers without CEL).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector.match_labels.as_ref();
    let expressions = selector.match_expressions.as_deref().unwrap_or_default();
    if match_labels.is_none_or(|m| m.is_empty()) && expressions.is_empty() {
        return false;
    }
    if let Some(wanted) = match_labels {
        if !wanted.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return false;
        }
    }
    expressions.iter().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false, // unknown operators select nothing, as the API server refuses them
        }
    })
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
    fn an_empty_selector_selects_nothing() {
        assert!(!matches(
            &LabelSelector::default(),
            &labels(&[("app", "web")])
        ));
    }
}
