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

#[cfg(test)]
mod tests {
    use super::*;

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
