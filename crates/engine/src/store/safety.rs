//! Settings of the store's server that break the guarantees, found at
//! start and after a new primary, so an operator learns of them then rather
//! than after an incident. Each store reads its own (see docs/redis.md,
//! "What Redis must provide").

/// One setting of the store's server that weakens a guarantee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingWarning {
    /// The setting, one of [`SettingWarning::SETTINGS`].
    pub setting: &'static str,
    /// What can go wrong and what to set, one sentence.
    pub message: String,
}

impl SettingWarning {
    /// Every setting checked, for metric labels: Redis's three, then
    /// PostgreSQL's three (a process reports those of its own store; the
    /// other store's read 0).
    pub const SETTINGS: [&'static str; 6] = [
        "maxmemory-policy",
        "min-replicas-to-write",
        "persistence",
        "fsync",
        "synchronous_commit",
        "synchronous_standby_names",
    ];
}
