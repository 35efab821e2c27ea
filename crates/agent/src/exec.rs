//! Exec mode: run a command only while this pod leads its group.
//!
//! The command starts when the local lease view says this node leads, with
//! `LEASEHOLD_GROUP`, `LEASEHOLD_TERM` and `LEASEHOLD_NODE_ID` in its
//! environment. Its whole process group gets SIGTERM, and SIGKILL after the
//! grace period, when the lease is lost, and also *before* it could run out:
//! once less than the grace period is left (renewals failing), so the
//! command is gone before Redis can give the lease to another node. A
//! step-down and a graceful stop of the agent stop the command first and
//! release the lease after. The command starts again, under a new term, if
//! this pod wins again. If the command ends by itself
//! while leading, the agent ends too, with the command's exit code, so the
//! pod's restart policy decides what happens next.
//!
//! The command is tied to the agent's life: it gets SIGKILL if the agent
//! dies (Linux `PR_SET_PDEATHSIG`), so a crashed agent cannot leave a
//! leaderless copy running while a successor starts its own. The agent, a
//! Kubernetes sidecar, builds on Unix; the death signal is Linux's.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use leasehold_engine::Group;

/// Between role changes, the local lease is re-checked this often, so the
/// command stops within this much of the lease lapsing locally.
const RECHECK: Duration = Duration::from_millis(20);

/// Refuses a command that cannot be found, at start rather than at the
/// first election.
pub fn check_program(program: &str) -> Result<(), String> {
    let found = if program.contains('/') {
        std::path::Path::new(program).is_file()
    } else {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| dir.join(program).is_file())
        })
    };
    if found {
        Ok(())
    } else {
        Err(format!(
            "exec mode: command {program:?} was not found (not a file, nor in PATH)"
        ))
    }
}

/// The exit code the agent passes on: the command's, or 128 + the signal
/// that ended it, as a shell reports it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(signal)) => (128 + signal).clamp(0, 255) as u8,
        (None, None) => 1,
    }
}

/// Why exec mode failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("exec mode: cannot start {program:?}: {source}")]
    Start {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("exec mode: waiting for the command: {0}")]
    Wait(#[source] std::io::Error),
    #[error("exec supervisor failed: {0}")]
    Supervisor(#[source] tokio::task::JoinError),
}

/// What the agent asks of the supervisor.
enum Control {
    /// Stop the command before a step-down releases the lease, and do not
    /// start it again under the same term; answered once it is gone.
    HandOver(oneshot::Sender<()>),
    /// Stop the command for good; the agent is shutting down.
    Stop,
}

/// The supervising task.
pub(crate) struct Exec {
    control: mpsc::UnboundedSender<Control>,
    task: JoinHandle<Result<u8, ExecError>>,
}

impl Exec {
    pub fn spawn(
        command: Vec<String>,
        name: String,
        group: Group,
        node_id: String,
        grace: Duration,
    ) -> Self {
        let (control, requests) = mpsc::unbounded_channel();
        let task = tokio::spawn(supervise(command, name, group, node_id, grace, requests));
        Self { control, task }
    }

    /// Resolves when the command ended by itself while leading (its exit
    /// code), or could not be started.
    pub async fn ended(&mut self) -> Result<u8, ExecError> {
        (&mut self.task).await.map_err(ExecError::Supervisor)?
    }

    /// Stops the command if it runs, before a step-down; returns once it is
    /// gone (SIGTERM, SIGKILL after the grace period).
    pub async fn hand_over(&self) {
        let (done, gone) = oneshot::channel();
        if self.control.send(Control::HandOver(done)).is_ok() {
            let _ = gone.await;
        }
    }

    /// Stops the command if it runs and waits until it is gone.
    pub async fn stop(mut self) {
        let _ = self.control.send(Control::Stop);
        let _ = (&mut self.task).await;
    }
}

fn spawn_command(
    command: &[String],
    name: &str,
    term: u64,
    node_id: &str,
) -> std::io::Result<Child> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("LEASEHOLD_GROUP", name)
        .env("LEASEHOLD_TERM", term.to_string())
        .env("LEASEHOLD_NODE_ID", node_id)
        .stdin(Stdio::null())
        // Its own process group, so a stop reaches what a shell script started.
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    // The death signal is tied to the thread that forks; tokio's worker
    // threads live as long as the runtime, which is the agent's life.
    // Linux only: elsewhere a crashed agent leaves its command running.
    #[cfg(target_os = "linux")]
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

fn signal_group(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: plain syscall; a group that is already gone gives ESRCH.
        unsafe {
            libc::kill(-(pid as libc::pid_t), signal);
        }
    }
}

