//! [`EngineDfs`](super::EngineDfs) over the fabric: each DFS request is one call on the
//! tenant session's connection to the engine, its payload moving by RMA through a scoped rkey.

use super::transport::{Bulk, DfsTransport, TransportError, TransportReply};
use dpufs_fabric::RdmaDevice;
use dpufs_fabric::session::{self, Connection, SessionError};
use std::sync::Arc;

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
    fn call(&self, request: &[u8], bulk: Bulk<'_>) -> Result<TransportReply, TransportError> {
        let reply = self.conn.call(request, bulk).map_err(transport_error)?;
        Ok(TransportReply {
            message: reply.message,
            bulk_bytes: reply.bulk_len,
        })
    }
}

fn transport_error(e: SessionError) -> TransportError {
    match e {
        SessionError::Timeout { .. } => TransportError::TimedOut(e.to_string()),
        other => TransportError::Failed(other.to_string()),
    }
}

/// Connects `session` to the engine's data service at `server` with `capability`, and mounts
/// the capability's container.
pub fn mount<D: RdmaDevice>(
    session: &session::TenantSession<D>,
    server: std::net::SocketAddr,
    capability: session::SignedCapability,
) -> super::DfsResult<super::EngineDfs> {
    let conn = session.connect(server, capability).map_err(|e| {
        let errno = match e {
            SessionError::Refused { .. } | SessionError::Capability(_) => super::Errno::ACCES,
            _ => super::Errno::IO,
        };
        super::DfsError::new(errno, format!("connect to the engine at {server}: {e}"))
    })?;
    super::EngineDfs::mount(Arc::new(FabricTransport::new(conn)))
}
