//! The DFS data service: one request of a client connection in, one reply out, against the
//! namespaces this service keeps open ([`Volumes`]).
//!
//! It is independent of the transport. The fabric session layer verifies the connection's
//! capability, hands each request message here with a [`ConnectionContext`] built from it,
//! and a [`BulkIo`] over the request's scoped rkey; file data moves only through that (RMA
//! READ of the client's write-staging buffer, RMA WRITE into its read-landing buffer).
//!
//! Rights: a connection without write rights, or to a snapshot, is read-only: every change
//! (and opening for writing) fails with EROFS, the error a read-only mount gives, and
//! `MountInfo.read_only` says so up front.

mod budget;
mod dispatch;
pub mod fabric;
mod lifecycle;
mod verifier;
mod volumes;
mod wire;

pub use budget::{PoolBudget, data_tier};
pub use volumes::{DEFAULT_CHUNK_SIZE, VolumeKey, Volumes, chunk_size_of, quota_of};

use crate::engine::Engine;
use crate::namespace::{DfsError, Errno};
pub use dpufs_fabric::session::Rights;
use dpufs_proto::engine::v1::{DfsReply, DfsRequest};
use prost::Message;
use std::io;
use std::sync::Arc;

pub use dpufs_proto::dfs::{MAX_INLINE, MAX_IO, READDIR_BATCH};

/// The client's buffer a Read or Write moves data through: a scoped rkey over the client's
/// registered memory, or a plain buffer in tests.
pub trait BulkIo {
    /// Bytes in the buffer.
    fn len(&self) -> usize;
    /// Whether the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `out.len()` bytes from `offset` of the client's buffer (RDMA READ of its
    /// write-staging buffer).
    fn pull(&mut self, offset: usize, out: &mut [u8]) -> io::Result<()>;
    /// Copies `data` to `offset` of the client's buffer (RDMA WRITE into its read-landing
    /// buffer).
    fn push(&mut self, offset: usize, data: &[u8]) -> io::Result<()>;
    /// Pushes to `offset` what `produce` writes into a buffer of up to `len` bytes (it returns
    /// how many it wrote; it is called once, unless the transfer is refused first), and returns
    /// that count. The fabric hands `produce` its registered
    /// bounce memory, so a read goes from the disk to the client with no copy in between;
    /// by default the data goes through a buffer of its own.
    fn push_from(
        &mut self,
        offset: usize,
        len: usize,
        produce: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize> {
        let mut buf = vec![0; len];
        let n = produce(&mut buf).min(len);
        if n > 0 {
            self.push(offset, &buf[..n])?;
        }
        Ok(n)
    }
}

/// No buffer: for requests without data.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoBulk;

impl BulkIo for NoBulk {
    fn len(&self) -> usize {
        0
    }
    fn pull(&mut self, _: usize, _: &mut [u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the request has no buffer",
        ))
    }
    fn push(&mut self, _: usize, _: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the request has no buffer",
        ))
    }
}

/// The connection a request came on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionContext {
    /// Pool UUID.
    pub pool: String,
    /// Container UUID.
    pub container: String,
    /// The snapshot (by epoch) the connection serves, read-only; None for the container.
    pub snapshot: Option<u64>,
    /// What the connection may do, from its verified capability.
    pub rights: Rights,
}

impl ConnectionContext {
    fn key(&self) -> VolumeKey {
        VolumeKey {
            pool: self.pool.clone(),
            container: self.container.clone(),
            snapshot: self.snapshot,
        }
    }

    /// Whether changes are refused (EROFS).
    pub fn read_only(&self) -> bool {
        self.snapshot.is_some() || !self.rights.write
    }
}

/// The data service of an engine.
#[derive(Debug, Clone)]
pub struct DataService {
    volumes: Arc<Volumes>,
}

impl DataService {
    /// The data service of `engine`'s containers.
    pub fn new(engine: Arc<Engine>) -> DataService {
        DataService {
            volumes: engine.volumes().clone(),
        }
    }

    /// Serves one encoded request; the reply is always a message (an undecodable request
    /// gets EPROTO).
    pub fn handle(
        &self,
        ctx: &ConnectionContext,
        request: &[u8],
        bulk: &mut dyn BulkIo,
    ) -> Vec<u8> {
        let reply = match DfsRequest::decode(request) {
            Ok(req) => self.serve(ctx, req, bulk),
            Err(e) => wire::failure(
                0,
                DfsError {
                    errno: Errno::PROTO,
                    detail: format!("undecodable request: {e}"),
                },
            ),
        };
        reply.encode_to_vec()
    }

    /// Serves one request.
    pub fn serve(
        &self,
        ctx: &ConnectionContext,
        req: DfsRequest,
        bulk: &mut dyn BulkIo,
    ) -> DfsReply {
        let id = req.id;
        let mut reply = match dispatch::run(&self.volumes, ctx, req, bulk) {
            Ok(answer) => DfsReply {
                id,
                errno: 0,
                detail: String::new(),
                result: answer.result,
                dirs: answer.dirs,
                verifier: 0,
            },
            Err(e) => {
                tracing::debug!(id, errno = e.errno.0, detail = %e.detail, "dfs request failed");
                wire::failure(id, e)
            }
        };
        reply.verifier = self.volumes.verifier();
        reply
    }
}
