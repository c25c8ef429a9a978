//! The Node service (host mode): a volume is staged once per node — its own worker, its own
//! tenant session and a capability this plugin signs as the node agent, mounted at the
//! staging path through the node's mount keeper — and bind-mounted into each pod that uses
//! it, after checking that the pod's namespace belongs to the volume's tenant.
//!
//! The plugin keeps what it staged in `<state-dir>/csi/` ([`record`]); the keeper keeps the
//! mounts and workers. Both outlive the plugin's process: a restarted plugin adopts the
//! keeper and answers a repeated stage or publish from what is there, starting no second
//! worker.

pub mod agent;
pub mod mounts;
pub mod prepare;
pub(crate) mod publish;
pub mod record;
pub(crate) mod stage;
pub(crate) mod stats;
pub mod uids;

use crate::csi::directory::Directory;
use crate::csi::error::{CsiError, PathError};
use crate::csi::locks::VolumeLocks;
use crate::csi::{TOPOLOGY_NODE_KEY, TOPOLOGY_SYSTEM_KEY};
use crate::keeper::Keeper;
use dpufs_node_api::handover::AccessMode;
use dpufs_proto::csi::v1::{
    self as csi, NodeServiceCapability, Topology, VolumeCapability, node_service_capability,
    volume_capability,
};
use prepare::Stager;
use std::path::PathBuf;
use std::sync::Arc;

/// How a node plugin runs; what it stages with is its [`Stager`].
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's id (the Kubernetes node name), ≤ 128 bytes.
    pub node_id: String,
    /// Every staging and target path must be under it (kubelet's directory,
    /// `/var/lib/kubelet`); the plugin mounts and unmounts nowhere else.
    pub mount_root: PathBuf,
}

/// The Node service.
pub struct NodeService {
    config: NodeConfig,
    dir: Arc<dyn Directory>,
    stager: Stager,
    locks: VolumeLocks,
}

impl std::fmt::Debug for NodeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeService")
            .field("config", &self.config)
            .field("stager", &self.stager)
            .finish_non_exhaustive()
    }
}

impl NodeService {
    pub fn new(config: NodeConfig, stager: Stager) -> NodeService {
        NodeService {
            config,
            dir: stager.directory().clone(),
            stager,
            locks: VolumeLocks::default(),
        }
    }

    /// Where the plugin's records and capability files are.
    pub fn records_dir(&self) -> PathBuf {
        self.stager.records_dir()
    }

    fn keeper_socket(&self) -> PathBuf {
        Keeper::socket(self.stager.state_dir())
    }

    /// The capabilities this Node service really implements.
    pub fn capabilities() -> Vec<NodeServiceCapability> {
        use node_service_capability::{Rpc, Type, rpc};
        [
            rpc::Type::StageUnstageVolume,
            rpc::Type::GetVolumeStats,
            rpc::Type::VolumeCondition,
            rpc::Type::SingleNodeMultiWriter,
            rpc::Type::VolumeMountGroup,
        ]
        .into_iter()
        .map(|t| NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect()
    }

    async fn info(&self) -> Result<csi::NodeGetInfoResponse, CsiError> {
        let mut segments = std::collections::HashMap::new();
        segments.insert(TOPOLOGY_NODE_KEY.to_string(), self.config.node_id.clone());
        // A node reaches the systems its directory knows; a volume's topology names only
        // its system, so the node segment never pins a volume to one node.
        if let Ok(system) = self.dir.default_system().await {
            segments.insert(TOPOLOGY_SYSTEM_KEY.to_string(), system);
        }
        Ok(csi::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.stager.max_volumes(),
            accessible_topology: Some(Topology { segments }),
        })
    }
}

impl NodeService {
    /// A path from kubelet under this plugin's mount root ([`node_path`]).
    fn node_path(&self, what: &'static str, raw: &str) -> Result<PathBuf, PathError> {
        node_path(&self.config.mount_root, what, raw)
    }
}

/// A path from kubelet a node plugin may mount on, unmount or remove: absolute, without `..`
/// or NUL, within Linux's limits, and under the mount root (kubelet's directory). The plugin
/// runs as root: a relative path would resolve against its own working directory, and a path
/// elsewhere (`/tmp`, `/proc`) is never one kubelet sends.
pub(crate) fn node_path(
    mount_root: &std::path::Path,
    what: &'static str,
    raw: &str,
) -> Result<PathBuf, PathError> {
    let bad = |reason| PathError {
        what,
        path: raw.to_string(),
        reason,
    };
    let path = std::path::Path::new(raw);
    if !path.is_absolute() {
        return Err(bad("is not absolute"));
    }
    if raw.contains('\0') {
        return Err(bad("contains NUL"));
    }
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(bad("contains .."));
    }
    if raw.len() > 4095 || path.iter().any(|c| c.len() > 255) {
        return Err(bad("is longer than Linux allows (PATH_MAX, NAME_MAX)"));
    }
    if !path.starts_with(mount_root) || path == mount_root {
        return Err(bad("is not under the node plugin's --mount-root"));
    }
    Ok(path.to_path_buf())
}

