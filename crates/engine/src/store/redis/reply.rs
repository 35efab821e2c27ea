//! Script and command replies read into the engine's types: the shapes the
//! scripts in `scripts/` return, checked, with a [`StoreError::Reply`] for
//! anything else. Read by position on purpose, for now: a script answers an
//! array whose first element says which outcome it is and whose other
//! elements depend on it, which redis-rs's tuple `FromRedisValue` (one
//! fixed shape) does not read. Typed outcomes per script belong to the
//! Redis side of the store interface (issue 24), which replaces these.

use redis::Value;

use crate::config::ElectionConfig;
use crate::store::outcome::adopted_timings;
use crate::store::StoreError;

/// A group's timings from its config hash: all three present and valid, or
/// nothing (a half-written or invalid config is ignored, not half-applied).
pub(super) fn group_config(value: Option<&Value>) -> Option<ElectionConfig> {
    let Some(Value::Array(fields)) = value else {
        return None;
    };
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| as_int(v).ok())
            .and_then(|n| u64::try_from(n).ok())
    };
    adopted_timings(field(0), field(1), field(2))
}

/// The node id part of a lease value `NODE_ID#INCARNATION#TERM`.
pub(crate) fn holder_id(value: &str) -> &str {
    split_lease(value).0
}

/// Node id, incarnation and term of a lease value `NODE_ID#INCARNATION#TERM`
/// (missing parts are empty).
pub(super) fn split_lease(value: &str) -> (&str, &str, &str) {
    let mut parts = value.splitn(3, '#');
    let id = parts.next().unwrap_or_default();
    let incarnation = parts.next().unwrap_or_default();
    let term = parts.next().unwrap_or_default();
    (id, incarnation, term)
}

pub(super) fn array(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(StoreError::Reply(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

pub(super) fn as_int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StoreError::Reply(format!("expected an integer, got {v:?}"))),
        other => Err(StoreError::Reply(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

pub(super) fn as_string(v: &Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        other => Err(StoreError::Reply(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

pub(super) fn at(items: &[Value], i: usize) -> Result<&Value, StoreError> {
    items
        .get(i)
        .ok_or_else(|| StoreError::Reply(format!("reply has no element {i}: {items:?}")))
}
pub(super) fn int_at(items: &[Value], i: usize) -> Result<i64, StoreError> {
    as_int(at(items, i)?)
}
pub(super) fn uint_at(items: &[Value], i: usize) -> Result<u64, StoreError> {
    let n = int_at(items, i)?;
    u64::try_from(n)
        .map_err(|_| StoreError::Reply(format!("expected a non-negative integer, got {n}")))
}
pub(super) fn string_at(items: &[Value], i: usize) -> Result<String, StoreError> {
    as_string(at(items, i)?)
}
