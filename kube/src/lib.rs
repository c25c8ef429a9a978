//! dpufs-kube: what the operator and the CSI driver both do with the dpufs
//! Kubernetes objects, so that neither depends on the other.
//!
//! - [`system_client`]: the DAOS clients of a DaosSystem (endpoints, the TLS
//!   Secret written out to files, timeouts), cached per DaosSystem and rebuilt
//!   when the DaosSystem's spec or its Secret changes.
//! - [`tenancy`]: which namespaces belong to a DaosTenant (names or a label
//!   selector, with Kubernetes's selector semantics) and whether its principal
//!   can be granted.
//! - [`testing`] (feature `testing`, for tests only): an in-memory fake
//!   Kubernetes API server, also served over HTTP for binaries under test.
//!
//! Dependencies point one way: `operator, driver -> kube -> api, daos`.

pub mod system_client;
pub mod tenancy;
#[cfg(feature = "testing")]
pub mod testing;

pub use system_client::{
    SystemClient, SystemClientCache, SystemClientError, check_servers, check_version,
    libdaos_containers,
};
pub use tenancy::{
    NamespaceView, SelectorError, matched_namespaces, principal_problem, selector_matches,
    tenant_claims,
};
