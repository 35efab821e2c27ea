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

/// Longest cluster name: a DNS label, as Kubernetes names a namespace.
pub const MAX_CLUSTER_NAME_BYTES: usize = 63;

/// A cluster name (`--cluster`) that is not a DNS label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value:?} is invalid: {reason}; a cluster name is 1 to {MAX_CLUSTER_NAME_BYTES} lowercase letters, digits and '-', starting and ending with a letter or digit")]
pub struct InvalidClusterName {
    pub flag: &'static str,
    pub value: String,
    pub reason: &'static str,
}

/// Checks a cluster name: a DNS label, so it holds no '/' (it is the first
/// part of a node id) and reads as the namespace names beside it do.
pub fn validate_cluster_name(flag: &'static str, value: &str) -> Result<(), InvalidClusterName> {
    let edge = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let reason = if value.is_empty() {
        Some("it is empty")
    } else if value.len() > MAX_CLUSTER_NAME_BYTES {
        Some("it is too long")
    } else if !value.bytes().all(|b| edge(b) || b == b'-') {
        Some("it contains a character outside the allowed set")
    } else if !edge(value.as_bytes()[0]) || !edge(value.as_bytes()[value.len() - 1]) {
        Some("it must start and end with a letter or digit")
    } else {
        None
    };
    reason.map_or(Ok(()), |reason| {
        Err(InvalidClusterName {
            flag,
            value: value.to_owned(),
            reason,
        })
    })
}

/// A pod's node id: `NAMESPACE/POD`, or `CLUSTER/NAMESPACE/POD` once the
/// clusters that share a store are named (`--cluster`), so that pods of the
/// same name in two clusters are two members of one group. The one place
/// that joins and splits a pod's node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodId<'a> {
    pub cluster: Option<&'a str>,
    pub namespace: &'a str,
    pub pod: &'a str,
}

impl<'a> PodId<'a> {
    /// `id` as a process reads it that names its cluster (`clustered`) or
    /// not: an id of the other form is no pod's (`None`), save that an
    /// unclustered reader sees `CLUSTER/NAMESPACE/POD` as a pod `NAMESPACE/POD`
    /// of a namespace `CLUSTER`, as it did before clusters had names.
    pub fn parse(id: &'a str, clustered: bool) -> Option<Self> {
        let (cluster, rest) = if clustered {
            let (cluster, rest) = id.split_once('/')?;
            (Some(cluster).filter(|c| !c.is_empty())?, rest)
        } else {
            return NamespacedName::split(id).map(|(namespace, pod)| Self {
                cluster: None,
                namespace,
                pod,
            });
        };
        let (namespace, pod) = NamespacedName::split(rest)?;
        Some(Self {
            cluster: Some(cluster),
            namespace,
            pod,
        })
    }
}

impl std::fmt::Display for PodId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(cluster) = self.cluster {
            write!(f, "{cluster}/")?;
        }
        write!(f, "{}/{}", self.namespace, self.pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ids_name_their_cluster_once_clusters_are_named() {
        let here = PodId {
            cluster: Some("east"),
            namespace: "shop",
            pod: "web-0",
        };
        assert_eq!(here.to_string(), "east/shop/web-0");
        assert_eq!(PodId::parse("east/shop/web-0", true), Some(here));
        let plain = PodId {
            cluster: None,
            ..here
        };
        assert_eq!(plain.to_string(), "shop/web-0");
        assert_eq!(PodId::parse("shop/web-0", false), Some(plain));
        // An id of the other form: no pod of a clustered reader's...
        assert_eq!(PodId::parse("shop/web-0", true), None);
        assert_eq!(PodId::parse("/shop/web-0", true), None);
        // ...and a pod of namespace "east" to an unclustered one, as before.
        let old = PodId::parse("east/shop/web-0", false).unwrap();
        assert_eq!((old.namespace, old.pod), ("east", "shop/web-0"));
    }

    #[test]
    fn cluster_names_are_dns_labels() {
        validate_cluster_name("--cluster", "eu-west-1").unwrap();
        for (bad, reason) in [
            ("", "it is empty"),
            ("East", "outside the allowed set"),
            ("a/b", "outside the allowed set"),
            ("a.b", "outside the allowed set"),
            ("-a", "start and end with a letter or digit"),
            (&"a".repeat(64), "too long"),
        ] {
            let e = validate_cluster_name("--cluster", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains(reason) && e.contains("--cluster"), "{bad}: {e}");
            assert!(e.contains("1 to 63"), "{e}");
        }
    }

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
