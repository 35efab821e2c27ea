//! The exec guard: a small process between the agent and the command, so
//! that nothing of the command's process tree outlives the agent, nor the
//! lease the agent last confirmed.
//!
//! The kernel's parent-death signal reaches only a direct child, and a
//! shell's children, or a daemon that called `setsid`, escape a process
//! group. So the agent runs its own binary as `leasehold exec-guard --
//! COMMAND`, and the guard:
//! - is a child subreaper: every orphan of the command's tree is re-parented
//!   to it instead of to PID 1, so it can reap them and find them;
//! - enforces the lease's deadline by itself ([`super::deadline`]): its
//!   standard input is a socket on which the agent sends, before the
//!   command starts and after every confirmed renewal, the instant by which
//!   the command must be gone. When the grace period before that instant
//!   begins with no newer deadline, it sends SIGTERM to the command's group,
//!   and SIGKILLs the whole tree just before the instant, whatever the agent
//!   is doing (stopped, throttled, wedged): a stalled agent cannot leave its
//!   command running past its lease. It then writes `expired` on the socket,
//!   so the agent, once it runs again, knows the command did not end by
//!   itself;
//! - gets SIGUSR1 when the agent dies (parent-death signal) or wants the
//!   command gone at once, and then SIGKILLs the command's process group and
//!   every process re-parented to it, until it has no child left; the end of
//!   the socket (the agent gone) means the same;
//! - passes SIGTERM, SIGINT, SIGHUP and SIGQUIT on to the command's group;
//! - exits when the command does, with its exit code (128 + signal if a
//!   signal ended it), after killing what the command left behind.
//!
//! It is plain blocking code around `poll` on a signalfd and the socket: it
//! runs no runtime and holds no lock, so nothing can stop it from hearing a
//! signal or from acting on the deadline. It assumes it is scheduled while
//! the agent is not: a freeze of the whole pod stops both, and then the
//! store's lease and the term are the only fence (docs/agent.md).
// unsafe_code is denied workspace-wide; `pre_exec` (code between fork and
// exec) needs it, and so does `wait_any` (see there).
#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::process::CommandExt;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

use super::deadline::{monotonic_ns, Act, Deadline, Lines, EXPIRED};
use super::procfs;

/// The hidden subcommand of the `leasehold` binary that runs the guard.
pub const SUBCOMMAND: &str = "exec-guard";

/// The signal that tells the guard to end the command's tree now: sent by
/// the kernel when the agent dies, and by the agent after the grace period.
pub const END_NOW: Signal = Signal::SIGUSR1;

/// Signals the guard passes on to the command's process group.
const PASSED_ON: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Runs `command` under the guard and returns the exit code to leave with.
pub fn run(command: &[String]) -> u8 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("leasehold exec-guard: no command given");
        return 2;
    };
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGCHLD, END_NOW].into_iter().chain(PASSED_ON) {
        signals.add(signal);
    }
    if let Err(e) = signals.thread_block() {
        eprintln!("leasehold exec-guard: cannot block signals: {e}");
    }
    let signal_fd = match SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("leasehold exec-guard: cannot open a signalfd: {e}");
            return 126;
        }
    };
    // Standard input is the agent's socket for the guard's whole life.
    let agent = std::io::stdin();
    let mut link = Link {
        fd: agent.as_fd(),
        lines: Lines::default(),
    };
    // The agent writes the first deadline before it starts the guard; a
    // guard that finds none (or one already in its grace period) starts
    // nothing.
    let Some(deadline) = link.first_deadline() else {
        eprintln!("leasehold exec-guard: no deadline from the agent; not starting the command");
        return 126;
    };
    if !deadline.allows_start(monotonic_ns()) {
        link.report_expired();
        return 128 + Signal::SIGKILL as u8;
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("leasehold exec-guard: cannot become a child subreaper: {e}");
    }
    match start(program, args, signals) {
        Ok(pgid) => watch(pgid, &signal_fd, &mut link, deadline),
        Err(code) => code,
    }
}

