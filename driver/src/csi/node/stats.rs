//! NodeGetVolumeStats: bytes and inodes of a staged or published path, and the volume's
//! condition — abnormal, with the reason, when its worker is not serving or the mount does
//! not answer (ENOTCONN from a mount whose FUSE server is gone).

use super::NodeService;
use super::record::{StagedVolume, VolumeFiles};
use crate::csi::error::StatsError;
use crate::csi::volume_id::VolumeId;
use dpufs_proto::csi::v1::{
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, VolumeCondition, VolumeUsage,
    volume_usage::Unit,
};
use std::path::Path;

impl NodeService {
    /// NodeGetVolumeStats.
    pub async fn stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, StatsError> {
        if req.volume_id.is_empty() {
            return Err(StatsError::MissingId);
        }
        if req.volume_path.is_empty() {
            return Err(StatsError::MissingPath);
        }
        let not_found = || StatsError::NotFound {
            id: req.volume_id.clone(),
            path: req.volume_path.clone(),
        };
        let id = VolumeId::parse(&req.volume_id).map_err(|_| not_found())?;
        let files = VolumeFiles::of(&self.records_dir(), &id);
        let Ok(Some(volume)) = StagedVolume::load(&files.record) else {
            return Err(not_found());
        };
        // A path the plugin would never mount on (relative, outside the mount root) is no
        // path of the volume: NOT_FOUND, as for any other path the volume is not at.
        let path = &self
            .node_path("volume path", &req.volume_path)
            .map_err(|_| not_found())?;
        if !is_staged_or_published(path, &volume.served_at) {
            return Err(not_found());
        }
        let socket = self.keeper_socket();
        let keeper_volume = files.keeper_volume;
        let path = path.to_path_buf();
        let answer = tokio::task::spawn_blocking(move || measure(&socket, &keeper_volume, &path))
            .await
            .unwrap_or_else(|e| (vec![], Some(format!("measuring failed: {e}"))));
        let (usage, abnormal) = answer;
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(VolumeCondition {
                abnormal: abnormal.is_some(),
                message: abnormal.unwrap_or_else(|| "the worker serves the volume".into()),
            }),
        })
    }
}

/// Whether a volume staged at `staging` is mounted at `path`: the staging mount itself or a
/// bind of it (the same device).
pub(crate) fn is_staged_or_published(path: &Path, staging: &Path) -> bool {
    let dev = |p: &Path| super::mounts::at(p).ok().flatten().map(|m| m.dev);
    dev(path).is_some_and(|d| dev(staging) == Some(d))
}

/// Usage from statvfs and, when something is wrong, why.
fn measure(socket: &Path, keeper_volume: &str, path: &Path) -> (Vec<VolumeUsage>, Option<String>) {
    let serving = match crate::ipc::keeper::list(socket) {
        Ok(list) => match list.volumes.iter().find(|v| v.volume == keeper_volume) {
            Some(v) if v.pid.is_some() => None,
            Some(_) => Some("no worker serves the volume now (the keeper is replacing it)".into()),
            None => Some("the mount keeper does not hold the volume".into()),
        },
        Err(e) => Some(format!("the mount keeper does not answer: {e:#}")),
    };
    match usage_of(path) {
        Ok(usage) => (usage, serving),
        Err(e) => (vec![], Some(format!("the mount does not answer: {e}"))),
    }
}

/// Bytes and inodes of the file system mounted at `path`, from statvfs(2).
pub(crate) fn usage_of(path: &Path) -> std::io::Result<Vec<VolumeUsage>> {
    let st = statvfs(path)?;
    let block = st.f_frsize;
    Ok(vec![
        VolumeUsage {
            available: (st.f_bavail * block) as i64,
            total: (st.f_blocks * block) as i64,
            used: (st.f_blocks.saturating_sub(st.f_bfree) * block) as i64,
            unit: Unit::Bytes as i32,
        },
        VolumeUsage {
            available: st.f_favail as i64,
            total: st.f_files as i64,
            used: st.f_files.saturating_sub(st.f_ffree) as i64,
            unit: Unit::Inodes as i32,
        },
    ])
}

fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statvfs is plain data; all-zero is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and a valid out pointer.
    if unsafe { libc::statvfs(p.as_ptr(), &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}
