//! A CPU quota for one process: a cgroup of its own with the `cpu`
//! controller's quota, the process moved into it and back out, the cgroup
//! removed when dropped. Only the process named moves, not its children
//! (exec mode's guard and command): the agent alone starved, as when its
//! runtime is wedged or it alone loses the CPU. A container's CPU limit
//! holds every process of the container, guard included; what exec mode
//! promises then is in docs/agent.md.
//!
//! Works on cgroup v2 (`cpu.max`) and on v1's `cpu` hierarchy
//! (`cpu.cfs_quota_us`), as root; [`CpuQuota::create`] says why not
//! elsewhere.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// Where cgroups are mounted, and which interface they speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

pub struct CpuQuota {
    root: PathBuf,
    version: Version,
    dir: PathBuf,
    /// The processes moved in, each with the cgroup it came from.
    moved: Vec<(u32, PathBuf)>,
}

/// The cgroup root whose `cpu` controller a new child cgroup gets.
fn hierarchy() -> anyhow::Result<(PathBuf, Version)> {
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").is_file() {
        return Ok((v1.to_owned(), Version::V1));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let controllers =
        std::fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "cpu") {
        return Ok((v2.to_owned(), Version::V2));
    }
    bail!("no cgroup with the cpu controller enabled for children (neither /sys/fs/cgroup/cpu of v1 nor cpu in v2's cgroup.subtree_control)")
}

impl CpuQuota {
    /// A new cgroup named `name` that lets its processes run `quota_us` of
    /// CPU time in every `period_us`.
    pub fn create(name: &str, quota_us: u64, period_us: u64) -> anyhow::Result<Self> {
        if !crate::root() {
            bail!("a cgroup's CPU quota needs root");
        }
        let (root, version) = hierarchy()?;
        let dir = root.join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let set = |file: &str, value: String| {
            std::fs::write(dir.join(file), &value)
                .with_context(|| format!("{value} > {}", dir.join(file).display()))
        };
        match version {
            Version::V1 => {
                set("cpu.cfs_period_us", period_us.to_string())?;
                set("cpu.cfs_quota_us", quota_us.to_string())?;
            }
            Version::V2 => set("cpu.max", format!("{quota_us} {period_us}"))?,
        }
        Ok(Self {
            root,
            version,
            dir,
            moved: Vec::new(),
        })
    }

    /// The cgroup `pid` is in now, in this hierarchy.
    fn current(&self, pid: u32) -> anyhow::Result<PathBuf> {
        let table = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .with_context(|| format!("read /proc/{pid}/cgroup"))?;
        let path = table.lines().find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let ours = match self.version {
                Version::V1 => controllers.split(',').any(|c| c == "cpu"),
                Version::V2 => controllers.is_empty(),
            };
            ours.then(|| path.trim_start_matches('/').to_owned())
        });
        let path = path.with_context(|| format!("no cpu cgroup for {pid} in {table:?}"))?;
        Ok(self.root.join(path))
    }

    /// Moves `pid` (all its threads) under the quota.
    pub fn throttle(&mut self, pid: u32) -> anyhow::Result<()> {
        let from = self.current(pid)?;
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("move {pid} into {}", self.dir.display()))?;
        self.moved.push((pid, from));
        Ok(())
    }

    /// Moves `pid` back where it came from: no quota.
    pub fn release(&mut self, pid: u32) -> anyhow::Result<()> {
        let Some(i) = self.moved.iter().position(|(p, _)| *p == pid) else {
            bail!("{pid} was not throttled");
        };
        let (_, from) = self.moved.swap_remove(i);
        std::fs::write(from.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("move {pid} back into {}", from.display()))
    }
}

impl Drop for CpuQuota {
    /// Moves every process out, those it was given and any born inside
    /// since (a throttled agent's new guard), so the cgroup can go.
    fn drop(&mut self) {
        for (pid, from) in std::mem::take(&mut self.moved) {
            let _ = std::fs::write(from.join("cgroup.procs"), pid.to_string());
        }
        let born = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in born.lines() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
