//! The stack's state directory (`./.dpufs` by default) and the processes it records.
//!
//! | file | what |
//! |---|---|
//! | `endpoint` | the engine's management endpoint (other `dpufs` commands read it) |
//! | `engine.pid`, `csi-controller.pid`, `csi-node.pid`, `keeper.pid` | the children (the keeper is the node plugin's), so `dpufs down` can stop them after a crash of `up` |
//! | `mount` | the mountpoint of the default volume (its CSI target path) |
//! | `fabric.dir` | the software fabric's device directory in shared memory |
//! | `agent.key`, `agent.pub` | the node agent's signing key (the node plugin's `--agent-key`) and the public half the engine trusts |
//! | `directory.json` | the CSI plugins' directory: the system, its endpoints, the default pool and tenant |
//! | `csi/` | the plugins' sockets (`controller.sock`, `node.sock`) and the volume's staging directory |
//! | `node/`, `node/keeper.log` | the node plugin's state: the mount keeper's socket, each worker's state (control socket, session record), the stage records and capabilities (`node/csi/`) |
//! | `csi-controller.log`, `csi-node.log`, `engine/`, `engine.log` | the plugins' logs; the engine's data and log |

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal, kill_process};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// How long a child may take to stop after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The programs `up` runs.
pub const ENGINE: &str = "dpufs-engine";
/// The CSI plugins, the mount keeper and the workers it starts (one binary).
pub const CSI: &str = "dpufs-csi";

/// Paths inside the state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    pub dir: PathBuf,
}

impl StateDir {
    pub fn new(dir: &Path) -> StateDir {
        StateDir {
            dir: dir.to_path_buf(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The node plugin's state directory (`--state-dir`), which is also its mount keeper's
    /// (the keeper's socket, each worker's state).
    pub fn keeper(&self) -> PathBuf {
        self.dir.join("node")
    }

    /// The CSI plugins' sockets.
    pub fn csi(&self) -> PathBuf {
        self.dir.join("csi")
    }

    /// The default volume's staging path (NodeStageVolume's `staging_target_path`).
    pub fn staging(&self) -> PathBuf {
        self.csi().join("staging")
    }

    /// Records `value` in `file`.
    pub fn record(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let path = self.path(file);
        std::fs::write(&path, value).with_context(|| format!("writing {}", path.display()))
    }

    /// What `file` records, if anything.
    pub fn recorded(&self, file: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.path(file)).ok()?;
        Some(text.trim().to_string()).filter(|t| !t.is_empty())
    }

    /// The pid recorded in `file`, if that process still runs `program`.
    pub fn running(&self, file: &str, program: &str) -> Option<u32> {
        self.recorded(file)?
            .parse()
            .ok()
            .filter(|pid| runs(*pid, program))
    }

    /// Forgets the running stack: pids, endpoint, mount and fabric records. Keeps the data,
    /// the key and the logs.
    pub fn forget(&self) {
        for file in [
            ENDPOINT,
            ENGINE_PID,
            CONTROLLER_PID,
            NODE_PID,
            KEEPER_PID,
            MOUNT,
            FABRIC_DIR,
        ] {
            let _ = std::fs::remove_file(self.path(file));
        }
    }
}

pub const ENDPOINT: &str = "endpoint";
pub const ENGINE_PID: &str = "engine.pid";
pub const KEEPER_PID: &str = "keeper.pid";
pub const CONTROLLER_PID: &str = "csi-controller.pid";
pub const NODE_PID: &str = "csi-node.pid";
pub const MOUNT: &str = "mount";
pub const FABRIC_DIR: &str = "fabric.dir";

/// Whether `pid` runs `program` (a reused pid or a zombie does not).
pub fn runs(pid: u32, program: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let first = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    Path::new(std::str::from_utf8(first).unwrap_or_default()).file_name() == Some(program.as_ref())
}

/// Sends SIGTERM, waits for `gone` up to the grace period, then SIGKILL.
pub async fn terminate(
    program: &str,
    pid: u32,
    mut gone: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let target = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .context("invalid pid")?;
    if gone() {
        return Ok(());
    }
    // An error means the process is gone already.
    let _ = kill_process(target, Signal::TERM);
    if wait_until(&mut gone, STOP_GRACE).await {
        return Ok(());
    }
    eprintln!(
        "{program} (pid {pid}) did not stop within {} s: killing it",
        STOP_GRACE.as_secs()
    );
    let _ = kill_process(target, Signal::KILL);
    if wait_until(&mut gone, STOP_GRACE).await {
        Ok(())
    } else {
        bail!("{program} (pid {pid}) survived SIGKILL")
    }
}

/// Polls `cond` until it holds or `limit` passes; whether it held.
pub async fn wait_until(cond: &mut impl FnMut() -> bool, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(20)).await;
    }
    true
}

/// The file system type mounted exactly at `path`, if any (from /proc/self/mountinfo).
pub fn mounted_fstype(path: &Path) -> Option<String> {
    dpufs_node_api::mountinfo::find(path)
        .ok()
        .flatten()
        .map(|m| m.fstype)
}

/// Detaches whatever is mounted at `path` (lazily: a mount whose server died detaches
/// without blocking; processes with files open there get errors, not hangs).
pub fn detach(path: &Path) -> std::io::Result<()> {
    rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_mounted_and_a_temp_dir_is_not() {
        assert!(mounted_fstype(Path::new("/")).is_some());
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(mounted_fstype(dir.path()), None);
    }

    #[test]
    fn a_pid_runs_its_own_program_only() {
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap();
        assert!(runs(me, name));
        assert!(!runs(me, "dpufs-engine"));
        assert!(!runs(u32::MAX, name));
    }
}
