//! Script replies read into the interface's outcomes: one
//! `FromRedisValue` per reply shape of the scripts in `scripts/`, reading
//! each element under the name the script's header gives it, and deciding
//! by the first element which shape it is where a script answers in
//! several. [`read`] names the script: any other reply is a
//! [`StoreError::Reply`] saying which script and which element.

use std::collections::BTreeMap;

use redis::{FromRedisValue, ParsingError, Value};

use crate::config::{ElectionConfig, DEFAULT_PRIORITY};
use crate::store::messaging::{NodeInfo, PublishOutcome};
use crate::store::outcome::{adopted_timings, Claim, DeferReason, Deferral, GroupState};
use crate::store::outcome::{Heartbeat, Renewal, Sweep};
use crate::store::StoreError;

/// `reply`, the answer of `script`, as `T`.
pub(super) fn read<T: FromRedisValue>(script: &str, reply: Value) -> Result<T, StoreError> {
    T::from_redis_value(reply).map_err(|e| StoreError::Reply(format!("{script}: {e}")))
}

/// A reply array taken element by element, in the order the script
/// answers them (a struct literal evaluates its fields in written order).
/// A missing element reads as nil (Lua's false): one that only some
/// answers have is read as an `Option`.
struct Fields(std::vec::IntoIter<Value>);

impl Fields {
    fn of(reply: Value) -> Result<Self, ParsingError> {
        match reply {
            Value::Array(items) => Ok(Self(items.into_iter())),
            other => Err(format!("expected an array, got {other:?}").into()),
        }
    }

    /// The next element, which the script's header calls `name`.
    fn next<T: FromRedisValue>(&mut self, name: &str) -> Result<T, ParsingError> {
        let value = self.0.next().unwrap_or(Value::Nil);
        T::from_redis_value_ref(&value).map_err(|_| format!("{name}: got {value:?}").into())
    }

    /// A term, a time or a count: an integer, never negative.
    fn uint(&mut self, name: &str) -> Result<u64, ParsingError> {
        let n: i64 = self.next(name)?;
        u64::try_from(n).map_err(|_| format!("{name}: got {n}").into())
    }
}

/// A group's timings from its config hash (`{ttlMs, renewIntervalMs,
/// retryIntervalMs}`): all three present and valid, or nothing (a
/// half-written or invalid config is ignored, not half-applied, and never
/// fails the reply).
fn group_config(value: Value) -> Option<ElectionConfig> {
    let ms = |v: &Value| u64::try_from(i64::from_redis_value_ref(v).ok()?).ok();
    match value {
        Value::Array(fields) => match &fields[..] {
            [ttl, renew, retry] => adopted_timings(ms(ttl), ms(renew), ms(retry)),
            _ => None,
        },
        _ => None,
    }
}

/// Node id and incarnation of a lease value `NODE_ID#INCARNATION#TERM`
/// (missing parts are empty).
fn split_lease(value: &str) -> (&str, &str) {
    let mut parts = value.splitn(3, '#');
    (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    )
}

/// claim.lua: `{1, term, fresh, config}`, or `{0, term, pttl ms, holder
/// id, config}` with `reason, candidate` after it when the seat is left
/// to a better candidate.
impl FromRedisValue for Claim {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        Ok(match f.next::<i64>("outcome")? {
            1 => Claim::Won {
                term: f.uint("term")?,
                fresh: f.next::<i64>("fresh")? == 1,
                config: group_config(f.next("config")?),
            },
            _ => Claim::Lost {
                term: f.uint("term")?,
                pttl_ms: f.next("pttl ms")?,
                holder: f.next("holder id")?,
                config: group_config(f.next("config")?),
                deferred: match f.next::<Option<String>>("reason")? {
                    Some(reason) => Some(Deferral {
                        reason: DeferReason::parse(&reason)
                            .ok_or_else(|| format!("unknown deferral {reason:?}"))?,
                        to: f.next("candidate")?,
                    }),
                    None => None,
                },
            },
        })
    }
}

