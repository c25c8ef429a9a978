//! The Identity service: who the plugin is, what it offers, and whether it is ready.
//!
//! Probe reports the plugin's own readiness only. It never asks DAOS: the livenessprobe
//! sidecar restarts plugins whose Probe fails, and a storage outage must not crash-loop
//! every plugin (remote health belongs in errors of the calls that need DAOS).

use crate::csi::DRIVER_NAME;
use dpufs_proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
    identity_server::Identity, plugin_capability,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The Identity service of a plugin: the controller plugin's (with the Controller service) or
/// the node plugin's.
pub struct IdentityService {
    ready: Arc<dyn Fn() -> bool + Send + Sync>,
    controller: bool,
}

impl std::fmt::Debug for IdentityService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityService")
            .field("ready", &(self.ready)())
            .finish()
    }
}

impl IdentityService {
    /// `ready` says whether the plugin itself can serve (e.g. its directory is loaded).
    pub fn new(ready: impl Fn() -> bool + Send + Sync + 'static) -> IdentityService {
        IdentityService {
            ready: Arc::new(ready),
            controller: true,
        }
    }

    /// The node plugin's: no Controller service.
    pub fn node(ready: impl Fn() -> bool + Send + Sync + 'static) -> IdentityService {
        IdentityService {
            ready: Arc::new(ready),
            controller: false,
        }
    }

    /// The capabilities of the controller plugin: the Controller service, topology
    /// (volumes are reachable where their DAOS system is), and online expansion
    /// (ControllerExpandVolume changes the container's quota; nothing to do on nodes).
    pub fn capabilities() -> Vec<PluginCapability> {
        use plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
        let service = |t: service::Type| PluginCapability {
            r#type: Some(Type::Service(Service { r#type: t as i32 })),
        };
        vec![
            service(service::Type::ControllerService),
            service(service::Type::VolumeAccessibilityConstraints),
            PluginCapability {
                r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                })),
            },
        ]
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = IdentityService::capabilities();
        if !self.controller {
            use plugin_capability::{Type, service};
            let controller = service::Type::ControllerService as i32;
            capabilities
                .retain(|c| !matches!(&c.r#type, Some(Type::Service(s)) if s.r#type == controller));
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some((self.ready)()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn info_names_the_driver_and_version() {
        let id = IdentityService::new(|| true);
        let info = id
            .get_plugin_info(Request::new(GetPluginInfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, "dfs.dpufs.io");
        assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
        assert!(!info.vendor_version.is_empty());
    }

    #[tokio::test]
    async fn capabilities_are_controller_topology_and_online_expansion() {
        use plugin_capability::{Type, service, volume_expansion};
        let caps = IdentityService::new(|| true)
            .get_plugin_capabilities(Request::new(GetPluginCapabilitiesRequest {}))
            .await
            .unwrap()
            .into_inner()
            .capabilities;
        let services: Vec<i32> = caps
            .iter()
            .filter_map(|c| match c.r#type {
                Some(Type::Service(s)) => Some(s.r#type),
                _ => None,
            })
            .collect();
        assert_eq!(
            services,
            vec![
                service::Type::ControllerService as i32,
                service::Type::VolumeAccessibilityConstraints as i32
            ]
        );
        let expansion: Vec<i32> = caps
            .iter()
            .filter_map(|c| match c.r#type {
                Some(Type::VolumeExpansion(e)) => Some(e.r#type),
                _ => None,
            })
            .collect();
        assert_eq!(expansion, vec![volume_expansion::Type::Online as i32]);
    }

    #[tokio::test]
    async fn probe_reports_own_readiness() {
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let id = IdentityService::new(move || f.load(Ordering::SeqCst));
        let probe = || async { id.probe(Request::new(ProbeRequest {})).await.unwrap() };
        assert_eq!(probe().await.into_inner().ready, Some(false));
        flag.store(true, Ordering::SeqCst);
        assert_eq!(probe().await.into_inner().ready, Some(true));
    }
}
