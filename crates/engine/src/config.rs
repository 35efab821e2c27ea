//! Every tunable of the engine, its default, and the rules a value must obey.
//!
//! Validation lives here and nowhere else, so the library and every program
//! built on it refuse the same values with the same words:
//! an error names the option, the value it was given and the range it must
//! be in.

use std::time::Duration;

/// Largest millisecond value any option accepts (docs/behaviour.md E1, N1):
/// a signed 32-bit integer, which is also what `PX`/`PEXPIRE` clients and
/// JavaScript timers agree on.
pub const MAX_MS: u64 = 2_147_483_647;

/// Longest node id or group name, in bytes: a Kubernetes object name.
pub const MAX_ID_BYTES: usize = 253;

/// Key prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "leasehold";

/// At most this many expired nodes are removed by one sweep, so a sweep never
/// blocks the store for long even after a mass failure.
pub const SWEEP_BATCH: usize = 100;

/// How long a connection attempt to the store may take before it counts as failed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest time an engine call to the store is given before it counts as
/// failed. Claims, renewals and releases are otherwise bounded by the group's
/// retry interval, which may legally be 1 ms: far too short for a round trip
/// on a busy machine. So shutdown is bounded by about 3 x max(retry, this).
pub const MIN_CALL_TIMEOUT: Duration = Duration::from_millis(100);

/// A connection whose sent data stays unacknowledged this long is dropped and
/// rebuilt (Linux `TCP_USER_TIMEOUT`). Engine calls carry their own, shorter
/// bounds; this only retires a connection into a black-holed network, which
/// otherwise would hang until the kernel's retransmissions give up (minutes).
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);

/// Keepalive probes on idle connections (the pub/sub one is mostly idle):
/// first probe after this much silence, then every half of it.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(10);

/// A background connection (pub/sub wake-ups, inbox reader, event
/// follower) that failed is retried after this, doubling each time...
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// ...up to this.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Default longest inbox backlog before the oldest unread messages are dropped.
pub const DEFAULT_INBOX_MAX_LENGTH: u64 = 10_000;

/// Largest inbox limit accepted: a backlog is memory in the store.
pub const MAX_INBOX_LENGTH: u64 = 10_000_000;

/// Default largest payload a publish accepts.
pub const DEFAULT_MAX_MESSAGE_SIZE: u64 = 512 * 1024;

/// Largest `max_message_size` accepted: the store's own limit for one value.
pub const MAX_MESSAGE_SIZE_LIMIT: u64 = 512 * 1024 * 1024;

/// Messages a node's reader hands over ahead of its consumer. Kept small so
/// a slow consumer's backlog stays in the store, where it is visible and bounded.
pub const INBOX_BUFFER: usize = 256;

/// Most inbox entries fetched by one read.
pub const INBOX_BATCH: usize = 512;

/// How long one blocking inbox read waits for a message before it is
/// re-issued (also a net under TCP keepalive for a dead connection).
pub const INBOX_BLOCK: Duration = Duration::from_secs(30);

/// While its consumer is not taking messages, the reader re-checks the
/// backlog this often to report lag.
pub const LAG_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// How long one `WAIT` for the replicas after a lease write may block
/// (see `store::ReplicaAcks`), and never more than half the call's bound
/// (the retry interval), so that a wait that runs out is still answered.
/// Short: while it blocks, the node's other commands on that connection
/// wait behind it.
pub const REPLICA_WAIT: Duration = Duration::from_millis(250);

/// How often the primary's replicas (in sync, and attached in any state) are
/// counted again.
pub const REPLICA_COUNT_REFRESH: Duration = Duration::from_secs(1);

/// With `--store-replica-acks all`, a primary that reports fewer replicas
/// than it had (in sync, or attached in their full sync) is believed only
/// after this long: until then a lease write waits for as many as before
/// (and so is not confirmed). A primary that a
/// failover deposed but that still takes writes loses its replicas at the
/// promotion; its word "no replica, nothing to wait for" must not confirm a
/// lease while its clients have not yet moved to the new primary (behind
/// Sentinel, at most `SENTINEL_RECHECK` + `SENTINEL_TIMEOUT` after the
/// sentinels name it, and the promotion comes up to a second before that).
/// A replica removed for good costs one lease round of this long.
pub const REPLICA_LOSS_GRACE: Duration = Duration::from_secs(5);