/// renew.lua: `{1, config, term}`, `{0}` or `{-1, lease value}`.
impl FromRedisValue for Renewal {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        Ok(match f.next::<i64>("outcome")? {
            1 => Renewal::Renewed {
                config: group_config(f.next("config")?),
                term: f.uint("term")?,
            },
            0 => Renewal::Gone,
            _ => {
                let lease: String = f.next("lease value")?;
                let (holder, incarnation) = split_lease(&lease);
                Renewal::Replaced {
                    holder: holder.to_owned(),
                    incarnation: incarnation.to_owned(),
                }
            }
        })
    }
}

/// group_state.lua: `{lease value or false, term, pttl ms, now ms, {id,
/// expiry, ...}, {id, priority, ...}, preferred or false}`.
impl FromRedisValue for GroupState {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        let lease: Option<String> = f.next("lease value")?;
        let term = f.uint("term")?;
        let pttl: i64 = f.next("pttl ms")?;
        let now_ms = f.uint("now ms")?;
        let members: Vec<(String, u64)> = f.next("live members")?;
        let set: BTreeMap<String, String> = f.next("priorities")?;
        let preferred: Option<String> = f.next("preferred")?;
        let mut priorities = BTreeMap::new();
        let mut problems = BTreeMap::new();
        for (id, _) in &members {
            // `N`, or `0 REASON` for a member whose application is unhealthy.
            let value = set.get(id).map_or("", String::as_str);
            let (number, problem) = value.split_once(' ').unzip();
            let number = number.unwrap_or(value).parse();
            priorities.insert(id.clone(), number.unwrap_or(DEFAULT_PRIORITY));
            if let Some(problem) = problem {
                problems.insert(id.clone(), problem.to_owned());
            }
        }
        Ok(GroupState {
            holder: lease.map(|v| split_lease(&v).0.to_owned()),
            term,
            lease_pttl_ms: u64::try_from(pttl).ok(),
            members,
            priorities,
            problems,
            preferred: preferred.map(|p| p.split_whitespace().map(str::to_owned).collect()),
            now_ms,
        })
    }
}

/// heartbeat.lua: `{1, now}`, `{0, now}` or `{-1, incarnation}`.
impl FromRedisValue for Heartbeat {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        Ok(match f.next::<i64>("outcome")? {
            1 => Heartbeat::Extended,
            0 => Heartbeat::Expired,
            _ => Heartbeat::Displaced {
                incarnation: f.next("incarnation")?,
            },
        })
    }
}

/// sweep.lua: `{swept ids, now ms, earliest remaining expiry ms or -1}`.
impl FromRedisValue for Sweep {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        Ok(Sweep {
            swept: f.next("swept ids")?,
            now_ms: f.uint("now ms")?,
            next_expiry_ms: u64::try_from(f.next::<i64>("earliest expiry")?).ok(),
        })
    }
}

/// list_nodes.lua: `{now, {id, lease_until, registered_at, heartbeat_at,
/// backlog, dropped, groups}...}`.
pub(super) struct Nodes(pub Vec<NodeInfo>);

impl FromRedisValue for Nodes {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        let now = f.uint("now")?;
        let rows: Vec<Value> = f.next("nodes")?;
        let node = |row| -> Result<NodeInfo, ParsingError> {
            let mut n = Fields::of(row)?;
            let id = n.next("id")?;
            let lease_until_ms = n.uint("lease_until")?;
            Ok(NodeInfo {
                id,
                lease_until_ms,
                registered_at_ms: n.uint("registered_at")?,
                last_heartbeat_ms: n.uint("heartbeat_at")?,
                backlog: n.uint("backlog")?,
                dropped: n.uint("dropped")?,
                groups: (n.next::<String>("groups")?)
                    .split(',')
                    .filter(|g| !g.is_empty())
                    .map(str::to_owned)
                    .collect(),
                live: lease_until_ms > now,
            })
        };
        Ok(Nodes(rows.into_iter().map(node).collect::<Result<_, _>>()?))
    }
}

/// publish.lua: one string, two words per message: `ID REACHED`, `-1
/// NODE` (a full inbox refused it) or `-2 NODE` (the target is not live).
pub(super) struct Published(pub Vec<PublishOutcome>);

