//! The errors of each CSI operation, and their gRPC codes.
//!
//! Every RPC returns its own error enum; all of them meet in [`CsiError`], whose
//! [`CsiError::code`] is the one place that decides gRPC codes (CSI v1.12 "Error Scheme"
//! and the per-RPC tables). The message is the error's text, meant for people (it ends up
//! in PVC events); `status.details` stays empty, as CSI requires.

use crate::csi::directory::DirectoryError;
use crate::csi::label::NameError;
use crate::csi::locks::Busy;
use crate::csi::node::uids::UidError;
use crate::csi::params::ParamError;
use crate::csi::volume_id::VolumeIdError;
use dpufs_daos::DaosError;
use tonic::{Code, Status};

/// A volume capability this driver does not support.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    #[error("a volume capability has no access mode")]
    MissingAccessMode,
    #[error("a volume capability has no access type (mount or block)")]
    MissingAccessType,
    #[error(
        "block access is not supported: dfs.dpufs.io volumes are file systems (use volumeMode: Filesystem)"
    )]
    Block,
    #[error("access mode {0} is not supported")]
    AccessMode(String),
    #[error("file system type {0:?} is not supported: leave fsType empty (or use dfs)")]
    FsType(String),
}

/// A capacity range this driver cannot satisfy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    #[error("capacity range has a negative bound (required {required}, limit {limit})")]
    Negative { required: i64, limit: i64 },
    #[error("capacity range asks for at least {required} bytes but at most {limit}")]
    RequiredAboveLimit { required: u64, limit: u64 },
    #[error("{requested} bytes is more than pool {pool:?} can hold ({pool_bytes} bytes of data)")]
    ExceedsPool {
        pool: String,
        requested: u64,
        pool_bytes: u64,
    },
}

/// CreateVolume.
#[derive(Debug, thiserror::Error)]
pub enum CreateVolumeError {
    #[error("CreateVolume needs a volume name")]
    MissingName,
    #[error("volume name {name:?} is not acceptable: {source}")]
    InvalidName { name: String, source: NameError },
    #[error("CreateVolume needs at least one volume capability")]
    MissingCapabilities,
    #[error("{0}")]
    Capability(#[from] CapabilityError),
    #[error(
        "a volume cannot be cloned from another volume directly: create a VolumeSnapshot of it, then a volume from that"
    )]
    ContentSource,
    #[error("the content source names no snapshot id")]
    MissingSnapshotId,
    #[error(
        "a volume with a pool of its own (provisioning=pool) cannot be made from a snapshot: its data would have to be copied between pools; use a StorageClass with provisioning=container"
    )]
    SourceForOwnPool,
    #[error("snapshot {0} does not exist")]
    SnapshotNotFound(String),
    #[error(
        "snapshot {snapshot} is in pool {snapshot_pool}; a volume from it is made in the same pool, not in {pool:?}: use a StorageClass of that pool"
    )]
    SnapshotElsewhere {
        snapshot: String,
        snapshot_pool: String,
        pool: String,
    },
    #[error("{0}")]
    Params(#[from] ParamError),
    #[error("{0}")]
    Capacity(#[from] CapacityError),
    #[error("{0}")]
    Directory(#[from] DirectoryError),
    #[error(
        "tenant {tenant:?} may use several pools ({}); set the StorageClass parameter pool",
        .allowed.join(", ")
    )]
    PoolRequired {
        tenant: String,
        allowed: Vec<String>,
    },
    #[error(
        "tenant {tenant:?} may not use pool {pool:?}; its allowedPools are {}",
        .allowed.join(", ")
    )]
    PoolNotAllowed {
        tenant: String,
        pool: String,
        allowed: Vec<String>,
    },
    #[error("pool {pool:?} ({uuid}) does not exist in DAOS system {system:?}")]
    PoolMissing {
        system: String,
        pool: String,
        uuid: String,
    },
    #[error(
        "DAOS system {system:?} is not in the requisite topology ({requisite}); volumes of this StorageClass can only be placed there"
    )]
    Topology { system: String, requisite: String },
    #[error("volume {name:?} already exists with other settings: {}", .differences.join("; "))]
    Incompatible {
        name: String,
        differences: Vec<String>,
    },
    #[error(
        "volume {name:?} already exists in pool {pool:?}, not in the requested pool {requested:?}"
    )]
    InOtherPool {
        name: String,
        pool: String,
        requested: String,
    },
    #[error("container label {label} is taken by a container of volume {other:?}")]
    LabelTaken { label: String, other: String },
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("{step}: {source}")]
    Daos { step: String, source: DaosError },
}

