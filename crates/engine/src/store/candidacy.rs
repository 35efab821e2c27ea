//! What a claim or a renewal tells the store about the candidate beside
//! its lease: how long its candidacy lasts, the priority it campaigns
//! with, and how long a free seat waits for a better candidate. Both
//! stores keep the priority with the candidacy and apply the same rule to
//! a free seat (docs/behaviour.md P1-P4).

/// A candidacy as a claim or a renewal refreshes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidacy {
    /// How long the membership lasts from the store's clock at the call.
    pub ms: u64,
    /// 0 (never leads) to [`crate::config::MAX_PRIORITY`].
    pub priority: u32,
    /// How long a free seat waits for a better live candidate
    /// ([`crate::ElectionConfig::deference`]), and a handover for its
    /// named successor.
    pub defer_ms: u64,
    /// Why the application is unhealthy, if it is: the priority sent is 0
    /// then, and the store keeps the reason for the controller.
    pub problem: Option<String>,
}
