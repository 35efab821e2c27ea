//! The exec guard: a small process between the agent and the command, so
//! that nothing of the command's process tree outlives the agent.
//!
//! The kernel's parent-death signal reaches only a direct child, and a
//! shell's children, or a daemon that called `setsid`, escape a process
//! group. So the agent runs its own binary as `leasehold exec-guard --
//! COMMAND`, and the guard:
//! - is a child subreaper: every orphan of the command's tree is re-parented
//!   to it instead of to PID 1, so it can reap them and find them;
//! - gets SIGUSR1 when the agent dies (parent-death signal) or wants the
//!   command gone at once, and then SIGKILLs the command's process group and
//!   every process re-parented to it, until it has no child left;
//! - passes SIGTERM, SIGINT, SIGHUP and SIGQUIT on to the command's group;
//! - exits when the command does, with its exit code (128 + signal if a
//!   signal ended it), after killing what the command left behind.
//!
//! It is plain blocking code around `sigwait`: it runs no runtime and
//! holds no lock, so nothing can stop it from hearing a signal.
// unsafe_code is denied workspace-wide; `pre_exec` (code between fork and
// exec) needs it, and so does `wait_any` (see there).
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;

use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::unistd::Pid;

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
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("leasehold exec-guard: cannot become a child subreaper: {e}");
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).process_group(0);
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
    let pgid = match cmd.spawn() {
        Ok(child) => Pid::from_raw(child.id() as i32),
        Err(e) => {
            eprintln!("leasehold exec-guard: cannot start {program:?}: {e}");
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    loop {
        // One of the blocked signals; an interrupted wait is tried again.
        let Ok(signal) = signals.wait() else {
            continue;
        };
        match signal {
            Signal::SIGCHLD => {
                if let Some(status) = reap(pgid) {
                    end_tree(pgid);
                    return exit_code(status);
                }
            }
            signal if signal == END_NOW => {
                end_tree(pgid);
                return 128 + Signal::SIGKILL as u8;
            }
            passed => {
                // ESRCH once the group is gone.
                let _ = killpg(pgid, passed);
            }
        }
    }
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
