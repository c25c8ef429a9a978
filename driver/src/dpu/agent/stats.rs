//! GetVolumeStats on the DPU: there is no mount to statfs here, so the volume's worker is
//! asked (its control socket's `statfs`, answered by the DFS it serves), and the volume's
//! condition comes from the keeper and the worker: abnormal, with the reason, when no worker
//! serves the volume, the keeper or the worker does not answer, or no frontend (the host's
//! device) is connected to the worker.

use crate::keeper::Keeper;
use dpufs_node_api::control::FsUsage;
use std::path::Path;

/// Used, total and available, in one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub used: u64,
    pub total: u64,
    pub available: u64,
}

/// A volume's usage (when the worker answered) and condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    pub bytes: Option<Usage>,
    pub inodes: Option<Usage>,
    /// Why the volume is abnormal; `None` when its worker serves it.
    pub abnormal: Option<String>,
}

impl VolumeStats {
    pub fn abnormal(why: String) -> VolumeStats {
        VolumeStats {
            bytes: None,
            inodes: None,
            abnormal: Some(why),
        }
    }

    /// The condition's message.
    pub fn message(&self) -> &str {
        self.abnormal
            .as_deref()
            .unwrap_or("the worker serves the volume")
    }
}

/// Bytes and inodes, counted as host mode counts a statvfs of its mount.
fn usage(u: &FsUsage) -> (Usage, Usage) {
    (
        Usage {
            used: u.blocks.saturating_sub(u.blocks_free) * u.block_size,
            total: u.blocks * u.block_size,
            available: u.blocks_available * u.block_size,
        },
        Usage {
            used: u.files.saturating_sub(u.files_free),
            total: u.files,
            available: u.files_free,
        },
    )
}

/// Asks the keeper at `state_dir` who serves `keeper_volume`, then that worker.
pub fn measure(state_dir: &Path, keeper_volume: &str) -> VolumeStats {
    let list = match crate::ipc::keeper::list(&Keeper::socket(state_dir)) {
        Ok(list) => list,
        Err(e) => return VolumeStats::abnormal(format!("the mount keeper does not answer: {e:#}")),
    };
    let Some(status) = list.volumes.iter().find(|v| v.volume == keeper_volume) else {
        return VolumeStats::abnormal("the mount keeper does not hold the volume".into());
    };
    if status.pid.is_none() {
        return VolumeStats::abnormal(
            "no worker serves the volume now (the keeper is replacing it)".into(),
        );
    }
    let control = Keeper::worker_control_socket(state_dir, keeper_volume, status.generation);
    let (bytes, inodes) = match crate::ipc::control::statfs(&control) {
        Ok(u) => {
            let (b, i) = usage(&u);
            (Some(b), Some(i))
        }
        Err(e) => return VolumeStats::abnormal(format!("the worker does not answer: {e}")),
    };
    let abnormal = match crate::ipc::control::health(&control) {
        Ok(h) => match h.frontend {
            Some(f) if !f.connected => {
                Some("no frontend is connected: the host's device is not attached".into())
            }
            _ => None,
        },
        Err(e) => Some(format!("the worker does not answer: {e}")),
    };
    VolumeStats {
        bytes,
        inodes,
        abnormal,
    }
}
