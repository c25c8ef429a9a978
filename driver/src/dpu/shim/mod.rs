//! The host shim (`dpufs-csi node --mode dpu-host`, docs/dpu.md): kubelet's CSI Node service
//! on a host whose DPU runs the dpufs agent. It holds no agent key, no capability, no fabric
//! session and no DAOS configuration; it forwards to the agent over the control channel and
//! mounts the virtio-fs devices the agent shows it.
//!
//! - NodeStageVolume checks the request and records it: CSI names the pod only at
//!   NodePublishVolume (podInfoOnMount), and the agent stages only for a pod it can check.
//! - NodePublishVolume asks the agent to stage the volume for the pod (every publish: the
//!   agent's StageVolume is idempotent and doubles as "authorize this pod"), mounts the device
//!   the agent returns at the staging path (`mount -t virtiofs TAG PATH`, once), then
//!   bind-mounts it into the pod's target with host mode's checks.
//! - NodeUnstageVolume unmounts the staging path, then has the agent take the device away
//!   and stop the worker.
//! - NodeGetVolumeStats asks the agent (usage from the worker, and its condition).

mod error;
mod link;
mod record;
mod virtiofs;

pub use error::ShimError;
pub use link::{AgentAddress, AgentLink};

use crate::csi::TOPOLOGY_NODE_KEY;
use crate::csi::error::{PublishError, StageError, StatsError};
use crate::csi::locks::VolumeLocks;
use crate::csi::node::prepare::{describe, shared_access};
use crate::csi::node::publish::{
    bind_target, publish_paths, publish_read_only, share_with_mount_group, unmount_target,
    unpublish_path,
};
use crate::csi::node::stage::{stage_request, unstage_request};
use crate::csi::node::{mounts, node_path};
use crate::csi::volume_id::VolumeId;
use crate::dpu::tag::is_dpufs_tag;
use dpufs_node_api::handover::AccessMode;
use dpufs_proto::csi::v1 as csi;
use dpufs_proto::dpu::v1 as pb;
use record::ShimRecord;
use std::path::{Path, PathBuf};
use tonic::{Response, Status};

/// The volume context keys kubelet adds at NodePublishVolume (CSIDriver podInfoOnMount).
const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
const POD_UID: &str = "csi.storage.k8s.io/pod.uid";

/// How the shim runs.
#[derive(Debug, Clone)]
pub struct ShimConfig {
    /// This host's node name.
    pub node_id: String,
    /// Where the shim keeps its records (`shim/`).
    pub state_dir: PathBuf,
    /// `max_volumes_per_node`.
    pub max_volumes: i64,
    /// Staging and target paths must be under it (kubelet's directory).
    pub mount_root: PathBuf,
}

/// The shim's Node service.
#[derive(Debug)]
pub struct ShimService {
    config: ShimConfig,
    agent: AgentLink,
    locks: VolumeLocks,
}

fn agent_err(rpc: &'static str) -> impl FnOnce(Status) -> ShimError {
    move |status| ShimError::Agent { rpc, status }
}

fn io_err<E: From<StageError>>(step: &'static str) -> impl FnOnce(std::io::Error) -> E {
    move |e| {
        StageError::Node {
            step: step.to_string(),
            detail: e.to_string(),
        }
        .into()
    }
}

impl ShimService {
    pub fn new(config: ShimConfig, agent: AgentLink) -> ShimService {
        ShimService {
            config,
            agent,
            locks: VolumeLocks::default(),
        }
    }

    fn records_dir(&self) -> PathBuf {
        self.config.state_dir.join("shim")
    }

    fn record_path(&self, id: &VolumeId) -> PathBuf {
        record::path_of(&self.records_dir(), id)
    }

