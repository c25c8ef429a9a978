//! NodePublishVolume and NodeUnpublishVolume: a bind mount of the staged volume into the
//! pod's target (read-only when asked or when the volume was staged for reading), after
//! checking that the pod's namespace belongs to the volume's tenant.
//!
//! The request checks and the bind itself are free functions the DPU mode's host shim shares
//! (`crate::dpu::shim`): it mounts a virtio-fs device at the staging path instead of a FUSE
//! connection, and binds it the same way.

use super::mounts;
use super::record::{StagedVolume, VolumeFiles};
use super::{NodeService, access_of, is_directory, node_path, reader_only};
use crate::csi::controller::check_capability;
use crate::csi::error::{PathError, PublishError};
use crate::csi::volume_id::{VolumeId, VolumeIdError};
use dpufs_node_api::handover::AccessMode;
use dpufs_node_api::mountinfo::MountInfo;
use dpufs_proto::csi::v1::{
    NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability,
};
use std::path::{Path, PathBuf};

/// The pod's namespace, which kubelet adds to the volume context (CSIDriver
/// `podInfoOnMount: true`).
pub const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";

fn node_err(step: &str) -> impl FnOnce(std::io::Error) -> PublishError + '_ {
    move |e| PublishError::Node {
        step: step.to_string(),
        detail: e.to_string(),
    }
}

impl NodeService {
    /// NodePublishVolume.
    pub async fn publish(&self, req: NodePublishVolumeRequest) -> Result<(), PublishError> {
        let (staging, target) = publish_paths(&req, &self.config.mount_root)?;
        let _guard = self
            .locks
            .try_lock(format!("target {}", target.display()))?;
        let volume = self.staged(&req.volume_id, &staging)?;
        let namespace = req.volume_context.get(POD_NAMESPACE).map(String::as_str);
        self.stager.check_tenant(&volume, namespace).await?;
        let read_only = publish_read_only(&req) || volume.read_only;
        share_with_mount_group(&req, &staging, read_only)?;
        bind_target(&req, &staging, &target, read_only)
    }

    /// The record of a volume staged at `staging`: NOT_FOUND for a volume this node has not
    /// staged (or a foreign id), FAILED_PRECONDITION for one staged elsewhere.
    fn staged(&self, raw_id: &str, staging: &Path) -> Result<StagedVolume, PublishError> {
        let id = match VolumeId::parse(raw_id) {
            Ok(id) => id,
            Err(VolumeIdError::Foreign(_)) => return Err(PublishError::NotFound(raw_id.into())),
            Err(e) => return Err(PublishError::MalformedId(e)),
        };
        let files = VolumeFiles::of(&self.records_dir(), &id);
        match StagedVolume::load(&files.record).map_err(node_err("reading the stage record"))? {
            Some(v) if v.served_at == staging => Ok(v),
            Some(_) => Err(not_staged(raw_id, staging)),
            None => Err(PublishError::NotFound(raw_id.into())),
        }
    }

    /// NodeUnpublishVolume: unmounts the target and removes it; a target that is gone, not
    /// mounted or whose mount is dead is fine.
    pub async fn unpublish(&self, req: NodeUnpublishVolumeRequest) -> Result<(), PublishError> {
        let target = unpublish_path(&req, &self.config.mount_root)?;
        let _guard = self
            .locks
            .try_lock(format!("target {}", target.display()))?;
        let ours = self.staged_devices();
        // A dpufs mount whose device no staged volume has is ours too: the bind of a
        // connection that died (its worker killed with a node whose keeper went with it) and
        // was mounted anew at the staging path since.
        unmount_target(&req.volume_id, &target, |m| {
            ours.contains(&m.dev) || m.fstype == crate::fuse::FSTYPE
        })
    }

    /// The devices of the volumes staged here: what a target may be a bind mount of.
    fn staged_devices(&self) -> Vec<(u32, u32)> {
        let staged = StagedVolume::all(&self.records_dir()).unwrap_or_default();
        staged
            .iter()
            .filter_map(|v| mounts::at(&v.served_at).ok().flatten())
            .map(|m| m.dev)
            .collect()
    }
}