/// Behind Sentinel, the primary a call goes to was named by a majority of
/// the sentinels at most this long ago; older, they are asked again before
/// the call. A process cut off from the sentinel majority thus makes no
/// write for longer than this, so a leader in a minority partition fails
/// its renewals and demotes within its ttl. Sentinel's
/// `down-after-milliseconds` must be at least twice this, 2000 (its
/// default is 30000).
pub const SENTINEL_RECHECK: Duration = Duration::from_secs(1);

/// How long one sentinel may take to name the primary.
pub const SENTINEL_TIMEOUT: Duration = Duration::from_millis(300);

/// In a clustered store, how often the node serving the prefix's slot is
/// looked up again (and at once after an error, a MOVED say).
pub const CLUSTER_RECHECK: Duration = Duration::from_secs(5);

/// Most unread commands a node's command stream keeps (the oldest go first).
/// Commands are rare (a step-down per request) and read at once, even while
/// the application's inbox is full. publish.lua carries the same number.
pub const COMMANDS_MAX: u64 = 100;

/// Most messages one publish script carries (see `inbox::publisher`).
pub const PUBLISH_BATCH: usize = 128;

/// A batch stops growing past this many payload bytes.
pub const PUBLISH_BATCH_BYTES: usize = 1024 * 1024;

/// Longest retain ttl a publish accepts: 100 years. A store's expiry stops at
/// 2^63 ms; a bound far inside it keeps every batch writable.
pub const MAX_RETAIN_MS: u64 = 100 * 365 * 24 * 3_600_000;

/// Bound on user-facing calls (publish, subscribe, introspection).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A refused option value. The message is meant for the person who set it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{option} = {value} is out of range: it must be a whole number of milliseconds from 1 to {MAX_MS}")]
    OutOfRange { option: &'static str, value: u64 },
    #[error("{option} = {value} is out of range: it must be a whole number of milliseconds from 1 to {MAX_MS}")]
    Negative { option: &'static str, value: i64 },
    #[error("renew_interval_ms = {renew} must be less than ttl_ms = {ttl}, so the leader renews before its lease runs out")]
    RenewNotBelowTtl { renew: u64, ttl: u64 },
    #[error("{option} = {value} is out of range: it must be a whole number from {min} to {max}")]
    OutOfBounds {
        option: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    #[error("{kind} {value:?} is invalid: {reason}; allowed are 1 to {MAX_ID_BYTES} bytes of ASCII letters, digits, '_', '-', '.' and '/'")]
    InvalidName {
        kind: &'static str,
        value: String,
        reason: &'static str,
    },
}

fn check_bounds(option: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfBounds {
            option,
            value,
            min,
            max,
        })
    }
}

fn check_ms(option: &'static str, value: u64) -> Result<(), ConfigError> {
    if (1..=MAX_MS).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange { option, value })
    }
}

/// The priority a candidate campaigns with when none is given: every
/// member equal, the election as without priorities.
pub const DEFAULT_PRIORITY: u32 = 1;

/// The highest priority a candidate may campaign with. Priority 0 is a
/// member that never leads (docs/behaviour.md P2).
pub const MAX_PRIORITY: u32 = 100;

/// Checks a candidate's priority; `option` names it in the error (the
/// agent's flag, the engine's argument).
pub fn validate_priority(option: &'static str, value: u32) -> Result<(), ConfigError> {
    check_bounds(option, value.into(), 0, MAX_PRIORITY.into())
}

/// Timings of one group's election. A group's leader keeps its lease for
/// `ttl_ms`, renews it every `renew_interval_ms`, and followers try to claim
/// it at least every `retry_interval_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ElectionConfig {
    pub ttl_ms: u64,
    pub renew_interval_ms: u64,
    pub retry_interval_ms: u64,
}

impl Default for ElectionConfig {
    fn default() -> Self {
        Self {
            ttl_ms: 15_000,
            renew_interval_ms: 5_000,
            retry_interval_ms: 2_000,
        }
    }
}