/// Starts the command in a process group of its own (its id is the
/// group's); the exit code to leave with if it cannot be started.
fn start(program: &str, args: &[String], signals: SigSet) -> Result<Pid, u8> {
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .process_group(0);
    // SAFETY: prctl and pthread_sigmask are async-signal-safe and touch no
    // memory of the parent. The command must not inherit the guard's
    // blocked signals (a shell would never see SIGTERM or SIGCHLD); and if
    // the guard itself is SIGKILLed, the command goes with it.
    unsafe {
        cmd.pre_exec(move || {
            signals.thread_unblock()?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            Ok(())
        });
    }
    match cmd.spawn() {
        Ok(child) => Ok(Pid::from_raw(child.id() as i32)),
        Err(e) => {
            eprintln!("leasehold exec-guard: cannot start {program:?}: {e}");
            Err(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            })
        }
    }
}

/// Watches the running command until it ends or has to: the agent's
/// deadlines and signals, and the deadline's own clock. Returns the exit
/// code to leave with.
fn watch(pgid: Pid, signal_fd: &SignalFd, link: &mut Link, mut deadline: Deadline) -> u8 {
    // Whether the deadline's SIGTERM went out: from then on the command is
    // on its way out, and a later deadline does not call it back.
    let mut terminated = false;
    loop {
        let act = deadline.act(monotonic_ns(), terminated);
        if !matches!(act, Act::Wait(_)) {
            // A renewal written just as the last deadline ran out is read
            // before acting on that one.
            if let Some(newer) = link.waiting() {
                deadline = newer;
                continue;
            }
        }
        let wait = match act {
            Act::Wait(wait) => wait,
            Act::Terminate => {
                eprintln!("leasehold exec-guard: the lease's deadline is near with no renewal from the agent: SIGTERM to the command");
                let _ = killpg(pgid, Signal::SIGTERM);
                terminated = true;
                continue;
            }
            Act::Kill => {
                eprintln!("leasehold exec-guard: the lease's deadline came with no renewal from the agent: SIGKILL to the command's tree");
                end_tree(pgid);
                link.report_expired();
                return 128 + Signal::SIGKILL as u8;
            }
        };
        match next_event(signal_fd, link, wait) {
            Event::Timeout => {}
            Event::Deadline(newer) => {
                deadline = newer;
            }
            Event::AgentGone => {
                end_tree(pgid);
                return 128 + Signal::SIGKILL as u8;
            }
            Event::Signal(Signal::SIGCHLD) => {
                if let Some(status) = reap(pgid) {
                    end_tree(pgid);
                    if terminated {
                        link.report_expired();
                    }
                    return exit_code(status);
                }
            }
            Event::Signal(signal) if signal == END_NOW => {
                end_tree(pgid);
                return 128 + Signal::SIGKILL as u8;
            }
            Event::Signal(passed) => {
                // ESRCH once the group is gone.
                let _ = killpg(pgid, passed);
            }
        }
    }
}

/// The guard's end of the agent's socket.
struct Link<'a> {
    fd: BorrowedFd<'a>,
    lines: Lines,
}

impl Link<'_> {
    /// Reads until the first deadline (the agent wrote it before starting
    /// the guard, so it is there at once); `None` at the end of input.
    fn first_deadline(&mut self) -> Option<Deadline> {
        loop {
            match self.read()? {
                Some(deadline) => return Some(deadline),
                None => continue,
            }
        }
    }

    /// One read: `None` at the end of input (or a read error), else the
    /// last whole deadline it completed, if any.
    fn read(&mut self) -> Option<Option<Deadline>> {
        let mut buf = [0u8; 512];
        loop {
            match nix::unistd::read(self.fd, &mut buf) {
                Ok(0) => return None,
                Ok(n) => return Some(self.lines.push(&buf[..n])),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    eprintln!("leasehold exec-guard: cannot read from the agent: {e}");
                    return None;
                }
            }
        }
    }

    /// A deadline the agent has written and the guard not read yet, if any
    /// (the end of input is left to the next wait to find).
    fn waiting(&mut self) -> Option<Deadline> {
        let mut fds = [PollFd::new(self.fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(1..)
                if fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLIN)) =>
            {
                self.read().flatten()
            }
            _ => None,
        }
    }

    /// Tells the agent the deadline ended the command. The agent may be
    /// stopped: the socket keeps the line until it reads.
    fn report_expired(&self) {
        let _ = nix::unistd::write(self.fd, EXPIRED);
    }
}

