//! DPU mode (docs/dpu.md): the node plugin's work moves to the host's BlueField DPU.
//!
//! - [`agent`]: `dpufs-csi dpu-agent` on the DPU: stages volumes (keeper, workers, fabric
//!   sessions, capabilities, the node agent key) and shows each to the host as a virtio-fs
//!   device, after checking the host's claims against the API server.
//! - [`shim`]: `dpufs-csi node --mode dpu-host` on the host: kubelet's CSI Node service,
//!   forwarding to the agent and mounting the devices; it holds no key, capability or fabric
//!   session.
//! - [`tls`]: the control channel's mutual TLS, both ends.
//! - [`attach`]: how a device reaches the host (nothing to do, QEMU's monitor, DOCA SNAP).
//! - [`pairing`]: which host a DPU serves, by DPF's pairing label.
//! - [`tag`]: the virtio-fs tag of a volume's device, within DOCA SNAP's bound.

pub mod agent;
pub mod attach;
pub mod pairing;
pub mod shim;
pub mod tag;
pub mod tls;

/// The revision of `dpufs.dpu.v1` this build speaks (ProbeResponse.api_version).
pub const API_VERSION: u32 = 1;
