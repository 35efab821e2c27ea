//! Kubernetes object names as leasehold's processes use them: the rule a
//! LeaderGroup or pod name obeys, checked before a name goes into a URL
//! path, a file name or an engine id (`NAMESPACE/NAME`). The engine's own,
//! wider, id rule lives in `leasehold_engine::config`; this one narrows it.

use leasehold_engine::config::{check_name, MAX_ID_BYTES};

/// A name that is not a Kubernetes object name. The message names the flag
/// or field (`kind`) and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {value:?} is invalid: {reason}; a Kubernetes object name is 1 to {MAX_ID_BYTES} bytes of lowercase letters, digits, '-' and '.', starting and ending with a letter or digit")]
pub struct InvalidObjectName {
    pub kind: &'static str,
    pub value: String,
    pub reason: &'static str,
}

/// Checks the name of a Kubernetes object, such as a LeaderGroup: a DNS
/// subdomain (lowercase letters, digits, '-' and '.', starting and ending
/// with a letter or digit, at most 253 bytes). The agent puts it in URL
/// paths and file names, where a '/' would not do.
pub fn validate_object_name(kind: &'static str, value: &str) -> Result<(), InvalidObjectName> {
    let edge = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    check_name(value, |b| edge(b) || matches!(b, b'-' | b'.'))
        .and_then(|()| {
            let bytes = value.as_bytes();
            if edge(bytes[0]) && edge(bytes[bytes.len() - 1]) {
                Ok(())
            } else {
                Err("it must start and end with a letter or digit")
            }
        })
        .map_err(|reason| InvalidObjectName {
            kind,
            value: value.to_owned(),
            reason,
        })
}

/// The engine id of a namespaced Kubernetes object: `NAMESPACE/NAME`. A
/// LeaderGroup's engine group and a pod's node id are both named so; this
/// type is the one place that joins and splits them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}

impl NamespacedName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// `(namespace, name)` of an id, split at its first '/', if both sides
    /// are non-empty. The engine allows more '/' in an id; they stay in the
    /// name (which then names no pod, and is reported so).
    pub fn split(id: &str) -> Option<(&str, &str)> {
        id.split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
    }

    pub fn parse(id: &str) -> Option<Self> {
        Self::split(id).map(|(ns, name)| Self::new(ns, name))
    }

    /// The name, if `id` names an object of `namespace`.
    pub fn name_in<'a>(id: &'a str, namespace: &str) -> Option<&'a str> {
        Self::split(id)
            .filter(|(ns, _)| *ns == namespace)
            .map(|(_, name)| name)
    }
}

impl std::fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_names_join_and_split() {
        let n = NamespacedName::new("shop", "web-0");
        assert_eq!(n.to_string(), "shop/web-0");
        assert_eq!(NamespacedName::parse("shop/web-0"), Some(n));
        for bad in ["noslash", "/a", "a/"] {
            assert_eq!(NamespacedName::split(bad), None, "{bad}");
        }
        assert_eq!(NamespacedName::split("a/b/c"), Some(("a", "b/c")));
        assert_eq!(NamespacedName::name_in("shop/a", "shop"), Some("a"));
        assert_eq!(NamespacedName::name_in("other/a", "shop"), None);
    }

    #[test]
    fn object_names_are_dns_subdomains() {
        validate_object_name("--group", "web-1.a").unwrap();
        for (bad, reason) in [
            ("", "it is empty"),
            ("Web", "outside the allowed set"),
            ("a/b", "outside the allowed set"),
            ("-a", "start and end with a letter or digit"),
            ("a.", "start and end with a letter or digit"),
        ] {
            let e = validate_object_name("--group", bad)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("--group {bad:?} is invalid")), "{e}");
            assert!(e.contains(reason) && e.contains("1 to 253 bytes"), "{e}");
        }
        assert!(validate_object_name("--group", &"a".repeat(254)).is_err());
    }
}
