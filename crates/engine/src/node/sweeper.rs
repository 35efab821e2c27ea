//! The sweeper: removes nodes whose lease expired, with their subscriptions
//! and inbox, at most [`SWEEP_BATCH`] per pass.
//!
//! Instead of waking every sweep interval, it sleeps until the earliest lease
//! expiry in the registry (as the sweep script reports it, on the store's
//! clock), never longer than the sweep interval. A full batch means more may
//! be waiting, so the next pass follows at once.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{NodeConfig, SWEEP_BATCH};
use crate::events::{Event, Operation};
use crate::store::bounded;

use crate::incarnation::Incarnation;

/// Delay before the next pass, from what the last one saw.
pub(crate) fn next_delay(
    swept: usize,
    now_ms: u64,
    next_expiry_ms: Option<u64>,
    interval: Duration,
) -> Duration {
    if swept >= SWEEP_BATCH {
        return Duration::ZERO;
    }
    match next_expiry_ms {
        // +1 ms: a lease whose expiry equals the store's clock is expired.
        Some(at) => Duration::from_millis(at.saturating_sub(now_ms) + 1).min(interval),
        None => interval,
    }
}

pub(crate) async fn run(shared: Arc<Incarnation>, config: NodeConfig) {
    let interval = config.sweep_interval();
    loop {
        let pass = bounded(
            interval.max(Duration::from_millis(100)),
            shared.store.sweep(SWEEP_BATCH),
        )
        .await;
        let delay = match pass {
            Ok(sweep) => {
                if !sweep.swept.is_empty() {
                    tracing::info!(nodes = ?sweep.swept, "swept expired nodes");
                    shared.events.emit(Event::Swept {
                        node: shared.id.clone(),
                        nodes: sweep.swept.clone(),
                    });
                }
                next_delay(
                    sweep.swept.len(),
                    sweep.now_ms,
                    sweep.next_expiry_ms,
                    interval,
                )
            }
            Err(e) => {
                shared.events.emit(Event::StoreError {
                    node: shared.id.clone(),
                    during: Operation::Sweep,
                    message: e.to_string(),
                });
                interval.min(Duration::from_secs(1))
            }
        };
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_until_the_earliest_expiry_bounded_by_the_interval() {
        let iv = Duration::from_millis(1000);
        assert_eq!(
            next_delay(0, 5000, Some(5300), iv),
            Duration::from_millis(301)
        );
        assert_eq!(next_delay(0, 5000, Some(9000), iv), iv);
        assert_eq!(next_delay(0, 5000, None, iv), iv);
        assert_eq!(
            next_delay(0, 5000, Some(4990), iv),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn a_full_batch_sweeps_again_at_once() {
        let iv = Duration::from_millis(1000);
        assert_eq!(next_delay(SWEEP_BATCH, 0, Some(10_000), iv), Duration::ZERO);
    }
}
