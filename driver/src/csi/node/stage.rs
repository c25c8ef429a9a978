//! NodeStageVolume and NodeUnstageVolume.
//!
//! Stage: the checks of the request, then what every node does ([`super::prepare`]: the
//! tenant from the volume's container, never from the caller's volume context, so a
//! PersistentVolume written by hand cannot claim another tenant's container; the capability;
//! the record), then the keeper mounts the staging path and starts the worker
//! ([`super::prepare::Stager::serve`]: a volume the keeper already serves is adopted, not
//! served twice).

use super::prepare::{node_err, parse_id};
use super::{NodeService, access_of, is_directory, node_path};
use crate::csi::controller::check_capability;
use crate::csi::error::{PathError, StageError};
use crate::csi::volume_id::VolumeId;
use crate::launcher::Attachment;
use dpufs_node_api::handover::AccessMode;
use dpufs_proto::csi::v1::{NodeStageVolumeRequest, NodeUnstageVolumeRequest};
use std::path::{Path, PathBuf};

impl NodeService {
    /// NodeStageVolume.
    pub async fn stage(&self, req: NodeStageVolumeRequest) -> Result<(), StageError> {
        let (id, staging, access) = stage_request(&req, &self.config.mount_root)?;
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let prepared = self.stager.prepare(&id, &staging, access).await?;
        let served = self
            .stager
            .serve(&prepared, Attachment::Mount(staging))
            .await?;
        tracing::info!(volume_id = %id, tenant = %prepared.volume.tenant, ?served, "volume staged");
        Ok(())
    }

    /// NodeUnstageVolume: the keeper stops the worker and unmounts; the record and the
    /// capability go last. A volume that is not staged (or half-staged by a plugin that
    /// crashed) is cleaned up as far as it exists, and succeeds.
    pub async fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<(), StageError> {
        let id = unstage_request(&req)?;
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        self.stager.stop_serving(&id).await?;
        let staging = self.node_path("staging target path", &req.staging_target_path)?;
        if is_dpufs_mount(&staging) {
            // Mounted, but not by the keeper (a crash between mount and record, or by hand).
            super::mounts::unmount(&staging)
                .map_err(|e| node_err("unmounting the staging path")(e.to_string()))?;
        }
        self.stager.forget(&id)?;
        tracing::info!(volume_id = %id, "volume unstaged");
        Ok(())
    }
}

/// The checks every NodeStageVolume makes of its request, in CSI's order: missing fields
/// (INVALID_ARGUMENT whatever the id names: the id is looked at only when the request is
/// complete), the id, the capability, the staging path, which must be a directory. The
/// volume, the staging path, and who writes it (from the access mode).
pub(crate) fn stage_request(
    req: &NodeStageVolumeRequest,
    mount_root: &Path,
) -> Result<(VolumeId, PathBuf, AccessMode), StageError> {
    const RPC: &str = "NodeStageVolume";
    if req.volume_id.is_empty() {
        return Err(StageError::MissingId(RPC));
    }
    if req.staging_target_path.is_empty() {
        return Err(StageError::MissingStagingPath(RPC));
    }
    let cap = req
        .volume_capability
        .as_ref()
        .ok_or(StageError::MissingCapability)?;
    let id = parse_id(&req.volume_id, RPC)?;
    check_capability(cap)?;
    let staging = node_path(mount_root, "staging target path", &req.staging_target_path)?;
    if !is_directory(&staging) {
        return Err(StageError::Path(PathError {
            what: "staging target path",
            path: req.staging_target_path.clone(),
            reason: "is not a directory (kubelet creates it before NodeStageVolume)",
        }));
    }
    Ok((id, staging, access_of(cap)))
}

/// The checks of a NodeUnstageVolume request; the volume.
pub(crate) fn unstage_request(req: &NodeUnstageVolumeRequest) -> Result<VolumeId, StageError> {
    const RPC: &str = "NodeUnstageVolume";
    if req.volume_id.is_empty() {
        return Err(StageError::MissingId(RPC));
    }
    if req.staging_target_path.is_empty() {
        return Err(StageError::MissingStagingPath(RPC));
    }
    parse_id(&req.volume_id, RPC)
}

/// Whether a dpufs FUSE file system is mounted at `path`: the only kind of mount an unstage
/// removes by itself.
fn is_dpufs_mount(path: &Path) -> bool {
    matches!(dpufs_node_api::mountinfo::find(path), Ok(Some(m)) if m.fstype == crate::fuse::FSTYPE)
}
