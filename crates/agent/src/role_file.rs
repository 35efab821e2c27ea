//! One file per group, for applications that would rather watch a file than
//! call an API: `DIR/NAME` holds `leader TERM until UNIX_MS`, `follower`,
//! `candidate`, `abstaining`, or `stopped` once the agent is stopping
//! (written before its leases are released). Each write goes to a
//! temporary file that is renamed over the old one, so a reader never sees
//! half a line, and inotify watchers see one event per change.
//!
//! `until` is when the agent's local view of the lease ends, in
//! milliseconds of the Unix clock: a reader on the same machine compares it
//! with its own clock, so a file that still says `leader` because the agent
//! is stopped or starved (and cannot rewrite it) reads as stale once the
//! instant passes. The file is rewritten at every confirmed renewal. The
//! term stays the second word, so a reader of `leader TERM` alone still
//! finds it (docs/agent.md says how to read the rest).

use std::future::Future;
use std::path::{Path, PathBuf};

use leasehold_daemon::error::FlagError;

use leasehold_engine::{Group, Leadership, Role};

pub(crate) struct RoleFiles {
    dir: PathBuf,
}

/// What a group's file holds, with `now_ms` the Unix clock now.
pub fn content(role: &Role, leading: Option<Leadership>, now_ms: u64) -> String {
    match leading {
        Some(lease) => {
            let until = now_ms.saturating_add(lease.remaining().as_millis() as u64);
            format!("leader {} until {until}\n", lease.term)
        }
        None => format!("{}\n", crate::api::role_text(role, None)),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(name))
}

impl RoleFiles {
    /// Creates the directory if needed and proves it is writable, so a bad
    /// `--role-dir` fails at start, not at the first election.
    pub fn create(dir: PathBuf) -> Result<Self, FlagError> {
        std::fs::create_dir_all(&dir)
            .and_then(|()| write(&dir, ".probe", ""))
            .and_then(|()| std::fs::remove_file(dir.join(".probe")))
            .map_err(|e| {
                FlagError::worded("--role-dir", format!("--role-dir {}: {e}", dir.display()))
            })?;
        Ok(Self { dir })
    }

    /// Keeps `name`'s file current until the returned future is dropped.
    /// It follows role changes and confirmed renewals (a new `until`): the
    /// campaign itself demotes at the moment its local lease runs out, so
    /// no timer per group is needed (an agent may hold thousands). A leader
    /// costs one write and rename per renewal (docs/agent.md has the cost).
    pub fn keep_current(
        &self,
        name: &str,
        group: Group,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (dir, name) = (self.dir.clone(), name.to_owned());
        async move {
            let mut role = group.role();
            let mut leadership = group.leadership_changes();
            let mut written = String::new();
            loop {
                let _ = leadership.borrow_and_update();
                let text = content(
                    &role.borrow_and_update().clone(),
                    group.leadership(),
                    leasehold_engine::sync::wall_clock_ms(),
                );
                if text != written {
                    match write(&dir, &name, &text) {
                        Ok(()) => written = text,
                        Err(e) => tracing::warn!(%name, error = %e, "cannot write the role file"),
                    }
                }
                let changed = tokio::select! {
                    changed = role.changed() => changed,
                    changed = leadership.changed() => changed,
                };
                if changed.is_err() {
                    break;
                }
            }
        }
    }

    /// Marks every file `stopped`, before the leases are released.
    pub fn write_stopped(&self, groups: &[(String, Group)]) {
        for (name, _) in groups {
            if let Err(e) = write(&self.dir, name, "stopped\n") {
                tracing::warn!(%name, error = %e, "cannot write the role file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_live_local_lease_reads_as_leader_until_its_end() {
        let lease = Leadership {
            term: 3,
            until: tokio::time::Instant::now() + std::time::Duration::from_millis(800),
        };
        let now_ms = 1_700_000_000_000;
        let text = content(&Role::Leader { term: 3 }, Some(lease), now_ms);
        let until: u64 = text
            .strip_prefix("leader 3 until ")
            .and_then(|ms| ms.trim_end().parse().ok())
            .unwrap_or_else(|| panic!("{text:?}"));
        // The time left, read a moment after the lease was made.
        assert!((now_ms + 700..=now_ms + 800).contains(&until), "{text:?}");
        // An old reader that took the term after "leader " up to the next
        // space still gets it.
        assert_eq!(text["leader ".len()..].split(' ').next(), Some("3"));
        assert_eq!(
            content(&Role::Leader { term: 3 }, None, now_ms),
            "candidate\n"
        );
        let follower = Role::Follower {
            leader: "ns/a".into(),
            term: 3,
        };
        assert_eq!(content(&follower, None, now_ms), "follower\n");
        assert_eq!(content(&Role::Abstaining, None, now_ms), "abstaining\n");
    }
}