    /// NodeStageVolume: the checks, then the record; nothing reaches the agent yet.
    async fn stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), ShimError> {
        let (id, staging, access) = stage_request(&req, &self.config.mount_root)?;
        let read_only = access == AccessMode::ReadOnly;
        let _guard = self
            .locks
            .try_lock(format!("volume {id}"))
            .map_err(StageError::from)?;
        let path = self.record_path(&id);
        let known =
            ShimRecord::load(&path).map_err(io_err::<ShimError>("reading the stage record"))?;
        match known {
            Some(r) if r.staging_path != staging => Err(StageError::StagedElsewhere {
                id: id.to_string(),
                at: r.staging_path.display().to_string(),
                asked: staging.display().to_string(),
            }
            .into()),
            Some(r) if r.read_only != read_only => Err(StageError::OtherAccess {
                id: id.to_string(),
                staged: describe(shared_access(r.read_only)),
                asked: describe(shared_access(read_only)),
            }
            .into()),
            Some(_) => Ok(()),
            None => {
                let staged = ShimRecord::count(&self.records_dir())
                    .map_err(io_err::<ShimError>("reading the stage records"))?;
                if staged as i64 >= self.config.max_volumes {
                    return Err(StageError::TooManyVolumes {
                        max: self.config.max_volumes,
                    }
                    .into());
                }
                ShimRecord {
                    volume_id: id.to_string(),
                    staging_path: staging,
                    read_only,
                }
                .save(&path)
                .map_err(io_err::<ShimError>("writing the stage record"))?;
                tracing::info!(volume_id = %id, "volume staged (recorded; the DPU stages it at publish)");
                Ok(())
            }
        }
    }

    /// NodeUnstageVolume: unmounts the device at the staging path, then the agent takes it
    /// away and stops the worker; the record goes last.
    async fn unstage(&self, req: csi::NodeUnstageVolumeRequest) -> Result<(), ShimError> {
        let id = unstage_request(&req)?;
        let staging = node_path(
            &self.config.mount_root,
            "staging target path",
            &req.staging_target_path,
        )
        .map_err(StageError::from)?;
        let _guard = self
            .locks
            .try_lock(format!("volume {id}"))
            .map_err(StageError::from)?;
        while let Some(m) =
            mounts::at(&staging).map_err(io_err::<ShimError>("reading the mount table"))?
        {
            if m.fstype != virtiofs::FSTYPE {
                return Err(ShimError::StagingInUse(
                    staging.display().to_string(),
                    "(a virtio-fs device)".into(),
                ));
            }
            mounts::unmount(&staging)
                .map_err(io_err::<ShimError>("unmounting the staging path"))?;
        }
        self.agent
            .client()
            .await?
            .unstage_volume(pb::UnstageVolumeRequest {
                volume_id: req.volume_id.clone(),
                host_node: self.config.node_id.clone(),
            })
            .await
            .map_err(agent_err("UnstageVolume"))?;
        match std::fs::remove_file(self.record_path(&id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err::<ShimError>("removing the stage record")(e));
            }
            _ => {}
        }
        tracing::info!(volume_id = %id, "volume unstaged");
        Ok(())
    }

    /// The record of a volume staged at `staging`: NOT_FOUND when this host has not staged it,
    /// FAILED_PRECONDITION when it is staged elsewhere.
    fn staged_at(&self, raw_id: &str, staging: &Path) -> Result<ShimRecord, PublishError> {
        let id = VolumeId::parse(raw_id).map_err(|e| match e {
            crate::csi::volume_id::VolumeIdError::Foreign(_) => {
                PublishError::NotFound(raw_id.to_string())
            }
            e => PublishError::MalformedId(e),
        })?;
        let known = ShimRecord::load(&self.record_path(&id)).map_err(|e| PublishError::Node {
            step: "reading the stage record".into(),
            detail: e.to_string(),
        })?;
        match known {
            Some(r) if r.staging_path == staging => Ok(r),
            Some(_) => Err(PublishError::NotStaged {
                id: raw_id.to_string(),
                staging: staging.display().to_string(),
            }),
            None => Err(PublishError::NotFound(raw_id.to_string())),
        }
    }

    /// NodePublishVolume: the agent stages the volume for the pod, the device is mounted at
    /// the staging path (once), and bound into the target.
    async fn publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), ShimError> {
        let (staging, target) = publish_paths(&req, &self.config.mount_root)?;
        let _guard = self
            .locks
            .try_lock(format!("target {}", target.display()))
            .map_err(PublishError::from)?;
        let record = self.staged_at(&req.volume_id, &staging)?;
        // Publishes of one volume into two pods each mount its device at the staging path if
        // it is not there: one at a time, or both would find it missing and mount it twice.
        let _volume = self
            .locks
            .try_lock(format!("volume {}", record.volume_id))
            .map_err(PublishError::from)?;
        let context = |k: &str| req.volume_context.get(k).cloned().unwrap_or_default();
        let mode = req
            .volume_capability
            .as_ref()
            .and_then(|c| c.access_mode.as_ref())
            .map_or(0, |m| m.mode);
        let answer = self
            .agent
            .client()
            .await?
            .stage_volume(pb::StageVolumeRequest {
                volume_id: req.volume_id.clone(),
                access: Some(pb::VolumeAccess {
                    mode,
                    read_only: record.read_only,
                }),
                volume_context: req.volume_context.clone(),
                pod: Some(pb::PodRef {
                    namespace: context(crate::csi::node::publish::POD_NAMESPACE),
                    name: context(POD_NAME),
                    uid: context(POD_UID),
                }),
                host_node: self.config.node_id.clone(),
            })
            .await
            .map_err(agent_err("StageVolume"))?
            .into_inner();
        let device = answer
            .device
            .ok_or(ShimError::NoDevice { rpc: "StageVolume" })?;
        self.mount_device(&device, &staging).await?;
        let read_only = publish_read_only(&req) || record.read_only;
        share_with_mount_group(&req, &staging, read_only)?;
        Ok(bind_target(&req, &staging, &target, read_only)?)
    }

    /// Mounts the device at the staging path unless it is mounted there already.
    async fn mount_device(
        &self,
        device: &pb::VirtioFsDevice,
        staging: &Path,
    ) -> Result<(), ShimError> {
        match mounts::at(staging).map_err(io_err::<ShimError>("reading the mount table"))? {
            Some(m) if m.fstype == virtiofs::FSTYPE && m.source == device.tag => return Ok(()),
            Some(m) => {
                return Err(ShimError::StagingInUse(
                    format!("{} ({} {})", staging.display(), m.fstype, m.source),
                    device.tag.clone(),
                ));
            }
            None => {}
        }
        let (tag, path, read_only) = (device.tag.clone(), staging.to_path_buf(), device.read_only);
        tokio::task::spawn_blocking(move || virtiofs::mount(&tag, &path, read_only))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|detail| ShimError::Mount {
                tag: device.tag.clone(),
                path: staging.display().to_string(),
                detail,
            })?;
        tracing::info!(tag = %device.tag, staging = %staging.display(), "virtio-fs device mounted");
        Ok(())
    }

    /// NodeUnpublishVolume: host mode's, for virtio-fs mounts of dpufs devices.
    async fn unpublish(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<(), ShimError> {
        let target = unpublish_path(&req, &self.config.mount_root)?;
        let _guard = self
            .locks
            .try_lock(format!("target {}", target.display()))
            .map_err(PublishError::from)?;
        Ok(unmount_target(&req.volume_id, &target, |m| {
            m.fstype == virtiofs::FSTYPE && is_dpufs_tag(&m.source)
        })?)
    }

    /// NodeGetVolumeStats: the path must be the staging path or a target of the volume; the
    /// usage and the condition come from the agent. When the agent does not answer, the usage
    /// is the host's view of the mount and the condition says why.
    async fn stats(
        &self,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, ShimError> {
        if req.volume_id.is_empty() {
            return Err(StatsError::MissingId.into());
        }
        if req.volume_path.is_empty() {
            return Err(StatsError::MissingPath.into());
        }
        let not_found = || StatsError::NotFound {
            id: req.volume_id.clone(),
            path: req.volume_path.clone(),
        };
        let id = VolumeId::parse(&req.volume_id).map_err(|_| not_found())?;
        let Ok(Some(record)) = ShimRecord::load(&self.record_path(&id)) else {
            return Err(not_found().into());
        };
        let path = node_path(&self.config.mount_root, "volume path", &req.volume_path)
            .map_err(|_| not_found())?;
        if !crate::csi::node::stats::is_staged_or_published(&path, &record.staging_path) {
            return Err(not_found().into());
        }
        let asked = match self.agent.client().await {
            Ok(mut client) => client
                .get_volume_stats(pb::GetVolumeStatsRequest {
                    volume_id: req.volume_id.clone(),
                })
                .await
                .map(Response::into_inner)
                .map_err(|s| format!("the DPU agent does not answer: {}", s.message())),
            Err(e) => Err(e.to_string()),
        };
        use csi::volume_usage::Unit;
        let usage = |u: pb::Usage, unit: Unit| csi::VolumeUsage {
            available: u.available,
            total: u.total,
            used: u.used,
            unit: unit as i32,
        };
        Ok(match asked {
            Ok(s) => csi::NodeGetVolumeStatsResponse {
                usage: s
                    .bytes
                    .map(|u| usage(u, Unit::Bytes))
                    .into_iter()
                    .chain(s.inodes.map(|u| usage(u, Unit::Inodes)))
                    .collect(),
                volume_condition: s.condition.map(|c| csi::VolumeCondition {
                    abnormal: c.abnormal,
                    message: c.message,
                }),
            },
            Err(why) => {
                let (usage, message) = match host_usage(path).await {
                    Ok(usage) => (usage, why),
                    Err(e) => (vec![], format!("{why}; the mount does not answer: {e}")),
                };
                csi::NodeGetVolumeStatsResponse {
                    usage,
                    volume_condition: Some(csi::VolumeCondition {
                        abnormal: true,
                        message,
                    }),
                }
            }
        })
    }

    /// NodeGetInfo: this host, and the topology its DPU reaches (from the agent's Probe).
    async fn info(&self) -> Result<csi::NodeGetInfoResponse, ShimError> {
        let probe = self
            .agent
            .client()
            .await?
            .probe(pb::ProbeRequest {})
            .await
            .map_err(agent_err("Probe"))?
            .into_inner();
        let mut segments = probe.topology;
        segments.insert(TOPOLOGY_NODE_KEY.to_string(), self.config.node_id.clone());
        Ok(csi::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes,
            accessible_topology: Some(csi::Topology { segments }),
        })
    }
}

/// How long the host's own statfs of a device may take when the agent does not answer.
const HOST_STATFS_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The host's view of the device mounted at `path`, when the agent cannot say. The device may
/// be as unreachable as the agent, and a virtio-fs request whose server is gone is never
/// answered: the statfs runs off the runtime's threads and is given up after
/// [`HOST_STATFS_WITHIN`] (its thread stays blocked until the device answers).
async fn host_usage(path: PathBuf) -> Result<Vec<csi::VolumeUsage>, String> {
    let statfs = tokio::task::spawn_blocking(move || crate::csi::node::stats::usage_of(&path));
    match tokio::time::timeout(HOST_STATFS_WITHIN, statfs).await {
        Ok(Ok(usage)) => usage.map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer in {HOST_STATFS_WITHIN:?}")),
    }
}

crate::csi::node::node_rpcs!(ShimService, ShimError);
