//! The Controller service: a DAOS container per volume, in a pool the tenant may use or in
//! a pool of the volume's own (`provisioning: pool`, [`dedicated`]).
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
//! and attributes holding the full CSI name, the request record, the PVC and the QoS limits
//! (the mutable parameters, [`crate::csi::qos`]).
//!
//! Every call on one CSI name or volume id runs alone; a concurrent one gets ABORTED.

use crate::csi::TOPOLOGY_SYSTEM_KEY;
use crate::csi::directory::{Directory, PoolRef, SystemClients, Tenant};
use crate::csi::error::{
    CapabilityError, CapacityError, CreateVolumeError, CsiError, DeleteVolumeError,
    ExpandVolumeError, ModifyVolumeError, ValidateVolumeError,
};
use crate::csi::label::{
    self, NAME_ATTR, PV_NAME_ATTR, PVC_NAME_ATTR, PVC_NAMESPACE_ATTR, QOS_ATTR, REQUEST_ATTR,
};
use crate::csi::locks::VolumeLocks;
use crate::csi::params::{self, ContainerProperties, Provisioning, VolumeParams};
use crate::csi::volume_id::{VolumeId, VolumeIdError};
use dpufs_daos::{ContainerInfo, ContainerSpec, DaosError};
use dpufs_node_api::qos::QosLimits;
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
    /// The snapshot the volume was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_snapshot: Option<String>,
}

mod checks;
mod create;
mod dedicated;
mod inventory;
mod lifecycle;
mod snapshots;
#[cfg(test)]
mod tests;

use checks::*;
pub use checks::{Capacity, check_capability, check_topology};
pub use snapshots::DELETED_ATTR;

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
        [
            rpc::Type::CreateDeleteVolume,
            rpc::Type::ExpandVolume,
            rpc::Type::CreateDeleteSnapshot,
            rpc::Type::ListSnapshots,
            rpc::Type::ListVolumes,
            rpc::Type::GetCapacity,
            rpc::Type::GetVolume,
            rpc::Type::VolumeCondition,
            rpc::Type::SingleNodeMultiWriter,
            rpc::Type::ModifyVolume,
        ]
        .into_iter()
        .map(|t| ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect()
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
        req: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        Ok(Response::new(self.volumes(req.into_inner()).await?))
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        Ok(Response::new(self.capacity(req.into_inner()).await?))
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
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let snapshot = self.take_snapshot(req.into_inner()).await?;
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.drop_snapshot(req.into_inner()).await?;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        Ok(Response::new(self.find_snapshots(req.into_inner()).await?))
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
        req: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        Ok(Response::new(self.volume_status(req.into_inner()).await?))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        self.modify(request.into_inner()).await?;
        Ok(Response::new(csi::ControllerModifyVolumeResponse {}))
    }
}
