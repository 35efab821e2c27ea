//! Topic names and subscription patterns, and the matching rule between them.
//!
//! A topic is dot-separated segments (`orders.eu.created`). A pattern may use
//! `*` for exactly one segment and, as its last segment only, `>` for one or
//! more remaining segments (`orders.*.created`, `orders.>`). Matching itself
//! happens in the store (its publish script), where publishing picks the
//! subscribers; `crates/engine/tests/engine/messaging.rs` pins that rule. This module checks
//! names before anything is written.

use crate::config::MAX_ID_BYTES;

/// Why a topic or pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("topic {value:?} is invalid: {reason}; a topic is 1 to {MAX_ID_BYTES} bytes of dot-separated, non-empty segments of ASCII letters, digits, '_', '-' and '/'")]
    InvalidTopic { value: String, reason: &'static str },
    #[error("pattern {value:?} is invalid: {reason}; a pattern is a topic whose segments may be '*' (one segment) and whose last segment may be '>' (the rest)")]
    InvalidPattern { value: String, reason: &'static str },
}

fn segment_ok(segment: &str) -> bool {
    !segment.is_empty()
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'/'))
}

/// Checks a concrete topic (what is published to).
pub fn validate_topic(topic: &str) -> Result<(), TopicError> {
    let fail = |reason| {
        Err(TopicError::InvalidTopic {
            value: topic.to_owned(),
            reason,
        })
    };
    if topic.is_empty() {
        return fail("it is empty");
    }
    if topic.len() > MAX_ID_BYTES {
        return fail("it is too long");
    }
    if topic.contains(['*', '>']) {
        return fail("wildcards are for subscriptions, not topics");
    }
    if !topic.split('.').all(segment_ok) {
        return fail("a segment is empty or has a character outside the allowed set");
    }
    Ok(())
}

/// Checks a subscription: a topic, or a pattern with wildcards.
pub fn validate_subscription(pattern: &str) -> Result<(), TopicError> {
    if !is_pattern(pattern) {
        return validate_topic(pattern);
    }
    let fail = |reason| {
        Err(TopicError::InvalidPattern {
            value: pattern.to_owned(),
            reason,
        })
    };
    if pattern.len() > MAX_ID_BYTES {
        return fail("it is too long");
    }
    let segments: Vec<&str> = pattern.split('.').collect();
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "*" => {}
            ">" if i + 1 == segments.len() => {}
            ">" => return fail("'>' may only be the last segment"),
            s if s.contains(['*', '>']) => return fail("a wildcard must be a whole segment"),
            s if !segment_ok(s) => {
                return fail("a segment is empty or has a character outside the allowed set")
            }
            _ => {}
        }
    }
    Ok(())
}

pub fn is_pattern(subscription: &str) -> bool {
    subscription.contains(['*', '>'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_dot_separated_segments() {
        for ok in ["orders", "orders.eu.created", "a-b_c/d.e", &"x".repeat(253)] {
            validate_topic(ok).unwrap();
        }
        for (bad, reason) in [
            ("", "empty"),
            ("orders..created", "segment is empty"),
            (".orders", "segment is empty"),
            ("orders.", "segment is empty"),
            ("or ders", "outside the allowed set"),
            ("orders:eu", "outside the allowed set"),
            ("orders.*", "wildcards are for subscriptions"),
            (&"x".repeat(254), "too long"),
        ] {
            let err = validate_topic(bad).unwrap_err();
            assert!(matches!(err, TopicError::InvalidTopic { .. }));
            assert!(err.to_string().contains(reason), "{bad:?}: {err}");
        }
    }

    #[test]
    fn invalid_patterns_are_refused_with_the_reason() {
        for ok in ["orders.*.created", "orders.>", "*", ">", "*.*", "a.*.>"] {
            validate_subscription(ok).unwrap();
        }
        for (bad, reason) in [
            ("orders.>.created", "only be the last"),
            ("orders.cre*", "whole segment"),
            ("orders.>x", "whole segment"),
            ("orders..*", "segment is empty"),
            ("*.", "segment is empty"),
        ] {
            let err = validate_subscription(bad).unwrap_err();
            assert!(matches!(err, TopicError::InvalidPattern { .. }), "{bad:?}");
            assert!(err.to_string().contains(reason), "{bad:?}: {err}");
        }
    }
}
