//! The Controller service: a DAOS container per volume, in a pool the tenant may use.
//!
//! **CreateVolume** is idempotent by name without any state of its own: the container's
//! label is a digest of the CSI name ([`label`]), so a retry, from this controller or
//! another after a crash at any step, finds the container and completes what is missing
//! (quota, ACL, attributes; the request record attribute is written last). A retry whose
//! request does not fit what exists (capacity outside the range, other properties, another
//! tenant, another pool) gets ALREADY_EXISTS.
//!
//! A volume's container has: the label, the properties of the StorageClass (layout POSIX,
//! `rd_fac`, `dpufs_chunk_size`), the quota `dpufs_quota` = the capacity (enforced by the
//! embedded engine, advisory on real DAOS), the ACL `A::OWNER@:rwdtTaAo` (the controller's
//! own identity, which owns the container) and `A::<tenant principal>:rwt` and nothing else,
//! and attributes holding the full CSI name, the request record and the PVC.
//!
//! Every call on one CSI name or volume id runs alone; a concurrent one gets ABORTED.

use crate::csi::TOPOLOGY_SYSTEM_KEY;
use crate::csi::directory::{Directory, PoolRef, SystemClients, Tenant};
use crate::csi::error::{
    CapabilityError, CapacityError, CreateVolumeError, CsiError, DeleteVolumeError,
    ExpandVolumeError, ValidateVolumeError,
};
use crate::csi::label::{
    self, NAME_ATTR, PV_NAME_ATTR, PVC_NAME_ATTR, PVC_NAMESPACE_ATTR, REQUEST_ATTR,
};
use crate::csi::locks::VolumeLocks;
use crate::csi::params::{self, ContainerProperties, VolumeParams};
use crate::csi::volume_id::{VolumeId, VolumeIdError};
use dpufs_daos::{ContainerInfo, ContainerSpec, DaosError};
use dpufs_proto::csi::v1::{
    self as csi, CapacityRange, ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerServiceCapability, CreateVolumeRequest, CreateVolumeResponse, DeleteVolumeRequest,
    DeleteVolumeResponse, Topology, TopologyRequirement, ValidateVolumeCapabilitiesRequest,
    ValidateVolumeCapabilitiesResponse, Volume, VolumeCapability, controller_server::Controller,
    controller_service_capability, validate_volume_capabilities_response::Confirmed,
    volume_capability,
};
use dpufs_proto::daos::props::{CONT_DPUFS_CHUNK_SIZE, CONT_DPUFS_QUOTA, CONT_RD_FAC, PropValue};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use tonic::{Request, Response, Status};
use uuid::Uuid;

/// Capacity of a volume whose request gives no required size: 1 GiB (capped by the limit).
pub const DEFAULT_CAPACITY: u64 = 1 << 30;

/// File system types a mount capability may name: none (the driver's) or `dfs`.
pub const FS_TYPES: [&str; 2] = ["", "dfs"];

/// Keys of a volume's `volume_context`.
pub const CTX_SYSTEM: &str = "system";
/// The pool's UUID.
pub const CTX_POOL: &str = "pool";
/// The DaosPool name.
pub const CTX_POOL_NAME: &str = "poolName";
/// The container's UUID.
pub const CTX_CONTAINER: &str = "container";
pub const CTX_CONTAINER_LABEL: &str = "containerLabel";
/// The DaosTenant name.
pub const CTX_TENANT: &str = "tenant";
/// The tenant's DAOS principal, granted in the container's ACL.
pub const CTX_PRINCIPAL: &str = "principal";

/// The ACL entry of the container's owner: the controller's own DAOS identity.
pub const OWNER_ACE: &str = "A::OWNER@:rwdtTaAo";
/// What a tenant may do in its volume's container: read, write, connect.
pub const TENANT_PERMS: &str = "rwt";

/// The ACL of a volume of the tenant with this principal.
pub fn volume_acl(principal: &str) -> Vec<String> {
    vec![
        OWNER_ACE.to_string(),
        format!("A::{principal}:{TENANT_PERMS}"),
    ]
}

/// What a volume was created with, kept in the [`REQUEST_ATTR`] attribute as JSON and
/// compared with later requests of the same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    pub system: String,
    /// The DaosPool name.
    pub pool: String,
    pub tenant: String,
    pub principal: String,
    #[serde(default)]
    pub properties: ContainerProperties,
}

/// The capacity a request asks for: its required bytes, or [`DEFAULT_CAPACITY`] capped by
/// its limit; and the range an existing volume must fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub bytes: u64,
    pub required: u64,
    /// 0: no limit.
    pub limit: u64,
}

impl Capacity {
    /// Reads a CSI capacity range.
    pub fn of(range: Option<&CapacityRange>) -> Result<Capacity, CapacityError> {
        let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        if required < 0 || limit < 0 {
            return Err(CapacityError::Negative { required, limit });
        }
        let (required, limit) = (required as u64, limit as u64);
        if limit > 0 && required > limit {
            return Err(CapacityError::RequiredAboveLimit { required, limit });
        }
        let bytes = match (required, limit) {
            (0, 0) => DEFAULT_CAPACITY,
            (0, l) => DEFAULT_CAPACITY.min(l),
            (r, _) => r,
        };
        Ok(Capacity {
            bytes,
            required,
            limit,
        })
    }

