//! Running the agent: one task owns the node and carries out every
//! step-down (asked through the API, by the controller, or after failed
//! health checks), so in exec mode the command always stops before the
//! lease is released.

use tokio::sync::broadcast;

use super::AgentError;
use super::{Agent, Exit};
use crate::exec;
use crate::settings::Settings;
use leasehold_daemon::names::NamespacedName;
use leasehold_engine::{Event, Node};

impl Agent {
    /// Carries out step-downs until `shutdown`, the command's own end, or
    /// the node's displacement.
    pub(crate) async fn run_until(
        &mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Exit {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return Exit::Signal,
                Some(request) = self.requests.recv() => {
                    let full = NamespacedName::new(&self.namespace, &request.group).to_string();
                    let result = step_down(&self.node, self.command.as_ref(), &self.settings, &full, request.to.as_deref()).await;
                    tracing::info!(group = %full, to = ?request.to, ?result, "step-down asked through the API");
                    let _ = request.reply.send(result);
                }
                Some(name) = self.unhealthy.recv() => {
                    let full = NamespacedName::new(&self.namespace, &name).to_string();
                    let result = step_down(&self.node, self.command.as_ref(), &self.settings, &full, None).await;
                    tracing::warn!(group = %full, ?result, "stepped down: the application failed its health checks");
                }
                Some(request) = self.deferred.recv() => {
                    let result = step_down(&self.node, self.command.as_ref(), &self.settings, &request.group, request.to.as_deref()).await;
                    tracing::info!(group = %request.group, from = %request.from, to = ?request.to, ?result, "step-down asked by the controller");
                }
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
}

/// Steps down from `group`, handing it to the node `to` when one is named;
/// in exec mode, the command of that group is stopped first, so it is gone
/// before another pod can win the lease. A handover that would be refused
/// is refused before the command stops; one refused after (the successor
/// died in between) becomes a plain step-down, as a command stopped for a
/// term is not started again in it.
async fn step_down(
    node: &Node,
    command: Option<&exec::Exec>,
    settings: &Settings,
    group: &str,
    to: Option<&str>,
) -> Result<bool, leasehold_engine::Error> {
    if let Some(to) = to {
        node.check_hand_over(group, to).await?;
    }
    let stopped = match command {
        Some(command) if settings.groups[0].1 == group => {
            command.hand_over().await;
            true
        }
        _ => false,
    };
    match to {
        None => node.step_down(group).await,
        Some(to) => match node.hand_over(group, to).await {
            Ok(()) => Ok(true),
            Err(e) if stopped => {
                tracing::warn!(%group, %to, error = %e, "the handover was refused after the command stopped; stepping down");
                node.step_down(group).await
            }
            Err(e) => Err(e),
        },
    }
}
