//! Where the keeper runs: outside the PID namespace and the cgroups of whoever started it.
//!
//! A container restart kills every process in the container's PID namespace and cgroup. The
//! kernel lets no process create children in an *ancestor* PID namespace (`setns` with
//! CLONE_NEWPID only goes down the tree), so a launcher can place the keeper outside its own
//! lifetime only when it already shares the host's PID namespace (a pod with
//! `hostPID: true`). It then detaches the keeper (a double fork into a new session) and the
//! keeper moves itself into its own cgroup in every hierarchy — the equivalent of
//! `systemd-run --scope` on a node without systemd.

use anyhow::{Context as _, Result, bail};
use dpufs_node_api::mountinfo;
use std::path::{Path, PathBuf};

/// The cgroup the keeper moves into, under the root of every hierarchy.
pub const KEEPER_CGROUP: &str = "dpufs-keeper";

/// Whether this process lives in a nested PID namespace: its `NSpid` line has one pid per
/// namespace level from the root down.
pub fn in_nested_pid_namespace() -> Result<bool> {
    Ok(ns_pids("self")?.len() > 1)
}

/// The pids of process `pid` (a number, or `self`) from the outermost PID namespace down to
/// its own. (`self`, not our pid: in a namespace of its own without a /proc of its own, our
/// pid names another process in /proc.)
pub fn ns_pids(pid: &str) -> Result<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .context("the kernel reports no NSpid")?;
    line.split_whitespace()
        .map(|p| p.parse().context("NSpid"))
        .collect()
}

/// The mount points of the cgroup hierarchies (v1 controllers, named v1 hierarchies and
/// the v2 unified one).
pub fn cgroup_roots() -> Result<Vec<PathBuf>> {
    Ok(mountinfo::read()
        .context("read mountinfo")?
        .into_iter()
        .filter(|m| matches!(m.fstype.as_str(), "cgroup" | "cgroup2"))
        .map(|m| m.mountpoint)
        .collect())
}

/// Moves this process into `<root>/<name>` of every hierarchy; returns the cgroups it is now
/// in. A hierarchy that refuses is reported and skipped; none accepting is an error.
pub fn move_to_own_cgroups(name: &str) -> Result<Vec<PathBuf>> {
    let roots = cgroup_roots()?;
    let mut moved = Vec::new();
    let mut refused = Vec::new();
    for root in &roots {
        match move_into(&root.join(name)) {
            Ok(()) => moved.push(root.join(name)),
            Err(e) => refused.push(format!("{}: {e:#}", root.display())),
        }
    }
    for r in &refused {
        tracing::warn!("cgroup hierarchy kept the launcher's cgroup: {r}");
    }
    if moved.is_empty() && !roots.is_empty() {
        bail!(
            "no cgroup hierarchy took the keeper: {}",
            refused.join("; ")
        );
    }
    Ok(moved)
}

fn move_into(cgroup: &Path) -> Result<()> {
    match std::fs::create_dir(cgroup) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(e).with_context(|| format!("create {}", cgroup.display()));
        }
        _ => {}
    }
    inherit_cpuset(cgroup)?;
    // "0" names the writing process.
    std::fs::write(cgroup.join("cgroup.procs"), "0")
        .with_context(|| format!("join {}", cgroup.display()))
}

/// A new cgroup v1 cpuset has no CPUs and no memory nodes, and joining it fails with ENOSPC:
/// it gets its parent's, as systemd and runc do. Other hierarchies have no such files.
fn inherit_cpuset(cgroup: &Path) -> Result<()> {
    let Some(parent) = cgroup.parent() else {
        return Ok(());
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let (own, theirs) = (cgroup.join(file), parent.join(file));
        let Ok(current) = std::fs::read_to_string(&own) else {
            continue;
        };
        if current.trim().is_empty() {
            let value = std::fs::read_to_string(&theirs)
                .with_context(|| format!("read {}", theirs.display()))?;
            std::fs::write(&own, value.trim())
                .with_context(|| format!("write {}", own.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_its_own_pid_at_the_innermost_level() {
        let pids = ns_pids("self").unwrap();
        assert_eq!(pids[pids.len() - 1], std::process::id());
    }

    /// A cpuset cgroup (v1) takes its parent's CPUs and memory nodes; what has none of those
    /// files, or has them set, is left alone.
    #[test]
    fn a_new_cpuset_gets_its_parents_cpus_and_memory_nodes() {
        let root = tempfile::tempdir().unwrap();
        let child = root.path().join("dpufs-keeper");
        std::fs::create_dir(&child).unwrap();
        std::fs::write(root.path().join("cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(root.path().join("cpuset.mems"), "0\n").unwrap();
        std::fs::write(child.join("cpuset.cpus"), "\n").unwrap();
        std::fs::write(child.join("cpuset.mems"), "").unwrap();
        inherit_cpuset(&child).unwrap();
        assert_eq!(
            std::fs::read_to_string(child.join("cpuset.cpus")).unwrap(),
            "0-3"
        );
        assert_eq!(
            std::fs::read_to_string(child.join("cpuset.mems")).unwrap(),
            "0"
        );
        std::fs::write(child.join("cpuset.cpus"), "1").unwrap();
        inherit_cpuset(&child).unwrap();
        assert_eq!(
            std::fs::read_to_string(child.join("cpuset.cpus")).unwrap(),
            "1"
        );
        let other = root.path().join("pids");
        std::fs::create_dir(&other).unwrap();
        inherit_cpuset(&other).unwrap();
        assert!(!other.join("cpuset.cpus").exists());
    }
}
