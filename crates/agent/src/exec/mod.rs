//! Exec mode: run a command only while this pod leads its group.
//!
//! The command starts when the local lease view says this node leads, with
//! `LEASEHOLD_GROUP`, `LEASEHOLD_TERM` and `LEASEHOLD_NODE_ID` in its
//! environment. It gets SIGTERM, and SIGKILL with its whole process tree
//! after the grace period, when the lease is lost, and also *before* it
//! could run out: once less than the grace period is left (renewals
//! failing), so the command is gone before the store can give the lease to
//! another node. A step-down and a graceful stop of the agent stop the
//! command first and release the lease after. The command starts again,
//! under a new term, if this pod wins again. If the command ends by itself
//! while leading, the agent ends too, with the command's exit code, so the
//! pod's restart policy decides what happens next.
//!
//! The grace period must fit the timings: the command is stopped once less
//! than the grace period is left on the lease, so a grace period longer
//! than what a healthy renewal cycle leaves would stop it at every cycle,
//! or never let it start. The flags are checked at start; timings adopted
//! later from the LeaderGroup may leave less room, and then the grace
//! period is shortened to fit ([`grace_under`]), with a warning, rather
//! than the command stopping under a term that holds.
//!
//! The command runs under a guard process ([`guard`]) tied to the agent's
//! life, so a crashed agent cannot leave any part of the command's tree
//! running while a successor starts its own. The guard also holds the
//! lease's deadline ([`deadline`]): the agent sends it the end of its local
//! view at the start and after every confirmed renewal, and the guard stops
//! the command by that instant on its own when no renewal extends it, so an
//! agent that is stopped or starved while its command runs on cannot leave
//! the command running past the lease. An agent that comes back to find its
//! command ended that way starts it again only under a lease whose claim or
//! renewal it sent after it came back. When the agent is PID 1 of its
//! namespace, it also reaps orphans ([`reaper`]). The agent, a Kubernetes
//! sidecar, builds on Unix; the death signal and the subreaper are Linux's.
// unsafe_code is denied workspace-wide; `pre_exec` (code between fork and exec) needs it.
#![allow(unsafe_code)]

pub(crate) mod deadline;
pub mod guard;
mod procfs;
pub mod reaper;

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use leasehold_daemon::error::FlagError;
use leasehold_engine::config::ElectionConfig;
use leasehold_engine::{Group, Leadership};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use deadline::{Deadline, EXPIRED};

/// Between role changes, the local lease is re-checked this often, so the
/// command stops within this much of the lease lapsing locally.
const RECHECK: Duration = Duration::from_millis(20);

/// After the guard was told to end the command's tree at once, how long
/// the agent waits for it before killing the guard itself (the command then
/// dies by its own parent-death signal).
const GUARD_EXIT: Duration = Duration::from_secs(1);

/// The longest grace period the timings allow: the lease must hold for
/// longer than the grace period (plus the re-check) all through a healthy
/// renewal cycle, even one late by a retry interval. Zero when the timings
/// leave no room at all: the command is then SIGKILLed when it must stop.
pub fn grace_room(timings: &ElectionConfig) -> Duration {
    let room = timings
        .ttl_ms
        .saturating_sub(timings.renew_interval_ms + timings.retry_interval_ms);
    Duration::from_millis(room).saturating_sub(2 * RECHECK)
}

/// The grace period to use under `timings`: the configured one, shortened
/// to [`grace_room`] if that is less.
pub fn grace_under(configured: Duration, timings: &ElectionConfig) -> Duration {
    configured.min(grace_room(timings))
}

