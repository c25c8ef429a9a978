//! Serving the engine's gRPC services on TCP or a unix socket.

use crate::admission::{self, AdmissionLimits};
use crate::service::EngineServices;
use dpufs_proto::engine::v1::{
    container_svc_server::ContainerSvcServer, rank_control_server::RankControlServer,
};
use dpufs_proto::mgmt::mgmt_svc_server::MgmtSvcServer;
use std::future::Future;
use tonic::transport::server::Router;

/// A router with every engine service plus gRPC reflection (for grpcurl).
pub fn router(services: EngineServices) -> anyhow::Result<Router> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(dpufs_proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    Ok(tonic::transport::Server::builder()
        .add_service(MgmtSvcServer::new(services.clone()))
        .add_service(ContainerSvcServer::new(services.clone()))
        .add_service(RankControlServer::new(services))
        .add_service(reflection))
}

/// Serves plaintext h2c (DAOS's insecure mode) on a bound TCP listener, admitting
/// connections within `limits`.
pub async fn serve_tcp(
    router: Router,
    listener: tokio::net::TcpListener,
    limits: AdmissionLimits,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let incoming = admission::incoming(listener, limits, |tcp| async { Ok(tcp) });
    router
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// Serves on a unix socket (local tools and tests).
pub async fn serve_unix(
    router: Router,
    listener: tokio::net::UnixListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    router
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// Serves DAOS's mutual TLS on a bound TCP listener, admitting connections within `limits`.
pub async fn serve_tls(
    router: Router,
    listener: tokio::net::TcpListener,
    acceptor: openssl::ssl::SslAcceptor,
    limits: AdmissionLimits,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    router
        .serve_with_incoming_shutdown(crate::tls::incoming(listener, acceptor, limits), shutdown)
        .await?;
    Ok(())
}
