//! `leasehold agent`: the sidecar. One node per pod, named `NAMESPACE/POD`,
//! campaigns for the pod's LeaderGroups (engine group `NAMESPACE/NAME`) and
//! tells the pod what it is: through a local HTTP API (`api`), a file per
//! group (`role_file`) and, in exec mode (`exec`), by running a command
//! only while it leads. It talks to the store only; the controller reflects
//! what it does into Kubernetes.
//!
//! Its flags (`args`) are checked into [`Settings`] before anything starts;
//! `lifecycle` starts the agent, runs it and stops it in the order that
//! keeps a single leader.
// Production code only (clippy.toml sets the length); a test reads as one scenario.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod api;
mod args;
pub mod config;
mod exec;
mod health;
mod invalid;
mod lifecycle;
mod mailbox;
mod metrics;
mod payload;
mod role_file;
mod settings;

use leasehold_daemon::error::{FlagError, StartError};

pub use api::{DeferView, GroupView, InboxView, Status};
pub use args::AgentArgs;
pub use health::HealthView;
pub use mailbox::Item;
pub use settings::Settings;

/// The exec guard, run by the `leasehold` binary as its hidden
/// `exec-guard` subcommand (see `exec::guard`).
pub mod exec_guard {
    pub use crate::exec::deadline::LEAD as KILL_LEAD;
    pub use crate::exec::guard::{run, SUBCOMMAND};
}

/// Why the agent could not run, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("another live process took over node id {0:?}; this agent stopped campaigning")]
    Displaced(String),
    #[error(transparent)]
    Exec(#[from] exec::ExecError),
    #[error("the node's event stream ended")]
    EventsEnded,
}

impl From<FlagError> for AgentError {
    fn from(e: FlagError) -> Self {
        Self::Start(e.into())
    }
}

/// Runs the agent until SIGTERM/SIGINT (exit code 0), or in exec mode until
/// the command ends by itself while leading (its exit code).
pub async fn run(args: AgentArgs) -> Result<u8, AgentError> {
    // Installed first, so a SIGTERM during start-up is still graceful.
    let shutdown = leasehold_daemon::signal::shutdown();
    let settings = Settings::from_args(&args)?;
    let mut agent = lifecycle::Agent::start(&args, settings).await?;
    let exit = agent.run_until(shutdown).await;
    agent.stop(exit).await
}
