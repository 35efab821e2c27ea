//! Script replies read into the interface's outcomes: one
//! `FromRedisValue` per reply shape of the scripts in `scripts/`, reading
//! each element under the name the script's header gives it, and deciding
//! by the first element which shape it is where a script answers in
//! several. [`read`] names the script: any other reply is a
//! [`StoreError::Reply`] saying which script and which element.
//!
//! Elements are read through the strict types here, not redis-rs's own
//! (whose `bool` takes nil and "OK", whose `u64` wraps a negative number
//! and whose `Vec` reads nil as empty): a broken reply is an error, not a
//! plausible outcome. A list is required, save where nil can only mean
//! none (a group's members and priorities, the node list, the config).
//!
//! Text is read lossily (invalid UTF-8 replaced), not refused: node ids,
//! topics, reasons and incarnations in a reply may have been written by
//! any client of the store, and one bad byte in one member's id must not
//! make a whole group state, sweep or node list unreadable to every node;
//! at worst that one member is named inexactly.

use std::collections::BTreeMap;

use redis::{FromRedisValue, ParsingError, Value};

use crate::config::{ElectionConfig, DEFAULT_PRIORITY};
use crate::store::messaging::{NodeInfo, PublishOutcome};
use crate::store::outcome::{adopted_timings, Claim, DeferReason, Deferral, GroupState};
use crate::store::outcome::{Heartbeat, Renewal, SpecVote, Sweep};
use crate::store::StoreError;

/// `reply`, the answer of `script`, as `T`.
pub(super) fn read<T: FromRedisValue>(script: &str, reply: Value) -> Result<T, StoreError> {
    T::from_redis_value(reply).map_err(|e| StoreError::Reply(format!("{script}: {e}")))
}

/// An integer: a Lua number, or one in a string (a hash field).
pub(super) struct Int(pub i64);

impl FromRedisValue for Int {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let n = match &v {
            Value::Int(n) => Some(*n),
            Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
            _ => None,
        };
        n.map(Int)
            .ok_or_else(|| format!("expected an integer, got {v:?}").into())
    }
}

/// A term, a time or a count: an integer, never negative.
pub(super) struct Uint(pub u64);

impl FromRedisValue for Uint {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Int(n) = Int::from_redis_value(v)?;
        let fits = u64::try_from(n).map(Uint);
        fits.map_err(|_| format!("expected a non-negative integer, got {n}").into())
    }
}

/// A script's yes or no: the integer 1 or 0, nothing else.
pub(super) struct Flag(pub bool);

impl FromRedisValue for Flag {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(n @ (0 | 1)) => Ok(Flag(n == 1)),
            other => Err(format!("expected 0 or 1, got {other:?}").into()),
        }
    }
}

/// A string or a number as text, invalid UTF-8 replaced (module doc).
pub(super) struct Text(pub String);

impl FromRedisValue for Text {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::BulkString(b) => Ok(Text(String::from_utf8_lossy(&b).into_owned())),
            Value::SimpleString(s) => Ok(Text(s)),
            Value::Int(n) => Ok(Text(n.to_string())),
            other => Err(format!("expected a string, got {other:?}").into()),
        }
    }
}

/// A reply array taken element by element, in the order the script
/// answers them (a struct literal evaluates its fields in written order).
/// A missing element reads as nil (Lua's false).
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

    fn int(&mut self, name: &str) -> Result<i64, ParsingError> {
        self.next(name).map(|Int(n)| n)
    }

    fn uint(&mut self, name: &str) -> Result<u64, ParsingError> {
        self.next(name).map(|Uint(n)| n)
    }

    fn text(&mut self, name: &str) -> Result<String, ParsingError> {
        self.next(name).map(|Text(s)| s)
    }

    /// The next element, a list.
    fn list(&mut self, name: &str) -> Result<Fields, ParsingError> {
        match self.0.next().unwrap_or(Value::Nil) {
            Value::Array(items) => Ok(Self(items.into_iter())),
            other => Err(format!("{name}: got {other:?}").into()),
        }
    }

    /// The next element, a list, or nil (or nothing) for an empty one.
    fn list_or_nil(&mut self, name: &str) -> Result<Fields, ParsingError> {
        if let None | Some(Value::Nil) = self.0.as_slice().first() {
            self.0.next();
            return Ok(Self(Vec::new().into_iter()));
        }
        self.list(name)
    }

    fn is_done(&self) -> bool {
        self.0.as_slice().is_empty()
    }

    /// The remaining elements, each read by `read` (which may take several).
    fn each<T, C: FromIterator<T>>(
        mut self,
        mut read: impl FnMut(&mut Self) -> Result<T, ParsingError>,
    ) -> Result<C, ParsingError> {
        std::iter::from_fn(|| (!self.is_done()).then(|| read(&mut self))).collect()
    }
}

