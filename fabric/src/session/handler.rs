//! The interface the engine implements: a [`Handler`] per server, called with each [`Request`]
//! and the [`BulkAccess`] that is its only way to reach worker memory.
//!
//! Why the accessor is all a handler gets: it can touch only the memory the request's own scoped
//! rkey names, on the QP the request came on, within the length the request declared, and only
//! in the one direction the lease grants. A handler cannot name another rkey, so a request of
//! one tenant can never make the server move another tenant's data (the confused deputy).

use std::net::SocketAddr;

use super::capability::Capability;
use super::error::SessionError;
use super::wire::{LeaseClaim, LeaseRight};

/// Serves requests. Called on a worker thread; several requests (also of one connection) run
/// at once. Write the reply message (at most [`MAX_CONTROL_MESSAGE`](super::MAX_CONTROL_MESSAGE) bytes) into `reply`, which
/// arrives empty. Application errors belong in the reply.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request.
    fn handle(&self, request: &Request<'_>, bulk: &mut BulkAccess<'_>, reply: &mut Vec<u8>);
}

impl<F> Handler for F
where
    F: Fn(&Request<'_>, &mut BulkAccess<'_>, &mut Vec<u8>) + Send + Sync + 'static,
{
    fn handle(&self, request: &Request<'_>, bulk: &mut BulkAccess<'_>, reply: &mut Vec<u8>) {
        self(request, bulk, reply)
    }
}

/// A request as the handler sees it.
#[derive(Debug)]
pub struct Request<'a> {
    /// Verified claims of the connection's capability.
    pub claims: &'a Capability,
    /// The worker's address (the handshake connection's).
    pub peer: SocketAddr,
    /// Request id (increasing per connection).
    pub request_id: u64,
    /// The request message.
    pub message: &'a [u8],
    /// The bulk memory the request names, if any.
    pub lease: Option<LeaseClaim>,
}

/// Moves the request's bulk data; the only way a handler reaches worker memory.
pub struct BulkAccess<'a> {
    ops: &'a mut dyn BulkOps,
}

impl std::fmt::Debug for BulkAccess<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkAccess")
            .field("lease", &self.ops.lease())
            .finish()
    }
}

/// What a request's accessor does (implemented by the server's workers).
pub(crate) trait BulkOps {
    fn lease(&self) -> Option<LeaseClaim>;
    fn pull(&mut self, offset: usize, out: &mut [u8]) -> Result<(), SessionError>;
    fn push_with(
        &mut self,
        offset: usize,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<usize, SessionError>;
}

impl<'a> BulkAccess<'a> {
    pub(crate) fn new(ops: &'a mut dyn BulkOps) -> BulkAccess<'a> {
        BulkAccess { ops }
    }

    /// Bytes the request leases (0 without bulk).
    pub fn len(&self) -> usize {
        self.ops.lease().map_or(0, |l| l.len as usize)
    }

    /// Whether the request has no bulk.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The direction the lease allows: `RemoteRead` (pull) or `RemoteWrite` (push).
    pub fn right(&self) -> Option<LeaseRight> {
        self.ops.lease().map(|l| l.right)
    }

    /// Reads `out.len()` bytes at `offset` of the worker's buffer (RDMA READ; waits for it).
    pub fn pull(&mut self, offset: usize, out: &mut [u8]) -> Result<(), SessionError> {
        self.ops.pull(offset, out)
    }

    /// Writes `data` at `offset` of the worker's buffer (RDMA WRITE). Pushes must go forward
    /// (each starts at or after the end of the previous one); the reply reports the end of the
    /// last push as the bulk length. A push is posted, not awaited: RC ordering delivers it
    /// before the reply, and if the worker's NIC refuses it the connection dies and no reply
    /// is delivered.
    pub fn push(&mut self, offset: usize, data: &[u8]) -> Result<(), SessionError> {
        let copy = &mut |slot: &mut [u8]| {
            slot.copy_from_slice(data);
            data.len()
        };
        self.ops.push_with(offset, data.len(), copy).map(drop)
    }

    /// [`push`](Self::push) of data that `fill` produces straight into the server's registered
    /// bounce memory (one copy less than producing it into a buffer and pushing that): `fill`
    /// gets up to `len` bytes to write (called once, with an empty slice when `len` is 0) and
    /// returns how many it wrote, which are pushed at `offset`. Returns that count. The checks
    /// are [`push`](Self::push)'s, for `len`; when one fails, `fill` is not called.
    pub fn push_with(
        &mut self,
        offset: usize,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<usize, SessionError> {
        self.ops.push_with(offset, len, fill)
    }
}
