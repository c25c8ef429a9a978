//! The dpufs agent on a DPU (`dpufs-csi dpu-agent`, docs/dpu.md): it stages volumes for the
//! host it is paired with and shows each one to the host as a virtio-fs device. The keeper,
//! the workers, the fabric sessions, the capabilities and the node agent key all live here;
//! the host holds none of them.
//!
//! [`Agent`] is the core both front doors call: the control channel's gRPC service
//! ([`service`], for the host's shim) and DPF's storage-plugin socket (`crate::dpf`, for SNAP's
//! node driver on the DPU).
//!
//! Staging (`Agent::stage`): the host's claims are checked first — it must be the paired host
//! and, for a pod, the API server must agree ([`pods`]) and the pod's namespace must belong to
//! the volume's tenant, read from the volume's container. Then the same preparation as host
//! mode (`crate::csi::node::prepare`: capability, QoS, record), then the keeper exports the
//! volume on a vhost-user socket and starts its worker with the vhost-user-fs transport, then
//! the device is attached to the host ([`crate::dpu::attach`]).

pub mod error;
pub mod pods;
pub mod service;
mod stats;

pub use error::AgentError;
pub use pods::PodRef;
pub use stats::VolumeStats;

use crate::csi::locks::VolumeLocks;
use crate::csi::node::prepare::{Stager, make_private_dir, parse_id, shared_access};
use crate::csi::node::record::StagedVolume;
use crate::csi::volume_id::VolumeId;
use crate::dpu::attach::{Attach, DeviceSpec};
use crate::dpu::pairing;
use crate::dpu::tag::tag_of;
use crate::launcher::Attachment;
use dpufs_proto::dpu::v1::DeviceTransport;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// Who asks the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The host's shim over the control channel, saying it is this host node: it must be the
    /// host this DPU is paired with.
    Host(String),
    /// A process on the DPU itself (DPF's SNAP node driver on the storage-plugin socket),
    /// trusted as the DPU's own components are.
    Dpu,
}

/// A staged volume's device, as the host sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub transport: DeviceTransport,
    /// The virtio-fs tag: `mount -t virtiofs <tag> <path>`.
    pub tag: String,
    /// The vhost-user socket the volume's worker serves on the DPU.
    pub socket: PathBuf,
    pub read_only: bool,
}

/// A page of staged volumes: (volume id, device), and the token of the next page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub entries: Vec<(String, Device)>,
    pub next: Option<String>,
}

/// The answer to Probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeInfo {
    pub ready: bool,
    pub dpu_node: String,
    /// The paired host, once known.
    pub host_node: Option<String>,
    /// The DAOS system the DPU reaches by default (`dpufs.io/daos-system`), if the directory
    /// names one.
    pub system: Option<String>,
}

/// How the agent knows which host its DPU serves.
#[derive(Clone)]
pub enum Pairing {
    /// Named at start (`--host-node`).
    Given(String),
    /// The pairing label on the DPU's own Node, read once through this client of the cluster
    /// the agent runs in. Under DPF that is the DPU cluster, not the host cluster where the
    /// pods are: the DPU's Node exists only in its own cluster.
    Label(kube::Client),
}

impl std::fmt::Debug for Pairing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pairing::Given(host) => write!(f, "given: {host}"),
            Pairing::Label(_) => write!(f, "the DPU Node's label {}", pairing::HOST_LABEL),
        }
    }
}

/// The agent.
pub struct Agent {
    stager: Stager,
    locks: VolumeLocks,
    /// The cluster of the host's pods, claims and PersistentVolumes.
    host_cluster: kube::Client,
    pairing: Pairing,
    attach: Arc<dyn Attach>,
    dpu_node: String,
    /// The pairing label, once read.
    labelled_host: OnceCell<String>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("dpu_node", &self.dpu_node)
            .field("pairing", &self.pairing)
            .field("attach", &self.attach)
            .field("stager", &self.stager)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// An agent preparing volumes with `stager`, checking pods through `host_cluster` (the
    /// cluster of the host's pods), attaching with `attach`; it runs on the Node `dpu_node`,
    /// paired with its host as `pairing` says.
    pub fn new(
        stager: Stager,
        host_cluster: kube::Client,
        pairing: Pairing,
        attach: Arc<dyn Attach>,
        dpu_node: String,
    ) -> Agent {
        Agent {
            stager,
            locks: VolumeLocks::default(),
            host_cluster,
            pairing,
            attach,
            dpu_node,
            labelled_host: OnceCell::new(),
        }
    }

