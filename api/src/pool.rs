//! `DaosPool`: a DAOS pool, its size, placement, properties and ACL.

use crate::common::DeletionPolicy;
use crate::quantity::{self, ByteQuantity};
use crate::validation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

/// The pool to create and keep: size, placement, properties, ACL and owner.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "dpufs.io",
    version = "v1alpha1",
    kind = "DaosPool",
    shortname = "dpool",
    category = "dpufs",
    status = "DaosPoolStatus",
    derive = "PartialEq",
    doc = "A DAOS pool: size, placement, properties and ACL. The operator creates the pool in the DaosSystem named by spec.systemRef and keeps its properties and ACL as written.",
    printcolumn = r#"{"name":"System","type":"string","jsonPath":".spec.systemRef"}"#,
    printcolumn = r#"{"name":"Label","type":"string","jsonPath":".status.label"}"#,
    printcolumn = r#"{"name":"Size","type":"string","jsonPath":".spec.size.totalBytes"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"UUID","type":"string","jsonPath":".status.uuid","priority":1}"#,
    printcolumn = r#"{"name":"Deletion","type":"string","jsonPath":".spec.deletionPolicy","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct DaosPoolSpec {
    /// Name of the DaosSystem the pool lives in. Cannot be changed.
    #[schemars(transform = validation::system_ref)]
    pub system_ref: String,

    /// DAOS label of the pool: at most 127 letters, digits, `.`, `_`, `:` and
    /// `-`, not a UUID, unique in the DAOS system. When omitted, the operator
    /// derives one from the object's name. Cannot be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::pool_label)]
    pub label: Option<String>,

    /// How big the pool is. Cannot be changed.
    pub size: PoolSize,

    /// Engine ranks to place the pool on; the management service chooses when
    /// omitted. Mutually exclusive with `numRanks`. Cannot be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::ranks)]
    pub ranks: Option<Vec<u32>>,

    /// Number of engine ranks to spread the pool over; all ranks when omitted.
    /// Mutually exclusive with `ranks`. Cannot be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub num_ranks: Option<u32>,

    /// Pool service (metadata) replicas: 1, 3, 5, 7 or 9; DAOS uses no more
    /// than there are ranks. DAOS's default (5 in DAOS 2.8) when omitted.
    /// Cannot be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 9), transform = validation::service_replicas)]
    pub service_replicas: Option<u8>,

    /// Pool properties; DAOS defaults apply to those not given. The operator
    /// sets changed values on the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<PoolProperties>,

    /// Access control entries `TYPE:FLAGS:PRINCIPAL:PERMS`, for example
    /// `A::alice@:rw` or `A:G:admins@:r`. Permissions: r read, w write,
    /// c create containers, d delete containers, t connect/get properties,
    /// T set properties, a get ACL, A set ACL. When omitted, DAOS's default
    /// ACL applies (owner and owner group read-write). The operator adds these
    /// entries and restores them when they drift; entries others added (for
    /// tenants) are left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::pool_acl)]
    pub acl: Option<Vec<String>>,

    /// Owning user, `name@`. Cannot be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::principal)]
    pub owner: Option<String>,

    /// Owning group, `name@`. Cannot be changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::principal)]
    pub group: Option<String>,

    /// What deleting this object does to the DAOS pool. Retain (default): the
    /// pool and its data stay in DAOS. Delete: the operator destroys the pool,
    /// but only once no DaosContainer and no PersistentVolume uses it; until
    /// then the object stays with the DeletionBlocked condition.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
}

fn spec_rules(schema: &mut Schema) {
    validation::push(
        schema,
        validation::rule(
            "!(has(self.ranks) && has(self.numRanks))",
            "'ranks names the ranks and numRanks counts them; set only one of the two'",
        ),
    );
    for field in [
        "label",
        "ranks",
        "numRanks",
        "serviceReplicas",
        "owner",
        "group",
    ] {
        validation::immutable_field(
            schema,
            field,
            &format!("{field} cannot be added, changed or removed after the pool is created"),
        );
    }
}

/// The size of a pool: either `totalBytes` (with an optional `tierRatio`) or
/// `tierBytes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = size_rules)]
pub struct PoolSize {
    /// Total size over all ranks and both tiers, for example `10Ti`. DAOS
    /// splits it by `tierRatio` and spreads it over the ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = quantity::nonzero)]
    pub total_bytes: Option<ByteQuantity>,

    /// With `totalBytes`: percent of the total for the metadata (SCM) tier and
    /// the data (NVMe) tier, adding up to 100. DAOS's default is [6, 94].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(range(max = 100)), transform = validation::tier_ratio)]
    pub tier_ratio: Option<Vec<u8>>,

    /// Instead of `totalBytes`: bytes per rank for the metadata (SCM) tier and
    /// the data (NVMe) tier, for example [`6Gi`, `94Gi`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::tier_bytes)]
    pub tier_bytes: Option<Vec<ByteQuantity>>,
}

