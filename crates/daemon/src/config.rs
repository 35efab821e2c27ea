//! The limits and defaults of what the processes share, in one place.

use std::time::Duration;

/// Most HTTP connections open at once; more wait in the listen backlog.
/// Probes, a metrics scraper and the pod's own application need a handful.
pub const HTTP_MAX_CONNECTIONS: usize = 64;

/// A client has this long to send its request head, so idle and
/// half-sent connections are closed instead of held.
pub const HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest request body read (the agent's publish carries a message
/// of up to 512 KiB; a bigger one is refused by its size, not cut).
pub const HTTP_MAX_BODY: usize = 1024 * 1024;

/// A client has this long to send its request body once its head arrived.
pub const HTTP_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed accept (e.g. out of file descriptors), so the
/// accept loop does not spin a core.
pub const HTTP_ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The store server's settings are read again this often (and at once when
/// the store finds a new primary), so a change made at runtime, or a
/// restart with other settings, is reported.
pub const STORE_SETTINGS_RECHECK: Duration = Duration::from_secs(30);

/// How often the store is asked whether it found a new primary.
pub const PRIMARY_CHANGE_POLL: Duration = Duration::from_secs(1);