    /// Whether a volume of `bytes` satisfies the range.
    pub fn fits(&self, bytes: u64) -> bool {
        bytes >= self.required && (self.limit == 0 || bytes <= self.limit)
    }

    fn describe(&self) -> String {
        match self.limit {
            0 => format!("at least {} bytes", self.required),
            l => format!("{} to {l} bytes", self.required),
        }
    }
}

/// Checks one volume capability: mount access (fs type empty or `dfs`) with any of the
/// GA access modes a shared file system supports.
pub fn check_capability(cap: &VolumeCapability) -> Result<(), CapabilityError> {
    use volume_capability::access_mode::Mode;
    match &cap.access_type {
        None => return Err(CapabilityError::MissingAccessType),
        Some(volume_capability::AccessType::Block(_)) => return Err(CapabilityError::Block),
        Some(volume_capability::AccessType::Mount(m)) => {
            if !FS_TYPES.contains(&m.fs_type.as_str()) {
                return Err(CapabilityError::FsType(m.fs_type.clone()));
            }
        }
    }
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or(CapabilityError::MissingAccessMode)?
        .mode;
    match Mode::try_from(mode) {
        Ok(
            Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::MultiNodeReaderOnly
            | Mode::MultiNodeSingleWriter
            | Mode::MultiNodeMultiWriter,
        ) => Ok(()),
        // SINGLE_NODE_{SINGLE,MULTI}_WRITER need the SINGLE_NODE_MULTI_WRITER capability,
        // which this driver does not advertise.
        Ok(other) => Err(CapabilityError::AccessMode(other.as_str_name().to_string())),
        Err(_) => Err(CapabilityError::AccessMode(format!("{mode}"))),
    }
}

