//! The CSI services of `dfs.dpufs.io` (CSI v1.12): Identity and the Controller's volume
//! lifecycle, served on a unix socket. `docs/csi.md` is the user-facing description
//! (StorageClass parameters, volume ids, error codes).
//!
//! - [`identity`]: GetPluginInfo, GetPluginCapabilities, Probe.
//! - [`controller`]: CreateVolume, DeleteVolume, ValidateVolumeCapabilities,
//!   ControllerExpandVolume, ControllerGetCapabilities; every other Controller RPC answers
//!   UNIMPLEMENTED.
//! - [`directory`]: where the controller learns DAOS systems, pools and tenants
//!   ([`Directory`]): from a file ([`StaticDirectory`]) or the dpufs CRDs
//!   ([`KubeDirectory`]).
//! - [`error`]: one error enum per operation, mapped to gRPC codes in one place.
//! - [`volume_id`], [`params`], [`label`]: the volume id format, the StorageClass
//!   parameters, and container labels derived from CSI names.
//! - [`server`]: the unix-socket gRPC server with per-call logging.
//!
//! Host mode only: the controller talks to DAOS (the embedded engine, through
//! `dpufs_daos::EngineContainers`) from wherever it runs.

pub mod controller;
pub mod directory;
pub mod error;
pub mod identity;
pub mod label;
pub(crate) mod locks;
pub mod node;
pub mod params;
pub mod qos;
pub mod server;
pub mod volume_id;

pub use controller::ControllerService;
pub use directory::{
    Directory, KubeDirectory, PoolRef, StaticConfig, StaticDirectory, SystemClients, Tenant,
};
pub use identity::IdentityService;
pub use node::{NodeConfig, NodeService};
pub use server::{ServeError, parse_endpoint, serve_controller, serve_controller_until};
pub use volume_id::VolumeId;

/// The CSI driver name (`GetPluginInfo.name`, the StorageClass `provisioner`).
pub const DRIVER_NAME: &str = "dfs.dpufs.io";

/// The topology key of a volume's DAOS system: the only segment volumes carry.
pub const TOPOLOGY_SYSTEM_KEY: &str = "dpufs.io/daos-system";

/// The topology key of a node (NodeGetInfo only; never on a volume, which would pin it).
pub const TOPOLOGY_NODE_KEY: &str = "dpufs.io/node";
