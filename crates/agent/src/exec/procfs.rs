//! The process table, read from `/proc`: which processes a given process is
//! the parent of, and which of them are zombies. A scan of `/proc/*/stat`
//! rather than `/proc/PID/task/TID/children`, which not every kernel has.

/// A process whose parent is the one asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Child {
    pub pid: i32,
    /// Exited but not yet waited for.
    pub zombie: bool,
}

/// The children of `parent`, as far as `/proc` shows them now.
pub fn children(parent: i32) -> Vec<Child> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (state, ppid) = parse_stat(&stat)?;
            (ppid == parent).then_some(Child {
                pid,
                zombie: state == 'Z',
            })
        })
        .collect()
}

/// `(state, ppid)` from a `/proc/PID/stat` line. The command name in
/// parentheses may hold spaces and parentheses itself, so the fields are
/// read after its last `)`.
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        assert_eq!(parse_stat("42 (sh) S 7 42 42 0 -1 4194560"), Some(('S', 7)));
        assert_eq!(
            parse_stat("43 (a (weird) name) Z 1 43 43 0"),
            Some(('Z', 1))
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_test_is_a_child_of_its_parent() {
        let me = std::process::id() as i32;
        // SAFETY: plain syscall.
        let parent = std::os::unix::process::parent_id() as i32;
        assert!(children(parent).iter().any(|c| c.pid == me && !c.zombie));
    }
}
