//! The retry delay of the engine's background connections (pub/sub
//! wake-ups, the inbox reader, the event follower): doubling from
//! [`RECONNECT_BACKOFF_MIN`] up to [`RECONNECT_BACKOFF_MAX`], back to the
//! start after a success.

use std::time::Duration;

use crate::config::{RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(RECONNECT_BACKOFF_MIN)
    }
}

impl Backoff {
    /// Sleeps for the current delay, then doubles it (up to the cap).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(RECONNECT_BACKOFF_MAX);
    }

    /// After a success: the next failure waits the shortest delay again.
    pub fn reset(&mut self) {
        self.0 = RECONNECT_BACKOFF_MIN;
    }

    pub fn current(&self) -> Duration {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let mut seen = Vec::new();
        for _ in 0..8 {
            seen.push(b.current());
            b.wait().await;
        }
        assert_eq!(seen[0], RECONNECT_BACKOFF_MIN);
        assert_eq!(seen[1], RECONNECT_BACKOFF_MIN * 2);
        assert_eq!(b.current(), RECONNECT_BACKOFF_MAX);
        b.reset();
        assert_eq!(b.current(), RECONNECT_BACKOFF_MIN);
    }
}
