//! The three election timings as flags, for every command that campaigns
//! (`leasehold agent`), and the one check behind every set of timings a
//! command takes under other names (the controller's replicas, the demo,
//! the bench), so each refuses bad values with the same words.

use leasehold_engine::ElectionConfig;

use crate::error::FlagError;

#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ElectionArgs {
    /// Lease time to live, ms, until the controller writes the LeaderGroup's own.
    #[arg(long, env = "LEASEHOLD_TTL_MS", default_value_t = ElectionConfig::default().ttl_ms)]
    pub ttl_ms: u64,
    /// How often the leader renews, ms (less than the ttl).
    #[arg(long, env = "LEASEHOLD_RENEW_INTERVAL_MS", default_value_t = ElectionConfig::default().renew_interval_ms)]
    pub renew_interval_ms: u64,
    /// How often a follower tries to claim at the latest, ms.
    #[arg(long, env = "LEASEHOLD_RETRY_INTERVAL_MS", default_value_t = ElectionConfig::default().retry_interval_ms)]
    pub retry_interval_ms: u64,
}

/// The names under which a command takes the three timings.
pub const FLAGS: &str = "--ttl-ms/--renew-interval-ms/--retry-interval-ms";

impl ElectionArgs {
    pub fn config(&self) -> Result<ElectionConfig, FlagError> {
        election_config(
            FLAGS,
            self.ttl_ms,
            self.renew_interval_ms,
            self.retry_interval_ms,
        )
    }
}

/// Checks timings a command took as the flags `flags` names.
pub fn election_config(
    flags: &'static str,
    ttl_ms: u64,
    renew_interval_ms: u64,
    retry_interval_ms: u64,
) -> Result<ElectionConfig, FlagError> {
    let config = ElectionConfig {
        ttl_ms,
        renew_interval_ms,
        retry_interval_ms,
    };
    config.validate().map_err(|e| FlagError::new(flags, e))?;
    Ok(config)
}
