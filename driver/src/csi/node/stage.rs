//! NodeStageVolume and NodeUnstageVolume.
//!
//! Stage: the volume's tenant comes from its container (the request record the controller
//! wrote), never from the caller's volume context, so a PersistentVolume written by hand
//! cannot claim another tenant's container. The plugin signs the worker a capability for
//! exactly that container, records the volume, then has the keeper mount the staging path
//! and start the worker ([`crate::launcher::ensure_volume`]: a volume the keeper already
//! serves is adopted, not served twice).

use super::reader_only;
use super::record::{StagedVolume, VolumeFiles};
use super::{NodeService, is_directory};
use crate::csi::controller::{RequestRecord, check_capability};
use crate::csi::directory::SystemClients;
use crate::csi::error::{PathError, StageError};
use crate::csi::label::REQUEST_ATTR;
use crate::csi::qos;
use crate::csi::volume_id::{VolumeId, VolumeIdError};
use crate::launcher::{Attachment, WantedVolume, ensure_volume};
use dpufs_node_api::keeper::{Reply, Request as KeeperRequest};
use dpufs_node_api::qos::QosLimits;
use dpufs_proto::csi::v1::{NodeStageVolumeRequest, NodeUnstageVolumeRequest};
use std::path::Path;

fn node_err(step: &str) -> impl FnOnce(String) -> StageError + '_ {
    move |detail| StageError::Node {
        step: step.to_string(),
        detail,
    }
}

fn describe(read_only: bool) -> &'static str {
    if read_only {
        "reading only"
    } else {
        "reading and writing"
    }
}

impl NodeService {
    /// NodeStageVolume.
    pub async fn stage(&self, req: NodeStageVolumeRequest) -> Result<(), StageError> {
        const RPC: &str = "NodeStageVolume";
        // Every missing field is INVALID_ARGUMENT, whatever the id names: the id is looked
        // at only when the request is complete.
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
        let staging = self.node_path("staging target path", &req.staging_target_path)?;
        if !is_directory(&staging) {
            return Err(StageError::Path(PathError {
                what: "staging target path",
                path: req.staging_target_path.clone(),
                reason: "is not a directory (kubelet creates it before NodeStageVolume)",
            }));
        }
        let read_only = reader_only(cap);
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let files = VolumeFiles::of(&self.records_dir(), &id);
        let known = StagedVolume::load(&files.record)
            .map_err(|e| node_err("reading the stage record")(e.to_string()))?;
        let new = known.is_none();
        let clients = self.dir.system(&id.system).await?;
        let (volume, limits) = match known {
            Some(v) => {
                let v = check_same(&id, v, &staging, read_only)?;
                let limits = qos::read(&clients, &id)
                    .await
                    .map_err(|source| StageError::Daos {
                        step: format!("reading the QoS limits of volume {id}"),
                        source,
                    })?;
                (v, limits)
            }
            None => self.resolve(&clients, &id, &staging, read_only).await?,
        };
        let data = clients
            .data_endpoint
            .ok_or_else(|| StageError::NoDataEndpoint(id.system.clone()))?;
        make_private_dir(&self.records_dir())
            .map_err(|e| node_err("creating the records directory")(e.to_string()))?;
        self.config
            .agent
            .issue(&volume, &files.capability)
            .map_err(node_err("signing the worker's capability"))?;
        limits
            .store(&files.qos)
            .map_err(|e| node_err("writing the QoS file")(e.to_string()))?;
        volume
            .save(&files.record)
            .map_err(|e| node_err("writing the stage record")(e.to_string()))?;
        let want = WantedVolume {
            name: files.keeper_volume.clone(),
            attachment: Attachment::Mount(staging),
            worker_args: self.worker_args(data, &files),
        };
        let state_dir = self.config.state_dir.clone();
        let served = tokio::task::spawn_blocking(move || ensure_volume(&state_dir, &want))
            .await
            .map_err(|e| node_err("the keeper call")(e.to_string()))
            .and_then(|r| {
                r.map_err(|e| node_err("mounting through the mount keeper")(format!("{e:#}")))
            });
        let served = match served {
            Ok(served) => served,
            Err(e) => {
                // A first stage that mounted nothing leaves nothing behind.
                if new {
                    for f in [&files.record, &files.capability, &files.qos] {
                        let _ = std::fs::remove_file(f);
                    }
                }
                return Err(e);
            }
        };
        tracing::info!(volume_id = %id, tenant = %volume.tenant, ?served, "volume staged");
        Ok(())
    }