    /// The host this DPU is paired with.
    pub async fn host(&self) -> Result<&str, AgentError> {
        match &self.pairing {
            Pairing::Given(host) => Ok(host),
            Pairing::Label(dpu_cluster) => self
                .labelled_host
                .get_or_try_init(|| pairing::host_of(dpu_cluster, &self.dpu_node))
                .await
                .map(String::as_str)
                .map_err(|e| AgentError::HostUnknown(e.to_string())),
        }
    }

    /// Whether the agent can serve, and who it is.
    pub async fn probe(&self) -> ProbeInfo {
        let host_node = self.host().await.ok().map(str::to_string);
        let dir = self.stager.directory();
        ProbeInfo {
            ready: dir.ready() && host_node.is_some(),
            dpu_node: self.dpu_node.clone(),
            host_node,
            system: dir.default_system().await.ok(),
        }
    }

    /// The device of `id`: its socket under the state directory and its tag, both named by
    /// the digest of the id (the tag within DOCA SNAP's bound, [`crate::dpu::tag`]).
    pub fn device_of(&self, id: &VolumeId, read_only: bool) -> Device {
        let key = self.stager.files(id).key;
        Device {
            transport: self.attach.transport(),
            tag: tag_of(id),
            socket: self.sockets_dir().join(format!("{key}.sock")),
            read_only,
        }
    }

    fn sockets_dir(&self) -> PathBuf {
        self.stager.state_dir().join("vhost-user")
    }

    /// Stages `volume_id` (for reading only or not) and shows its device to the host; checks
    /// first that `caller` is the paired host and, when a pod is named (always from the
    /// host), that the API server agrees about it. Idempotent: a staged volume answers the
    /// same device, after the same checks.
    pub async fn stage(
        &self,
        volume_id: &str,
        read_only: bool,
        caller: &Caller,
        pod: Option<&PodRef>,
    ) -> Result<Device, AgentError> {
        const RPC: &str = "StageVolume";
        let id = parse_id(volume_id, RPC)?;
        self.check_caller(caller, RPC).await?;
        let pod = match (caller, pod) {
            (Caller::Host(_), None) => return Err(AgentError::MissingPod),
            (_, Some(p)) if p.namespace.is_empty() || p.name.is_empty() || p.uid.is_empty() => {
                return Err(AgentError::MissingPod);
            }
            (_, pod) => pod,
        };
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        // The pod before anything of the volume is read: until the API server shows a pod on
        // the paired host that uses this volume, the host learns nothing about the volume, not
        // even whether its container exists (which planning would tell by its error).
        if let Some(pod) = pod {
            pods::check(&self.host_cluster, pod, self.host().await?, volume_id).await?;
        }
        let device = self.device_of(&id, read_only);
        let planned = self
            .stager
            .plan(&id, &device.socket, shared_access(read_only))
            .await?;
        if let Some(pod) = pod {
            self.stager
                .check_tenant(&planned.volume, Some(&pod.namespace))
                .await?;
        }
        let prepared = planned.write(&self.stager)?;
        // Whoever connects to a worker's socket reads and writes its volume: root's only.
        make_private_dir(&self.sockets_dir()).map_err(|e| crate::csi::error::StageError::Node {
            step: "creating the vhost-user socket directory".into(),
            detail: e.to_string(),
        })?;
        // The keeper starts the worker with the export's transport (vhost-user-fs).
        let export = Attachment::VhostUser {
            socket: device.socket.clone(),
        };
        let served = self.stager.serve(&prepared, export).await?;
        self.run_attach(&device, true).await?;
        tracing::info!(volume_id, tenant = %prepared.volume.tenant, tag = %device.tag, ?served, "volume staged on the DPU");
        Ok(device)
    }

