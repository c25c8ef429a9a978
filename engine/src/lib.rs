//! The embedded, single-node, DAOS-compatible engine.
//!
//! It serves the DAOS 2.8 management API (`mgmt.MgmtSvc`) with DAOS's
//! semantics and error shapes, plus dpufs's own container and rank-control
//! services, so that the one DAOS client in `dpufs-daos` is tested against
//! it. State lives in an embedded transactional store under the data
//! directory; each simulated rank has an endpoint and a directory of its own.
//!
//! The data plane is the DFS service ([`dfs_service`]), which serves each container's
//! POSIX namespace ([`namespace`]) over the fabric.

pub mod acl;
pub mod admission;
pub mod containers;
pub mod dfs_service;
pub mod engine;
pub mod error;
pub mod layout;
pub mod namespace;
pub mod pools;
pub mod props;
pub mod ranks;
pub mod records;
pub mod server;
pub mod service;
pub mod snapshots;
pub mod store;
pub mod system;
pub mod tls;
pub mod version;

pub use engine::{Engine, EngineConfig};
pub use error::EngineError;
