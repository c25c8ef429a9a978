//! NodePublishVolume and NodeUnpublishVolume: a bind mount of the staged volume into the
//! pod's target (read-only when asked or when the volume was staged for reading), after
//! checking that the pod's namespace belongs to the volume's tenant.

use super::NodeService;
use super::mounts;
use super::reader_only;
use super::record::{StagedVolume, VolumeFiles};
use crate::csi::controller::check_capability;
use crate::csi::directory::DirectoryError;
use crate::csi::error::PublishError;
use crate::csi::volume_id::VolumeId;
use dpufs_proto::csi::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest};
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
        const RPC: &str = "NodePublishVolume";
        if req.volume_id.is_empty() {
            return Err(PublishError::MissingId(RPC));
        }
        if req.staging_target_path.is_empty() {
            return Err(PublishError::MissingStagingPath);
        }
        if req.target_path.is_empty() {
            return Err(PublishError::MissingTargetPath(RPC));
        }
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or(PublishError::MissingCapability)?;
        check_capability(cap)?;
        let staging = PathBuf::from(&req.staging_target_path);
        let target = PathBuf::from(&req.target_path);
        let _guard = self
            .locks
            .try_lock(format!("target {}", target.display()))?;
        let volume = self.staged(&req.volume_id, &staging)?;
        self.check_tenant(&volume, req.volume_context.get(POD_NAMESPACE))
            .await?;
        let read_only = req.readonly || reader_only(cap) || volume.read_only;
        let staged_dev = mounts::at(&staging)
            .map_err(node_err("reading the mount table"))?
            .ok_or_else(|| not_staged(&req.volume_id, &staging))?
            .dev;
        match mounts::at(&target).map_err(node_err("reading the mount table"))? {
            Some(m) if m.dev == staged_dev && m.read_only == read_only => return Ok(()),
            Some(m) if m.dev == staged_dev => {
                return Err(PublishError::Incompatible {
                    id: req.volume_id,
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
        std::fs::create_dir_all(&target).map_err(node_err("creating the target path"))?;
        mounts::bind(&staging, &target, read_only).map_err(node_err("bind-mounting"))?;
        tracing::info!(volume_id = %req.volume_id, target = %target.display(), read_only, "volume published");
        Ok(())
    }

    /// The record of a volume staged at `staging`.
    fn staged(&self, raw_id: &str, staging: &Path) -> Result<StagedVolume, PublishError> {
        let id = VolumeId::parse(raw_id).map_err(|_| not_staged(raw_id, staging))?;
        let files = VolumeFiles::of(&self.records_dir(), &id);
        match StagedVolume::load(&files.record).map_err(node_err("reading the stage record"))? {
            Some(v) if v.staging_path == staging => Ok(v),
            _ => Err(not_staged(raw_id, staging)),
        }
    }

    /// The pod's namespace (none: the default tenant's request, as from a CSI client that
    /// is not Kubernetes) must belong to the tenant that owns the volume.
    async fn check_tenant(
        &self,
        volume: &StagedVolume,
        namespace: Option<&String>,
    ) -> Result<(), PublishError> {
        let tenant = match self.dir.tenant(namespace.map(String::as_str)).await {
            Ok(t) => t,
            Err(e @ (DirectoryError::NoTenant(_) | DirectoryError::NoDefaultTenant)) => {
                return Err(PublishError::NoTenant {
                    id: volume.volume_id.clone(),
                    source: e,
                });
            }
            Err(e) => {
                return Err(PublishError::Node {
                    step: "looking up the pod's tenant".into(),
                    detail: e.to_string(),
                });
            }
        };
        if tenant.name != volume.tenant || tenant.principal != volume.principal {
            return Err(PublishError::OtherTenant {
                id: volume.volume_id.clone(),
                namespace: namespace.cloned().unwrap_or_default(),
                tenant: tenant.name,
                owner: volume.tenant.clone(),
            });
        }
        Ok(())
    }

    /// NodeUnpublishVolume: unmounts the target and removes it; a target that is gone, not
    /// mounted or whose mount is dead is fine.
    pub async fn unpublish(&self, req: NodeUnpublishVolumeRequest) -> Result<(), PublishError> {
        const RPC: &str = "NodeUnpublishVolume";
        if req.volume_id.is_empty() {
            return Err(PublishError::MissingId(RPC));
        }
        if req.target_path.is_empty() {
            return Err(PublishError::MissingTargetPath(RPC));
        }
        let target = PathBuf::from(&req.target_path);
        let _guard = self
            .locks
            .try_lock(format!("target {}", target.display()))?;
        while mounts::at(&target)
            .map_err(node_err("reading the mount table"))?
            .is_some()
        {
            mounts::unmount(&target).map_err(node_err("unmounting the target"))?;
        }
        match std::fs::remove_dir(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(node_err("removing the target path")(e))
            }
            _ => {
                tracing::info!(volume_id = %req.volume_id, target = %target.display(), "volume unpublished");
                Ok(())
            }
        }
    }
}

fn not_staged(id: &str, staging: &Path) -> PublishError {
    PublishError::NotStaged {
        id: id.to_string(),
        staging: staging.display().to_string(),
    }
}