/// DeleteVolume.
#[derive(Debug, thiserror::Error)]
pub enum DeleteVolumeError {
    #[error("DeleteVolume needs a volume id")]
    MissingId,
    #[error("{0}")]
    MalformedId(VolumeIdError),
    #[error("{0}")]
    Directory(#[from] DirectoryError),
    #[error(
        "container {container} (label {label:?}) in volume {id} was not provisioned by dfs.dpufs.io; it is not deleted"
    )]
    NotOurs {
        id: String,
        container: String,
        label: String,
    },
    #[error("volume {id} is in use: {message}")]
    InUse { id: String, message: String },
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("{step}: {source}")]
    Daos { step: String, source: DaosError },
}

/// ValidateVolumeCapabilities.
#[derive(Debug, thiserror::Error)]
pub enum ValidateVolumeError {
    #[error("ValidateVolumeCapabilities needs a volume id")]
    MissingId,
    #[error("ValidateVolumeCapabilities needs at least one volume capability")]
    MissingCapabilities,
    #[error("{0}")]
    MalformedId(VolumeIdError),
    #[error("volume {0} does not exist")]
    NotFound(String),
    #[error("{0}")]
    Directory(#[from] DirectoryError),
    #[error("{step}: {source}")]
    Daos { step: String, source: DaosError },
}

/// ControllerExpandVolume.
#[derive(Debug, thiserror::Error)]
pub enum ExpandVolumeError {
    #[error("ControllerExpandVolume needs a volume id")]
    MissingId,
    #[error("ControllerExpandVolume needs a capacity range with required_bytes")]
    MissingCapacity,
    #[error("{0}")]
    MalformedId(VolumeIdError),
    #[error("volume {0} does not exist")]
    NotFound(String),
    #[error("{0}")]
    Capability(#[from] CapabilityError),
    #[error("{0}")]
    Capacity(#[from] CapacityError),
    #[error(
        "container {container} (label {label:?}) in volume {id} was not provisioned by dfs.dpufs.io; it is not changed"
    )]
    NotOurs {
        id: String,
        container: String,
        label: String,
    },
    #[error("{0}")]
    Directory(#[from] DirectoryError),
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("{step}: {source}")]
    Daos { step: String, source: DaosError },
}

/// ControllerModifyVolume.
#[derive(Debug, thiserror::Error)]
pub enum ModifyVolumeError {
    #[error("ControllerModifyVolume needs a volume id")]
    MissingId,
    #[error("{0}")]
    MalformedId(VolumeIdError),
    #[error("{0}")]
    Params(#[from] ParamError),
    #[error("volume {0} does not exist")]
    NotFound(String),
    #[error(
        "container {container} (label {label:?}) in volume {id} was not provisioned by dfs.dpufs.io; it is not changed"
    )]
    NotOurs {
        id: String,
        container: String,
        label: String,
    },
    #[error("{0}")]
    Directory(#[from] DirectoryError),
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("{step}: {source}")]
    Daos { step: String, source: DaosError },
}

