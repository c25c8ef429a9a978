//! The two services of the storage plugin: IdentityService (who the plugin is, whether it
//! is ready) and StoragePluginService (devices for volumes), both over one [`DeviceBackend`].
//!
//! Every call is idempotent: CreateDevice of a volume that has its device returns that
//! device; DeleteDevice of a volume without one succeeds. Calls that change a volume take its
//! lock, so a second call on the same volume while one runs is ABORTED (retry), never a
//! second staging.

use crate::csi::DRIVER_NAME;
use crate::csi::locks::VolumeLocks;
use crate::dpf::backend::{Device, DeviceBackend};
use crate::dpf::error::PluginError;
use crate::dpf::page::page;
use crate::dpf::request::{self, FILESYSTEM, device_spec, differences};
use dpufs_proto::nvidia::storage::plugins::v1 as dpf;
use dpufs_proto::nvidia::storage::plugins::v1::storage_plugin_service_capability::{
    Rpc, Type as CapabilityType, rpc,
};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The plugin's name in GetPluginInfo (domain-name notation, at most 63 characters): the
/// CSI driver whose volumes it makes devices for.
pub const PLUGIN_NAME: &str = DRIVER_NAME;

/// The capabilities the plugin really implements. There is no stats RPC in the API, so
/// GET_DEVICE_STATS is not claimed; block devices are not made.
pub const CAPABILITIES: [rpc::Type; 2] = [rpc::Type::CreateDeleteFsDevice, rpc::Type::ListDevices];

/// IdentityService: the plugin's name and version, and the backend's readiness.
pub struct PluginIdentity {
    backend: Arc<dyn DeviceBackend>,
}

impl std::fmt::Debug for PluginIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginIdentity").finish_non_exhaustive()
    }
}

impl PluginIdentity {
    pub fn new(backend: Arc<dyn DeviceBackend>) -> PluginIdentity {
        PluginIdentity { backend }
    }

    /// What GetPluginInfo's opaque manifest says: which CSI driver's volume ids the plugin
    /// takes, and that it makes file-system devices only.
    pub fn manifest() -> HashMap<String, String> {
        [("csiDriver", DRIVER_NAME), ("volumeModes", FILESYSTEM)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

#[tonic::async_trait]
impl dpf::identity_service_server::IdentityService for PluginIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<dpf::GetPluginInfoRequest>,
    ) -> Result<Response<dpf::GetPluginInfoResponse>, Status> {
        Ok(Response::new(dpf::GetPluginInfoResponse {
            name: PLUGIN_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: PluginIdentity::manifest(),
        }))
    }

    async fn probe(
        &self,
        _: Request<dpf::ProbeRequest>,
    ) -> Result<Response<dpf::ProbeResponse>, Status> {
        Ok(Response::new(dpf::ProbeResponse {
            ready: Some(self.backend.ready().await),
        }))
    }
}

/// StoragePluginService over a backend.
pub struct StoragePlugin {
    backend: Arc<dyn DeviceBackend>,
    locks: VolumeLocks,
}

impl std::fmt::Debug for StoragePlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoragePlugin").finish_non_exhaustive()
    }
}

impl StoragePlugin {
    pub fn new(backend: Arc<dyn DeviceBackend>) -> StoragePlugin {
        StoragePlugin {
            backend,
            locks: VolumeLocks::default(),
        }
    }

    async fn create(&self, req: dpf::CreateDeviceRequest) -> Result<String, PluginError> {
        const RPC: &str = "CreateDevice";
        let spec = device_spec(req)?;
        let _guard = self.locks.try_lock(format!("volume {}", spec.volume_id))?;
        let backend_err = |source| PluginError::Backend { rpc: RPC, source };
        match self
            .backend
            .get(&spec.volume_id)
            .await
            .map_err(backend_err)?
        {
            Some(made) => {
                let differences = differences(&made.spec, &spec);
                if differences.is_empty() {
                    Ok(made.name)
                } else {
                    Err(PluginError::Incompatible {
                        volume_id: spec.volume_id,
                        differences,
                    })
                }
            }
            None => self.backend.create(&spec).await.map_err(backend_err),
        }
    }

