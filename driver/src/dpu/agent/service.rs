//! The control channel's server: `dpufs.dpu.v1.DpuAgent` over TCP with mutual TLS
//! ([`crate::dpu::tls`]), each call handed to the [`Agent`] and logged with its code
//! ([`crate::csi::server::CallLogLayer`]).

use super::{Agent, Caller, Device, PodRef};
use crate::csi::TOPOLOGY_SYSTEM_KEY;
use crate::dpu::API_VERSION;
use crate::dpu::tls;
use dpufs_proto::dpu::v1::{
    self as pb, dpu_agent_server::DpuAgent, dpu_agent_server::DpuAgentServer,
};
use std::future::Future;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The gRPC face of an [`Agent`].
#[derive(Debug, Clone)]
pub struct AgentService {
    agent: Arc<Agent>,
}

impl AgentService {
    pub fn new(agent: Arc<Agent>) -> AgentService {
        AgentService { agent }
    }
}

fn device(d: Device) -> pb::VirtioFsDevice {
    pb::VirtioFsDevice {
        transport: d.transport as i32,
        tag: d.tag,
        read_only: d.read_only,
    }
}

/// Whether an access mode only reads.
fn reader_only(mode: i32) -> bool {
    matches!(
        pb::AccessMode::try_from(mode),
        Ok(pb::AccessMode::SingleNodeReaderOnly | pb::AccessMode::MultiNodeReaderOnly)
    )
}

/// The most entries of a ListVolumes page, whatever the caller asks.
const MAX_PAGE: usize = 1000;

#[tonic::async_trait]
impl DpuAgent for AgentService {
    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        let info = self.agent.probe().await;
        Ok(Response::new(pb::ProbeResponse {
            ready: info.ready,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            api_version: API_VERSION,
            dpu_node: info.dpu_node,
            host_node: info.host_node.unwrap_or_default(),
            topology: info
                .system
                .map(|s| (TOPOLOGY_SYSTEM_KEY.to_string(), s))
                .into_iter()
                .collect(),
        }))
    }

    async fn stage_volume(
        &self,
        req: Request<pb::StageVolumeRequest>,
    ) -> Result<Response<pb::StageVolumeResponse>, Status> {
        let req = req.into_inner();
        let access = req.access.unwrap_or_default();
        let read_only = access.read_only || reader_only(access.mode);
        let pod = req.pod.map(|p| PodRef {
            namespace: p.namespace,
            name: p.name,
            uid: p.uid,
        });
        let staged = self
            .agent
            .stage(
                &req.volume_id,
                read_only,
                &Caller::Host(req.host_node),
                pod.as_ref(),
            )
            .await?;
        Ok(Response::new(pb::StageVolumeResponse {
            device: Some(device(staged)),
        }))
    }

    async fn unstage_volume(
        &self,
        req: Request<pb::UnstageVolumeRequest>,
    ) -> Result<Response<pb::UnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        self.agent
            .unstage(&req.volume_id, &Caller::Host(req.host_node))
            .await?;
        Ok(Response::new(pb::UnstageVolumeResponse {}))
    }

    async fn get_volume_stats(
        &self,
        req: Request<pb::GetVolumeStatsRequest>,
    ) -> Result<Response<pb::GetVolumeStatsResponse>, Status> {
        let stats = self.agent.stats(&req.into_inner().volume_id).await?;
        let usage = |u: super::stats::Usage| pb::Usage {
            used: u.used as i64,
            total: u.total as i64,
            available: u.available as i64,
        };
        Ok(Response::new(pb::GetVolumeStatsResponse {
            bytes: stats.bytes.map(usage),
            inodes: stats.inodes.map(usage),
            condition: Some(pb::VolumeCondition {
                abnormal: stats.abnormal.is_some(),
                message: stats.message().to_string(),
            }),
        }))
    }

    async fn list_volumes(
        &self,
        req: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        let req = req.into_inner();
        let max = usize::try_from(req.max_entries)
            .ok()
            .filter(|&m| m > 0)
            .map_or(MAX_PAGE, |m| m.min(MAX_PAGE));
        let page = self.agent.list(max, &req.starting_token)?;
        Ok(Response::new(pb::ListVolumesResponse {
            entries: page
                .entries
                .into_iter()
                .map(|(volume_id, d)| pb::list_volumes_response::Entry {
                    volume_id,
                    device: Some(device(d)),
                })
                .collect(),
            next_token: page.next.unwrap_or_default(),
        }))
    }
}

/// Serves the control channel on `listener` with mutual TLS until `shutdown`.
pub async fn serve(
    agent: Arc<Agent>,
    listener: tokio::net::TcpListener,
    acceptor: openssl::ssl::SslAcceptor,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let addr = listener.local_addr().ok();
    tracing::info!(?addr, "serving the DPU control channel (mutual TLS)");
    tonic::transport::Server::builder()
        .layer(crate::csi::server::CallLogLayer)
        .add_service(DpuAgentServer::new(AgentService::new(agent)))
        .serve_with_incoming_shutdown(tls::incoming(listener, acceptor), shutdown)
        .await
}
