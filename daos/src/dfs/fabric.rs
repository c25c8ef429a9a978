//! [`EngineDfs`](super::EngineDfs) over the fabric: each DFS request is one call on the
//! tenant session's connection to the engine, its payload moving by RMA through a scoped rkey.
//!
//! [`EngineClient`] is how a product binary opens all of it: the provider it was told to use
//! (`--fabric-provider`), its own tenant session on that device, and mounts and capability
//! renewals against one engine, without naming a device type.

use super::transport::{Bulk, DfsTransport, TransportReply};
use super::{DfsResult, EngineDfs};
use dpufs_fabric::session::{self, Connection, SessionConfig, SessionError, TenantSession};
use dpufs_fabric::{RdmaDevice, UseDevice};
use std::net::SocketAddr;
use std::sync::Arc;

pub use dpufs_fabric::soft::DeviceOptions;
pub use dpufs_fabric::{Provider, ProviderKind, RDMA_DEVICE_ENV};

/// A connection of a `TenantSession` as the DFS client's transport.
#[derive(Debug)]
pub struct FabricTransport<D: RdmaDevice> {
    conn: Arc<Connection<D>>,
}

impl<D: RdmaDevice> FabricTransport<D> {
    /// Wraps a connection made with `TenantSession::connect`.
    pub fn new(conn: Arc<Connection<D>>) -> FabricTransport<D> {
        FabricTransport { conn }
    }
}

impl<D: RdmaDevice> DfsTransport for FabricTransport<D> {
    fn call(&self, request: &[u8], bulk: Bulk<'_>) -> DfsResult<TransportReply> {
        let reply = self.conn.call(request, bulk)?;
        Ok(TransportReply {
            message: reply.message,
            bulk_bytes: reply.bulk_len,
        })
    }
}

/// Connects `session` to the engine's data service at `server` with `capability`, and mounts
/// the capability's container.
pub fn mount<D: RdmaDevice>(
    session: &TenantSession<D>,
    server: SocketAddr,
    capability: session::SignedCapability,
) -> DfsResult<EngineDfs> {
    let conn = session.connect(server, capability).map_err(|e| {
        let mut e = super::DfsError::from(e);
        e.detail = format!("connect to the engine at {server}: {}", e.detail);
        e
    })?;
    EngineDfs::mount(Arc::new(FabricTransport::new(conn)))
}

/// A tenant session of its own on the provider the process was told to use, for one engine's
/// data service.
pub struct EngineClient {
    session: Box<dyn Session>,
    server: SocketAddr,
}

impl std::fmt::Debug for EngineClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineClient")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl EngineClient {
    /// Opens `provider`'s device and a tenant session on it (its own PD, buffer pools and
    /// QPs) for the data service at `server`. A software device's QPs accept the engine's
    /// connections on this machine's address towards `server` (the engine connects back to
    /// them from its node).
    pub fn open(provider: &Provider, server: SocketAddr) -> Result<EngineClient, SessionError> {
        let session = provider
            .facing(server)?
            .open(OpenSession(SessionConfig::default()))??;
        Ok(EngineClient { session, server })
    }

    /// Mounts the container `capability` names.
    pub fn mount(&self, capability: session::SignedCapability) -> DfsResult<EngineDfs> {
        self.session.mount(self.server, capability)
    }

    /// Presents `capability` (the node agent renewed it) from the connection's next call on,
    /// on a new QP ([`session::Connection::renew`]).
    pub fn renew(&self, capability: session::SignedCapability) -> Result<(), SessionError> {
        self.session.renew(self.server, capability)
    }
}

/// A tenant session whatever its device.
trait Session: Send + Sync {
    fn mount(&self, server: SocketAddr, cap: session::SignedCapability) -> DfsResult<EngineDfs>;
    fn renew(&self, server: SocketAddr, cap: session::SignedCapability)
    -> Result<(), SessionError>;
}

impl<D: RdmaDevice> Session for TenantSession<D> {
    fn mount(&self, server: SocketAddr, cap: session::SignedCapability) -> DfsResult<EngineDfs> {
        mount(self, server, cap)
    }

    fn renew(
        &self,
        server: SocketAddr,
        cap: session::SignedCapability,
    ) -> Result<(), SessionError> {
        self.connect(server, cap).map(drop)
    }
}

/// Opens a tenant session on the device the provider opened.
struct OpenSession(SessionConfig);

impl UseDevice for OpenSession {
    type Output = Result<Box<dyn Session>, SessionError>;

    fn use_device<D: RdmaDevice>(self, device: D) -> Self::Output {
        Ok(Box::new(TenantSession::open(device, self.0)?))
    }
}
