//! What leasehold's long-running processes (the controller and the agent)
//! share, and the engine must not know: the store flags, Kubernetes object
//! names, election flags, start-up errors, process signals, logging,
//! metrics and the small HTTP server for probes and APIs.
// Production code only (clippy.toml sets the length); a test reads as one scenario.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod config;
pub mod election_args;
pub mod error;
pub mod http;
pub mod metrics;
pub mod names;
pub mod signal;
pub mod store_args;
pub mod store_settings;

use tracing_subscriber::EnvFilter;

/// Logs to stderr with `tracing`, filtered by `RUST_LOG` or else by
/// `default_filter`.
pub fn init_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours for a person at a terminal, plain text for log collectors.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
