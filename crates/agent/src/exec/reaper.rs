//! Reaping orphans when the agent is PID 1 of its PID namespace (the
//! container's entrypoint without `shareProcessNamespace`). Every orphan of
//! the namespace is re-parented to PID 1, and one that nobody waits for
//! stays a zombie and holds its PID. The command's own tree is reaped by its
//! guard; this covers the rest, such as what a `kubectl exec` session leaves
//! behind.
//!
//! The agent's own children (the guards) are waited for by tokio, so they
//! are skipped: a guard is listed in [`OwnChildren`] from before it could
//! exit until tokio has reaped it.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use tokio::signal::unix::{signal, SignalKind};

use super::procfs;

/// Zombies are looked for on SIGCHLD, and this often in case signals merged.
const SWEEP: Duration = Duration::from_secs(1);

/// PIDs of children the agent waits for itself.
#[derive(Debug, Clone, Default)]
pub struct OwnChildren(Arc<Mutex<HashSet<u32>>>);

impl OwnChildren {
    /// Held while a child is spawned and its PID added, so the reaper never
    /// sees it exited but unlisted.
    pub fn lock(&self) -> MutexGuard<'_, HashSet<u32>> {
        leasehold_engine::sync::locked(&self.0)
    }
}

/// The loop that reaps orphans if this process is PID 1 (it runs until it
/// is dropped); `None` otherwise.
pub fn if_pid_one(own: OwnChildren) -> Option<impl Future<Output = ()> + Send + 'static> {
    if std::process::id() != 1 {
        return None;
    }
    let mut sigchld = signal(SignalKind::child())
        .inspect_err(|e| {
            tracing::warn!(error = %e, "PID 1: cannot listen for SIGCHLD; orphans are reaped every second");
        })
        .ok();
    tracing::info!("running as PID 1: orphaned processes are reaped");
    Some(async move {
        loop {
            tokio::select! {
                Some(_) = async { sigchld.as_mut()?.recv().await } => {}
                _ = tokio::time::sleep(SWEEP) => {}
            }
            reap_orphans(&own);
        }
    })
}

/// Waits for every zombie child that is not one of the agent's own.
fn reap_orphans(own: &OwnChildren) {
    let own = own.lock();
    for child in procfs::children(1) {
        if child.zombie && !own.contains(&(child.pid as u32)) {
            let _ = waitpid(Pid::from_raw(child.pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}