enum Event {
    Timeout,
    Deadline(Deadline),
    AgentGone,
    Signal(Signal),
}

/// Waits up to `wait` for a signal or a line from the agent.
fn next_event(signal_fd: &SignalFd, link: &mut Link, wait: std::time::Duration) -> Event {
    // Rounded up to whole milliseconds: poll's unit. The deadline's lead
    // covers the rounding.
    let millis = wait.as_micros().div_ceil(1000).min(i32::MAX as u128);
    let timeout = PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX);
    let mut fds = [
        PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
        PollFd::new(link.fd, PollFlags::POLLIN),
    ];
    match poll(&mut fds, timeout) {
        Ok(0) | Err(_) => return Event::Timeout,
        Ok(_) => {}
    }
    let ready = |fd: &PollFd| {
        fd.revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
        })
    };
    let (signal_ready, link_ready) = (ready(&fds[0]), ready(&fds[1]));
    if signal_ready {
        if let Ok(Some(info)) = signal_fd.read_signal() {
            if let Ok(signal) = Signal::try_from(info.ssi_signo as i32) {
                return Event::Signal(signal);
            }
        }
    }
    if link_ready {
        return match link.read() {
            None => Event::AgentGone,
            Some(Some(deadline)) => Event::Deadline(deadline),
            Some(None) => Event::Timeout,
        };
    }
    Event::Timeout
}

/// Reaps every child that has exited; the command's wait status once it
/// is among them.
fn reap(command: Pid) -> Option<i32> {
    let mut command_status = None;
    while let Some((pid, status)) = wait_any(nix::libc::WNOHANG) {
        if pid == command.as_raw() {
            command_status = Some(status);
        }
    }
    command_status
}

/// `waitpid(-1, ...)`: a child that ended and its raw wait status, `None`
/// when none has (or there is no child left). Raw, not nix's `waitpid`:
/// that one reaps a child killed by a real-time signal and then fails to
/// name the signal, and the guard would lose that child's end.
fn wait_any(flags: i32) -> Option<(i32, i32)> {
    let mut status = 0;
    // SAFETY: a plain system call writing into a local.
    let pid = unsafe { nix::libc::waitpid(-1, &mut status, flags) };
    (pid > 0).then_some((pid, status))
}

/// SIGKILL to the command's process group and to every child of the
/// guard (orphans of the tree are re-parented here), again after each
/// death, until the guard has no child left.
fn end_tree(pgid: Pid) {
    let me = nix::unistd::getpid();
    loop {
        // ESRCH for what is already gone.
        let _ = killpg(pgid, Signal::SIGKILL);
        for child in procfs::children(me.as_raw()) {
            let _ = kill(Pid::from_raw(child.pid), Signal::SIGKILL);
        }
        // Blocks until a child dies; ECHILD: nothing left.
        if wait_any(0).is_none() {
            return;
        }
    }
}

/// The exit code a shell would report for a wait status.
fn exit_code(status: i32) -> u8 {
    if nix::libc::WIFEXITED(status) {
        nix::libc::WEXITSTATUS(status) as u8
    } else if nix::libc::WIFSIGNALED(status) {
        (128 + nix::libc::WTERMSIG(status)).clamp(0, 255) as u8
    } else {
        1
    }
}
