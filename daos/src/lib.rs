//! The DAOS client of dpufs: one management client (leader discovery,
//! version headers, DAOS's retry rules, typed errors) used by the operator,
//! the CSI controller and the CLI; container administration behind a trait
//! with an engine backend.

pub mod certs;

/// The capabilities a node agent signs for a worker's tenant session, and its keys (the
/// fabric's, re-exported so that users of DFS need not depend on the fabric).
pub mod capability {
    pub use dpufs_fabric::session::{
        AgentKey, AgentPublicKey, Capability, Rights, SignedCapability, unix_now,
    };
}
pub mod containers;
pub mod dfs;
pub mod error;
#[cfg(feature = "daos-ffi")]
pub mod libdaos;
pub mod mgmt;
pub mod principal;
pub mod ranks;
mod session;
pub mod tls;
pub mod wire;

pub use containers::{
    ContainerAdmin, ContainerInfo, ContainerSpec, EngineContainers, Snapshot, SnapshotRef,
};
pub use error::{DaosError, Result};
pub use mgmt::{
    Acl, LeaderInfo, Member, MgmtClient, PoolCreated, PoolInfo, PoolSize, PoolSpec, PoolSummary,
    TierUsage,
};
pub use ranks::EngineRanks;
pub use session::{ClientConfig, Security};
pub use tls::TlsFiles;
pub use wire::{ServerVersion, Wire};