/// CreateSnapshot, DeleteSnapshot and ListSnapshots.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0} needs a snapshot name")]
    MissingName(&'static str),
    #[error("{0} needs a source volume id")]
    MissingSource(&'static str),
    #[error("{0} needs a snapshot id")]
    MissingId(&'static str),
    #[error("{0}")]
    MalformedId(VolumeIdError),
    #[error("unknown snapshot parameters: {}", .0.join(", "))]
    UnknownParameters(Vec<String>),
    #[error("volume {0} does not exist")]
    SourceNotFound(String),
    #[error("snapshot name {name:?} is taken by a snapshot of another volume, {volume}")]
    NameTaken { name: String, volume: String },
    #[error("starting token {0:?} is not one this driver gave")]
    BadToken(String),
    #[error("{0}")]
    Directory(#[from] DirectoryError),
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("{step}: {source}")]
    Daos { step: String, source: DaosError },
}

/// ListVolumes, ControllerGetVolume and GetCapacity.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("ControllerGetVolume needs a volume id")]
    MissingId,
    #[error("{0}")]
    MalformedId(VolumeIdError),
    #[error("volume {0} does not exist")]
    NotFound(String),
    #[error("starting token {0:?} is not one this driver gave")]
    BadToken(String),
    #[error("{0}")]
    Params(#[from] ParamError),
    #[error("{0}")]
    Directory(#[from] DirectoryError),
    #[error("{step}: {source}")]
    Daos { step: String, source: DaosError },
}

/// A path kubelet passed that the node plugin will not touch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {path:?} {reason}")]
pub struct PathError {
    pub what: &'static str,
    pub path: String,
    pub reason: &'static str,
}

/// NodeStageVolume and NodeUnstageVolume.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{0} needs a volume id")]
    MissingId(&'static str),
    #[error("{0} needs a staging target path")]
    MissingStagingPath(&'static str),
    #[error("NodeStageVolume needs a volume capability")]
    MissingCapability,
    #[error("{0}")]
    Path(#[from] PathError),
    #[error("{0}")]
    Capability(#[from] CapabilityError),
    #[error("{0}")]
    MalformedId(VolumeIdError),
    #[error("volume {0} does not exist")]
    NotFound(String),
    #[error(
        "container {container} in volume {id} was not provisioned by dfs.dpufs.io (it has no request record); static volumes of other containers are not supported"
    )]
    NotOurs { id: String, container: String },
    #[error("volume {id} is staged at {at}, not at {asked}")]
    StagedElsewhere {
        id: String,
        at: String,
        asked: String,
    },
    #[error("volume {id} is staged for {staged}; a stage for {asked} needs it unstaged first")]
    OtherAccess {
        id: String,
        staged: &'static str,
        asked: &'static str,
    },
    #[error("this node already has {max} volumes staged (max_volumes_per_node)")]
    TooManyVolumes { max: i64 },
    #[error("DAOS system {0:?} has no data endpoint configured: nodes cannot reach its volumes")]
    NoDataEndpoint(String),
    #[error("{0}")]
    TenantUid(#[from] UidError),
    #[error("{0}")]
    Directory(#[from] DirectoryError),
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("{step}: {source}")]
    Daos { step: String, source: DaosError },
    #[error("{step}: {detail}")]
    Node { step: String, detail: String },
}

/// Why a pod's namespace may not use a volume: host mode's NodePublishVolume and the DPU
/// agent's StageVolume decide it the same way (`csi::node::prepare::Stager::check_tenant`).
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error(
        "namespace {namespace:?} belongs to tenant {tenant:?}, but volume {id} belongs to tenant {owner:?}"
    )]
    OtherTenant {
        id: String,
        namespace: String,
        tenant: String,
        owner: String,
    },
    #[error("the pod's namespace may not use volume {id}: {source}")]
    NoTenant { id: String, source: DirectoryError },
    #[error("looking up the pod's tenant: {0}")]
    Directory(DirectoryError),
}

/// NodePublishVolume and NodeUnpublishVolume.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("{0} needs a volume id")]
    MissingId(&'static str),
    /// CSI: with STAGE_UNSTAGE_VOLUME, a publish without a staging path is "stage not
    /// performed" — FAILED_PRECONDITION, the CO must stage first.
    #[error(
        "NodePublishVolume needs the staging target path of NodeStageVolume: this node stages volumes before it publishes them"
    )]
    MissingStagingPath,
    #[error("{0} needs a target path")]
    MissingTargetPath(&'static str),
    #[error("NodePublishVolume needs a volume capability")]
    MissingCapability,
    #[error("{0}")]
    Path(#[from] PathError),
    #[error("{0}")]
    Capability(#[from] CapabilityError),
    #[error("{0}")]
    MalformedId(VolumeIdError),
    #[error("volume {0} is not staged on this node")]
    NotFound(String),
    #[error("volume {id} is not staged at {staging}; NodeStageVolume first")]
    NotStaged { id: String, staging: String },
    #[error(
        "{target} is a mount of something other than a volume of dfs.dpufs.io; not unmounting it"
    )]
    NotOurMount { target: String },
    #[error("{0}")]
    Tenant(#[from] TenantError),
    #[error(
        "{target} is already a mount of volume {id} {}; publish it there with the same settings",
        if *.read_only { "read-only" } else { "read-write" }
    )]
    Incompatible {
        id: String,
        target: String,
        read_only: bool,
    },
    #[error("{target} is already mounted by something else")]
    TargetInUse { target: String },
    #[error(
        "volume {id} is SINGLE_NODE_SINGLE_WRITER and already published at {other}; unpublish it there first"
    )]
    SingleWriterInUse { id: String, other: String },
    #[error(
        "volume_mount_group {0:?} is not a group id (kubelet sends the pod's fsGroup, a decimal number)"
    )]
    MountGroup(String),
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("{step}: {detail}")]
    Node { step: String, detail: String },
}