/// The checks every NodePublishVolume makes of its request, in CSI's order (missing fields,
/// the capability, then the paths); the staging path and the target.
pub(crate) fn publish_paths(
    req: &NodePublishVolumeRequest,
    mount_root: &Path,
) -> Result<(PathBuf, PathBuf), PublishError> {
    const RPC: &str = "NodePublishVolume";
    if req.volume_id.is_empty() {
        return Err(PublishError::MissingId(RPC));
    }
    if req.target_path.is_empty() {
        return Err(PublishError::MissingTargetPath(RPC));
    }
    let cap = req
        .volume_capability
        .as_ref()
        .ok_or(PublishError::MissingCapability)?;
    check_capability(cap)?;
    if req.staging_target_path.is_empty() {
        return Err(PublishError::MissingStagingPath);
    }
    let staging = node_path(mount_root, "staging target path", &req.staging_target_path)?;
    let target = node_path(mount_root, "target path", &req.target_path)?;
    Ok((staging, target))
}

/// Whether the publish asks for reading only (its flag or its access mode).
pub(crate) fn publish_read_only(req: &NodePublishVolumeRequest) -> bool {
    req.readonly || req.volume_capability.as_ref().is_some_and(reader_only)
}

/// The pod's fsGroup, which kubelet sends as `volume_mount_group` instead of changing the
/// volume's ownership itself (VOLUME_MOUNT_GROUP, CSIDriver `fsGroupPolicy: File`): a gid.
pub(crate) fn mount_group(req: &NodePublishVolumeRequest) -> Result<Option<u32>, PublishError> {
    use dpufs_proto::csi::v1::volume_capability::AccessType;
    let group = match req
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.as_ref())
    {
        Some(AccessType::Mount(m)) if !m.volume_mount_group.is_empty() => &m.volume_mount_group,
        _ => return Ok(None),
    };
    group
        .parse()
        .map(Some)
        .map_err(|_| PublishError::MountGroup(group.clone()))
}

/// Lets the pod's fsGroup write the volume (docs/csi.md, "fsGroup"): its root directory
/// gets the group, group read-write-search and set-group-ID, so what the pod creates there
/// takes the group too. Only the root and only when it differs, as kubelet's
/// `fsGroupChangePolicy: OnRootMismatch` would, without walking the tree (a shared volume
/// may hold millions of files). Nothing for a read-only publish.
pub(crate) fn share_with_mount_group(
    req: &NodePublishVolumeRequest,
    staging: &Path,
    read_only: bool,
) -> Result<(), PublishError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const GROUP_RWX_SETGID: u32 = 0o2070;
    let Some(gid) = mount_group(req)? else {
        return Ok(());
    };
    if read_only {
        return Ok(());
    }
    let root = std::fs::metadata(staging).map_err(node_err("reading the volume's root"))?;
    if root.gid() == gid && root.mode() & GROUP_RWX_SETGID == GROUP_RWX_SETGID {
        return Ok(());
    }
    std::os::unix::fs::chown(staging, None, Some(gid))
        .map_err(node_err("giving the volume's root to the pod's fsGroup"))?;
    let mode = (root.mode() | GROUP_RWX_SETGID) & 0o7777;
    std::fs::set_permissions(staging, std::fs::Permissions::from_mode(mode)).map_err(node_err(
        "letting the pod's fsGroup write the volume's root",
    ))?;
    tracing::info!(volume_id = %req.volume_id, gid, mode = format!("{mode:o}"), "volume root shared with the pod's fsGroup");
    Ok(())
}