    async fn delete(&self, req: dpf::DeleteDeviceRequest) -> Result<(), PluginError> {
        const RPC: &str = "DeleteDevice";
        request::volume_id(RPC, &req.volume_id)?;
        request::device_name(RPC, &req.device_name)?;
        let _guard = self.locks.try_lock(format!("volume {}", req.volume_id))?;
        let backend_err = |source| PluginError::Backend { rpc: RPC, source };
        let shown = self
            .backend
            .get(&req.volume_id)
            .await
            .map_err(backend_err)?;
        if let Some(device) = shown
            && !req.device_name.is_empty()
            && req.device_name != device.name
        {
            return Err(PluginError::DeleteOtherDevice {
                volume_id: req.volume_id,
                named: req.device_name,
                actual: device.name,
            });
        }
        self.backend
            .delete(&req.volume_id)
            .await
            .map_err(backend_err)
    }

    async fn get(&self, req: dpf::GetDeviceRequest) -> Result<Device, PluginError> {
        const RPC: &str = "GetDevice";
        request::volume_id(RPC, &req.volume_id)?;
        request::device_name(RPC, &req.device_name)?;
        let device = self
            .backend
            .get(&req.volume_id)
            .await
            .map_err(|source| PluginError::Backend { rpc: RPC, source })?
            .ok_or_else(|| PluginError::NotFound(req.volume_id.clone()))?;
        if !req.device_name.is_empty() && req.device_name != device.name {
            return Err(PluginError::OtherDevice {
                volume_id: req.volume_id,
                named: req.device_name,
                actual: device.name,
            });
        }
        Ok(device)
    }

    async fn list(
        &self,
        req: dpf::ListDevicesRequest,
    ) -> Result<dpf::ListDevicesResponse, PluginError> {
        let devices = self
            .backend
            .list()
            .await
            .map_err(|source| PluginError::Backend {
                rpc: "ListDevices",
                source,
            })?;
        let (devices, next_token) = page(devices, req.max_entries, &req.starting_token)?;
        Ok(dpf::ListDevicesResponse {
            entries: devices
                .into_iter()
                .map(|d| dpf::list_devices_response::Entry {
                    volume_id: d.spec.volume_id,
                    device_name: d.name,
                })
                .collect(),
            next_token,
        })
    }
}

#[tonic::async_trait]
impl dpf::storage_plugin_service_server::StoragePluginService for StoragePlugin {
    async fn storage_plugin_get_capabilities(
        &self,
        _: Request<dpf::StoragePluginGetCapabilitiesRequest>,
    ) -> Result<Response<dpf::StoragePluginGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|&t| dpf::StoragePluginServiceCapability {
                r#type: Some(CapabilityType::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(dpf::StoragePluginGetCapabilitiesResponse {
            capabilities,
        }))
    }

    /// SNAP's default provider serves dpufs's devices.
    async fn get_snap_provider(
        &self,
        _: Request<dpf::GetSnapProviderRequest>,
    ) -> Result<Response<dpf::GetSnapProviderResponse>, Status> {
        Ok(Response::new(dpf::GetSnapProviderResponse::default()))
    }

    async fn create_device(
        &self,
        req: Request<dpf::CreateDeviceRequest>,
    ) -> Result<Response<dpf::CreateDeviceResponse>, Status> {
        let device_name = self.create(req.into_inner()).await?;
        Ok(Response::new(dpf::CreateDeviceResponse { device_name }))
    }

    async fn delete_device(
        &self,
        req: Request<dpf::DeleteDeviceRequest>,
    ) -> Result<Response<dpf::DeleteDeviceResponse>, Status> {
        self.delete(req.into_inner()).await?;
        Ok(Response::new(dpf::DeleteDeviceResponse {}))
    }

    async fn get_device(
        &self,
        req: Request<dpf::GetDeviceRequest>,
    ) -> Result<Response<dpf::GetDeviceResponse>, Status> {
        let spec = self.get(req.into_inner()).await?.spec;
        Ok(Response::new(dpf::GetDeviceResponse {
            access_modes: spec.access_modes.iter().map(|&m| m as i32).collect(),
            volume_mode: FILESYSTEM.to_string(),
            publish_context: spec.publish_context,
            volume_context: spec.volume_context,
            storage_parameters: spec.storage_parameters,
        }))
    }

    async fn list_devices(
        &self,
        req: Request<dpf::ListDevicesRequest>,
    ) -> Result<Response<dpf::ListDevicesResponse>, Status> {
        Ok(Response::new(self.list(req.into_inner()).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_in_domain_notation_and_short_enough() {
        assert!(PLUGIN_NAME.len() <= 63);
        assert!(PLUGIN_NAME.split('.').count() >= 2);
        assert!(PLUGIN_NAME.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        }));
    }
}
