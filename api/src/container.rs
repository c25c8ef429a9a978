//! `DaosContainer`: a POSIX (DFS) container in a DaosPool, for volumes that
//! several workloads share and for statically provisioned volumes.

use crate::common::DeletionPolicy;
use crate::quantity::{self, ByteQuantity};
use crate::validation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

/// The container to create and keep. A PersistentVolume can name it to mount
/// its files.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "dpufs.io",
    version = "v1alpha1",
    kind = "DaosContainer",
    namespaced,
    shortname = "dcont",
    category = "dpufs",
    status = "DaosContainerStatus",
    derive = "PartialEq",
    doc = "A POSIX (DFS) container in a DaosPool, for shared and statically provisioned volumes. The operator creates it and keeps its ACL and owner as written.",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.poolRef"}"#,
    printcolumn = r#"{"name":"Label","type":"string","jsonPath":".status.label"}"#,
    printcolumn = r#"{"name":"Capacity","type":"string","jsonPath":".spec.capacity"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"UUID","type":"string","jsonPath":".status.uuid","priority":1}"#,
    printcolumn = r#"{"name":"Deletion","type":"string","jsonPath":".spec.deletionPolicy","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct DaosContainerSpec {
    /// Name of the DaosPool the container lives in. Cannot be changed.
    #[schemars(transform = validation::pool_ref)]
    pub pool_ref: String,

    /// DAOS label of the container: at most 127 letters, digits, `.`, `_`, `:`
    /// and `-`, not a UUID, unique in the pool. When omitted, the operator
    /// derives one from the namespace and name. Cannot be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::container_label)]
    pub label: Option<String>,

    /// Container layout. Only POSIX (a DFS file system) is supported. Cannot be
    /// changed.
    #[serde(default)]
    pub layout: ContainerLayout,

    /// Redundancy factor (`rd_fac`), 0 to 4; the pool's when omitted. Cannot
    /// be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 4))]
    pub redundancy_factor: Option<u8>,

    /// Object class of all objects (dmg's `--oclass`), for example SX, RP_3G1
    /// or EC_8P2GX. DFS picks by redundancy factor when omitted. Cannot be
    /// changed. Not applied yet: DAOS keeps object classes in the DFS
    /// superblock, which only a libdaos backend can write, and the embedded
    /// engine has no object classes; the operator records a warning event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::object_class)]
    pub object_class: Option<String>,

    /// Object class of directories (`--dir-oclass`), overriding `objectClass`.
    /// Cannot be changed. Not applied yet, as `objectClass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::object_class)]
    pub directory_object_class: Option<String>,

    /// Object class of files (`--file-oclass`), overriding `objectClass`.
    /// Cannot be changed. Not applied yet, as `objectClass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::object_class)]
    pub file_object_class: Option<String>,

    /// DFS chunk size of files, 4Ki to 1Gi; 1Mi when omitted. Cannot be
    /// changed. Passed as the container property `dpufs_chunk_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = quantity::chunk_size)]
    pub chunk_size: Option<ByteQuantity>,

    /// Space the container may use, for example `500Gi`. Passed as the
    /// container property `dpufs_quota` and kept as written when changed. The
    /// embedded engine enforces it; DAOS itself has no container quotas, so
    /// on a real DAOS system it is advisory. Removing it leaves the last
    /// quota in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = quantity::nonzero)]
    pub capacity: Option<ByteQuantity>,

    /// Access control entries `TYPE:FLAGS:PRINCIPAL:PERMS`, for example
    /// `A::alice@:rw`. Permissions: r read, w write, d delete, t get
    /// properties, T set properties, a get ACL, A set ACL, o set owner (`c`,
    /// create containers, exists on pools only). When omitted, DAOS's default
    /// ACL applies. The operator adds these entries and restores them when they
    /// drift; entries others added are left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::container_acl)]
    pub acl: Option<Vec<String>>,

    /// Owning user, `name@`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::principal)]
    pub owner: Option<String>,

    /// Owning group, `name@`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::principal)]
    pub group: Option<String>,

    /// What deleting this object does to the DAOS container. Retain (default):
    /// the container and its files stay in the pool. Delete: the operator
    /// destroys the container, but only once no PersistentVolume uses it;
    /// until then the object stays with the DeletionBlocked condition.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
}

fn spec_rules(schema: &mut Schema) {
    for field in [
        "label",
        "layout",
        "redundancyFactor",
        "objectClass",
        "directoryObjectClass",
        "fileObjectClass",
        "chunkSize",
    ] {
        validation::immutable_field(
            schema,
            field,
            &format!("{field} cannot be added, changed or removed after the container is created"),
        );
    }
}

/// The container's layout type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ContainerLayout {
    /// A POSIX file system (DFS).
    #[default]
    #[serde(rename = "POSIX")]
    Posix,
}

/// What the operator last saw of the container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DaosContainerStatus {
    /// Container UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,

    /// DAOS label of the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,

    /// UUID of the pool the container is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_uuid: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: the container exists and matches the spec. `DeletionBlocked`:
    /// deletion waits for volumes that use the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = validation::conditions)]
    pub conditions: Vec<Condition>,
}