impl ElectionConfig {
    /// Checks every field; the first offending option is reported.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_ms("ttl_ms", self.ttl_ms)?;
        check_ms("renew_interval_ms", self.renew_interval_ms)?;
        check_ms("retry_interval_ms", self.retry_interval_ms)?;
        if self.renew_interval_ms >= self.ttl_ms {
            return Err(ConfigError::RenewNotBelowTtl {
                renew: self.renew_interval_ms,
                ttl: self.ttl_ms,
            });
        }
        Ok(())
    }

    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
    pub fn renew_interval(&self) -> Duration {
        Duration::from_millis(self.renew_interval_ms)
    }
    pub fn retry_interval(&self) -> Duration {
        Duration::from_millis(self.retry_interval_ms)
    }
    /// How long one claim, renewal or release may wait for the store: one retry
    /// interval, but never less than [`MIN_CALL_TIMEOUT`].
    pub fn call_timeout(&self) -> Duration {
        self.retry_interval().max(MIN_CALL_TIMEOUT)
    }
    /// How long a free seat waits for a better candidate (one of higher
    /// priority, the controller's preferred one, a named successor) before
    /// any other may take it: two retry intervals. A live candidate claims
    /// within one retry interval of the seat freeing, woken or not
    /// (`follower_wait`), and its claim may take up to a call timeout, one
    /// retry interval more. So a better candidate that lives always wins
    /// the seat, and one that died (its candidacy not yet lapsed) keeps it
    /// empty for two retry intervals at most.
    pub fn deference(&self) -> Duration {
        self.retry_interval() * 2
    }
}

/// Timings of a node's registration. Build it with [`NodeConfig::with_lease`]
/// to get the derived defaults (heartbeat = lease / 3, sweep = lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeConfig {
    pub lease_duration_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub sweep_interval_ms: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self::with_lease(30_000)
    }
}

impl NodeConfig {
    /// A lease with the derived defaults of docs/behaviour.md N1: a heartbeat every third of the
    /// lease (rounded down, at least 1 ms) and a sweep every lease.
    pub fn with_lease(lease_duration_ms: u64) -> Self {
        Self {
            lease_duration_ms,
            heartbeat_interval_ms: (lease_duration_ms / 3).max(1),
            sweep_interval_ms: lease_duration_ms,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_ms("lease_duration_ms", self.lease_duration_ms)?;
        check_ms("heartbeat_interval_ms", self.heartbeat_interval_ms)?;
        check_ms("sweep_interval_ms", self.sweep_interval_ms)?;
        Ok(())
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_duration_ms)
    }
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }
    pub fn sweep_interval(&self) -> Duration {
        Duration::from_millis(self.sweep_interval_ms)
    }
}

/// Limits of a node's inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InboxConfig {
    /// Past this many unread messages the oldest are dropped (and counted).
    pub max_length: u64,
    /// A backlog beyond this many messages is reported as `Lag`.
    pub lag_threshold: u64,
    /// Largest payload, in bytes, this node publishes.
    pub max_message_size: u64,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self::with_max_length(DEFAULT_INBOX_MAX_LENGTH)
    }
}

impl InboxConfig {
    /// A limit with the derived default lag threshold (half of it, at least 1).
    pub fn with_max_length(max_length: u64) -> Self {
        Self {
            max_length,
            lag_threshold: (max_length / 2).max(1),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_bounds("inbox_max_length", self.max_length, 1, MAX_INBOX_LENGTH)?;
        check_bounds("lag_threshold", self.lag_threshold, 1, self.max_length)?;
        check_bounds(
            "max_message_size",
            self.max_message_size,
            1,
            MAX_MESSAGE_SIZE_LIMIT,
        )
    }
}

/// Checks a node id or group name. Both end up inside the store's key names and
/// Kubernetes label values' neighbourhood, so the alphabet is kept small:
/// no spaces, no braces (they would break the hash tag), no `#` (it separates
/// a lease holder's id from its incarnation).
pub fn validate_name(kind: &'static str, value: &str) -> Result<(), ConfigError> {
    check_name(value, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/')
    })
    .map_err(|reason| ConfigError::InvalidName {
        kind,
        value: value.to_owned(),
        reason,
    })
}

/// The rules every kind of name shares (engine ids here, Kubernetes object
/// names in the applications): not empty, at most [`MAX_ID_BYTES`], every
/// byte `allowed`. The error is the reason.
pub fn check_name(value: &str, allowed: impl Fn(u8) -> bool) -> Result<(), &'static str> {
    if value.is_empty() {
        return Err("it is empty");
    }
    if value.len() > MAX_ID_BYTES {
        return Err("it is too long");
    }
    if !value.bytes().all(allowed) {
        return Err("it contains a character outside the allowed set");
    }
    Ok(())
}

