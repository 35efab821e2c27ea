//! What `/proc` says of a process the bench or a test runs: whether it
//! still runs, its CPU time so far and its memory, read by the `procfs`
//! crate.

use std::time::Duration;

use procfs::process::Process;

/// Whether `pid` still runs: a zombie, killed but not yet reaped by
/// whichever process adopted it, does not count.
pub fn alive(pid: u32) -> bool {
    Process::new(pid as i32)
        .and_then(|p| p.stat())
        .is_ok_and(|stat| stat.state != 'Z' && stat.state != 'X')
}

/// User plus system CPU time process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = Process::new(pid as i32).ok()?.stat().ok()?;
    let ticks = stat.utime + stat.stime;
    Some(Duration::from_micros(
        ticks * 1_000_000 / procfs::ticks_per_second().max(1),
    ))
}

/// (resident, peak resident) memory of process `pid`, in KiB (0 where
/// `/proc` does not say).
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = Process::new(pid as i32).and_then(|p| p.status());
    status.map_or((0, 0), |s| {
        (s.vmrss.unwrap_or_default(), s.vmhwm.unwrap_or_default())
    })
}

/// [`memory_kib`] in MiB.
pub fn memory_mib(pid: u32) -> (f64, f64) {
    let (resident, peak) = memory_kib(pid);
    (resident as f64 / 1024.0, peak as f64 / 1024.0)
}
