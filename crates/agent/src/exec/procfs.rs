//! The process table: which processes a given process is the parent of,
//! and which of them are zombies, from every process's `/proc/PID/stat`
//! (read by the `procfs` crate) rather than `/proc/PID/task/TID/children`,
//! which not every kernel has.

/// A process whose parent is the one asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Child {
    pub pid: i32,
    /// Exited but not yet waited for.
    pub zombie: bool,
}

/// The children of `parent`, as far as `/proc` shows them now (a process
/// that ends while it is read is left out). None elsewhere than on Linux.
#[cfg(target_os = "linux")]
pub fn children(parent: i32) -> Vec<Child> {
    let Ok(processes) = procfs::process::all_processes() else {
        return Vec::new();
    };
    processes
        .filter_map(|process| process.ok()?.stat().ok())
        .filter(|stat| stat.ppid == parent)
        .map(|stat| Child {
            pid: stat.pid,
            zombie: stat.state == 'Z',
        })
        .collect()
}

#[cfg(not(target_os = "linux"))]
pub fn children(_parent: i32) -> Vec<Child> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn this_test_is_a_child_of_its_parent() {
        let me = std::process::id() as i32;
        let parent = std::os::unix::process::parent_id() as i32;
        assert!(children(parent).iter().any(|c| c.pid == me && !c.zombie));
    }
}