/// Whether `path` is a directory (not a symlink to one): what a staging path must be, and an
/// existing target, before the plugin mounts on it.
pub(crate) fn is_directory(path: &std::path::Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Who writes a volume staged with `cap`, which tells its worker what the kernel may cache.
/// Only SINGLE_NODE_SINGLE_WRITER (ReadWriteOncePod) makes this node's pod the volume's only
/// writer: Kubernetes enforces it across the cluster. SINGLE_NODE_WRITER (ReadWriteOnce) does
/// not, for a driver without attach (`attachRequired: false`): pods on two nodes may mount
/// one RWO claim, so it stays multi-writer.
pub(crate) fn access_of(cap: &VolumeCapability) -> AccessMode {
    use volume_capability::access_mode::Mode;
    let mode = cap
        .access_mode
        .as_ref()
        .and_then(|m| Mode::try_from(m.mode).ok());
    match mode {
        _ if reader_only(cap) => AccessMode::ReadOnly,
        Some(Mode::SingleNodeSingleWriter) => AccessMode::SingleWriter,
        _ => AccessMode::MultiWriter,
    }
}

/// Whether a capability only reads: its access mode lets no one write.
pub(crate) fn reader_only(cap: &VolumeCapability) -> bool {
    use volume_capability::access_mode::Mode;
    cap.access_mode
        .as_ref()
        .and_then(|m| Mode::try_from(m.mode).ok())
        .is_some_and(|m| matches!(m, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly))
}

/// The CSI Node service's gRPC methods for a type whose inherent `stage`, `unstage`,
/// `publish`, `unpublish`, `stats` and `info` do the work, their errors turned into a
/// `tonic::Status` by the type's own error enum (`$errors`, which also answers
/// NodeExpandVolume as Unimplemented): the host's node plugin ([`NodeService`]) and DPU mode's
/// host shim (`crate::dpu::shim`) answer the same calls with different work behind them.
macro_rules! node_rpcs {
    ($service:ty, $errors:ident) => {
        const _: () = {
            use dpufs_proto::csi::v1::{self as csi, node_server::Node};
            use tonic::{Request, Response, Status};

            #[tonic::async_trait]
            impl Node for $service {
                async fn node_stage_volume(
                    &self,
                    req: Request<csi::NodeStageVolumeRequest>,
                ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
                    self.stage(req.into_inner()).await?;
                    Ok(Response::new(csi::NodeStageVolumeResponse {}))
                }

                async fn node_unstage_volume(
                    &self,
                    req: Request<csi::NodeUnstageVolumeRequest>,
                ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
                    self.unstage(req.into_inner()).await?;
                    Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
                }

                async fn node_publish_volume(
                    &self,
                    req: Request<csi::NodePublishVolumeRequest>,
                ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
                    self.publish(req.into_inner()).await?;
                    Ok(Response::new(csi::NodePublishVolumeResponse {}))
                }

                async fn node_unpublish_volume(
                    &self,
                    req: Request<csi::NodeUnpublishVolumeRequest>,
                ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
                    self.unpublish(req.into_inner()).await?;
                    Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
                }

                async fn node_get_volume_stats(
                    &self,
                    req: Request<csi::NodeGetVolumeStatsRequest>,
                ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
                    Ok(Response::new(self.stats(req.into_inner()).await?))
                }

                async fn node_expand_volume(
                    &self,
                    _: Request<csi::NodeExpandVolumeRequest>,
                ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
                    Err($errors::Unimplemented("NodeExpandVolume").into())
                }

                async fn node_get_capabilities(
                    &self,
                    _: Request<csi::NodeGetCapabilitiesRequest>,
                ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
                    Ok(Response::new(csi::NodeGetCapabilitiesResponse {
                        capabilities: $crate::csi::node::NodeService::capabilities(),
                    }))
                }

                async fn node_get_info(
                    &self,
                    _: Request<csi::NodeGetInfoRequest>,
                ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
                    Ok(Response::new(self.info().await?))
                }
            }
        };
    };
}
pub(crate) use node_rpcs;

node_rpcs!(NodeService, CsiError);

#[cfg(test)]
mod tests {
    use super::*;
    use volume_capability::access_mode::Mode;

    /// Only ReadWriteOncePod makes one writer: ReadWriteOnce admits pods on two nodes when
    /// the driver has no attach step.
    #[test]
    fn only_single_node_single_writer_stages_a_single_writer() {
        let cases = [
            (Mode::SingleNodeSingleWriter, AccessMode::SingleWriter),
            (Mode::SingleNodeWriter, AccessMode::MultiWriter),
            (Mode::SingleNodeMultiWriter, AccessMode::MultiWriter),
            (Mode::MultiNodeMultiWriter, AccessMode::MultiWriter),
            (Mode::MultiNodeSingleWriter, AccessMode::MultiWriter),
            (Mode::SingleNodeReaderOnly, AccessMode::ReadOnly),
            (Mode::MultiNodeReaderOnly, AccessMode::ReadOnly),
        ];
        for (mode, access) in cases {
            let cap = VolumeCapability {
                access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
                ..Default::default()
            };
            assert_eq!(access_of(&cap), access, "{mode:?}");
        }
    }
}