/// Refuses a command that cannot be found, at start rather than at the
/// first election.
pub fn check_program(program: &str) -> Result<(), FlagError> {
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
        Err(FlagError::worded(
            "COMMAND",
            format!("exec mode: command {program:?} was not found (not a file, nor in PATH)"),
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
    pub fn spawn(run: Run) -> Self {
        let (control, requests) = mpsc::unbounded_channel();
        let task = tokio::spawn(supervise(run, requests));
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

/// What the supervisor runs, and for which group.
pub(crate) struct Run {
    pub command: Vec<String>,
    /// The LeaderGroup's name.
    pub name: String,
    pub group: Group,
    pub node_id: String,
    /// `--grace-period-ms`, before [`grace_under`] the current timings.
    pub grace: Duration,
    pub own: reaper::OwnChildren,
}

impl Run {
    /// Starts the command under its guard: this same binary, run as
    /// `exec-guard`, in a process group of its own (a terminal's Ctrl-C
    /// reaches the agent, which stops the command in order). The guard's
    /// standard input is a socket that already holds the deadline of
    /// `lease`, so the guard never runs the command without one.
    fn spawn(&self, lease: Leadership) -> std::io::Result<Running> {
        let (link, guard_end) = std::os::unix::net::UnixStream::pair()?;
        let first = Deadline::at(lease.until.into_std(), self.grace());
        std::io::Write::write_all(&mut &link, first.line().as_bytes())?;
        link.set_nonblocking(true)?;
        let mut cmd = Command::new(guard_program());
        cmd.arg(guard::SUBCOMMAND)
            .arg("--")
            .args(&self.command)
            .env("LEASEHOLD_GROUP", &self.name)
            .env("LEASEHOLD_TERM", lease.term.to_string())
            .env("LEASEHOLD_NODE_ID", &self.node_id)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(guard_end)))
            .process_group(0);
        // SAFETY: prctl, getppid and kill are async-signal-safe and touch no
        // memory of the parent. The death signal is tied to the thread that
        // forks; tokio's worker threads live as long as the runtime, which
        // is the agent's life. If the agent died before the death signal
        // was set, the guard would never hear of it: it stops itself.
        let agent = nix::unistd::getpid();
        #[cfg(target_os = "linux")]
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(guard::END_NOW)?;
                if nix::unistd::getppid() != agent {
                    let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGKILL);
                }
                Ok(())
            });
        }
        let mut own = self.own.lock();
        let child = cmd.spawn()?;
        let pid = child.id();
        own.extend(pid);
        Ok(Running {
            child,
            pid,
            own: self.own.clone(),
            link,
            sent: lease,
            pending: Vec::new(),
        })
    }

    /// The grace period under the timings in force now.
    fn grace(&self) -> Duration {
        grace_under(self.grace, &self.group.timings())
    }

    fn sent_since(&self, lease: &Leadership, since: Option<Instant>) -> bool {
        sent_since(lease, self.group.timings().ttl(), since)
    }
}

/// Whether `lease` was confirmed by a claim or renewal sent at or after
/// `since` (always, without one): its end is that send plus the ttl.
fn sent_since(lease: &Leadership, ttl: Duration, since: Option<Instant>) -> bool {
    since.is_none_or(|since| lease.until >= since + ttl)
}

/// The agent's own executable, for the guard. `/proc/self/exe` names the
/// running binary even if its file was replaced since it started.
fn guard_program() -> std::path::PathBuf {
    if cfg!(target_os = "linux") {
        "/proc/self/exe".into()
    } else {
        std::env::current_exe().unwrap_or_else(|_| "leasehold".into())
    }
}

fn signal(child: &Child, signal: Signal) {
    if let Some(pid) = child.id() {
        // A process that is already gone gives ESRCH.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
    }
}

