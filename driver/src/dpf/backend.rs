//! What the storage plugin needs from the DPU agent: a device per volume, made, removed and
//! reported ([`DeviceBackend`]). The plugin checks requests, keeps calls idempotent and
//! answers in DPF's terms; the backend does the staging.

use dpufs_proto::nvidia::storage::plugins::v1::AccessMode;
use std::collections::HashMap;

/// A checked CreateDevice: a file-system device for one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The CSI volume id of `dfs.dpufs.io` (the PersistentVolume's `volumeHandle`).
    pub volume_id: String,
    /// Kubernetes access modes, sorted, without repeats, never empty or unspecified.
    pub access_modes: Vec<AccessMode>,
    /// Kept as given and reported by GetDevice; dpufs's controller publishes nothing.
    pub publish_context: HashMap<String, String>,
    /// The CSI volume context of the PersistentVolume.
    pub volume_context: HashMap<String, String>,
    /// The StorageClass's parameters.
    pub storage_parameters: HashMap<String, String>,
}

impl DeviceSpec {
    /// Whether the device is only read: every access mode is ReadOnlyMany.
    pub fn read_only(&self) -> bool {
        self.access_modes.iter().all(|m| *m == AccessMode::Rox)
    }
}

/// A volume's device on this DPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The device name SNAP exposes to the host: the volume's virtio-fs tag (docs/dpu.md,
    /// "Under NVIDIA DPF").
    pub name: String,
    /// The request the device was made for.
    pub spec: DeviceSpec,
}

/// Why the backend could not do what the plugin asked: one kind per gRPC code the plugin
/// answers with (`dpf::error`); the text says what happened, for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The volume does not exist in its storage (or its id names none of dpufs's).
    #[error("{0}")]
    NotFound(String),
    /// The volume id is malformed for dpufs.
    #[error("{0}")]
    Invalid(String),
    /// The agent will not stage this volume here (e.g. its tenant may not use this host).
    #[error("{0}")]
    Refused(String),
    /// The volume cannot be staged as things are (e.g. its container was not made by dpufs,
    /// its DAOS system has no data endpoint).
    #[error("{0}")]
    Precondition(String),
    /// The volume is staged on this DPU in a way that conflicts (read-only against
    /// read-write).
    #[error("{0}")]
    Conflict(String),
    /// The DPU has no room for another volume.
    #[error("{0}")]
    Exhausted(String),
    /// Another call on the volume is in progress in the agent; a retry succeeds.
    #[error("{0}")]
    Busy(String),
    /// The storage, the API server or the agent's directory cannot be reached now; a retry
    /// may succeed.
    #[error("{0}")]
    Unavailable(String),
    /// Anything else: a worker that would not start, a file that could not be written.
    #[error("{0}")]
    Failed(String),
}

/// The DPU agent as the storage plugin drives it. The plugin serializes calls per volume,
/// calls `create` only for a volume [`DeviceBackend::get`] had no device for, and `delete`
/// for any volume not shown with another device (a create that stopped half-way leaves
/// something `get` does not show but `delete` must clean up).
#[tonic::async_trait]
pub trait DeviceBackend: Send + Sync + 'static {
    /// Whether the agent can stage volumes now (Probe's `ready`).
    async fn ready(&self) -> bool;

    /// Stages the volume on the DPU and returns its device name; the device keeps `spec`
    /// for [`DeviceBackend::get`] and [`DeviceBackend::list`].
    async fn create(&self, spec: &DeviceSpec) -> Result<String, BackendError>;

    /// Unstages the volume and removes whatever a create left; succeeds when there is
    /// nothing (already deleted, never made, not a volume of dpufs).
    async fn delete(&self, volume_id: &str) -> Result<(), BackendError>;

    /// The volume's device, if it has one.
    async fn get(&self, volume_id: &str) -> Result<Option<Device>, BackendError>;

    /// Every device, in any order.
    async fn list(&self) -> Result<Vec<Device>, BackendError>;
}