/// A group's timings from its config hash (`{ttlMs, renewIntervalMs,
/// retryIntervalMs}`): all three present and valid, or nothing (a
/// half-written or invalid config is ignored, not half-applied, and never
/// fails the reply). Elements after the three are ignored: the script reads
/// the hash with HMGET by name, so a field added to the end of that list
/// leaves the three where they are, and must not make every node drop the
/// timings without an error.
fn group_config(value: Value) -> Option<ElectionConfig> {
    let ms = |v: &Value| Uint::from_redis_value_ref(v).ok().map(|Uint(n)| n);
    match value {
        Value::Array(fields) => match &fields[..] {
            [ttl, renew, retry, ..] => adopted_timings(ms(ttl), ms(renew), ms(retry)),
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
        Ok(match f.int("outcome")? {
            1 => Claim::Won {
                term: f.uint("term")?,
                fresh: f.int("fresh")? == 1,
                config: group_config(f.next("config")?),
            },
            _ => Claim::Lost {
                term: f.uint("term")?,
                pttl_ms: f.int("pttl ms")?,
                holder: f.text("holder id")?,
                config: group_config(f.next("config")?),
                deferred: if f.is_done() {
                    None
                } else {
                    let reason = f.text("reason")?;
                    Some(Deferral {
                        reason: DeferReason::parse(&reason)
                            .ok_or_else(|| format!("unknown deferral {reason:?}"))?,
                        to: f.text("candidate")?,
                    })
                },
            },
        })
    }
}

/// renew.lua: `{1, config, term}`, `{0}` or `{-1, lease value}`.
impl FromRedisValue for Renewal {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        Ok(match f.int("outcome")? {
            1 => Renewal::Renewed {
                config: group_config(f.next("config")?),
                term: f.uint("term")?,
            },
            0 => Renewal::Gone,
            _ => {
                let lease = f.text("lease value")?;
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
        let lease: Option<Text> = f.next("lease value")?;
        let term = f.uint("term")?;
        let pttl = f.int("pttl ms")?;
        let now_ms = f.uint("now ms")?;
        let members: Vec<(String, u64)> = (f.list_or_nil("live members")?)
            .each(|m| Ok((m.text("member id")?, m.uint("member expiry")?)))?;
        let set: BTreeMap<String, String> = (f.list_or_nil("priorities")?)
            .each(|p| Ok((p.text("member id")?, p.text("priority")?)))?;
        let preferred: Option<Text> = f.next("preferred")?;
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
            holder: lease.map(|Text(v)| split_lease(&v).0.to_owned()),
            term,
            lease_pttl_ms: u64::try_from(pttl).ok(),
            members,
            priorities,
            problems,
            preferred: preferred.map(|Text(p)| p.split_whitespace().map(str::to_owned).collect()),
            now_ms,
        })
    }
}

/// heartbeat.lua: `{1, now}`, `{0, now}` or `{-1, incarnation}`.
impl FromRedisValue for Heartbeat {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        Ok(match f.int("outcome")? {
            1 => Heartbeat::Extended,
            0 => Heartbeat::Expired,
            _ => Heartbeat::Displaced {
                incarnation: f.text("incarnation")?,
            },
        })
    }
}

/// sweep.lua: `{swept ids, now ms, earliest remaining expiry ms or -1}`.
impl FromRedisValue for Sweep {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        Ok(Sweep {
            swept: f.list("swept ids")?.each(|ids| ids.text("swept id"))?,
            now_ms: f.uint("now ms")?,
            next_expiry_ms: u64::try_from(f.int("earliest expiry")?).ok(),
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
        let node = |rows: &mut Fields| -> Result<NodeInfo, ParsingError> {
            let mut n = rows.list("node")?;
            let id = n.text("id")?;
            let lease_until_ms = n.uint("lease_until")?;
            Ok(NodeInfo {
                id,
                lease_until_ms,
                registered_at_ms: n.uint("registered_at")?,
                last_heartbeat_ms: n.uint("heartbeat_at")?,
                backlog: n.uint("backlog")?,
                dropped: n.uint("dropped")?,
                groups: (n.text("groups")?)
                    .split(',')
                    .filter(|g| !g.is_empty())
                    .map(str::to_owned)
                    .collect(),
                live: lease_until_ms > now,
            })
        };
        Ok(Nodes(f.list_or_nil("nodes")?.each(node)?))
    }
}

/// vote_spec.lua: `{now ms, {cluster, 'TTL RENEW RETRY AT', ...}}`. A
/// record that cannot be read is not an error (any client of the store may
/// have written it): a vote without timings, as old as can be, so it never
/// counts.
pub(super) struct Votes(pub Vec<SpecVote>);

impl FromRedisValue for Votes {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let mut f = Fields::of(reply)?;
        let now = f.uint("now ms")?;
        let records: Vec<(String, String)> =
            (f.list_or_nil("votes")?).each(|v| Ok((v.text("cluster")?, v.text("timings")?)))?;
        let vote = |(cluster, record): (String, String)| {
            let numbers: Vec<Option<u64>> = record.split(' ').map(|n| n.parse().ok()).collect();
            let (config, at) = match numbers[..] {
                [ttl, renew, retry, Some(at)] => (adopted_timings(ttl, renew, retry), at),
                _ => (None, 0),
            };
            SpecVote {
                cluster,
                config,
                age_ms: now.saturating_sub(at),
            }
        };
        Ok(Votes(records.into_iter().map(vote).collect()))
    }
}