/// SIGTERM to the group, SIGKILL after `grace` if the command is still
/// there, and SIGKILL to whatever of its group is left after it exited.
async fn terminate(child: &mut Child, pgid: Option<u32>, grace: Duration) {
    signal_group(child, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        tracing::warn!(?grace, "the command did not stop after SIGTERM; SIGKILL");
        signal_group(child, libc::SIGKILL);
        let _ = child.wait().await;
    }
    kill_stragglers(pgid);
}

fn kill_stragglers(pgid: Option<u32>) {
    if let Some(pgid) = pgid {
        // SAFETY: plain syscall; ESRCH when nothing is left.
        unsafe {
            libc::kill(-(pgid as libc::pid_t), libc::SIGKILL);
        }
    }
}

/// The term under which the command may run now: this node leads, and its
/// local lease holds for longer than the command could take to stop. So a
/// command is stopped, SIGKILL included, before the lease can expire in
/// Redis and pass to another node, and a healthy renewal never dips below
/// that (see the check on `--grace-period-ms`).
fn may_run(group: &Group, grace: Duration) -> Option<u64> {
    group
        .leader_lease()
        .filter(|(_, left)| *left > grace + RECHECK)
        .map(|(term, _)| term)
}

async fn supervise(
    command: Vec<String>,
    name: String,
    group: Group,
    node_id: String,
    grace: Duration,
    mut control: mpsc::UnboundedReceiver<Control>,
) -> Result<u8, ExecError> {
    let mut role = group.role();
    // A term handed over by a step-down is not run again.
    let mut handed_over: Option<u64> = None;
    loop {
        let term = loop {
            match may_run(&group, grace) {
                Some(term) if Some(term) != handed_over => break term,
                _ => {}
            }
            tokio::select! {
                request = control.recv() => match request {
                    Some(Control::HandOver(done)) => {
                        handed_over = group.leader_term().or(handed_over);
                        let _ = done.send(());
                    }
                    Some(Control::Stop) | None => return Ok(0),
                },
                changed = role.changed() => if changed.is_err() { return Ok(0) },
                _ = tokio::time::sleep(RECHECK) => {}
            }
        };
        let mut child =
            spawn_command(&command, &name, term, &node_id).map_err(|source| ExecError::Start {
                program: command[0].clone(),
                source,
            })?;
        let pgid = child.id();
        tracing::info!(group = %name, term, pid = ?pgid, "leading: command started");
        loop {
            tokio::select! {
                status = child.wait() => {
                    kill_stragglers(pgid);
                    let status = status.map_err(ExecError::Wait)?;
                    return Ok(exit_code(status));
                }
                request = control.recv() => match request {
                    Some(Control::HandOver(done)) => {
                        terminate(&mut child, pgid, grace).await;
                        tracing::info!(group = %name, term, "stepping down: command stopped");
                        handed_over = Some(term);
                        let _ = done.send(());
                        break;
                    }
                    Some(Control::Stop) | None => {
                        terminate(&mut child, pgid, grace).await;
                        tracing::info!(group = %name, "agent stopping: command stopped");
                        return Ok(0);
                    }
                },
                changed = role.changed() => if changed.is_err() {
                    terminate(&mut child, pgid, grace).await;
                    return Ok(0);
                },
                _ = tokio::time::sleep(RECHECK) => {}
            }
            if may_run(&group, grace) != Some(term) {
                tracing::warn!(group = %name, term, "leadership lost or about to run out: stopping the command");
                terminate(&mut child, pgid, grace).await;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_pass_through_like_a_shell_reports_them() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }

    #[test]
    fn a_missing_program_is_refused_up_front() {
        assert!(check_program("sh").is_ok());
        let e = check_program("no-such-program-here").unwrap_err();
        assert!(e.contains("no-such-program-here"), "{e}");
        assert!(check_program("/no/such/file").is_err());
    }
}
