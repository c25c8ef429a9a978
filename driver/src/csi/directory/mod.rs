//! Where the CSI plugins learn what Kubernetes objects say: the DAOS systems and their
//! clients (DaosSystem), pool names and UUIDs (DaosPool), and which tenant a PVC's or a
//! pod's namespace belongs to, with its principal and allowed pools (DaosTenant).
//!
//! - [`StaticDirectory`] (`static_dir`) answers from a fixed configuration (a JSON file):
//!   one system, a map of pools, tenants, and a default tenant for requests without a PVC
//!   namespace (conformance suites send none). It serves `dpufs up` and the tests.
//! - [`KubeDirectory`] (`kube`) answers from the dpufs CRDs through kube-rs reflectors:
//!   every lookup is a read of caches the API server's watches keep current
//!   (`from_crds` decides the answers), and it is [`Directory::ready`] once they are
//!   synced.
//! - [`DirectoryArgs`] (`source`): the `--directory` flag of `dpufs-csi controller` and
//!   `dpufs-csi node`, which chooses one of them.

mod from_crds;
mod kube;
mod source;
mod static_dir;

pub use self::kube::{KubeDirectory, KubeDirectoryConfig};
pub use source::{DirectoryArgs, DirectorySource, OpenError};
pub use static_dir::{
    ConfigError, StaticConfig, StaticDirectory, StaticSystem, StaticTenant, valid_tenant_principal,
};

use dpufs_daos::{ContainerAdmin, MgmtClient};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use uuid::Uuid;

/// The DAOS clients of one system.
#[derive(Clone)]
pub struct SystemClients {
    /// The system's name in the directory, as in volume ids and topology: the DAOS system
    /// name of a static directory, the DaosSystem's object name in Kubernetes.
    pub name: String,
    pub mgmt: MgmtClient,
    pub containers: Arc<dyn ContainerAdmin>,
    /// How nodes serve the system's volumes.
    pub volumes: VolumeAccess,
}

/// How nodes serve a system's volumes (its DaosSystem's `backend`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeAccess {
    /// Through the embedded engine's DFS data service at this fabric address, with a
    /// capability the node agent signs; `None` when the directory knows no address (nodes
    /// then refuse to stage).
    Engine {
        data_endpoint: Option<std::net::SocketAddr>,
    },
    /// Through DAOS's own libdfs, in this directory, and the node's `daos_agent`, by a
    /// worker running as its tenant's uid (docs/real-daos.md).
    Daos { lib: std::path::PathBuf },
}

impl std::fmt::Debug for SystemClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemClients")
            .field("name", &self.name)
            .field("mgmt", &self.mgmt)
            .finish_non_exhaustive()
    }
}

/// A pool a volume may go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRef {
    /// The DaosPool name (StorageClass parameter `pool`).
    pub name: String,
    pub uuid: Uuid,
}

/// A tenant: whose volumes, granted to which DAOS principal, in which pools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tenant {
    /// The DaosTenant name.
    pub name: String,
    /// The DAOS user principal its containers are granted to, `name@`.
    pub principal: String,
    /// DaosPool names its volumes may be created in.
    pub allowed_pools: Vec<String>,
    /// The uid its volume workers run as on every node, for systems served through libdfs;
    /// `None`: each node gives one of its range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// What the directory cannot answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    #[error("no DAOS system is configured")]
    NoSystem,
    #[error(
        "several DAOS systems are configured ({}); set the StorageClass parameter system",
        .0.join(", ")
    )]
    SeveralSystems(Vec<String>),
    #[error("DAOS system {0:?} is not configured (no such DaosSystem)")]
    UnknownSystem(String),
    #[error(
        "pool {pool:?} of DAOS system {system:?} is not known (no such DaosPool, or it has no UUID yet)"
    )]
    UnknownPool { system: String, pool: String },
    #[error(
        "namespace {0:?} belongs to no DaosTenant; add it to a tenant's namespaces to provision volumes there"
    )]
    NoTenant(String),
    #[error(
        "the request names no PVC namespace (run the external-provisioner with --extra-create-metadata) and no default tenant is configured"
    )]
    NoDefaultTenant,
    #[error("the directory cannot be read now: {0}")]
    Unavailable(String),
}

/// The source of systems, pools and tenants.
#[tonic::async_trait]
pub trait Directory: Send + Sync + 'static {
    /// Whether the directory can answer (a Kubernetes-backed one: its caches are synced).
    /// This is what Probe reports; it never involves DAOS.
    fn ready(&self) -> bool {
        true
    }

    /// The system of volumes whose StorageClass names none: the only one there is.
    async fn default_system(&self) -> Result<String, DirectoryError>;

    /// The clients of the named system.
    async fn system(&self, name: &str) -> Result<SystemClients, DirectoryError>;

    /// The pool named `pool` (a DaosPool name) in `system`.
    async fn pool(&self, system: &str, pool: &str) -> Result<PoolRef, DirectoryError>;

    /// The tenant of a PVC namespace; `None` (no namespace sent) gives the default tenant.
    async fn tenant(&self, namespace: Option<&str>) -> Result<Tenant, DirectoryError>;

    /// The tenant named `name` (a DaosTenant name); `None` when there is none (any more).
    async fn tenant_named(&self, name: &str) -> Result<Option<Tenant>, DirectoryError>;

    /// Every pool of `system` (where ListSnapshots looks).
    async fn pools(&self, system: &str) -> Result<Vec<PoolRef>, DirectoryError>;
}
