//! Stopping the agent in the order that keeps a single leader: nothing may
//! run as leader once the lease is free, and nothing may write a role file
//! after it says `stopped`.

use std::sync::Arc;
use std::time::Duration;

use super::AgentError;
use super::{Agent, Exit};
use leasehold_engine::Node;

impl Agent {
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
            tracing::warn!(groups = ?unreleased, "leases not released (Redis did not answer); they run out within their ttl");
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
