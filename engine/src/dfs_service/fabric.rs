//! The data service on the fabric: a tenant-session server whose handler is the
//! [`DataService`].
//!
//! The session layer has already verified the connection's capability (signature of a trusted
//! node agent, expiry) before any request arrives; this module turns its claims into the
//! [`ConnectionContext`] (pool, container, rights) and lets the service touch client memory only
//! through the request's own scoped rkey ([`BulkAccess`]).

use super::{BulkIo, ConnectionContext, DataService, MAX_IO};
use crate::engine::Engine;
use dpufs_fabric::session::{
    AgentPublicKey, BulkAccess, Capability, Request, RunningServer, ServerConfig, SessionError,
    SessionServer, TrustedAgents,
};
use dpufs_fabric::{Provider, RdmaDevice, UseDevice};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Where and how the data service listens.
#[derive(Debug, Clone)]
pub struct FabricOptions {
    /// Handshake listener of the session server.
    pub listen: SocketAddr,
    /// The provider whose device the service's QPs use (`--fabric-provider`).
    pub provider: Provider,
    /// PEM files of the node agents' public keys whose capabilities are honoured.
    pub agent_keys: Vec<PathBuf>,
    /// Clock skew between agents and this engine tolerated when checking expiry.
    pub clock_skew: std::time::Duration,
}

/// Errors starting the data service.
#[derive(Debug, thiserror::Error)]
pub enum FabricStartError {
    #[error("agent key {path}: {detail}")]
    AgentKey { path: String, detail: String },
    #[error("fabric device: {0}")]
    Device(#[from] dpufs_fabric::FabricError),
    #[error("data service: {0}")]
    Session(#[from] SessionError),
}

/// A running data service, whatever its device.
pub trait DataServer {
    /// The handshake address it listens on.
    fn local_addr(&self) -> SocketAddr;
    /// Stops it: no new connections, in-flight requests answered.
    fn shutdown(self: Box<Self>) -> Result<(), SessionError>;
}

impl<D: RdmaDevice> DataServer for RunningServer<D> {
    fn local_addr(&self) -> SocketAddr {
        self.server().local_addr()
    }

    fn shutdown(self: Box<Self>) -> Result<(), SessionError> {
        RunningServer::shutdown(*self)
    }
}

/// Starts serving DFS over the fabric; the server runs until the handle is shut down.
pub fn serve(
    engine: Arc<Engine>,
    opts: &FabricOptions,
) -> Result<Box<dyn DataServer>, FabricStartError> {
    let mut trusted = TrustedAgents::new();
    for path in &opts.agent_keys {
        let key_error = |detail: String| FabricStartError::AgentKey {
            path: path.display().to_string(),
            detail,
        };
        let pem = std::fs::read(path).map_err(|e| key_error(e.to_string()))?;
        trusted.add(AgentPublicKey::from_pem(&pem).map_err(|e| key_error(e.to_string()))?);
    }
    let bind = Bind {
        listen: opts.listen,
        trusted,
        service: DataService::new(engine),
        config: ServerConfig {
            max_bulk: MAX_IO,
            clock_skew: opts.clock_skew,
            ..ServerConfig::default()
        },
    };
    Ok(opts.provider.open(bind)??)
}

/// Binds the session server on the device the provider opened.
struct Bind {
    listen: SocketAddr,
    trusted: TrustedAgents,
    service: DataService,
    config: ServerConfig,
}

impl UseDevice for Bind {
    type Output = Result<Box<dyn DataServer>, SessionError>;

    fn use_device<D: RdmaDevice>(self, device: D) -> Self::Output {
        let service = self.service;
        let handler = move |req: &Request<'_>, bulk: &mut BulkAccess<'_>, reply: &mut Vec<u8>| {
            let ctx = context(req.claims);
            reply.extend_from_slice(&service.handle(&ctx, req.message, &mut SessionBulk(bulk)));
        };
        let server = SessionServer::bind(device, self.listen, self.trusted, handler, self.config)?;
        Ok(Box::new(server.spawn()?))
    }
}

/// The connection's context from its verified capability.
fn context(claims: &Capability) -> ConnectionContext {
    ConnectionContext {
        pool: claims.pool.clone(),
        container: claims.container.clone(),
        snapshot: None,
        rights: claims.rights,
    }
}

/// The request's scoped rkey as the service's [`BulkIo`].
struct SessionBulk<'a, 'b>(&'a mut BulkAccess<'b>);

fn io_error(e: SessionError) -> io::Error {
    io::Error::other(e.to_string())
}

impl BulkIo for SessionBulk<'_, '_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn pull(&mut self, offset: usize, out: &mut [u8]) -> io::Result<()> {
        self.0.pull(offset, out).map_err(io_error)
    }

    fn push(&mut self, offset: usize, data: &[u8]) -> io::Result<()> {
        self.0.push(offset, data).map_err(io_error)
    }

    fn push_from(
        &mut self,
        offset: usize,
        len: usize,
        produce: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize> {
        self.0.push_with(offset, len, produce).map_err(io_error)
    }
}