/// NodeGetVolumeStats.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("NodeGetVolumeStats needs a volume id")]
    MissingId,
    #[error("NodeGetVolumeStats needs a volume path")]
    MissingPath,
    #[error("{0}")]
    Path(#[from] PathError),
    #[error("{path} is not a staged or published path of volume {id} on this node")]
    NotFound { id: String, path: String },
}

/// Every error a CSI call of this driver can end with.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("CreateVolume: {0}")]
    CreateVolume(#[from] CreateVolumeError),
    #[error("DeleteVolume: {0}")]
    DeleteVolume(#[from] DeleteVolumeError),
    #[error("ValidateVolumeCapabilities: {0}")]
    ValidateVolume(#[from] ValidateVolumeError),
    #[error("ControllerExpandVolume: {0}")]
    ExpandVolume(#[from] ExpandVolumeError),
    #[error("ControllerModifyVolume: {0}")]
    ModifyVolume(#[from] ModifyVolumeError),
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    #[error("{0}")]
    Inventory(#[from] InventoryError),
    #[error("{0}")]
    Stage(#[from] StageError),
    #[error("{0}")]
    Publish(#[from] PublishError),
    #[error("NodeGetVolumeStats: {0}")]
    Stats(#[from] StatsError),
    #[error("{0} is not implemented by dfs.dpufs.io (not in its capabilities)")]
    Unimplemented(&'static str),
}

impl CsiError {
    /// The gRPC code of every error: the one table of this driver.
    pub fn code(&self) -> Code {
        use CreateVolumeError as C;
        use DeleteVolumeError as D;
        use ExpandVolumeError as E;
        use ValidateVolumeError as V;
        match self {
            CsiError::CreateVolume(e) => match e {
                C::MissingName
                | C::InvalidName { .. }
                | C::MissingCapabilities
                | C::Capability(_)
                | C::ContentSource
                | C::MissingSnapshotId
                | C::SourceForOwnPool
                | C::SnapshotElsewhere { .. }
                | C::PoolRequired { .. } => Code::InvalidArgument,
                C::Params(_) => Code::InvalidArgument,
                C::Capacity(_) => Code::OutOfRange,
                C::SnapshotNotFound(_) => Code::NotFound,
                C::Directory(d) => directory_code(d),
                C::PoolNotAllowed { .. } => Code::PermissionDenied,
                C::PoolMissing { .. } => Code::FailedPrecondition,
                C::Topology { .. } => Code::ResourceExhausted,
                C::Incompatible { .. } | C::InOtherPool { .. } => Code::AlreadyExists,
                C::LabelTaken { .. } => Code::Internal,
                C::Busy(_) => Code::Aborted,
                // DAOS refusing what the parameters asked for (rd_fac beyond the pool's
                // fault domains...) is the caller's to fix.
                C::Daos {
                    source: DaosError::Invalid { .. },
                    ..
                } => Code::InvalidArgument,
                C::Daos { source, .. } => daos_code(source),
            },
            CsiError::DeleteVolume(e) => match e {
                D::MissingId | D::MalformedId(_) => Code::InvalidArgument,
                D::Directory(d) => directory_code(d),
                D::NotOurs { .. } | D::InUse { .. } => Code::FailedPrecondition,
                D::Busy(_) => Code::Aborted,
                D::Daos { source, .. } => daos_code(source),
            },
            CsiError::ValidateVolume(e) => match e {
                V::MissingId | V::MissingCapabilities => Code::InvalidArgument,
                V::MalformedId(VolumeIdError::Foreign(_)) => Code::NotFound,
                V::MalformedId(_) => Code::InvalidArgument,
                V::NotFound(_) => Code::NotFound,
                V::Directory(d) => directory_code(d),
                V::Daos { source, .. } => daos_code(source),
            },
            CsiError::ExpandVolume(e) => match e {
                E::MissingId | E::MissingCapacity | E::Capability(_) => Code::InvalidArgument,
                E::MalformedId(VolumeIdError::Foreign(_)) => Code::NotFound,
                E::MalformedId(_) => Code::InvalidArgument,
                E::NotFound(_) => Code::NotFound,
                E::Capacity(_) => Code::OutOfRange,
                E::NotOurs { .. } => Code::FailedPrecondition,
                E::Directory(d) => directory_code(d),
                E::Busy(_) => Code::Aborted,
                E::Daos { source, .. } => daos_code(source),
            },
            CsiError::ModifyVolume(e) => modify_code(e),
            CsiError::Snapshot(e) => snapshot_code(e),
            CsiError::Inventory(e) => match e {
                InventoryError::MissingId | InventoryError::Params(_) => Code::InvalidArgument,
                InventoryError::MalformedId(VolumeIdError::Foreign(_))
                | InventoryError::NotFound(_) => Code::NotFound,
                InventoryError::MalformedId(_) => Code::InvalidArgument,
                InventoryError::BadToken(_) => Code::Aborted,
                InventoryError::Directory(d) => directory_code(d),
                InventoryError::Daos { source, .. } => daos_code(source),
            },
            CsiError::Stage(e) => stage_code(e),
            CsiError::Publish(e) => publish_code(e),
            CsiError::Stats(e) => match e {
                StatsError::MissingId | StatsError::MissingPath | StatsError::Path(_) => {
                    Code::InvalidArgument
                }
                StatsError::NotFound { .. } => Code::NotFound,
            },
            CsiError::Unimplemented(_) => Code::Unimplemented,
        }
    }
}

fn snapshot_code(e: &SnapshotError) -> Code {
    use SnapshotError as S;
    match e {
        S::MissingName(_)
        | S::MissingSource(_)
        | S::MissingId(_)
        | S::UnknownParameters(_)
        | S::MalformedId(_) => Code::InvalidArgument,
        S::SourceNotFound(_) => Code::NotFound,
        S::NameTaken { .. } => Code::AlreadyExists,
        S::BadToken(_) | S::Busy(_) => Code::Aborted,
        S::Directory(d) => directory_code(d),
        S::Daos {
            source: DaosError::NotFound { .. },
            ..
        } => Code::NotFound,
        S::Daos { source, .. } => daos_code(source),
    }
}

/// The code of a stage error; also the DPU agent's, for the part of staging it shares.
pub(crate) fn stage_code(e: &StageError) -> Code {
    use StageError as S;
    match e {
        S::MissingId(_)
        | S::MissingStagingPath(_)
        | S::MissingCapability
        | S::Path(_)
        | S::Capability(_) => Code::InvalidArgument,
        S::MalformedId(VolumeIdError::Foreign(_)) | S::NotFound(_) => Code::NotFound,
        S::MalformedId(_) => Code::InvalidArgument,
        S::NotOurs { .. } | S::NoDataEndpoint(_) | S::StagedElsewhere { .. } => {
            Code::FailedPrecondition
        }
        S::OtherAccess { .. } => Code::AlreadyExists,
        S::TooManyVolumes { .. } => Code::ResourceExhausted,
        S::TenantUid(e) => uid_code(e),
        S::Directory(d) => directory_code(d),
        S::Busy(_) => Code::Aborted,
        S::Daos {
            source: DaosError::NotFound { .. },
            ..
        } => Code::NotFound,
        S::Daos { source, .. } => daos_code(source),
        S::Node { .. } => Code::Internal,
    }
}

/// A node with no tenant uid range, a tenant whose principal names no user, or two tenants
/// naming one uid cannot serve DAOS volumes until they are configured; a full range is
/// exhausted; a damaged record is ours.
fn uid_code(e: &UidError) -> Code {
    match e {
        UidError::NoRange | UidError::NotAUser(_) | UidError::Taken { .. } => {
            Code::FailedPrecondition
        }
        UidError::Exhausted { .. } => Code::ResourceExhausted,
        UidError::Record { .. } => Code::Internal,
    }
}

fn publish_code(e: &PublishError) -> Code {
    use PublishError as P;
    match e {
        P::MissingId(_)
        | P::MissingTargetPath(_)
        | P::MissingCapability
        | P::Path(_)
        | P::Capability(_)
        | P::MountGroup(_) => Code::InvalidArgument,
        P::MalformedId(VolumeIdError::Foreign(_)) | P::NotFound(_) => Code::NotFound,
        P::MalformedId(_) => Code::InvalidArgument,
        P::NotStaged { .. }
        | P::MissingStagingPath
        | P::TargetInUse { .. }
        | P::NotOurMount { .. }
        | P::SingleWriterInUse { .. } => Code::FailedPrecondition,
        P::Tenant(e) => tenant_code(e),
        P::Incompatible { .. } => Code::AlreadyExists,
        P::Busy(_) => Code::Aborted,
        P::Node { .. } => Code::Internal,
    }
}

/// The code of a tenant refusal; also the DPU agent's.
pub(crate) fn tenant_code(e: &TenantError) -> Code {
    match e {
        TenantError::OtherTenant { .. } | TenantError::NoTenant { .. } => Code::PermissionDenied,
        TenantError::Directory(d) => directory_code(d),
    }
}

fn directory_code(e: &DirectoryError) -> Code {
    match e {
        DirectoryError::SeveralSystems(_) => Code::InvalidArgument,
        DirectoryError::NoSystem
        | DirectoryError::UnknownSystem(_)
        | DirectoryError::UnknownPool { .. }
        | DirectoryError::NoTenant(_)
        | DirectoryError::NoDefaultTenant => Code::FailedPrecondition,
        DirectoryError::Unavailable(_) => Code::Unavailable,
    }
}

fn daos_code(e: &DaosError) -> Code {
    match e {
        DaosError::NotFound { .. } => Code::NotFound,
        // Someone else changed the same object meanwhile; a retry sees the result.
        DaosError::Exists { .. } => Code::Aborted,
        DaosError::NoSpace { .. } => Code::ResourceExhausted,
        DaosError::PermissionDenied { .. } => Code::PermissionDenied,
        DaosError::Busy { .. }
        | DaosError::Unreachable { .. }
        | DaosError::Timeout(..)
        | DaosError::NotLeader { .. }
        | DaosError::NotReplica { .. } => Code::Unavailable,
        DaosError::Incompatible { .. } | DaosError::Config(_) => Code::FailedPrecondition,
        DaosError::Rpc {
            code: Code::Unavailable | Code::DeadlineExceeded,
            ..
        } => Code::Unavailable,
        e if e.is_retryable() => Code::Unavailable,
        DaosError::Invalid { .. }
        | DaosError::Fault { .. }
        | DaosError::Der { .. }
        | DaosError::Rpc { .. } => Code::Internal,
    }
}

/// ControllerModifyVolume: a parameter it cannot take is INVALID_ARGUMENT, which CSI 1.12
/// reads as "nothing applied, do not retry"; it is checked before anything is changed.
fn modify_code(e: &ModifyVolumeError) -> Code {
    use ModifyVolumeError as M;
    match e {
        M::MissingId | M::Params(_) => Code::InvalidArgument,
        M::MalformedId(VolumeIdError::Foreign(_)) | M::NotFound(_) => Code::NotFound,
        M::MalformedId(_) => Code::InvalidArgument,
        M::NotOurs { .. } => Code::FailedPrecondition,
        M::Directory(d) => directory_code(d),
        M::Busy(_) => Code::Aborted,
        M::Daos { source, .. } => daos_code(source),
    }
}

impl From<CsiError> for Status {
    fn from(e: CsiError) -> Status {
        // Status::new leaves `details` empty.
        Status::new(e.code(), e.to_string())
    }
}

macro_rules! into_status {
    ($($t:ty),*) => {$(
        impl From<$t> for Status {
            fn from(e: $t) -> Status {
                CsiError::from(e).into()
            }
        }
    )*};
}

into_status!(
    CreateVolumeError,
    DeleteVolumeError,
    ValidateVolumeError,
    ExpandVolumeError,
    ModifyVolumeError,
    StageError,
    PublishError,
    StatsError,
    SnapshotError,
    InventoryError
);

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
