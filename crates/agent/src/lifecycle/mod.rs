//! A running agent, [`Agent`], from [`run`]: `start` makes its node, joins
//! its groups and starts its tasks; `run_until` carries out step-downs
//! until a signal, the exec command's end or the node's displacement;
//! `stop` ends every task in the order that keeps a single leader (the
//! command before the leases). [`AgentError`] is why it could not run.
//!
//! The tasks other than the command are tracked by one `TaskTracker` and
//! told to end by one `CancellationToken`, so `stop` waits for every one of
//! them, whatever it was, before the role files say `stopped`.

mod run_until;
mod start;
mod stop;

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::StepDown;
use crate::args::AgentArgs;
use crate::settings::Settings;
use crate::{exec, role_file};
use leasehold_daemon::error::{FlagError, StartError};
use leasehold_daemon::redis_settings::SettingsWatch;
use leasehold_engine::{Event, Group, Node};

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
    let mut agent = Agent::start(&args, settings).await?;
    let exit = agent.run_until(shutdown).await;
    agent.stop(exit).await
}

/// Why the agent stopped.
pub(crate) enum Exit {
    Signal,
    Command(u8),
    Displaced,
    Failed(AgentError),
}

/// A running agent: its node and groups, its command, and every other task
/// it started, on `tasks`.
pub(crate) struct Agent {
    settings: Settings,
    /// Reports the store's unsafe settings while the agent runs.
    _redis_settings: SettingsWatch,
    namespace: String,
    /// Shared with the API, which publishes and subscribes through it.
    node: Arc<Node>,
    /// `(LeaderGroup name, handle)`.
    groups: Vec<(String, Group)>,
    events: broadcast::Receiver<Event>,
    /// Step-downs asked through the API.
    requests: mpsc::Receiver<StepDown>,
    /// Step-downs the controller asked for, held back so exec mode can stop
    /// the command before the lease is released.
    deferred: mpsc::UnboundedReceiver<leasehold_engine::StepDownRequest>,
    /// Groups (LeaderGroup names) to step down from because the
    /// application failed its health checks.
    unhealthy: mpsc::UnboundedReceiver<String>,
    role_files: Option<role_file::RoleFiles>,
    command: Option<exec::Exec>,
    /// The servers, the mailbox's notices, the role-file watchers, the
    /// orphan reaper and the health checks.
    tasks: TaskTracker,
    /// Cancelled when the agent stops: every task on `tasks` then ends.
    stopping: CancellationToken,
    /// A child of `stopping` for the health checks alone, cancelled before
    /// the command is stopped: a check of an application on its way down
    /// must not mark the groups unhealthy or ask for a step-down.
    health_stopping: CancellationToken,
}
