//! The agent's defaults and limits, in one place.

/// Where the agent's local HTTP API listens unless told otherwise: loopback,
/// so only the pod's own containers can ask it to step down.
pub const DEFAULT_AGENT_LISTEN: &str = "127.0.0.1:4040";

/// Exec mode: how long a command has between SIGTERM and SIGKILL once its
/// pod stops leading. Keep it short: until it is over, the command may still
/// be running while a successor's starts.
pub const DEFAULT_EXEC_GRACE_MS: u64 = 5_000;

/// Longest exec-mode grace period accepted.
pub const MAX_EXEC_GRACE_MS: u64 = 600_000;
