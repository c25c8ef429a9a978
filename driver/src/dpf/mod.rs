//! The storage plugin of NVIDIA's DOCA Platform Framework (DPF), served by the DPU agent.
//!
//! In a DPF cluster, SNAP's node driver on the BlueField calls the storage vendor's plugin
//! on a unix socket (`/var/lib/nvidia/storage/snap/plugins/<plugin name>/dpu.sock`,
//! package `nvidia.storage.plugins.v1`): CreateDevice for a volume attached to the DPU's
//! host, DeleteDevice when it is detached. dpufs answers as the plugin `dfs.dpufs.io`: a
//! device is a staged dpufs volume, named by its virtio-fs tag, which DOCA SNAP exposes to
//! the host as a virtio-fs PCI function. docs/dpu.md ("Under NVIDIA DPF") is the description
//! for people.
//!
//! - [`backend`]: what the plugin needs from the agent ([`DeviceBackend`]).
//! - [`agent`]: the DPU agent as that backend ([`AgentDevices`]).
//! - [`request`]: checks of CreateDevice, and when a repeat is the same request.
//! - [`page`]: ListDevices' pages and tokens.
//! - [`error`]: the plugin's errors, mapped to gRPC codes in one place.
//! - [`service`]: IdentityService and StoragePluginService.
//! - [`server`]: the unix-socket server.

pub mod agent;
pub mod backend;
pub mod error;
pub mod page;
pub mod request;
pub mod server;
pub mod service;

pub use agent::AgentDevices;
pub use backend::{BackendError, Device, DeviceBackend, DeviceSpec};
pub use error::PluginError;
pub use server::{DEFAULT_SOCKET, serve_until};
pub use service::{CAPABILITIES, PLUGIN_NAME, PluginIdentity, StoragePlugin};
