//! What a term is made of. A term must never be handed out twice, whatever
//! happens to the store under it: a replica promoted while it lagged, a
//! store restarted empty or on an older snapshot, a FLUSHALL, a restored
//! backup. After such a change nobody may remember the last term granted
//! (its holder can die with the data), so the store's counter alone cannot
//! keep the promise, and neither can what the claimants saw.
//!
//! So a term carries the history it was granted in, the way Kafka's leader
//! epochs do: `term = epoch × TERM_EPOCH_SPAN + n`. The epoch is taken from
//! the store's clock when its history begins (its first use, a new
//! server process, a new replication id, a data set without the epoch key),
//! counted in [`TERM_EPOCH_MS`] steps since [`TERM_EPOCH_ANCHOR_MS`]; `n`
//! counts acquisitions within it, from 1, and wraps into the next epoch.
//! A term is still one integer that only grows: it fits an `i64` and a
//! JavaScript number, and its last three decimal digits are the count.
//!
//! The rule that makes a new history's epoch greater than every epoch
//! granted before it, with no memory at all: a term of epoch `e` is granted
//! only once the store's clock reads at least `e`'s start plus
//! [`TERM_EPOCH_HOLD_MS`]. A later history begins after that grant, on a
//! clock that (by assumption) has not stepped back by more than
//! [`CLOCK_STEP_BACK_MS`], so its clock epoch is at least `e + 1`. Memory
//! still counts where it survives: a new epoch is also above the stored
//! one, and a claim lifts the counter to the highest term the claimant saw.
//! The store's terms script takes these numbers from [`lua_constants`], so
//! they are written once.

/// Acquisitions one epoch counts (`n` runs from 1 to `SPAN - 1`). A power
/// of ten, so a term reads as its epoch followed by a three-digit count.
pub const TERM_EPOCH_SPAN: u64 = 1000;

/// The clock step of epochs. Smaller steps shorten the hold; terms grow by
/// `SPAN` per step of history.
pub const TERM_EPOCH_MS: u64 = 100;

/// Epoch 0 starts at 2026-01-01T00:00:00Z (Unix ms), so terms stay short.
/// Every history takes its epoch from the clock; only a clock before the
/// anchor gives epoch 0 (and the tests preset it, so their terms count 1,
/// 2, 3). Epoch 0 is never held back.
pub const TERM_EPOCH_ANCHOR_MS: u64 = 1_767_225_600_000;

/// How far the clock of the store's server that takes over (a restarted
/// process, a promoted replica on another host) may read behind the clock
/// of the one it replaces, at the moment it takes over. NTP keeps hosts
/// within milliseconds; a step back of more than this across a restart or
/// a failover, together with the loss of the last term, could repeat a
/// term.
pub const CLOCK_STEP_BACK_MS: u64 = 1000;

/// How long after its start an epoch's first term may be granted: one
/// epoch step plus the clock allowance. A new history therefore elects at
/// the earliest this long after it began (or one ttl, whichever is later).
pub const TERM_EPOCH_HOLD_MS: u64 = TERM_EPOCH_MS + CLOCK_STEP_BACK_MS;

/// The epoch of a term.
pub fn epoch(term: u64) -> u64 {
    term / TERM_EPOCH_SPAN
}

/// The count of a term within its epoch (1 for the first acquisition).
pub fn count(term: u64) -> u64 {
    term % TERM_EPOCH_SPAN
}

/// When (Unix ms on the store's clock) an epoch started.
pub fn epoch_start_ms(epoch: u64) -> u64 {
    TERM_EPOCH_ANCHOR_MS + epoch * TERM_EPOCH_MS
}

/// The Lua lines that give `terms.lua` these constants.
pub(crate) fn lua_constants() -> String {
    format!(
        "local TERM_SPAN, EPOCH_MS, EPOCH_ANCHOR, EPOCH_HOLD = {TERM_EPOCH_SPAN}, {TERM_EPOCH_MS}, {TERM_EPOCH_ANCHOR_MS}, {TERM_EPOCH_HOLD_MS}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_term_reads_as_its_epoch_and_count() {
        let term = 288_612_345_004;
        assert_eq!(epoch(term), 288_612_345);
        assert_eq!(count(term), 4);
        // Epoch 0 holds the terms of stores from before epochs: 1, 2, 3...
        assert_eq!((epoch(3), count(3)), (0, 3));
    }

    #[test]
    fn terms_stay_exact_in_json_numbers_for_centuries() {
        // A hundred years of 100 ms epochs past the anchor.
        let epochs = 100 * 365 * 24 * 3_600_000 / TERM_EPOCH_MS;
        let last = epochs * TERM_EPOCH_SPAN + TERM_EPOCH_SPAN - 1;
        assert!(last < 1 << 53, "{last}");
        // Lua prints numbers with 14 significant digits: still exact.
        assert!(last < 100_000_000_000_000, "{last}");
    }

    #[test]
    fn the_hold_covers_one_epoch_step_and_the_clock_allowance() {
        assert_eq!(TERM_EPOCH_HOLD_MS, TERM_EPOCH_MS + CLOCK_STEP_BACK_MS);
        assert_eq!(epoch_start_ms(0), TERM_EPOCH_ANCHOR_MS);
        assert!(lua_constants().contains("1000, 100, 1767225600000, 1100"));
    }
}
