//! One file per group, for applications that would rather watch a file than
//! call an API: `DIR/NAME` holds `leader TERM`, `follower`, `candidate`,
//! `abstaining`, or `stopped` once the agent is stopping (written before
//! its leases are released). Each write goes to a
//! temporary file that is renamed over the old one, so a reader never sees
//! half a line, and inotify watchers see one event per change.

use std::path::{Path, PathBuf};

use leasehold_daemon::error::FlagError;
use tokio::task::JoinSet;

use leasehold_engine::{Group, Role};

pub(crate) struct RoleFiles {
    dir: PathBuf,
}

/// What a group's file holds.
pub fn content(role: &Role, leading: Option<u64>) -> String {
    match leading {
        Some(term) => format!("leader {term}\n"),
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

    /// Keeps each group's file current until the returned set is dropped
    /// (which aborts its tasks).
    /// It follows role changes only: the campaign itself demotes at the
    /// moment its local lease runs out, so no timer per group is needed
    /// (an agent may hold thousands).
    pub fn watch(&self, groups: &[(String, Group)]) -> JoinSet<()> {
        let mut tasks = JoinSet::new();
        for (name, group) in groups {
            let (dir, name, group) = (self.dir.clone(), name.clone(), group.clone());
            tasks.spawn(async move {
                let mut role = group.role();
                let mut written = String::new();
                loop {
                    let text = content(&role.borrow_and_update().clone(), group.leader_term());
                    if text != written {
                        match write(&dir, &name, &text) {
                            Ok(()) => written = text,
                            Err(e) => {
                                tracing::warn!(%name, error = %e, "cannot write the role file")
                            }
                        }
                    }
                    if role.changed().await.is_err() {
                        break;
                    }
                }
            });
        }
        tasks
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
    fn only_a_live_local_lease_reads_as_leader() {
        assert_eq!(content(&Role::Leader { term: 3 }, Some(3)), "leader 3\n");
        assert_eq!(content(&Role::Leader { term: 3 }, None), "candidate\n");
        let follower = Role::Follower {
            leader: "ns/a".into(),
            term: 3,
        };
        assert_eq!(content(&follower, None), "follower\n");
        assert_eq!(content(&Role::Abstaining, None), "abstaining\n");
    }
}