    /// Who the volume belongs to, from DAOS, and what this stage records; and its QoS.
    async fn resolve(
        &self,
        clients: &SystemClients,
        id: &VolumeId,
        staging: &Path,
        read_only: bool,
    ) -> Result<(StagedVolume, QosLimits), StageError> {
        let staged = StagedVolume::all(&self.records_dir())
            .map_err(|e| node_err("reading the stage records")(e.to_string()))?;
        if staged.len() as i64 >= self.config.max_volumes {
            return Err(StageError::TooManyVolumes {
                max: self.config.max_volumes,
            });
        }
        let (pool, container) = (id.pool.to_string(), id.container.to_string());
        let attrs = clients
            .containers
            .get_attributes(&pool, &container)
            .await
            .map_err(|source| StageError::Daos {
                step: format!("reading the attributes of volume {id}"),
                source,
            })?;
        let record: RequestRecord = attrs
            .get(REQUEST_ATTR)
            .and_then(|raw| serde_json::from_slice(raw).ok())
            .ok_or_else(|| StageError::NotOurs {
                id: id.to_string(),
                container: container.clone(),
            })?;
        let volume = StagedVolume {
            volume_id: id.to_string(),
            staging_path: staging.to_path_buf(),
            tenant: record.tenant,
            principal: record.principal,
            pool,
            container,
            read_only,
        };
        Ok((volume, qos::of(id, &attrs)))
    }

    fn worker_args(&self, data: std::net::SocketAddr, files: &VolumeFiles) -> Vec<String> {
        let mut args = vec![
            "--backend".to_string(),
            format!("engine:{data}"),
            "--capability".to_string(),
            files.capability.display().to_string(),
            "--qos".to_string(),
            files.qos.display().to_string(),
        ];
        args.extend(self.config.worker_args.iter().cloned());
        args
    }

    /// NodeUnstageVolume: the keeper stops the worker and unmounts; the record and the
    /// capability go last. A volume that is not staged (or half-staged by a plugin that
    /// crashed) is cleaned up as far as it exists, and succeeds.
    pub async fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<(), StageError> {
        const RPC: &str = "NodeUnstageVolume";
        if req.volume_id.is_empty() {
            return Err(StageError::MissingId(RPC));
        }
        if req.staging_target_path.is_empty() {
            return Err(StageError::MissingStagingPath(RPC));
        }
        let id = parse_id(&req.volume_id, RPC)?;
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let files = VolumeFiles::of(&self.records_dir(), &id);
        let socket = self.keeper_socket();
        let volume = files.keeper_volume.clone();
        tokio::task::spawn_blocking(move || unmount(&socket, &volume))
            .await
            .map_err(|e| node_err("the keeper call")(e.to_string()))?
            .map_err(node_err("unmounting through the mount keeper"))?;
        let staging = self.node_path("staging target path", &req.staging_target_path)?;
        if is_dpufs_mount(&staging) {
            // Mounted, but not by the keeper (a crash between mount and record, or by hand).
            super::mounts::unmount(&staging)
                .map_err(|e| node_err("unmounting the staging path")(e.to_string()))?;
        }
        for f in [&files.capability, &files.qos, &files.record] {
            match std::fs::remove_file(f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(node_err("removing the stage record")(format!(
                        "{}: {e}",
                        f.display()
                    )));
                }
                _ => {}
            }
        }
        tracing::info!(volume_id = %id, "volume unstaged");
        Ok(())
    }
}

/// Whether a dpufs FUSE file system is mounted at `path`: the only kind of mount an unstage
/// removes by itself.
fn is_dpufs_mount(path: &Path) -> bool {
    matches!(dpufs_node_api::mountinfo::find(path), Ok(Some(m)) if m.fstype == crate::fuse::FSTYPE)
}

/// The records directory: the capabilities in it are the node agent's to hand out.
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// A volume id the node can act on: ours and well formed. A foreign id names no volume.
fn parse_id(raw: &str, rpc: &'static str) -> Result<VolumeId, StageError> {
    match VolumeId::parse(raw) {
        Ok(id) => Ok(id),
        Err(VolumeIdError::Empty) => Err(StageError::MissingId(rpc)),
        Err(VolumeIdError::Foreign(_)) => Err(StageError::NotFound(raw.to_string())),
        Err(e) => Err(StageError::MalformedId(e)),
    }
}

/// A stage of a volume already staged: the same path and access (idempotent), or refused.
fn check_same(
    id: &VolumeId,
    v: StagedVolume,
    staging: &Path,
    read_only: bool,
) -> Result<StagedVolume, StageError> {
    if v.staging_path != staging {
        return Err(StageError::StagedElsewhere {
            id: id.to_string(),
            at: v.staging_path.display().to_string(),
            asked: staging.display().to_string(),
        });
    }
    if v.read_only != read_only {
        return Err(StageError::OtherAccess {
            id: id.to_string(),
            staged: describe(v.read_only),
            asked: describe(read_only),
        });
    }
    Ok(v)
}

/// Asks the keeper to stop the volume's worker and unmount it; a volume the keeper does not
/// know is fine.
fn unmount(socket: &Path, volume: &str) -> Result<(), String> {
    let list = crate::ipc::keeper::list(socket).map_err(|e| format!("{e:#}"))?;
    if !list.volumes.iter().any(|v| v.volume == volume) {
        return Ok(());
    }
    let req = KeeperRequest::Unmount {
        volume: volume.to_string(),
    };
    match crate::ipc::keeper::request(socket, &req).map_err(|e| format!("{e:#}"))? {
        (Reply::Unmounted, _) => Ok(()),
        (other, _) => Err(format!("the keeper answered {other:?}")),
    }
}
