//! Logging and metrics: `tracing` to stderr, filtered by `RUST_LOG`, and the
//! process's Prometheus counters ([`metrics`]).

pub mod http;
pub mod metrics;

use tracing_subscriber::EnvFilter;

pub fn init(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours for a person at a terminal, plain text for log collectors.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
