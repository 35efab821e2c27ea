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
//! It is plain blocking code around `sigwaitinfo`: it runs no runtime and
//! holds no lock, so nothing can stop it from hearing a signal.
// unsafe_code is denied workspace-wide; this module needs it for the guard's signal mask, prctl and process groups (libc).
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;

use super::procfs;

/// The hidden subcommand of the `leasehold` binary that runs the guard.
pub const SUBCOMMAND: &str = "exec-guard";

/// The signal that tells the guard to end the command's tree now: sent by
/// the kernel when the agent dies, and by the agent after the grace period.
pub const END_NOW: libc::c_int = libc::SIGUSR1;

/// Signals the guard passes on to the command's process group.
const PASSED_ON: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Runs `command` under the guard and returns the exit code to leave with.
pub fn run(command: &[String]) -> u8 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("leasehold exec-guard: no command given");
        return 2;
    };
    // SAFETY: plain syscalls on a sigset this function owns.
    let signals = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGCHLD, END_NOW].iter().chain(PASSED_ON.iter()) {
            libc::sigaddset(&mut set, *signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    // SAFETY: plain syscall.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        eprintln!(
            "leasehold exec-guard: cannot become a child subreaper: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).process_group(0);
    // SAFETY: prctl and pthread_sigmask are async-signal-safe and touch no
    // memory of the parent. The command must not inherit the guard's
    // blocked signals (a shell would never see SIGTERM or SIGCHLD); and if
    // the guard itself is SIGKILLed, the command goes with it.
    unsafe {
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &signals, std::ptr::null_mut());
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let pgid = match cmd.spawn() {
        Ok(child) => child.id() as libc::pid_t,
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
        // SAFETY: waits for one of the blocked signals; no memory is shared.
        let signal = unsafe { libc::sigwaitinfo(&signals, std::ptr::null_mut()) };
        match signal {
            libc::SIGCHLD => {
                if let Some(status) = reap(pgid) {
                    end_tree(pgid);
                    return exit_code(status);
                }
            }
            END_NOW => {
                end_tree(pgid);
                return 128 + libc::SIGKILL as u8;
            }
            -1 => {} // EINTR
            passed => {
                // SAFETY: plain syscall; ESRCH once the group is gone.
                unsafe {
                    libc::kill(-pgid, passed);
                }
            }
        }
    }
}

/// Reaps every child that has exited; the command's wait status once it
/// is among them.
fn reap(command: libc::pid_t) -> Option<libc::c_int> {
    let mut command_status = None;
    loop {
        let mut status = 0;
        // SAFETY: plain syscall writing into a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return command_status;
        }
        if pid == command {
            command_status = Some(status);
        }
    }
}

/// SIGKILL to the command's process group and to every child of the
/// guard (orphans of the tree are re-parented here), again after each
/// death, until the guard has no child left.
fn end_tree(pgid: libc::pid_t) {
    // SAFETY: plain syscall.
    let me = unsafe { libc::getpid() };
    loop {
        // SAFETY: plain syscalls; ESRCH for what is already gone.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        for child in procfs::children(me) {
            unsafe {
                libc::kill(child.pid, libc::SIGKILL);
            }
        }
        let mut status = 0;
        // SAFETY: plain syscall writing into a local; blocks until a child dies.
        if unsafe { libc::waitpid(-1, &mut status, 0) } < 0 {
            return; // ECHILD: nothing left
        }
    }
}

/// The exit code a shell would report for a wait status.
fn exit_code(status: libc::c_int) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status) as u8
    } else if libc::WIFSIGNALED(status) {
        (128 + libc::WTERMSIG(status)).clamp(0, 255) as u8
    } else {
        1
    }
}