/// Bind-mounts the volume mounted at `staging` on `target` (read-only or not): answered
/// from the mount table when it is there already, refused when the target holds something
/// else or a single writer's volume is published elsewhere.
pub(crate) fn bind_target(
    req: &NodePublishVolumeRequest,
    staging: &Path,
    target: &Path,
    read_only: bool,
) -> Result<(), PublishError> {
    let staged_dev = mounts::at(staging)
        .map_err(node_err("reading the mount table"))?
        .ok_or_else(|| not_staged(&req.volume_id, staging))?
        .dev;
    match mounts::at(target).map_err(node_err("reading the mount table"))? {
        Some(m) if m.dev == staged_dev && m.read_only == read_only => return Ok(()),
        Some(m) if m.dev == staged_dev => {
            return Err(PublishError::Incompatible {
                id: req.volume_id.clone(),
                target: target.display().to_string(),
                read_only: m.read_only,
            });
        }
        Some(_) => {
            return Err(PublishError::TargetInUse {
                target: target.display().to_string(),
            });
        }
        None => {}
    }
    if req.volume_capability.as_ref().is_some_and(single_writer) {
        check_sole_target(&req.volume_id, staged_dev, staging)?;
    }
    match std::fs::create_dir(target) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && is_directory(target) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotFound
            ) =>
        {
            return Err(PublishError::Path(PathError {
                what: "target path",
                path: req.target_path.clone(),
                reason: if e.kind() == std::io::ErrorKind::NotFound {
                    "has no parent directory (kubelet creates it)"
                } else {
                    "exists and is not a directory"
                },
            }));
        }
        other => other.map_err(node_err("creating the target path"))?,
    }
    mounts::bind(staging, target, read_only).map_err(node_err("bind-mounting"))?;
    tracing::info!(volume_id = %req.volume_id, target = %target.display(), read_only, "volume published");
    Ok(())
}

/// The checks of a NodeUnpublishVolume request; the target.
pub(crate) fn unpublish_path(
    req: &NodeUnpublishVolumeRequest,
    mount_root: &Path,
) -> Result<PathBuf, PublishError> {
    const RPC: &str = "NodeUnpublishVolume";
    if req.volume_id.is_empty() {
        return Err(PublishError::MissingId(RPC));
    }
    if req.target_path.is_empty() {
        return Err(PublishError::MissingTargetPath(RPC));
    }
    Ok(node_path(mount_root, "target path", &req.target_path)?)
}

/// Unmounts every mount at `target` that `ours` accepts (refusing anything else) and removes
/// the directory.
pub(crate) fn unmount_target(
    volume_id: &str,
    target: &Path,
    ours: impl Fn(&MountInfo) -> bool,
) -> Result<(), PublishError> {
    while let Some(m) = mounts::at(target).map_err(node_err("reading the mount table"))? {
        if !ours(&m) {
            return Err(PublishError::NotOurMount {
                target: target.display().to_string(),
            });
        }
        mounts::unmount(target).map_err(node_err("unmounting the target"))?;
    }
    match std::fs::remove_dir(target) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        // Not an empty directory: not one this plugin made; it stays.
        Err(e) => tracing::warn!(target = %target.display(), "not removing the target: {e}"),
    }
    tracing::info!(volume_id, target = %target.display(), "volume unpublished");
    Ok(())
}

fn not_staged(id: &str, staging: &Path) -> PublishError {
    PublishError::NotStaged {
        id: id.to_string(),
        staging: staging.display().to_string(),
    }
}

/// Whether the access mode allows one writer only, in one pod: SINGLE_NODE_SINGLE_WRITER
/// (ReadWriteOncePod).
fn single_writer(cap: &VolumeCapability) -> bool {
    access_of(cap) == AccessMode::SingleWriter
}

/// A single-writer volume goes to one target: FAILED_PRECONDITION when a bind of the staged
/// mount (device `dev`) exists anywhere but at its staging path.
fn check_sole_target(id: &str, dev: (u32, u32), staging: &Path) -> Result<(), PublishError> {
    let mounts = dpufs_node_api::mountinfo::read().map_err(node_err("reading the mount table"))?;
    match mounts
        .iter()
        .find(|m| m.dev == dev && m.mountpoint != staging)
    {
        Some(other) => Err(PublishError::SingleWriterInUse {
            id: id.to_string(),
            other: other.mountpoint.display().to_string(),
        }),
        None => Ok(()),
    }
}
