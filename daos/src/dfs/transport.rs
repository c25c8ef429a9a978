//! The seam between [`super::EngineDfs`] and whatever carries its messages: the fabric's
//! tenant session in production, a direct call into the engine's data service in tests.

use super::DfsResult;
use std::fmt;

/// The request's payload buffer, which the engine reaches by RMA (a scoped rkey over it):
/// the tenant session's own type, so the fabric transport passes it on as it is.
pub use dpufs_fabric::session::Bulk;

/// What came back for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportReply {
    /// The encoded `DfsReply`.
    pub message: Vec<u8>,
    /// Bulk bytes the engine moved, when the transport knows (0 otherwise).
    pub bulk_bytes: usize,
}

/// Carries `DfsRequest` messages to one container's data service and their replies back.
/// Called from many threads at once; each call is one request in flight.
pub trait DfsTransport: Send + Sync {
    /// Sends an encoded `DfsRequest` (at most 64 KiB) with its payload buffer, and waits
    /// for the reply. A request that got no reply fails with the errno its caller sees:
    /// ETIMEDOUT when none came in time, EACCES when the server refused the capability, EIO
    /// when the connection broke.
    fn call(&self, request: &[u8], bulk: Bulk<'_>) -> DfsResult<TransportReply>;
}

impl fmt::Debug for dyn DfsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DfsTransport")
    }
}
