//! What `/proc` says of a process the bench runs: its CPU time so far and
//! its memory. (The agent's own process-table reading, for exec mode, is
//! `leasehold_agent`'s and stays apart: the product does not carry the
//! bench's.)

use std::time::Duration;

/// User plus system CPU time process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which is in parentheses: state is field 3,
    // utime 14 and stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_micros(
        ticks * 1_000_000 / clock_ticks_per_second(),
    ))
}

/// (resident, peak resident) memory of process `pid`, in MiB (0 where
/// `/proc` does not say).
pub fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// The kernel's clock ticks per second, the unit of `/proc/PID/stat`'s
/// CPU times (100 where it cannot be read).
fn clock_ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |hz| hz.max(1) as u64)
}