/// publish.lua: one string, two words per message: `ID REACHED`, `-1
/// NODE` (a full inbox refused it) or `-2 NODE` (the target is not live).
pub(super) struct Published(pub Vec<PublishOutcome>);

impl FromRedisValue for Published {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let Text(text) = Text::from_redis_value(reply)?;
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
            "sweep.lua: Incompatible type - now ms: got int(-5)"
        );
        assert!(error(read("sweep.lua", Value::Int(1))).contains("expected an array"));
        let odd = read::<Published>("publish.lua", bulk("12 3 -1"));
        assert!(matches!(odd, Err(StoreError::Reply(t)) if t.contains("3 words, not pairs")));
    }

    /// The reply error of `script` for `reply`, read as `T`.
    fn refused<T: FromRedisValue>(script: &str, reply: Value) -> String {
        match read::<T>(script, reply.clone()) {
            Err(StoreError::Reply(text)) => text,
            Err(other) => panic!("{reply:?}: {other:?}"),
            Ok(_) => panic!("{script} read {reply:?}"),
        }
    }

    #[test]
    fn a_flag_is_the_integer_0_or_1_and_nothing_else() {
        assert!(matches!(read("release.lua", Value::Int(1)), Ok(Flag(true))));
        assert!(matches!(
            read("release.lua", Value::Int(0)),
            Ok(Flag(false))
        ));
        for reply in [
            Value::Nil,
            Value::Okay,
            bulk("1"),
            Value::SimpleString("OK".into()),
            Value::Int(2),
        ] {
            let text = refused::<Flag>("release.lua", reply);
            assert!(text.contains("release.lua: ") && text.contains("0 or 1"));
        }
    }

    #[test]
    fn a_required_list_refuses_nil_and_a_list_that_may_be_nil_reads_empty() {
        let sweep = Value::Array(vec![Value::Nil, Value::Int(5), Value::Int(-1)]);
        assert!(refused::<Sweep>("sweep.lua", sweep).ends_with("swept ids: got nil"));
        let empty_group = Value::Array(vec![
            Value::Nil,
            Value::Int(0),
            Value::Int(-2),
            Value::Int(5000),
            Value::Nil,
            Value::Nil,
            Value::Nil,
        ]);
        let state: GroupState = read("group_state.lua", empty_group).unwrap();
        assert!(state.members.is_empty() && state.holder.is_none());
        let Nodes(nodes) = read("list_nodes.lua", Value::Array(vec![Value::Int(5)])).unwrap();
        assert!(nodes.is_empty());
        // An odd member list lacks an expiry.
        let odd = Value::Array(vec![
            Value::Nil,
            Value::Int(0),
            Value::Int(-2),
            Value::Int(5000),
            Value::Array(vec![bulk("a")]),
        ]);
        assert!(refused::<GroupState>("group_state.lua", odd).ends_with("member expiry: got nil"));
    }

    #[test]
    fn numbers_and_texts_are_refused_where_the_other_is_due() {
        // A negative count, where redis-rs's u64 would wrap it.
        let ack = Value::Array(vec![Value::Int(3), Value::Int(-1)]);
        assert!(refused::<(Uint, Uint)>("ack.lua", ack).contains("got -1"));
        // A deferral with its reason nil.
        let lost = Value::Array(vec![
            Value::Int(0),
            Value::Int(7),
            Value::Int(250),
            bulk(""),
            Value::Nil,
            Value::Nil,
            bulk("b"),
        ]);
        assert!(refused::<Claim>("claim.lua", lost).ends_with("reason: got nil"));
        assert!(refused::<Int>("handover.lua", Value::Double(1.0)).contains("expected an integer"));
    }

    #[test]
    fn text_with_invalid_utf8_is_read_with_the_bytes_replaced() {
        let id = Value::BulkString(b"ns/pod-\xff".to_vec());
        let Text(text) = read("heartbeat.lua", id).unwrap();
        assert_eq!(text, "ns/pod-\u{fffd}");
    }

    #[test]
    fn a_config_with_more_than_three_fields_keeps_its_timings() {
        let mut fields = vec![bulk("3000"), bulk("1000"), bulk("500")];
        assert_eq!(
            group_config(Value::Array(fields.clone())).unwrap().ttl_ms,
            3000
        );
        fields.push(bulk("later"));
        assert_eq!(
            group_config(Value::Array(fields.clone())).unwrap().ttl_ms,
            3000
        );
        fields.truncate(2);
        assert!(group_config(Value::Array(fields)).is_none());
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
