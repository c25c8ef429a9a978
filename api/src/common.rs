//! Types and names shared by the kinds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Finalizer the operator puts on a DaosPool before it creates the DAOS pool.
pub const POOL_FINALIZER: &str = "dpufs.io/pool-protection";

/// Finalizer the operator puts on a DaosContainer before it creates the DAOS container.
pub const CONTAINER_FINALIZER: &str = "dpufs.io/container-protection";

/// Condition types (`status.conditions[].type`).
pub mod condition {
    /// The DAOS object exists and matches the spec.
    pub const READY: &str = "Ready";
    /// The pool works with reduced redundancy (targets excluded or rebuilding).
    pub const DEGRADED: &str = "Degraded";
    /// Deletion with `deletionPolicy: Delete` waits for dependents to go away.
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";
}

/// What deleting the Kubernetes object does to the DAOS pool or container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep the DAOS object and its data; only the Kubernetes object goes away.
    #[default]
    Retain,
    /// Destroy the DAOS object and its data.
    Delete,
}