    async fn check_caller(&self, caller: &Caller, rpc: &'static str) -> Result<(), AgentError> {
        match caller {
            Caller::Dpu => Ok(()),
            Caller::Host(asked) if asked.is_empty() => Err(AgentError::MissingHost(rpc)),
            Caller::Host(asked) => {
                let paired = self.host().await?;
                if asked != paired {
                    return Err(AgentError::OtherHost {
                        asked: asked.clone(),
                        paired: paired.to_string(),
                    });
                }
                Ok(())
            }
        }
    }

    async fn run_attach(&self, device: &Device, attach: bool) -> Result<(), AgentError> {
        let spec = DeviceSpec {
            tag: device.tag.clone(),
            socket: device.socket.clone(),
        };
        let attacher = self.attach.clone();
        let done = tokio::task::spawn_blocking(move || {
            if attach {
                attacher.attach(&spec)
            } else {
                attacher.detach(&spec)
            }
        })
        .await
        .map_err(|e| crate::csi::error::StageError::Node {
            step: "the device call".into(),
            detail: e.to_string(),
        })?;
        Ok(done?)
    }

    /// Takes the device from the host, stops the worker, forgets the volume. A volume that is
    /// not staged (or half-staged) is cleaned up as far as it exists, and succeeds.
    pub async fn unstage(&self, volume_id: &str, caller: &Caller) -> Result<(), AgentError> {
        const RPC: &str = "UnstageVolume";
        let id = parse_id(volume_id, RPC)?;
        self.check_caller(caller, RPC).await?;
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let read_only = self.stager.staged(&id)?.is_some_and(|v| v.read_only);
        let device = self.device_of(&id, read_only);
        self.run_attach(&device, false).await?;
        self.stager.stop_serving(&id).await?;
        self.stager.forget(&id)?;
        tracing::info!(volume_id, tag = %device.tag, "volume unstaged from the DPU");
        Ok(())
    }

    /// The record and device of a staged volume.
    pub fn staged(&self, volume_id: &str) -> Result<(StagedVolume, Device), AgentError> {
        let not_staged = || AgentError::NotStaged(volume_id.to_string());
        let id = match parse_id(volume_id, "GetVolumeStats") {
            Ok(id) => id,
            Err(crate::csi::error::StageError::NotFound(_)) => return Err(not_staged()),
            Err(e) => return Err(e.into()),
        };
        let volume = self.stager.staged(&id)?.ok_or_else(not_staged)?;
        let device = self.device_of(&id, volume.read_only);
        Ok((volume, device))
    }

    /// Usage of a staged volume and whether its worker serves it.
    pub async fn stats(&self, volume_id: &str) -> Result<VolumeStats, AgentError> {
        let (volume, _) = self.staged(volume_id)?;
        let id = parse_id(&volume.volume_id, "GetVolumeStats")?;
        let keeper_volume = self.stager.files(&id).keeper_volume;
        let state_dir = self.stager.state_dir().to_path_buf();
        let stats = tokio::task::spawn_blocking(move || stats::measure(&state_dir, &keeper_volume))
            .await
            .unwrap_or_else(|e| VolumeStats::abnormal(format!("measuring failed: {e}")));
        Ok(stats)
    }

    /// At most `max` (0: all) staged volumes after `token` (a volume id of an earlier page),
    /// in the order of their ids, and the token of the next page.
    pub fn list(&self, max: usize, token: &str) -> Result<Page, AgentError> {
        if !token.is_empty() && VolumeId::parse(token).is_err() {
            return Err(AgentError::BadToken(token.to_string()));
        }
        let mut staged = self.stager.all_staged()?;
        staged.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        let rest: Vec<StagedVolume> = staged
            .into_iter()
            .filter(|v| token.is_empty() || v.volume_id.as_str() > token)
            .collect();
        let take = if max == 0 { rest.len() } else { max };
        let next = (rest.len() > take).then(|| rest[take - 1].volume_id.clone());
        let entries = rest
            .into_iter()
            .take(take)
            .filter_map(|v| {
                let id = VolumeId::parse(&v.volume_id).ok()?;
                Some((v.volume_id.clone(), self.device_of(&id, v.read_only)))
            })
            .collect();
        Ok(Page { entries, next })
    }
}
