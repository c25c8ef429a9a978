//! DAOS's own FUSE client, `dfuse`, mounting a container of a [`DaosSystem`]: the reference
//! a dpufs volume on real DAOS is compared with.

use crate::daos_system::{DaosSystem, is_mount_point, terminate, unmount};
use crate::process::{Detach, spawn_logged};
use anyhow::bail;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// How long dfuse may take to mount.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);

/// A running dfuse and its mount; unmounted and stopped on drop.
#[derive(Debug)]
pub struct Dfuse {
    pub mountpoint: PathBuf,
    child: Child,
}

impl Dfuse {
    /// Mounts `pool`/`container` of `daos` at `mountpoint` (an existing directory) in
    /// multi-user mode, so new files belong to their creators as on a dpufs volume, and
    /// waits until the mount is there. Its log is `dfuse.log` in the system's log directory.
    pub fn mount(
        daos: &DaosSystem,
        pool: &str,
        container: &str,
        mountpoint: &Path,
    ) -> anyhow::Result<Dfuse> {
        let log = daos.log_dir().join("dfuse.log");
        let mut cmd = daos.prefix.command("dfuse");
        cmd.env("DAOS_AGENT_DRPC_DIR", daos.agent_dir())
            .env("D_LOG_FILE", &log)
            .args(["--foreground", "--multi-user"])
            .arg(mountpoint)
            .args([pool, container]);
        let stdout = daos.log_dir().join("dfuse.stdout");
        let child = spawn_logged(&mut cmd, &stdout, Detach::NewSession)?;
        let mut dfuse = Dfuse {
            mountpoint: mountpoint.to_path_buf(),
            child,
        };
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        while !is_mount_point(mountpoint) {
            if let Some(status) = dfuse.child.try_wait()? {
                bail!(
                    "dfuse exited ({status}) before mounting: {}",
                    std::fs::read_to_string(&stdout).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "dfuse did not mount {} within {MOUNT_TIMEOUT:?}",
                    mountpoint.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(dfuse)
    }
}

impl Drop for Dfuse {
    fn drop(&mut self) {
        unmount(&self.mountpoint);
        terminate(&mut self.child, "dfuse");
    }
}