impl FromRedisValue for Published {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let text = String::from_redis_value(reply)?;
        let words: Vec<&str> = text.split(' ').filter(|w| !w.is_empty()).collect();
        let number = |w: &str| w.parse::<u64>().map_err(|_| format!("{w:?} is no number"));
        let outcome = |pair: &[&str]| -> Result<PublishOutcome, ParsingError> {
            Ok(match *pair {
                ["-1", node] => PublishOutcome::InboxFull { node: node.into() },
                ["-2", node] => PublishOutcome::NotLive { node: node.into() },
                [id, reached] => PublishOutcome::Delivered {
                    id: number(id)?,
                    reached: number(reached)?,
                },
                _ => return Err(format!("{} words, not pairs", words.len()).into()),
            })
        };
        let outcomes = words.chunks(2).map(outcome);
        Ok(Published(outcomes.collect::<Result<_, _>>()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn config() -> Value {
        Value::Array(vec![bulk("3000"), bulk("1000"), bulk("500")])
    }

    #[test]
    fn a_lease_value_splits_into_holder_and_incarnation() {
        assert_eq!(split_lease("ns/pod-0#ab12#7"), ("ns/pod-0", "ab12"));
        assert_eq!(split_lease("plain"), ("plain", ""));
    }

    #[test]
    fn a_claim_reads_each_shape_by_its_first_element() {
        let won = Value::Array(vec![Value::Int(1), Value::Int(7), Value::Int(0), config()]);
        let Ok(Claim::Won {
            term: 7,
            fresh: false,
            config: Some(c),
        }) = read("claim.lua", won)
        else {
            panic!("not won at term 7");
        };
        assert_eq!(c.ttl_ms, 3000);
        let lost = |extra: Vec<Value>| {
            let base = [
                Value::Int(0),
                Value::Int(7),
                Value::Int(250),
                bulk(""),
                Value::Nil,
            ];
            read::<Claim>("claim.lua", Value::Array([base.to_vec(), extra].concat()))
        };
        assert!(matches!(
            lost(vec![]),
            Ok(Claim::Lost {
                term: 7,
                pttl_ms: 250,
                config: None,
                deferred: None,
                ..
            })
        ));
        let Ok(Claim::Lost {
            deferred: Some(d), ..
        }) = lost(vec![bulk("priority"), bulk("b")])
        else {
            panic!("no deferral");
        };
        assert_eq!((d.reason, d.to.as_str()), (DeferReason::Priority, "b"));
    }

    #[test]
    fn a_bad_reply_names_the_script_and_the_element() {
        let error = |reply: Result<Sweep, StoreError>| match reply {
            Err(StoreError::Reply(text)) => text,
            other => panic!("read: {other:?}"),
        };
        let short = Value::Array(vec![Value::Array(vec![]), Value::Int(5)]);
        assert_eq!(
            error(read("sweep.lua", short)),
            "sweep.lua: Incompatible type - earliest expiry: got nil"
        );
        let negative = Value::Array(vec![Value::Array(vec![]), Value::Int(-5), Value::Int(-1)]);
        assert_eq!(
            error(read("sweep.lua", negative)),
            "sweep.lua: Incompatible type - now ms: got -5"
        );
        assert!(error(read("sweep.lua", Value::Int(1))).contains("expected an array"));
        let odd = read::<Published>("publish.lua", bulk("12 3 -1"));
        assert!(matches!(odd, Err(StoreError::Reply(t)) if t.contains("3 words, not pairs")));
    }

    #[test]
    fn group_state_reads_members_priorities_and_problems() {
        let reply = Value::Array(vec![
            bulk("a#f00#7"),
            Value::Int(7),
            Value::Int(900),
            Value::Int(5000),
            Value::Array(vec![bulk("a"), bulk("6000"), bulk("b"), bulk("6100")]),
            Value::Array(vec![bulk("b"), bulk("0 disk full")]),
            bulk("b a"),
        ]);
        let state: GroupState = read("group_state.lua", reply).unwrap();
        assert_eq!(state.holder.as_deref(), Some("a"));
        assert_eq!(state.members, [("a".into(), 6000), ("b".into(), 6100)]);
        assert_eq!(state.priorities["a"], DEFAULT_PRIORITY);
        assert_eq!(state.problems["b"], "disk full");
        assert_eq!(state.preferred, Some(vec!["b".into(), "a".into()]));
    }
}
