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

/// The mailbox's log of what was read from the inbox, for clients that
/// reconnect and for a second reader: at most this many items ...
pub const MAILBOX_LOG_ITEMS: usize = 1024;

/// ... and at most this many bytes of payload (one message larger than
/// this is kept alone). With the engine's local buffer (256 messages) this
/// bounds the agent's memory for messages whatever its clients do.
pub const MAILBOX_LOG_BYTES: usize = 8 * 1024 * 1024;

/// An event stream with nothing to say sends a comment this often, so a
/// client (or a proxy) that went away is noticed and its connection freed.
pub const EVENT_STREAM_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// Most items an event stream writes as one chunk: what the inbox already
/// holds goes out together, while the channel to the connection still
/// holds one chunk at most.
pub const EVENT_STREAM_BATCH: usize = 64;

/// A chunk stops taking items past this size (a single bigger item goes
/// alone), so a client that stops reading holds at most about this much
/// of the agent's memory beyond the log.
pub const EVENT_STREAM_CHUNK_BYTES: usize = 256 * 1024;

/// The long-poll's wait when the client names none, and the longest.
pub const LONG_POLL_DEFAULT_WAIT_MS: u64 = 30_000;
pub const LONG_POLL_MAX_WAIT_MS: u64 = 120_000;

/// A long-poll answer stops taking items past about this many payload
/// bytes (one bigger item goes alone); the client asks again for the rest.
pub const LONG_POLL_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Items one long-poll answer carries when the client names no `max`, and
/// the most it may ask for.
pub const LONG_POLL_DEFAULT_MAX: usize = 100;
pub const LONG_POLL_MAX_ITEMS: usize = 1000;

/// Most messages one `POST /v1/publish/batch` carries (its body is also
/// bounded, by the HTTP server's 1 MiB).
pub const BATCH_MAX_MESSAGES: usize = 1000;
