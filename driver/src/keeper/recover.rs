//! What a keeper does at start with what a previous one left in its state directory (a
//! crash, a kill, its container gone).

use super::Keeper;
use crate::fuse;
use anyhow::{Context as _, Result};
use dpufs_node_api::keeper::{Recovered, RecoveryAction};
use dpufs_node_api::record::VolumeRecord;
use dpufs_node_api::transport::Attachment;

impl Keeper {
    /// A mount whose worker is gone too is dead (nobody holds its connection), so it is
    /// detached and its state removed; an export whose worker is gone has nobody listening
    /// on its socket, which is unlinked. One whose worker still runs is left serving and
    /// reported. Directories without a record are stale and removed.
    pub(super) fn recover(&self) -> Result<Vec<Recovered>> {
        let mut notes = Vec::new();
        let note = |action, volume: Option<&str>| Recovered {
            action,
            volume: volume.map(str::to_string),
            mountpoint: None,
            socket: None,
            pid: None,
            state: None,
        };
        for (dir, record) in VolumeRecord::load_all(&self.state_dir.join("volumes"))? {
            let Some(rec) = record else {
                let _ = std::fs::remove_dir_all(&dir);
                notes.push(Recovered {
                    state: Some(dir),
                    ..note(RecoveryAction::RemovedStaleState, None)
                });
                continue;
            };
            if let Some(pid) = rec.worker_pid_here().filter(|&p| is_worker_alive(p)) {
                tracing::warn!(
                    "worker {pid} of a previous keeper still serves {}, {}: left as it is",
                    rec.volume,
                    rec.attachment
                );
                notes.push(Recovered {
                    pid: Some(pid),
                    ..note(RecoveryAction::LeftServing, Some(&rec.volume))
                });
                continue;
            }
            let action = release(&rec.attachment)?;
            std::fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
            tracing::info!("{}: {action:?}, {}", rec.volume, rec.attachment);
            let (mountpoint, socket) = match &rec.attachment {
                Attachment::Mount(mp) => (Some(mp.clone()), None),
                Attachment::VhostUser { socket } => (None, Some(socket.clone())),
            };
            notes.push(Recovered {
                mountpoint,
                socket,
                ..note(action, Some(&rec.volume))
            });
        }
        Ok(notes)
    }
}

/// Lets go of what a volume nobody serves left attached: its dead FUSE mount (detached), or
/// its export's socket file (unlinked; the listener died with the previous keeper).
fn release(attachment: &Attachment) -> Result<RecoveryAction> {
    Ok(match attachment {
        Attachment::Mount(mp) => {
            if fuse::find_mount(mp)?.is_some_and(|m| m.is_fuse()) {
                fuse::unmount(mp, true).with_context(|| format!("detach {}", mp.display()))?;
                RecoveryAction::DetachedDeadMount
            } else {
                RecoveryAction::RemovedStaleState
            }
        }
        Attachment::VhostUser { socket } => match std::fs::remove_file(socket) {
            Ok(()) => RecoveryAction::RemovedDeadExport,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => RecoveryAction::RemovedStaleState,
            Err(e) => return Err(e).with_context(|| format!("unlink {}", socket.display())),
        },
    })
}

/// Whether `pid` is a running volume worker (not a zombie, not a reused pid).
fn is_worker_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    state.is_some_and(|s| s != 'Z' && s != 'X')
        && cmdline.split(|b| *b == 0).any(|arg| arg == b"worker")
}
