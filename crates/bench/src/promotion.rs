//! What the scenarios that fail a replicated store over share (Sentinel,
//! Redis Cluster, PostgreSQL): the wait for the deployment to reach a
//! state, the parts of a trial's bound that the engine's rules give once a
//! new primary serves, and the figures of a set of trials.

use std::time::{Duration, Instant};

use anyhow::bail;
use leasehold_engine::{ElectionConfig, TERM_EPOCH_HOLD_MS};

/// Waits until `check` holds, looking every `every` (each look starts
/// `redis-cli` or `psql` processes), or fails with `what` after `limit`.
pub async fn until(
    scenario: &str,
    every: Duration,
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while !check() {
        if start.elapsed() > limit {
            bail!("{scenario}: not within {limit:?}: {what}");
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// How soon a node writes to the new primary after a call to the old one
/// fails: the call in flight ends within its bound, and the next goes
/// after the error backoff, at most a retry interval.
pub fn reconnect(timings: &ElectionConfig) -> Duration {
    timings.call_timeout() + timings.retry_interval()
}

/// The hold of a store born again (the larger of the ttl and the term
/// epoch's hold), and a retry interval for the claim after it.
pub fn born_again_hold(timings: &ElectionConfig) -> Duration {
    Duration::from_millis(timings.ttl_ms.max(TERM_EPOCH_HOLD_MS) + timings.retry_interval_ms)
}

/// A duration in milliseconds, for the tables' `{:.0} ms` figures.
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