/// A key prefix follows the name rules too (it is part of every key).
pub fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    validate_name("prefix", prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_e1_and_n1() {
        let e = ElectionConfig::default();
        assert_eq!(
            (e.ttl_ms, e.renew_interval_ms, e.retry_interval_ms),
            (15_000, 5_000, 2_000)
        );
        e.validate().unwrap();
        let n = NodeConfig::default();
        assert_eq!(
            (
                n.lease_duration_ms,
                n.heartbeat_interval_ms,
                n.sweep_interval_ms
            ),
            (30_000, 10_000, 30_000)
        );
        n.validate().unwrap();
    }

    #[test]
    fn heartbeat_default_rounds_down_with_a_minimum_of_one() {
        assert_eq!(NodeConfig::with_lease(1000).heartbeat_interval_ms, 333);
        assert_eq!(NodeConfig::with_lease(2).heartbeat_interval_ms, 1);
        assert_eq!(NodeConfig::with_lease(1).heartbeat_interval_ms, 1);
    }

    #[test]
    fn zero_and_too_large_values_name_the_option_and_range() {
        for (cfg, option, value) in [
            (
                ElectionConfig {
                    ttl_ms: 0,
                    ..Default::default()
                },
                "ttl_ms",
                0,
            ),
            (
                ElectionConfig {
                    ttl_ms: MAX_MS + 1,
                    ..Default::default()
                },
                "ttl_ms",
                MAX_MS + 1,
            ),
            (
                ElectionConfig {
                    renew_interval_ms: 0,
                    ..Default::default()
                },
                "renew_interval_ms",
                0,
            ),
            (
                ElectionConfig {
                    retry_interval_ms: MAX_MS + 1,
                    ..Default::default()
                },
                "retry_interval_ms",
                MAX_MS + 1,
            ),
        ] {
            let err = cfg.validate().unwrap_err();
            assert_eq!(err, ConfigError::OutOfRange { option, value });
            let msg = err.to_string();
            assert!(
                msg.contains(option) && msg.contains(&value.to_string()),
                "{msg}"
            );
            assert!(msg.contains("from 1 to 2147483647"), "{msg}");
        }
        let max = ElectionConfig {
            ttl_ms: MAX_MS,
            renew_interval_ms: MAX_MS - 1,
            retry_interval_ms: MAX_MS,
        };
        max.validate().unwrap();
    }

    #[test]
    fn renew_must_be_below_ttl() {
        let err = ElectionConfig {
            ttl_ms: 1000,
            renew_interval_ms: 1000,
            retry_interval_ms: 10,
        }
        .validate()
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("renew_interval_ms = 1000") && msg.contains("ttl_ms = 1000"),
            "{msg}"
        );
    }

    #[test]
    fn node_options_are_checked_by_name() {
        for (cfg, option) in [
            (
                NodeConfig {
                    lease_duration_ms: 0,
                    ..NodeConfig::default()
                },
                "lease_duration_ms",
            ),
            (
                NodeConfig {
                    heartbeat_interval_ms: 0,
                    ..NodeConfig::default()
                },
                "heartbeat_interval_ms",
            ),
            (
                NodeConfig {
                    sweep_interval_ms: MAX_MS + 1,
                    ..NodeConfig::default()
                },
                "sweep_interval_ms",
            ),
        ] {
            let msg = cfg.validate().unwrap_err().to_string();
            assert!(msg.starts_with(option), "{msg}");
        }
    }

    #[test]
    fn inbox_limits_name_the_option_and_range() {
        let d = InboxConfig::default();
        assert_eq!(
            (d.max_length, d.lag_threshold, d.max_message_size),
            (10_000, 5_000, 524_288)
        );
        d.validate().unwrap();
        assert_eq!(InboxConfig::with_max_length(1).lag_threshold, 1);
        let msg = InboxConfig::with_max_length(0)
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "inbox_max_length = 0 is out of range: it must be a whole number from 1 to 10000000"
        );
        let msg = InboxConfig {
            lag_threshold: 11,
            ..InboxConfig::with_max_length(10)
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert_eq!(
            msg,
            "lag_threshold = 11 is out of range: it must be a whole number from 1 to 10"
        );
        let msg = InboxConfig {
            max_message_size: 0,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(msg.starts_with("max_message_size = 0"), "{msg}");
    }

    #[test]
    fn names_allow_the_documented_alphabet_only() {
        validate_name("node id", "default/web-0").unwrap();
        validate_name("node id", "a_b.c-D/9").unwrap();
        validate_name("node id", &"x".repeat(253)).unwrap();
        for (bad, reason) in [
            ("", "empty"),
            ("a b", "character"),
            ("{tag}", "character"),
            ("a#1", "character"),
            ("ü", "character"),
        ] {
            let msg = validate_name("group name", bad).unwrap_err().to_string();
            assert!(
                msg.contains("group name") && msg.contains(reason) && msg.contains("253 bytes"),
                "{msg}"
            );
        }
        let long = "x".repeat(254);
        assert!(validate_name("node id", &long)
            .unwrap_err()
            .to_string()
            .contains("too long"));
    }
}
