//! A running agent, [`Agent`], from [`run`]: `start` makes its node, joins
//! its groups and starts its tasks; `run_until` carries out step-downs
//! until a signal, the exec command's end or the node's displacement;
//! `stop` ends every task in the order that keeps a single leader (the
//! command before the leases), waiting for each before the role files say
//! `stopped`. [`AgentError`] is why it could not run.

mod start;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::StepDown;
use crate::args::AgentArgs;
use crate::settings::Settings;
use crate::{exec, role_file};
use leasehold_daemon::error::{FlagError, StartError};
use leasehold_daemon::names::NamespacedName;
use leasehold_daemon::store_settings::SettingsWatch;
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
    _store_settings: SettingsWatch,
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
    /// `stopping`'s child for the health checks, cancelled before the command
    /// stops: an application on its way down must not fail a check.
    health_stopping: CancellationToken,
}

impl Agent {
    /// Carries out step-downs until `shutdown`, the command's own end, or
    /// the node's displacement.
    pub(crate) async fn run_until(&mut self, shutdown: impl Future<Output = ()>) -> Exit {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return Exit::Signal,
                Some(request) = self.requests.recv() => {
                    let full = NamespacedName::new(&self.namespace, &request.group).to_string();
                    let result = self.step_down(&full, request.to.as_deref()).await;
                    tracing::info!(group = %full, to = ?request.to, ?result, "step-down asked through the API");
                    let _ = request.reply.send(result);
                }
                Some(name) = self.unhealthy.recv() => {
                    let full = NamespacedName::new(&self.namespace, &name).to_string();
                    let result = self.step_down(&full, None).await;
                    tracing::warn!(group = %full, ?result, "stepped down: the application failed its health checks");
                }
                Some(request) = self.deferred.recv() => {
                    let result = self.step_down(&request.group, request.to.as_deref()).await;
                    tracing::info!(group = %request.group, from = %request.from, to = ?request.to, ?result, "step-down asked by the controller");
                }
                // `None` without a command: select! then disables this branch.
                Some(ended) = async { Some(self.command.as_mut()?.ended().await) } => {
                    self.command = None;
                    return match ended {
                        Ok(code) => Exit::Command(code),
                        Err(e) => Exit::Failed(e.into()),
                    };
                }
                event = self.events.recv() => match event {
                    Ok(Event::Displaced { by_incarnation, .. }) => {
                        tracing::error!(%by_incarnation, "another process took over this node id");
                        return Exit::Displaced;
                    }
                    Err(broadcast::error::RecvError::Closed) => return Exit::Failed(AgentError::EventsEnded),
                    _ => {}
                },
            }
        }
    }

    /// Ends every task of the agent: the health checks, then the command
    /// (SIGTERM, SIGKILL after the grace period), then every other task,
    /// waited for; role files `stopped` before the leases go, the node last.
    pub(crate) async fn stop(self, exit: Exit) -> Result<u8, AgentError> {
        self.health_stopping.cancel();
        if let Some(command) = self.command {
            command.stop().await;
        }
        // The servers close their connections; a role-file watcher that is
        // mid-write on another thread is waited for, so none lands after
        // `stopped`.
        self.stopping.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        if let Some(files) = &self.role_files {
            files.write_stopped(&self.groups);
        }
        let unreleased = self.node.shutdown().await;
        if unreleased.is_empty() {
            tracing::info!("leases released");
        } else {
            tracing::warn!(groups = ?unreleased, "leases not released (the store did not answer); they run out within their ttl");
        }
        match only_owner(self.node).await {
            Some(node) => {
                if let Err(e) = node.close().await {
                    tracing::warn!(error = %e, "removing the registration failed (it expires on its own)");
                }
            }
            None => tracing::warn!(
                "an API request still held the node; its registration expires on its own"
            ),
        }
        match exit {
            Exit::Signal => {
                tracing::info!("agent stopped");
                Ok(0)
            }
            Exit::Command(code) => {
                tracing::info!(
                    code,
                    "the command ended by itself; the agent stops with its exit code"
                );
                Ok(code)
            }
            Exit::Displaced => Err(AgentError::Displaced(self.settings.node_id)),
            Exit::Failed(e) => Err(e),
        }
    }

    /// Steps down from `group`, handing it to the node `to` when one is named;
    /// in exec mode, the command of that group is stopped first, so it is gone
    /// before another pod can win the lease. A handover that would be refused
    /// is refused before the command stops; one refused after (the successor
    /// died in between) becomes a plain step-down, as a command stopped for a
    /// term is not started again in it.
    async fn step_down(
        &self,
        group: &str,
        to: Option<&str>,
    ) -> Result<bool, leasehold_engine::Error> {
        if let Some(to) = to {
            self.node.check_hand_over(group, to).await?;
        }
        let stopped = match &self.command {
            Some(command) if self.settings.groups[0].1 == group => {
                command.hand_over().await;
                true
            }
            _ => false,
        };
        match to {
            None => self.node.step_down(group).await,
            Some(to) => match self.node.hand_over(group, to).await {
                Ok(()) => Ok(true),
                Err(e) if stopped => {
                    tracing::warn!(%group, %to, error = %e, "the handover was refused after the command stopped; stepping down");
                    self.node.step_down(group).await
                }
                Err(e) => Err(e),
            },
        }
    }
}

/// The node once the API's last request has let go of it (the servers
/// are stopped; an event stream's task ends when its connection closes),
/// waiting up to a second.
async fn only_owner(mut node: Arc<Node>) -> Option<Node> {
    for _ in 0..100 {
        match Arc::try_unwrap(node) {
            Ok(node) => return Some(node),
            Err(shared) => node = shared,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