/// SIGTERM to the command (through its guard); after `grace`, the guard
/// SIGKILLs the command's whole tree; if the guard does not answer either,
/// it is SIGKILLed itself and the command dies with it.
async fn terminate(child: &mut Child, grace: Duration) {
    signal(child, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_ok() {
        return;
    }
    tracing::warn!(?grace, "the command did not stop after SIGTERM; SIGKILL");
    signal(child, guard::END_NOW);
    if tokio::time::timeout(GUARD_EXIT, child.wait())
        .await
        .is_err()
    {
        tracing::warn!("the exec guard did not answer; SIGKILL to it");
        signal(child, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

/// The term under which the command may run now: this node leads, and its
/// local lease holds for longer than the command could take to stop. So a
/// command is stopped, SIGKILL included, before the lease can expire in
/// the store and pass to another node, and a healthy renewal never dips below
/// that (see [`grace_room`]).
fn may_run(group: &Group, grace: Duration) -> Option<Leadership> {
    group
        .leadership()
        .filter(|lease| lease.remaining() > grace + RECHECK)
}

/// Says once per change of timings that the grace period was shortened.
#[derive(Default)]
struct GraceNotice(Option<ElectionConfig>);

impl GraceNotice {
    fn check(&mut self, run: &Run) {
        let timings = run.group.timings();
        if self.0 == Some(timings) {
            return;
        }
        self.0 = Some(timings);
        let grace = grace_under(run.grace, &timings);
        if grace < run.grace {
            tracing::warn!(
                group = %run.name,
                ttl_ms = timings.ttl_ms,
                renew_interval_ms = timings.renew_interval_ms,
                retry_interval_ms = timings.retry_interval_ms,
                configured_ms = run.grace.as_millis() as u64,
                grace_ms = grace.as_millis() as u64,
                "the group's timings leave less room than --grace-period-ms: the command gets a shorter grace period (ttl - renew interval - retry interval - 40 ms)"
            );
        }
    }
}

/// The guard of a running command, listed among the agent's own children
/// until it is dropped. Dropped while the guard still runs (the supervisor
/// aborted), it tells the guard to end the command's whole tree, as the
/// agent's death would; a SIGKILL would leave escaped descendants behind.
struct Running {
    child: Child,
    pid: Option<u32>,
    own: reaper::OwnChildren,
    /// The agent's end of the guard's socket: deadlines out, the guard's
    /// report in.
    link: std::os::unix::net::UnixStream,
    /// The lease whose deadline the guard holds, or will once `pending`
    /// is through.
    sent: Leadership,
    /// What the socket has not taken yet of the deadlines written.
    pending: Vec<u8>,
}

impl Running {
    /// Hands the guard the deadline of a renewed lease. A write the socket
    /// cannot take now is dropped: the guard then acts on the deadline it
    /// has, which is earlier, never later.
    fn extend(&mut self, lease: Leadership, grace: Duration) {
        if lease != self.sent {
            let line = Deadline::at(lease.until.into_std(), grace).line();
            self.pending.extend_from_slice(line.as_bytes());
            self.sent = lease;
        }
        // A line goes out whole or in parts over several calls, never
        // with a gap, so the guard never reads half of one glued to the
        // next.
        while !self.pending.is_empty() {
            match std::io::Write::write(&mut &self.link, &self.pending) {
                Ok(0) | Err(_) => {
                    tracing::debug!("the exec guard's socket takes no more now");
                    break;
                }
                Ok(n) => {
                    self.pending.drain(..n);
                }
            }
        }
    }

    /// Whether the guard said it ended the command at the deadline.
    fn expired(&self) -> bool {
        let mut buf = [0u8; 64];
        matches!(std::io::Read::read(&mut &self.link, &mut buf), Ok(n) if buf[..n].starts_with(EXPIRED))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            signal(&self.child, guard::END_NOW);
        }
        if let Some(pid) = self.pid {
            self.own.lock().remove(&pid);
        }
    }
}

/// What the supervisor waits with while no command runs.
struct Waiting<'a> {
    run: &'a Run,
    control: &'a mut mpsc::UnboundedReceiver<Control>,
    role: &'a mut tokio::sync::watch::Receiver<leasehold_engine::Role>,
    notice: &'a mut GraceNotice,
}

impl Waiting<'_> {
    /// The lease to run the command under, once there is one: this node
    /// leads with room for the grace period, under a term not handed over,
    /// and (after the guard ended the command at a deadline) under a lease
    /// sent since `came_back`. `None` once the agent stops.
    async fn lease_to_run(
        self,
        handed_over: &mut Option<u64>,
        came_back: Option<Instant>,
    ) -> Option<Leadership> {
        let run = self.run;
        loop {
            self.notice.check(run);
            // The guard refuses to start a command inside the grace period
            // of its deadline: a start needs a re-check's worth more room
            // than running on does, for the fork and exec on the way.
            match may_run(&run.group, run.grace() + RECHECK) {
                Some(lease)
                    if Some(lease.term) != *handed_over && run.sent_since(&lease, came_back) =>
                {
                    return Some(lease)
                }
                _ => {}
            }
            tokio::select! {
                request = self.control.recv() => match request {
                    Some(Control::HandOver(done)) => {
                        *handed_over = run.group.leader_term().or(*handed_over);
                        let _ = done.send(());
                    }
                    Some(Control::Stop) | None => return None,
                },
                changed = self.role.changed() => if changed.is_err() { return None },
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

async fn supervise(
    run: Run,
    mut control: mpsc::UnboundedReceiver<Control>,
) -> Result<u8, ExecError> {
    let mut role = run.group.role();
    let mut notice = GraceNotice::default();
    // A term handed over by a step-down is not run again.
    let mut handed_over: Option<u64> = None;
    // When the agent found that the guard had ended the command at the
    // deadline: the command runs again only under a lease sent since.
    let mut came_back: Option<Instant> = None;
    loop {
        let waiting = Waiting {
            run: &run,
            control: &mut control,
            role: &mut role,
            notice: &mut notice,
        };
        let Some(lease) = waiting.lease_to_run(&mut handed_over, came_back).await else {
            return Ok(0);
        };
        let term = lease.term;
        let mut running = run.spawn(lease).map_err(|source| ExecError::Start {
            program: run.command[0].clone(),
            source,
        })?;
        tracing::info!(group = %run.name, term, guard = ?running.pid, "leading: command started");
        // Each renewal reaches the guard as soon as it is confirmed, not at
        // the next re-check.
        let mut renewals = run.group.leadership_changes();
        renewals.mark_unchanged();
        loop {
            tokio::select! {
                status = running.child.wait() => {
                    let status = status.map_err(ExecError::Wait)?;
                    if running.expired() {
                        tracing::warn!(group = %run.name, term, "the guard ended the command at the lease's deadline: no renewal reached it in time (was the agent stopped or starved?); it runs again only under a lease confirmed from now on");
                        came_back = Some(Instant::now());
                        break;
                    }
                    return Ok(exit_code(status));
                }
                request = control.recv() => match request {
                    Some(Control::HandOver(done)) => {
                        terminate(&mut running.child, run.grace()).await;
                        tracing::info!(group = %run.name, term, "stepping down: command stopped");
                        handed_over = Some(term);
                        let _ = done.send(());
                        break;
                    }
                    Some(Control::Stop) | None => {
                        terminate(&mut running.child, run.grace()).await;
                        tracing::info!(group = %run.name, "agent stopping: command stopped");
                        return Ok(0);
                    }
                },
                changed = role.changed() => if changed.is_err() {
                    terminate(&mut running.child, run.grace()).await;
                    return Ok(0);
                },
                changed = renewals.changed() => if changed.is_err() {
                    terminate(&mut running.child, run.grace()).await;
                    return Ok(0);
                },
                _ = tokio::time::sleep(RECHECK) => {}
            }
            notice.check(&run);
            match may_run(&run.group, run.grace()) {
                Some(lease) if lease.term == term => running.extend(lease, run.grace()),
                _ => {
                    tracing::warn!(group = %run.name, term, "leadership lost or about to run out: stopping the command");
                    terminate(&mut running.child, run.grace()).await;
                    // An agent that was stopped may find the lease gone
                    // and the guard done before it sees the command's end.
                    if running.expired() {
                        came_back = Some(Instant::now());
                    }
                    break;
                }
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
        assert_eq!(exit_code(ExitStatus::from_raw(Signal::SIGKILL as i32)), 137);
    }

    #[test]
    fn the_grace_period_shrinks_to_what_the_timings_leave() {
        let timings = |ttl_ms, renew_interval_ms, retry_interval_ms| ElectionConfig {
            ttl_ms,
            renew_interval_ms,
            retry_interval_ms,
        };
        let five_s = Duration::from_secs(5);
        // Room to spare: the configured grace period stands.
        assert_eq!(grace_under(five_s, &timings(15_000, 5_000, 2_000)), five_s);
        // ttl 5000 with the default grace: 5000 - 1000 - 500 - 40.
        assert_eq!(
            grace_under(five_s, &timings(5_000, 1_000, 500)),
            Duration::from_millis(3_460)
        );
        // No room at all: SIGKILL at once, but the command still runs.
        assert_eq!(
            grace_under(five_s, &timings(2_000, 1_500, 500)),
            Duration::ZERO
        );
    }

    #[test]
    fn after_the_guard_ended_the_command_only_a_lease_sent_since_runs_it() {
        let ttl = Duration::from_millis(1000);
        let came_back = Instant::now();
        let lease = |sent: Instant| Leadership {
            term: 7,
            until: sent + ttl,
        };
        assert!(sent_since(&lease(came_back - ttl), ttl, None));
        // A renewal confirmed before the agent came back, though its
        // lease still holds: not enough.
        let before = came_back - Duration::from_millis(100);
        assert!(!sent_since(&lease(before), ttl, Some(came_back)));
        assert!(sent_since(&lease(came_back), ttl, Some(came_back)));
        let after = came_back + Duration::from_millis(300);
        assert!(sent_since(&lease(after), ttl, Some(came_back)));
    }

    #[test]
    fn a_missing_program_is_refused_up_front() {
        assert!(check_program("sh").is_ok());
        let e = check_program("no-such-program-here").unwrap_err();
        assert_eq!(e.flag, "COMMAND");
        assert!(e.message.contains("no-such-program-here"), "{}", e.message);
        assert!(check_program("/no/such/file").is_err());
    }
}
