//! A CSI driver that advertises every capability and answers OK, with an empty response, to
//! every call: what the suite must fail. With `echo`, CreateVolume and CreateSnapshot answer
//! an id made of the name (and the volume the size asked for), NodeGetInfo a node id, so the
//! cases get past their first call to the checks after it.

use dpufs_proto::csi::v1::controller_server::{Controller, ControllerServer};
use dpufs_proto::csi::v1::identity_server::{Identity, IdentityServer};
use dpufs_proto::csi::v1::node_server::{Node, NodeServer};
use dpufs_proto::csi::v1::{
    self as csi, ControllerServiceCapability, NodeServiceCapability, PluginCapability,
    controller_service_capability, node_service_capability, plugin_capability,
};
use std::path::Path;
use tonic::{Request, Response, Status};

#[derive(Debug, Clone, Copy)]
struct Yes {
    echo: bool,
}

/// An impl of `$trait` for [`Yes`] whose listed RPCs answer a default response, plus the
/// items given after it.
macro_rules! says_yes {
    ($trait:ident { $($rpc:ident($req:ty) -> $resp:ty;)* } $($item:item)*) => {
        #[tonic::async_trait]
        impl $trait for Yes {
            $(
                async fn $rpc(&self, _: Request<$req>) -> Result<Response<$resp>, Status> {
                    Ok(Response::new(<$resp>::default()))
                }
            )*
            $($item)*
        }
    };
}

says_yes! {
    Identity {
        probe(csi::ProbeRequest) -> csi::ProbeResponse;
    }
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse::default()))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::{Service, Type, service};
        let capabilities = [
            service::Type::ControllerService,
            service::Type::VolumeAccessibilityConstraints,
        ]
        .into_iter()
        .map(|t| PluginCapability {
            r#type: Some(Type::Service(Service { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(csi::GetPluginCapabilitiesResponse { capabilities }))
    }
}

says_yes! {
    Controller {
        delete_volume(csi::DeleteVolumeRequest) -> csi::DeleteVolumeResponse;
        controller_publish_volume(csi::ControllerPublishVolumeRequest) -> csi::ControllerPublishVolumeResponse;
        controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest) -> csi::ControllerUnpublishVolumeResponse;
        validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest) -> csi::ValidateVolumeCapabilitiesResponse;
        list_volumes(csi::ListVolumesRequest) -> csi::ListVolumesResponse;
        get_capacity(csi::GetCapacityRequest) -> csi::GetCapacityResponse;
        delete_snapshot(csi::DeleteSnapshotRequest) -> csi::DeleteSnapshotResponse;
        list_snapshots(csi::ListSnapshotsRequest) -> csi::ListSnapshotsResponse;
        get_snapshot(csi::GetSnapshotRequest) -> csi::GetSnapshotResponse;
        controller_expand_volume(csi::ControllerExpandVolumeRequest) -> csi::ControllerExpandVolumeResponse;
        controller_get_volume(csi::ControllerGetVolumeRequest) -> csi::ControllerGetVolumeResponse;
        controller_modify_volume(csi::ControllerModifyVolumeRequest) -> csi::ControllerModifyVolumeResponse;
    }
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        let volume = self.echo.then(|| csi::Volume {
            volume_id: format!("yes/{}", req.name),
            capacity_bytes: req.capacity_range.map_or(0, |r| r.required_bytes),
            ..Default::default()
        });
        Ok(Response::new(csi::CreateVolumeResponse { volume }))
    }
    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let req = req.into_inner();
        let snapshot = self.echo.then(|| csi::Snapshot {
            snapshot_id: format!("yes-snapshot/{}", req.name),
            source_volume_id: req.source_volume_id,
            creation_time: Some(prost_types::Timestamp {
                seconds: 1,
                nanos: 0,
            }),
            ready_to_use: true,
            ..Default::default()
        });
        Ok(Response::new(csi::CreateSnapshotResponse { snapshot }))
    }
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::{Rpc, Type, rpc};
        let capabilities = (1..)
            .map_while(|n| rpc::Type::try_from(n).ok())
            .map(|t| ControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities }))
    }
}

says_yes! {
    Node {
        node_stage_volume(csi::NodeStageVolumeRequest) -> csi::NodeStageVolumeResponse;
        node_unstage_volume(csi::NodeUnstageVolumeRequest) -> csi::NodeUnstageVolumeResponse;
        node_publish_volume(csi::NodePublishVolumeRequest) -> csi::NodePublishVolumeResponse;
        node_unpublish_volume(csi::NodeUnpublishVolumeRequest) -> csi::NodeUnpublishVolumeResponse;
        node_get_volume_stats(csi::NodeGetVolumeStatsRequest) -> csi::NodeGetVolumeStatsResponse;
        node_expand_volume(csi::NodeExpandVolumeRequest) -> csi::NodeExpandVolumeResponse;
    }
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let node_id = if self.echo { "yes-node" } else { "" };
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: node_id.into(),
            ..Default::default()
        }))
    }
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::{Rpc, Type, rpc};
        let capabilities = (1..)
            .map_while(|n| rpc::Type::try_from(n).ok())
            .map(|t| NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }
}

/// The server task; stopped when dropped.
#[derive(Debug)]
pub struct Server(tokio::task::JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves Identity, Controller and Node of [`Yes`] on the unix socket `socket`.
pub async fn serve(socket: &Path, echo: bool) -> Server {
    let listener = tokio::net::UnixListener::bind(socket).expect("bind the socket");
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    Server(tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(Yes { echo }))
            .add_service(ControllerServer::new(Yes { echo }))
            .add_service(NodeServer::new(Yes { echo }))
            .serve_with_incoming(incoming)
            .await
            .expect("serve");
    }))
}