fn size_rules(schema: &mut Schema) {
    validation::push(
        schema,
        validation::rule(
            "has(self.totalBytes) != has(self.tierBytes)",
            "has(self.totalBytes) ? 'set totalBytes or tierBytes, not both' : 'set totalBytes (the whole pool, for example 10Ti) or tierBytes (bytes per rank for the metadata and data tiers)'",
        ),
    );
    validation::push(
        schema,
        validation::rule(
            "!has(self.tierRatio) || has(self.totalBytes)",
            "'tierRatio splits totalBytes between the tiers; with tierBytes, give each tier its size directly'",
        ),
    );
    validation::immutable(
        schema,
        "size cannot be changed: DAOS pools do not shrink and dpufs does not grow them yet",
    );
}

/// Pool properties. Names follow dmg's; values and ranges are DAOS's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolProperties {
    /// Redundancy factor (`rd_fac`): how many concurrent engine failures the
    /// pool's data survives, 0 to 4. DAOS 2.8's default is 3, lowered to the
    /// number of fault domains minus one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 4))]
    pub redundancy_factor: Option<u8>,

    /// Percent of each target's space kept free for rebuild (`space_rb`), 0 to
    /// 100. DAOS 2.8's default is 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub rebuild_reserved_space_percent: Option<u8>,

    /// What DAOS does by itself when engines fail (`self_heal`): exclude,
    /// rebuild, delay_rebuild. An empty list turns self-healing off. DAOS's
    /// default is [exclude, rebuild].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::self_heal)]
    pub self_heal: Option<Vec<SelfHeal>>,

    /// When space of deleted data is reclaimed (`reclaim`): disabled, lazy or
    /// time. DAOS's default is lazy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<Reclaim>,

    /// Erasure-code cell size (`ec_cell_sz`), 1Ki to 1Gi. DAOS 2.8's default
    /// is 128Ki.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = quantity::ec_cell_size)]
    pub ec_cell_size: Option<ByteQuantity>,

    /// Writes of at least this size go to the data (NVMe) tier, smaller ones to
    /// the metadata tier (`data_thresh`). DAOS's default is 4Ki.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_threshold: Option<ByteQuantity>,

    /// Checksum scrubbing (`scrub`): disabled, lazy or timed. DAOS's default
    /// is disabled (`off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<Scrub>,

    /// Seconds between scrubs in timed mode (`scrub_freq`). DAOS's default is
    /// 604800 (a week).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub scrub_frequency_seconds: Option<u32>,

    /// Checksum errors after which a target is evicted (`scrub_thresh`); 0, the
    /// default, never evicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub_threshold: Option<u32>,

    /// Metadata checkpointing on MD-on-SSD systems (`checkpoint`): disabled,
    /// timed or lazy. DAOS's default is timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,

    /// Seconds between timed checkpoints (`checkpoint_freq`), 1 to 1048576.
    /// DAOS's default is 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub checkpoint_frequency_seconds: Option<u32>,

    /// Percent of the write-ahead log that triggers a lazy checkpoint
    /// (`checkpoint_thresh`), 10 to 75. DAOS's default is 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 75))]
    pub checkpoint_threshold_percent: Option<u8>,

    /// How a returning engine gets its data back (`reintegration`): data_sync,
    /// no_data_sync or incremental. DAOS's default is data_sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reintegration: Option<Reintegration>,
}

/// A self-healing action (`self_heal` flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SelfHeal {
    /// Exclude failed engines from the pool.
    Exclude,
    /// Rebuild their data on the remaining engines.
    Rebuild,
    /// Postpone the rebuild until asked.
    DelayRebuild,
}

/// When space is reclaimed (`reclaim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reclaim {
    /// Never.
    Disabled,
    /// When the pool is idle.
    Lazy,
    /// Periodically.
    Time,
}

/// Checksum scrubbing mode (`scrub`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scrub {
    /// No scrubbing: DAOS's `off`, named `disabled` here because YAML 1.1
    /// (kubectl) reads a bare `off` as `false`.
    Disabled,
    /// Scrub when the pool is idle.
    Lazy,
    /// Scrub every `scrubFrequencySeconds`.
    Timed,
}

/// Checkpoint mode (`checkpoint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Checkpoint {
    /// No checkpoints.
    Disabled,
    /// Every `checkpointFrequencySeconds`.
    Timed,
    /// When the log fills up to `checkpointThresholdPercent`.
    Lazy,
}

/// Reintegration mode (`reintegration`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reintegration {
    /// Copy the data back.
    DataSync,
    /// Bring the engine back without its data.
    NoDataSync,
    /// Copy only what changed.
    Incremental,
}

/// What the operator last saw of the pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DaosPoolStatus {
    /// Pool UUID. The operator chooses it before creating the pool, so a
    /// retried create finds the same pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,

    /// DAOS label of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,

    /// Pool service state: Creating, Ready, Destroying, TargetsExcluded or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,

    /// Rank of the pool service leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_leader: Option<u32>,

    /// Ranks of the pool service replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_replicas: Vec<u32>,

    /// Capacity and free space of each storage tier.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierUsage>,

    /// Rebuild state: idle, busy, done, stopping, stopped, failing or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_state: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: the pool exists and matches the spec. `Degraded`: targets are
    /// excluded or data is being rebuilt. `DeletionBlocked`: deletion waits for
    /// containers or volumes that use the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = validation::conditions)]
    pub conditions: Vec<Condition>,
}

/// Usage of one storage tier over the whole pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TierUsage {
    /// SCM (metadata tier) or NVMe (data tier).
    pub media_type: String,
    /// Capacity in bytes.
    pub total_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
}