/// Checks that a volume of `system` may be placed as the request's topology requires: some
/// requisite topology allows the system (names it, or does not constrain it).
pub fn check_topology(
    req: Option<&TopologyRequirement>,
    system: &str,
) -> Result<(), CreateVolumeError> {
    let Some(req) = req.filter(|r| !r.requisite.is_empty()) else {
        return Ok(());
    };
    let allowed = req.requisite.iter().any(|t| {
        t.segments
            .get(TOPOLOGY_SYSTEM_KEY)
            .is_none_or(|s| s == system)
    });
    if allowed {
        return Ok(());
    }
    let requisite = req
        .requisite
        .iter()
        .map(|t| {
            let mut segs: Vec<String> =
                t.segments.iter().map(|(k, v)| format!("{k}={v}")).collect();
            segs.sort();
            format!("{{{}}}", segs.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ");
    Err(CreateVolumeError::Topology {
        system: system.to_string(),
        requisite,
    })
}

/// The bytes of data a pool can hold: its NVMe tier, or SCM when it has no NVMe (where
/// DAOS puts data then). `None` when the pool reports no tiers.
fn pool_data_bytes(info: &dpufs_daos::PoolInfo) -> Option<u64> {
    let tier = |media: &str| {
        info.tiers
            .iter()
            .find(|t| t.media.eq_ignore_ascii_case(media))
            .map(|t| t.total)
    };
    match tier("NVME") {
        Some(n) if n > 0 => Some(n),
        _ => tier("SCM").filter(|&s| s > 0),
    }
}

fn quota_of(info: &ContainerInfo) -> Option<u64> {
    match info.properties.get(&CONT_DPUFS_QUOTA) {
        Some(PropValue::Num(q)) if *q > 0 => Some(*q),
        _ => None,
    }
}

fn num_prop(info: &ContainerInfo, number: u32) -> Option<u64> {
    match info.properties.get(&number) {
        Some(PropValue::Num(n)) => Some(*n),
        _ => None,
    }
}

fn same_acl(a: &[String], b: &[String]) -> bool {
    a.iter().collect::<BTreeSet<_>>() == b.iter().collect::<BTreeSet<_>>()
}

/// Looks a container up; `None` if it (or its pool) does not exist.
async fn find(
    clients: &SystemClients,
    pool: &str,
    cont: &str,
) -> Result<Option<ContainerInfo>, DaosError> {
    match clients.containers.query(pool, cont).await {
        Ok(info) => Ok(Some(info)),
        Err(DaosError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn container_uuid(info: &ContainerInfo) -> Result<Uuid, DaosError> {
    Uuid::parse_str(&info.uuid).map_err(|_| DaosError::Rpc {
        code: tonic::Code::Internal,
        message: format!("DAOS reported container UUID {:?}", info.uuid),
    })
}

/// The Controller service.
pub struct ControllerService {
    dir: Arc<dyn Directory>,
    locks: VolumeLocks,
}

impl std::fmt::Debug for ControllerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerService")
            .field("locks", &self.locks)
            .finish_non_exhaustive()
    }
}

/// Everything CreateVolume works out before touching the container.
struct Plan {
    name: String,
    params: VolumeParams,
    capacity: Capacity,
    clients: SystemClients,
    tenant: Tenant,
    pool: PoolRef,
    label: String,
    record: RequestRecord,
}

impl Plan {
    fn attributes(&self) -> BTreeMap<String, Vec<u8>> {
        let mut attrs = BTreeMap::new();
        attrs.insert(NAME_ATTR.to_string(), self.name.as_bytes().to_vec());
        let optional = [
            (PVC_NAMESPACE_ATTR, &self.params.pvc_namespace),
            (PVC_NAME_ATTR, &self.params.pvc_name),
            (PV_NAME_ATTR, &self.params.pv_name),
        ];
        for (key, value) in optional {
            if let Some(v) = value.as_ref().filter(|v| !v.is_empty()) {
                attrs.insert(key.to_string(), v.as_bytes().to_vec());
            }
        }
        attrs.insert(
            REQUEST_ATTR.to_string(),
            serde_json::to_vec(&self.record).expect("a request record serializes"),
        );
        attrs
    }

    fn pool_id(&self) -> String {
        self.pool.uuid.to_string()
    }

    fn step(&self, what: &str) -> String {
        format!(
            "{what} (volume {:?}, container {} in pool {:?})",
            self.name, self.label, self.pool.name
        )
    }

    fn daos(&self, what: &str) -> impl FnOnce(DaosError) -> CreateVolumeError + '_ {
        let step = self.step(what);
        move |source| CreateVolumeError::Daos { step, source }
    }
}

impl ControllerService {
    pub fn new(dir: Arc<dyn Directory>) -> ControllerService {
        ControllerService {
            dir,
            locks: VolumeLocks::default(),
        }
    }

    /// The capabilities this Controller service really implements.
    pub fn capabilities() -> Vec<ControllerServiceCapability> {
        use controller_service_capability::{Rpc, Type, rpc};
        [rpc::Type::CreateDeleteVolume, rpc::Type::ExpandVolume]
            .into_iter()
            .map(|t| ControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect()
    }

    /// CreateVolume.
    pub async fn create(&self, req: CreateVolumeRequest) -> Result<Volume, CreateVolumeError> {
        if req.name.is_empty() {
            return Err(CreateVolumeError::MissingName);
        }
        label::validate_name(&req.name).map_err(|source| CreateVolumeError::InvalidName {
            name: req.name.clone(),
            source,
        })?;
        if req.volume_capabilities.is_empty() {
            return Err(CreateVolumeError::MissingCapabilities);
        }
        for cap in &req.volume_capabilities {
            check_capability(cap)?;
        }
        if req
            .volume_content_source
            .as_ref()
            .is_some_and(|s| s.r#type.is_some())
        {
            return Err(CreateVolumeError::ContentSource);
        }
        if !req.mutable_parameters.is_empty() {
            let mut keys: Vec<String> = req.mutable_parameters.keys().cloned().collect();
            keys.sort();
            return Err(CreateVolumeError::MutableParameters(keys));
        }
        let params = params::parse(&req.parameters)?;
        let capacity = Capacity::of(req.capacity_range.as_ref())?;
        let _name_guard = self.locks.try_lock(format!("volume name {:?}", req.name))?;
        let system = match &params.system {
            Some(s) => s.clone(),
            None => self.dir.default_system().await?,
        };
        check_topology(req.accessibility_requirements.as_ref(), &system)?;
        let clients = self.dir.system(&system).await?;
        let tenant = self.dir.tenant(params.pvc_namespace.as_deref()).await?;
        let pool_name = match (&params.pool, tenant.allowed_pools.as_slice()) {
            (Some(p), _) => p.clone(),
            (None, [only]) => only.clone(),
            (None, allowed) => {
                return Err(CreateVolumeError::PoolRequired {
                    tenant: tenant.name.clone(),
                    allowed: allowed.to_vec(),
                });
            }
        };
        if !tenant.allowed_pools.contains(&pool_name) {
            return Err(CreateVolumeError::PoolNotAllowed {
                tenant: tenant.name.clone(),
                pool: pool_name,
                allowed: tenant.allowed_pools.clone(),
            });
        }
        let pool = self.dir.pool(&system, &pool_name).await?;
        let record = RequestRecord {
            system: system.clone(),
            pool: pool.name.clone(),
            tenant: tenant.name.clone(),
            principal: tenant.principal.clone(),
            properties: params.properties.clone(),
        };
        let plan = Plan {
            label: label::label_for(&req.name),
            name: req.name,
            params,
            capacity,
            clients,
            tenant,
            pool,
            record,
        };
        self.provision(&plan).await
    }

    async fn provision(&self, plan: &Plan) -> Result<Volume, CreateVolumeError> {
        let pool_info = match plan.clients.mgmt.pool_query(&plan.pool_id()).await {
            Ok(info) => info,
            Err(DaosError::NotFound { .. }) => {
                return Err(CreateVolumeError::PoolMissing {
                    system: plan.record.system.clone(),
                    pool: plan.pool.name.clone(),
                    uuid: plan.pool_id(),
                });
            }
            Err(e) => return Err(plan.daos("querying the pool")(e)),
        };
        let pool_bytes = pool_data_bytes(&pool_info);
        let fits_pool = |bytes: u64| match pool_bytes {
            Some(p) if bytes > p => Err(CapacityError::ExceedsPool {
                pool: plan.pool.name.clone(),
                requested: bytes,
                pool_bytes: p,
            }),
            _ => Ok(()),
        };
        self.check_other_pools(plan).await?;
        let existing = find(&plan.clients, &plan.pool_id(), &plan.label)
            .await
            .map_err(plan.daos("looking the volume up"))?;
        let (info, fresh) = match existing {
            Some(info) => (info, false),
            None => {
                fits_pool(plan.capacity.bytes)?;
                match self.create_container(plan).await {
                    Ok(info) => (info, true),
                    // Another controller created it meanwhile: continue with that one.
                    Err(CreateVolumeError::Daos {
                        source: DaosError::Exists { .. },
                        ..
                    }) => {
                        let info = find(&plan.clients, &plan.pool_id(), &plan.label)
                            .await
                            .map_err(plan.daos("looking the volume up again"))?
                            .ok_or_else(|| {
                                plan.daos("creating the container")(DaosError::Exists {
                                    message: "a container with this UUID or label exists but cannot be found by label".into(),
                                })
                            })?;
                        (info, false)
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let uuid = container_uuid(&info).map_err(plan.daos("reading the container"))?;
        let id = VolumeId::new(plan.record.system.clone(), plan.pool.uuid, uuid);
        let _id_guard = self.locks.try_lock(format!("volume {id}"))?;
        let attrs = if fresh {
            plan.attributes()
        } else {
            plan.clients
                .containers
                .get_attributes(&plan.pool_id(), &info.uuid)
                .await
                .map_err(plan.daos("reading the container's attributes"))?
        };
        let quota = self.check_existing(plan, &info, &attrs)?;
        let quota = match quota {
            Some(q) => q,
            None => {
                // Created by an attempt that stopped before setting the quota.
                fits_pool(plan.capacity.bytes)?;
                plan.clients
                    .containers
                    .set_properties(
                        &plan.pool_id(),
                        &info.uuid,
                        vec![(CONT_DPUFS_QUOTA, PropValue::Num(plan.capacity.bytes))],
                    )
                    .await
                    .map_err(plan.daos("setting the quota"))?;
                plan.capacity.bytes
            }
        };
        let acl = volume_acl(&plan.tenant.principal);
        if !same_acl(&info.acl.entries, &acl) {
            plan.clients
                .containers
                .overwrite_acl(&plan.pool_id(), &info.uuid, acl)
                .await
                .map_err(plan.daos("setting the ACL"))?;
        }
        let missing: BTreeMap<String, Vec<u8>> = plan
            .attributes()
            .into_iter()
            .filter(|(k, v)| attrs.get(k) != Some(v))
            .collect();
        if !missing.is_empty() {
            plan.clients
                .containers
                .set_attributes(&plan.pool_id(), &info.uuid, missing)
                .await
                .map_err(plan.daos("setting the attributes"))?;
        }
        if plan.params.properties.has_object_classes() {
            tracing::warn!(
                volume = %plan.name,
                "object classes are recorded but not applied yet (the engine has none; a libdaos backend will set them at create)"
            );
        }
        tracing::info!(
            volume = %plan.name,
            volume_id = %id,
            tenant = %plan.tenant.name,
            capacity = quota,
            created = fresh,
            "volume provisioned"
        );
        Ok(self.volume(plan, &id, quota, &info.label))
    }

    /// Refuses a name that already has a volume in another pool the tenant may use.
    async fn check_other_pools(&self, plan: &Plan) -> Result<(), CreateVolumeError> {
        for other in &plan.tenant.allowed_pools {
            if *other == plan.pool.name {
                continue;
            }
            let Ok(pool) = self.dir.pool(&plan.record.system, other).await else {
                continue;
            };
            let found = find(&plan.clients, &pool.uuid.to_string(), &plan.label)
                .await
                .map_err(plan.daos("looking the volume up in the tenant's other pools"))?;
            if found.is_some() {
                return Err(CreateVolumeError::InOtherPool {
                    name: plan.name.clone(),
                    pool: other.clone(),
                    requested: plan.pool.name.clone(),
                });
            }
        }
        Ok(())
    }

    async fn create_container(&self, plan: &Plan) -> Result<ContainerInfo, CreateVolumeError> {
        let mut properties = plan.params.properties.daos_properties();
        properties.push((CONT_DPUFS_QUOTA, PropValue::Num(plan.capacity.bytes)));
        let spec = ContainerSpec {
            pool: plan.pool_id(),
            // Derived from the pool and the name, so a retried create names the same one.
            uuid: Some(Uuid::new_v5(&plan.pool.uuid, plan.name.as_bytes())),
            label: plan.label.clone(),
            properties,
            acl: volume_acl(&plan.tenant.principal),
            owner_user: String::new(),
            owner_group: String::new(),
            attributes: plan.attributes(),
        };
        plan.clients
            .containers
            .create(&spec)
            .await
            .map_err(plan.daos("creating the container"))
    }

    /// Compares an existing container with the request; returns its quota (None: not set
    /// yet, to be completed).
    fn check_existing(
        &self,
        plan: &Plan,
        info: &ContainerInfo,
        attrs: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Option<u64>, CreateVolumeError> {
        if let Some(other) = attrs.get(NAME_ATTR)
            && other.as_slice() != plan.name.as_bytes()
        {
            return Err(CreateVolumeError::LabelTaken {
                label: plan.label.clone(),
                other: String::from_utf8_lossy(other).into_owned(),
            });
        }
        let mut differences = Vec::new();
        let record = attrs
            .get(REQUEST_ATTR)
            .and_then(|r| serde_json::from_slice::<RequestRecord>(r).ok());
        match record {
            Some(rec) => {
                if rec.principal != plan.record.principal {
                    differences.push(format!(
                        "it belongs to tenant {:?} ({}), the request to tenant {:?} ({})",
                        rec.tenant, rec.principal, plan.record.tenant, plan.record.principal
                    ));
                }
                if rec.properties != plan.record.properties {
                    differences.push(format!(
                        "its properties are {}, the request's {}",
                        serde_json::to_string(&rec.properties).unwrap_or_default(),
                        serde_json::to_string(&plan.record.properties).unwrap_or_default()
                    ));
                }
            }
            None => {
                // A create that stopped before recording itself: only what DAOS keeps.
                let want = &plan.params.properties;
                if let Some(rf) = want.redundancy_factor
                    && num_prop(info, CONT_RD_FAC) != Some(u64::from(rf))
                {
                    differences.push(format!("its redundancyFactor is not {rf}"));
                }
                if let Some(chunk) = want.chunk_size
                    && num_prop(info, CONT_DPUFS_CHUNK_SIZE) != Some(chunk)
                {
                    differences.push(format!("its chunkSize is not {chunk}"));
                }
            }
        }
        let quota = quota_of(info);
        if let Some(q) = quota
            && !plan.capacity.fits(q)
        {
            differences.push(format!(
                "its capacity is {q} bytes, the request asks {}",
                plan.capacity.describe()
            ));
        }
        if differences.is_empty() {
            Ok(quota)
        } else {
            Err(CreateVolumeError::Incompatible {
                name: plan.name.clone(),
                differences,
            })
        }
    }

    fn volume(&self, plan: &Plan, id: &VolumeId, capacity: u64, label: &str) -> Volume {
        let context: HashMap<String, String> = [
            (CTX_SYSTEM, id.system.clone()),
            (CTX_POOL, id.pool.to_string()),
            (CTX_POOL_NAME, plan.pool.name.clone()),
            (CTX_CONTAINER, id.container.to_string()),
            (CTX_CONTAINER_LABEL, label.to_string()),
            (CTX_TENANT, plan.tenant.name.clone()),
            (CTX_PRINCIPAL, plan.tenant.principal.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        Volume {
            capacity_bytes: i64::try_from(capacity).unwrap_or(i64::MAX),
            volume_id: id.to_string(),
            volume_context: context,
            content_source: None,
            accessible_topology: vec![Topology {
                segments: [(TOPOLOGY_SYSTEM_KEY.to_string(), id.system.clone())].into(),
            }],
        }
    }

    /// DeleteVolume: destroys the container of a volume of ours; unknown ids are OK.
    pub async fn delete(&self, req: DeleteVolumeRequest) -> Result<(), DeleteVolumeError> {
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(DeleteVolumeError::MissingId),
            Err(VolumeIdError::Foreign(_)) => {
                tracing::info!(volume_id = %req.volume_id, "not an id of ours: nothing to delete");
                return Ok(());
            }
            Err(e) => return Err(DeleteVolumeError::MalformedId(e)),
        };
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let clients = self.dir.system(&id.system).await?;
        let (pool, cont) = (id.pool.to_string(), id.container.to_string());
        let daos = |what: &str| {
            let step = format!("{what} (volume {id})");
            move |source| DeleteVolumeError::Daos { step, source }
        };
        let Some(info) = find(&clients, &pool, &cont)
            .await
            .map_err(daos("looking the container up"))?
        else {
            tracing::info!(volume_id = %id, "volume already gone");
            return Ok(());
        };
        if !label::is_volume_label(&info.label) {
            return Err(DeleteVolumeError::NotOurs {
                id: id.to_string(),
                container: cont,
                label: info.label,
            });
        }
        match clients.containers.destroy(&pool, &cont, false).await {
            Ok(()) | Err(DaosError::NotFound { .. }) => {
                tracing::info!(volume_id = %id, "volume deleted");
                Ok(())
            }
            Err(DaosError::Busy { message }) => Err(DeleteVolumeError::InUse {
                id: id.to_string(),
                message,
            }),
            Err(e) => Err(daos("destroying the container")(e)),
        }
    }

    /// ValidateVolumeCapabilities.
    pub async fn validate(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, ValidateVolumeError> {
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(ValidateVolumeError::MissingId),
            Err(e) => return Err(ValidateVolumeError::MalformedId(e)),
        };
        if req.volume_capabilities.is_empty() {
            return Err(ValidateVolumeError::MissingCapabilities);
        }
        let clients = self.dir.system(&id.system).await?;
        find(&clients, &id.pool.to_string(), &id.container.to_string())
            .await
            .map_err(|source| ValidateVolumeError::Daos {
                step: format!("looking volume {id} up"),
                source,
            })?
            .ok_or_else(|| ValidateVolumeError::NotFound(id.to_string()))?;
        let unsupported = req
            .volume_capabilities
            .iter()
            .find_map(|c| check_capability(c).err().map(|e| e.to_string()))
            .or_else(|| {
                (!req.parameters.is_empty())
                    .then(|| params::parse(&req.parameters).err().map(|e| e.to_string()))
                    .flatten()
            });
        Ok(match unsupported {
            Some(message) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
        })
    }

    /// ControllerExpandVolume: raises the container's quota. Online: nothing to do on
    /// nodes, the new quota applies to open mounts at once.
    pub async fn expand(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, ExpandVolumeError> {
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(ExpandVolumeError::MissingId),
            Err(e) => return Err(ExpandVolumeError::MalformedId(e)),
        };
        let range = req
            .capacity_range
            .as_ref()
            .ok_or(ExpandVolumeError::MissingCapacity)?;
        let capacity = Capacity::of(Some(range))?;
        if capacity.required == 0 {
            return Err(ExpandVolumeError::MissingCapacity);
        }
        if let Some(cap) = &req.volume_capability {
            check_capability(cap)?;
        }
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let clients = self.dir.system(&id.system).await?;
        let (pool, cont) = (id.pool.to_string(), id.container.to_string());
        let daos = |what: &str| {
            let step = format!("{what} (volume {id})");
            move |source| ExpandVolumeError::Daos { step, source }
        };
        let info = find(&clients, &pool, &cont)
            .await
            .map_err(daos("looking the container up"))?
            .ok_or_else(|| ExpandVolumeError::NotFound(id.to_string()))?;
        if !label::is_volume_label(&info.label) {
            return Err(ExpandVolumeError::NotOurs {
                id: id.to_string(),
                container: cont,
                label: info.label,
            });
        }
        let response = |bytes: u64| ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
            node_expansion_required: false,
        };
        match quota_of(&info) {
            // No quota: the volume is already as large as the pool.
            None => return Ok(response(capacity.required)),
            Some(q) if q >= capacity.required => return Ok(response(q)),
            Some(_) => {}
        }
        let pool_info = clients
            .mgmt
            .pool_query(&pool)
            .await
            .map_err(daos("querying the pool"))?;
        if let Some(p) = pool_data_bytes(&pool_info)
            && capacity.required > p
        {
            return Err(CapacityError::ExceedsPool {
                pool: pool_info.label,
                requested: capacity.required,
                pool_bytes: p,
            }
            .into());
        }
        clients
            .containers
            .set_properties(
                &pool,
                &cont,
                vec![(CONT_DPUFS_QUOTA, PropValue::Num(capacity.required))],
            )
            .await
            .map_err(daos("setting the quota"))?;
        tracing::info!(volume_id = %id, capacity = capacity.required, "volume expanded");
        Ok(response(capacity.required))
    }
}

fn unimplemented<T>(rpc: &'static str) -> Result<Response<T>, Status> {
    Err(CsiError::Unimplemented(rpc).into())
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let volume = self.create(request.into_inner()).await?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.delete(request.into_inner()).await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        unimplemented("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        unimplemented("ControllerUnpublishVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        Ok(Response::new(self.validate(request.into_inner()).await?))
    }

    async fn list_volumes(
        &self,
        _: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        unimplemented("ListVolumes")
    }

    async fn get_capacity(
        &self,
        _: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        unimplemented("GetCapacity")
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: ControllerService::capabilities(),
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        unimplemented("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        unimplemented("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        unimplemented("ListSnapshots")
    }

    async fn get_snapshot(
        &self,
        _: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        unimplemented("GetSnapshot")
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        Ok(Response::new(self.expand(request.into_inner()).await?))
    }

    async fn controller_get_volume(
        &self,
        _: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_proto::csi::v1::volume_capability::{
        AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
    };

    pub(crate) fn mount(mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    #[test]
    fn capacity_ranges() {
        let range = |required, limit| CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        };
        assert_eq!(Capacity::of(None).unwrap().bytes, DEFAULT_CAPACITY);
        assert_eq!(
            Capacity::of(Some(&range(0, 0))).unwrap().bytes,
            DEFAULT_CAPACITY
        );
        assert_eq!(Capacity::of(Some(&range(0, 4096))).unwrap().bytes, 4096);
        assert_eq!(
            Capacity::of(Some(&range(0, 8 << 30))).unwrap().bytes,
            DEFAULT_CAPACITY
        );
        assert_eq!(Capacity::of(Some(&range(5, 0))).unwrap().bytes, 5);
        assert_eq!(Capacity::of(Some(&range(5, 5))).unwrap().bytes, 5);
        assert_eq!(
            Capacity::of(Some(&range(6, 5))),
            Err(CapacityError::RequiredAboveLimit {
                required: 6,
                limit: 5
            })
        );
        assert!(matches!(
            Capacity::of(Some(&range(-1, 0))),
            Err(CapacityError::Negative { .. })
        ));
        assert!(matches!(
            Capacity::of(Some(&range(0, -1))),
            Err(CapacityError::Negative { .. })
        ));
        let c = Capacity::of(Some(&range(10, 20))).unwrap();
        assert!(c.fits(10) && c.fits(20) && !c.fits(9) && !c.fits(21));
        let c = Capacity::of(Some(&range(10, 0))).unwrap();
        assert!(c.fits(10) && c.fits(u64::MAX) && !c.fits(9));
    }

    #[test]
    fn capabilities_of_a_shared_file_system() {
        for mode in [
            Mode::SingleNodeWriter,
            Mode::SingleNodeReaderOnly,
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter,
            Mode::MultiNodeMultiWriter,
        ] {
            assert_eq!(check_capability(&mount(mode)), Ok(()), "{mode:?}");
        }
        for mode in [
            Mode::Unknown,
            Mode::SingleNodeSingleWriter,
            Mode::SingleNodeMultiWriter,
        ] {
            assert_eq!(
                check_capability(&mount(mode)),
                Err(CapabilityError::AccessMode(mode.as_str_name().into()))
            );
        }
        let mut cap = mount(Mode::MultiNodeMultiWriter);
        cap.access_mode = Some(AccessMode { mode: 42 });
        assert_eq!(
            check_capability(&cap),
            Err(CapabilityError::AccessMode("42".into()))
        );
        cap.access_mode = None;
        assert_eq!(
            check_capability(&cap),
            Err(CapabilityError::MissingAccessMode)
        );
        let mut cap = mount(Mode::MultiNodeMultiWriter);
        cap.access_type = Some(AccessType::Block(BlockVolume {}));
        assert_eq!(check_capability(&cap), Err(CapabilityError::Block));
        cap.access_type = None;
        assert_eq!(
            check_capability(&cap),
            Err(CapabilityError::MissingAccessType)
        );
        let mut cap = mount(Mode::MultiNodeMultiWriter);
        for (fs, ok) in [("", true), ("dfs", true), ("ext4", false), ("xfs", false)] {
            cap.access_type = Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            }));
            assert_eq!(check_capability(&cap).is_ok(), ok, "{fs}");
        }
    }

    #[test]
    fn topology_requirements() {
        let topo = |pairs: &[(&str, &str)]| Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let req = |requisite: Vec<Topology>| TopologyRequirement {
            requisite,
            preferred: vec![],
        };
        assert!(check_topology(None, "s").is_ok());
        assert!(check_topology(Some(&req(vec![])), "s").is_ok());
        let node = topo(&[(TOPOLOGY_SYSTEM_KEY, "s"), ("dpufs.io/node", "n1")]);
        assert!(check_topology(Some(&req(vec![node.clone()])), "s").is_ok());
        assert!(check_topology(Some(&req(vec![topo(&[("dpufs.io/node", "n1")])])), "s").is_ok());
        let other = topo(&[(TOPOLOGY_SYSTEM_KEY, "t")]);
        let err = check_topology(Some(&req(vec![other.clone()])), "s").unwrap_err();
        assert!(err.to_string().contains("dpufs.io/daos-system=t"), "{err}");
        assert!(check_topology(Some(&req(vec![other, node])), "s").is_ok());
    }

    #[test]
    fn controller_capabilities_are_what_is_built() {
        use controller_service_capability::{Type, rpc};
        let types: Vec<i32> = ControllerService::capabilities()
            .into_iter()
            .filter_map(|c| c.r#type.map(|Type::Rpc(r)| r.r#type))
            .collect();
        assert_eq!(
            types,
            vec![
                rpc::Type::CreateDeleteVolume as i32,
                rpc::Type::ExpandVolume as i32
            ]
        );
    }

    #[test]
    fn acl_of_a_volume() {
        assert_eq!(
            volume_acl("team-a@"),
            vec![
                "A::OWNER@:rwdtTaAo".to_string(),
                "A::team-a@:rwt".to_string()
            ]
        );
        assert!(same_acl(
            &volume_acl("x@"),
            &["A::x@:rwt".into(), "A::OWNER@:rwdtTaAo".into()]
        ));
        assert!(!same_acl(
            &volume_acl("x@"),
            &[
                "A::x@:rwt".into(),
                "A::OWNER@:rwdtTaAo".into(),
                "A:G:GROUP@:rwtT".into()
            ]
        ));
    }

    #[test]
    fn pool_data_is_on_nvme_or_else_scm() {
        let info = |scm: u64, nvme: u64| dpufs_daos::PoolInfo {
            uuid: String::new(),
            label: String::new(),
            state: String::new(),
            total_targets: 0,
            active_targets: 0,
            disabled_targets: 0,
            tiers: vec![
                dpufs_daos::TierUsage {
                    media: "SCM".into(),
                    total: scm,
                    free: scm,
                },
                dpufs_daos::TierUsage {
                    media: "NVME".into(),
                    total: nvme,
                    free: nvme,
                },
            ],
            disabled_ranks: String::new(),
            svc_leader: 0,
            svc_replicas: vec![],
            rebuild_state: String::new(),
            total_engines: 0,
        };
        assert_eq!(pool_data_bytes(&info(1, 2)), Some(2));
        assert_eq!(pool_data_bytes(&info(1, 0)), Some(1));
        assert_eq!(pool_data_bytes(&info(0, 0)), None);
    }

    #[tokio::test]
    async fn unimplemented_rpcs_say_so() {
        use crate::csi::directory::{StaticConfig, StaticDirectory};
        let config: StaticConfig = serde_json::from_value(serde_json::json!({
            "system": {"endpoints": ["127.0.0.1:1"]},
        }))
        .unwrap();
        let c = ControllerService::new(Arc::new(StaticDirectory::new(config).unwrap()));
        let s = c
            .list_volumes(Request::new(Default::default()))
            .await
            .unwrap_err();
        assert_eq!(s.code(), tonic::Code::Unimplemented);
        assert!(s.message().contains("ListVolumes"));
        for s in [
            c.controller_publish_volume(Request::new(Default::default()))
                .await
                .unwrap_err(),
            c.controller_unpublish_volume(Request::new(Default::default()))
                .await
                .unwrap_err(),
            c.get_capacity(Request::new(Default::default()))
                .await
                .unwrap_err(),
            c.create_snapshot(Request::new(Default::default()))
                .await
                .unwrap_err(),
            c.delete_snapshot(Request::new(Default::default()))
                .await
                .unwrap_err(),
            c.list_snapshots(Request::new(Default::default()))
                .await
                .unwrap_err(),
            c.get_snapshot(Request::new(Default::default()))
                .await
                .unwrap_err(),
            c.controller_get_volume(Request::new(Default::default()))
                .await
                .unwrap_err(),
            c.controller_modify_volume(Request::new(Default::default()))
                .await
                .unwrap_err(),
        ] {
            assert_eq!(s.code(), tonic::Code::Unimplemented, "{}", s.message());
        }
    }

    /// Requests rejected before any DAOS call (the directory points at a dead endpoint, so
    /// reaching DAOS would fail with UNAVAILABLE instead of the expected code).
    #[tokio::test]
    async fn bad_requests_are_refused_before_daos() {
        use crate::csi::directory::{StaticConfig, StaticDirectory};
        use tonic::Code;
        let config: StaticConfig = serde_json::from_value(serde_json::json!({
            "system": {"endpoints": ["127.0.0.1:1"], "requestTimeoutSeconds": 1},
            "pools": {"fast": "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f", "bulk": "0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b"},
            "tenants": [
                {"name": "a", "principal": "a@", "namespaces": ["ns-a"], "allowedPools": ["fast", "bulk"]},
                {"name": "b", "principal": "b@", "namespaces": ["ns-b"], "allowedPools": ["bulk"]}
            ],
            "defaultTenant": "b"
        }))
        .unwrap();
        let c = ControllerService::new(Arc::new(StaticDirectory::new(config).unwrap()));
        let good = || CreateVolumeRequest {
            name: "pvc-1".into(),
            volume_capabilities: vec![mount(Mode::MultiNodeMultiWriter)],
            ..Default::default()
        };
        let code = |r: CreateVolumeRequest| {
            let c = &c;
            async move { Status::from(c.create(r).await.unwrap_err()) }
        };
        let mut r = good();
        r.name.clear();
        assert_eq!(code(r).await.code(), Code::InvalidArgument);
        let mut r = good();
        r.volume_capabilities.clear();
        assert_eq!(code(r).await.code(), Code::InvalidArgument);
        let mut r = good();
        r.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: "s".into(),
                },
            )),
        });
        assert_eq!(code(r).await.code(), Code::InvalidArgument);
        let mut r = good();
        r.mutable_parameters.insert("qos".into(), "gold".into());
        assert_eq!(code(r).await.code(), Code::InvalidArgument);
        let mut r = good();
        r.parameters.insert("provisioning".into(), "pool".into());
        assert_eq!(code(r).await.code(), Code::Unimplemented);
        let mut r = good();
        r.capacity_range = Some(CapacityRange {
            required_bytes: 2,
            limit_bytes: 1,
        });
        assert_eq!(code(r).await.code(), Code::OutOfRange);
        let mut r = good();
        r.parameters
            .insert(params::PVC_NAMESPACE.into(), "nobody".into());
        let s = code(r).await;
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().contains("\"nobody\""), "{}", s.message());
        let mut r = good();
        r.parameters
            .insert(params::PVC_NAMESPACE.into(), "ns-a".into());
        let s = code(r).await;
        assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
        assert!(s.message().contains("fast, bulk"), "{}", s.message());
        let mut r = good();
        r.parameters.insert(params::POOL.into(), "fast".into());
        assert_eq!(code(r).await.code(), Code::PermissionDenied);
        let mut r = good();
        r.parameters.insert(params::SYSTEM.into(), "other".into());
        assert_eq!(code(r).await.code(), Code::FailedPrecondition);
        let mut r = good();
        r.accessibility_requirements = Some(TopologyRequirement {
            requisite: vec![Topology {
                segments: [(TOPOLOGY_SYSTEM_KEY.to_string(), "elsewhere".to_string())].into(),
            }],
            preferred: vec![],
        });
        assert_eq!(code(r).await.code(), Code::ResourceExhausted);
        // And a good request does reach DAOS, which is down here.
        assert_eq!(code(good()).await.code(), Code::Unavailable);
        // Ids: foreign deletes are OK, malformed ones are refused.
        let del = |id: &str| {
            c.delete(DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
        };
        assert!(del("some-driver-id").await.is_ok());
        assert_eq!(
            Status::from(del("").await.unwrap_err()).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            Status::from(del("v1/daos_server/x").await.unwrap_err()).code(),
            Code::InvalidArgument
        );
    }
}
