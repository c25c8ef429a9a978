//! `DaosTenant`: who may use which pools, read by the CSI driver.

use crate::quantity::{self, ByteQuantity};
use crate::validation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

/// Which namespaces belong to the tenant, which pools it may use, and the DAOS
/// principal its volumes are granted to.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "dpufs.io",
    version = "v1alpha1",
    kind = "DaosTenant",
    shortname = "dtenant",
    category = "dpufs",
    status = "DaosTenantStatus",
    derive = "PartialEq",
    doc = "A tenant of dpufs: its namespaces, the DaosPools it may use, the DAOS principal its volumes are granted to, and its limits. The CSI driver reads it; its volumes are isolated from other tenants down to the RDMA layer.",
    printcolumn = r#"{"name":"Principal","type":"string","jsonPath":".spec.principal"}"#,
    printcolumn = r#"{"name":"Pools","type":"string","jsonPath":".spec.allowedPools"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct DaosTenantSpec {
    /// Namespaces of the tenant. Exactly one of `namespaces` and
    /// `namespaceSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::namespace_names)]
    pub namespaces: Option<Vec<String>>,

    /// Labels selecting the namespaces of the tenant. Exactly one of
    /// `namespaces` and `namespaceSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Names of the DaosPools the tenant's volumes may be created in.
    #[schemars(transform = validation::pool_names)]
    pub allowed_pools: Vec<String>,

    /// DAOS user principal the tenant's containers are granted to, `name@`.
    /// Node agents assert it for the tenant's volume workers. Cannot be
    /// changed: it is written into the containers' ACLs.
    #[schemars(transform = validation::tenant_principal)]
    pub principal: String,

    /// How long a scoped rkey stays valid, in milliseconds, up to 60000. 0, the
    /// default, binds a key per transfer and invalidates it after the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 60000))]
    pub rkey_lease_milliseconds: Option<u32>,

    /// Limits on what the tenant provisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<TenantLimits>,

    /// The uid the tenant's volume workers run as on every node, for DAOS systems with
    /// `backend: daos`: DAOS's agent identifies a process by its uid, so each node's agent
    /// must map this uid to the principal's user. Unset: each node gives the tenant a uid of
    /// its own `--tenant-uids` range. It may be set later, but once set it cannot be changed
    /// or removed: the agents' maps name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1000, max = 4294967294u32))]
    pub uid: Option<u32>,
}

fn spec_rules(schema: &mut Schema) {
    validation::push(
        schema,
        validation::rule(
            "has(self.namespaces) != has(self.namespaceSelector)",
            "has(self.namespaces) ? 'set namespaces or namespaceSelector, not both' : 'set namespaces (a list of names) or namespaceSelector (namespace labels) to say which namespaces belong to the tenant'",
        ),
    );
    validation::settled_field(
        schema,
        "uid",
        "uid cannot be changed or removed once set: the DAOS agents' user maps name it; create a new DaosTenant instead",
    );
}

/// Limits on what a tenant provisions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantLimits {
    /// Total capacity of the tenant's volumes, for example `50Ti`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = quantity::nonzero)]
    pub capacity: Option<ByteQuantity>,

    /// Number of volumes the tenant may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub volumes: Option<u32>,
}

/// What the operator last saw of the tenant: written whenever the tenant, a
/// DaosPool or a Namespace changes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DaosTenantStatus {
    /// The namespaces that belong to the tenant now, sorted: those of
    /// `namespaces` that exist, or those whose labels match
    /// `namespaceSelector`. Namespaces being deleted are left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: the principal is valid and every allowed pool exists as a
    /// DaosPool. When False, the reason is `PoolNotFound` (the message names
    /// the missing pools), `InvalidPrincipal` or `InvalidSelector`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = validation::conditions)]
    pub conditions: Vec<Condition>,
}
