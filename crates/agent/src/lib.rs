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

pub use api::{DeferView, GroupView, InboxView, Status};
pub use args::AgentArgs;
pub use health::HealthView;
pub use lifecycle::{run, AgentError};
pub use mailbox::Item;
pub use settings::Settings;

/// The exec guard, run by the `leasehold` binary as its hidden
/// `exec-guard` subcommand (see `exec::guard`).
pub mod exec_guard {
    pub use crate::exec::deadline::LEAD as KILL_LEAD;
    pub use crate::exec::guard::{run, SUBCOMMAND};
}
