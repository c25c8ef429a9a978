//! [`EngineDfs`]: the [`Dfs`] interface over the embedded engine's data service.
//!
//! Every call is one small `DfsRequest` message over a [`DfsTransport`]. File data up to the
//! engine's `max_inline` travels in the messages themselves (an eager message: no rkey, no
//! RDMA round trip); larger data moves only through the request's bulk buffer, which the
//! engine reaches by RMA. A read or write
//! larger than the engine's `max_io` is cut into `max_io` pieces sent concurrently (a few at
//! a time), so several chunks are on the wire at once instead of one round trip after
//! another.

mod unstable;
mod wire;

use super::transport::{Bulk, DfsTransport};
use super::{Attr, DfsError, DfsResult, Errno, Oid, ROOT_OID};
use dpufs_proto::dfs::MAX_INLINE;
use dpufs_proto::engine::v1::{self as proto, dfs_reply::Result as Res, dfs_request::Op};
use prost::Message;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use unstable::{Lost, Unstable};

/// Pieces of one large read or write in flight at once, by default.
pub const DEFAULT_PIPELINE_DEPTH: usize = 4;

/// What the engine said about the container when it was mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Bytes per chunk of the container's files.
    pub chunk_size: u64,
    /// Every change fails with EROFS (a snapshot, or a read-only connection).
    pub read_only: bool,
    /// Largest read or write one request carries.
    pub max_io: usize,
    /// Largest read or write carried in the messages themselves (no rkey); 0: none.
    pub max_inline: usize,
}

/// A container served by the engine. See the module documentation.
#[derive(Debug)]
pub struct EngineDfs {
    transport: Arc<dyn DfsTransport>,
    mount: MountInfo,
    next_id: AtomicU64,
    depth: usize,
    changed_dirs: ChangedDirs,
    unstable: Unstable,
}

/// Directories as this client's last change of an entry left them (`DfsReply.dirs`), until
/// taken ([`Dfs::take_changed_dir`]).
#[derive(Debug, Default)]
struct ChangedDirs(Mutex<HashMap<Oid, (Attr, Instant)>>);

/// Changed directories remembered at most: the kernel takes each soon after the change or
/// never (then the attribute timeout has made it useless anyway).
const CHANGED_DIRS_MAX: usize = 1024;

impl ChangedDirs {
    /// Keeps each directory's attributes with the latest ctime: replies to two changes in
    /// one directory may arrive in either order.
    fn record(&self, dirs: Vec<proto::DfsAttr>) {
        let now = Instant::now();
        let mut map = self.0.lock().expect("changed directories");
        if map.len() >= CHANGED_DIRS_MAX {
            map.clear();
        }
        for d in dirs {
            let attr = wire::attr(d);
            match map.get(&attr.oid) {
                Some((had, _)) if had.ctime > attr.ctime => {}
                _ => {
                    map.insert(attr.oid, (attr, now));
                }
            }
        }
    }

    fn take(&self, dir: Oid) -> Option<(Attr, Instant)> {
        self.0.lock().expect("changed directories").remove(&dir)
    }
}

/// The error of an fsync (or a change) whose changes to `oid` an engine that is gone
/// acknowledged.
fn lost(oid: Oid, lost: Lost) -> DfsError {
    DfsError::new(
        Errno::IO,
        format!(
            "object {oid:#x}: the engine restarted after it acknowledged changes no fsync had \
             made durable (verifier {:#x}); they may be lost",
            lost.verifier
        ),
    )
}

fn expect<T>(what: &str, res: Option<Res>, pick: impl FnOnce(Res) -> Option<T>) -> DfsResult<T> {
    res.and_then(pick).ok_or_else(|| {
        wire::protocol_error(format!("the reply to {what} has no result of its kind"))
    })
}

fn attr_of(what: &str, res: Option<Res>) -> DfsResult<Attr> {
    expect(what, res, |r| match r {
        Res::Attr(a) => Some(wire::attr(a)),
        _ => None,
    })
}

/// One piece of a large transfer: its offset in the file and in the caller's buffer.
struct Piece {
    file_offset: u64,
    start: usize,
    len: usize,
}

fn pieces(offset: u64, len: usize, max_io: usize) -> Vec<Piece> {
    (0..len)
        .step_by(max_io.max(1))
        .map(|start| Piece {
            // A client may send any offset (a guest over virtio-fs is not the kernel); one
            // past 2^64 is past any file's end either way (the engine's end is 2^63 - 1):
            // reads there find nothing and writes are refused with EFBIG.
            file_offset: offset.saturating_add(start as u64),
            start,
            len: max_io.min(len - start),
        })
        .collect()
}

impl EngineDfs {
    /// Mounts the container the transport's connection serves.
    pub fn mount(transport: Arc<dyn DfsTransport>) -> DfsResult<EngineDfs> {
        let mut dfs = EngineDfs {
            transport,
            mount: MountInfo {
                chunk_size: 0,
                read_only: true,
                max_io: 0,
                max_inline: 0,
            },
            next_id: AtomicU64::new(1),
            depth: DEFAULT_PIPELINE_DEPTH,
            changed_dirs: ChangedDirs::default(),
            unstable: Unstable::new(Unstable::MAX),
        };
        let info = expect(
            "Mount",
            dfs.call(Op::Mount(proto::Mount {}), Bulk::None)?,
            |r| match r {
                Res::Mount(m) => Some(m),
                _ => None,
            },
        )?;
        if info.root != ROOT_OID || info.max_io == 0 {
            return Err(wire::protocol_error(format!(
                "mount says root {:#x}, max_io {}",
                info.root, info.max_io
            )));
        }
        dfs.mount = MountInfo {
            chunk_size: info.chunk_size,
            read_only: info.read_only,
            max_io: info.max_io as usize,
            // What this client is willing to copy, whatever a (newer) engine offers.
            max_inline: (info.max_inline as usize).min(MAX_INLINE),
        };
        Ok(dfs)
    }

    /// Changes how many pieces of one large read or write are in flight at once (≥ 1).
    pub fn with_pipeline_depth(mut self, depth: usize) -> EngineDfs {
        self.depth = depth.max(1);
        self
    }

    /// What the engine said at mount.
    pub fn mount_info(&self) -> &MountInfo {
        &self.mount
    }

    /// One request and its reply; an errno reply becomes the error.
    fn call(&self, op: Op, bulk: Bulk<'_>) -> DfsResult<Option<Res>> {
        self.exchange(op, bulk).map(|(result, _)| result)
    }

    /// A change of `oids`: one request and its reply, the change recorded under the reply's
    /// write verifier until an fsync covers it (see `unstable.rs`).
    fn change(&self, oids: &[Oid], op: Op, bulk: Bulk<'_>) -> DfsResult<Option<Res>> {
        let (result, verifier) = self.exchange(op, bulk)?;
        for &oid in oids {
            self.record(oid, verifier)?;
        }
        Ok(result)
    }

    /// Records a change of `oid` acknowledged under `verifier`. With the table full, the
    /// whole container is synced first; the change fails with EIO if the engine that
    /// acknowledged it is gone by then.
    fn record(&self, oid: Oid, verifier: u64) -> DfsResult<()> {
        if self.unstable.changed(oid, verifier) {
            return Ok(());
        }
        let synced = self.sync_container()?;
        if synced != verifier {
            return Err(lost(oid, Lost { verifier }));
        }
        Ok(())
    }

    /// Makes every change to the container durable (`Syncfs`); the verifier it was
    /// answered under.
    fn sync_container(&self) -> DfsResult<u64> {
        let mark = self.unstable.mark();
        let (_, verifier) = self.exchange(Op::Syncfs(proto::Syncfs {}), Bulk::None)?;
        self.unstable.synced_all(mark, verifier);
        Ok(verifier)
    }

    /// Makes `oid`'s changes durable (`Fsync`); EIO, once, if an engine that acknowledged
    /// some of them is gone.
    fn sync_object(&self, oid: Oid, datasync: bool) -> DfsResult<()> {
        let mark = self.unstable.mark();
        let op = Op::Fsync(proto::Fsync { oid, datasync });
        let (_, verifier) = self.exchange(op, Bulk::None)?;
        self.unstable
            .synced(oid, mark, verifier)
            .map_err(|l| lost(oid, l))
    }

    /// One request and its reply with the reply's write verifier; an errno reply becomes
    /// the error.
    fn exchange(&self, op: Op, bulk: Bulk<'_>) -> DfsResult<(Option<Res>, u64)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = proto::DfsRequest { id, op: Some(op) }.encode_to_vec();
        let reply = self.transport.call(&request, bulk)?;
        let reply = proto::DfsReply::decode(reply.message.as_slice())
            .map_err(|e| wire::protocol_error(format!("undecodable reply: {e}")))?;
        if reply.id != id {
            return Err(wire::protocol_error(format!(
                "reply {} to request {id}",
                reply.id
            )));
        }
        if reply.errno != 0 {
            return Err(wire::reply_error(reply.errno, reply.detail));
        }
        if !reply.dirs.is_empty() {
            self.changed_dirs.record(reply.dirs);
        }
        Ok((reply.result, reply.verifier))
    }

    fn bytes_of(what: &str, res: Option<Res>, max: usize) -> DfsResult<usize> {
        let n = expect(what, res, |r| match r {
            Res::Bytes(n) => Some(n as usize),
            _ => None,
        })?;
        if n > max {
            return Err(wire::protocol_error(format!(
                "{what} moved {n} of {max} bytes"
            )));
        }
        Ok(n)
    }

    /// Whether a transfer of `len` bytes goes in the messages instead of by RMA.
    fn inline(&self, len: usize) -> bool {
        len > 0 && len <= self.mount.max_inline
    }

    fn read_piece(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> DfsResult<usize> {
        let len = buf.len();
        let inline = self.inline(len);
        let op = Op::Read(proto::Read {
            oid,
            offset,
            len: len as u32,
            inline,
        });
        if !inline {
            return Self::bytes_of("Read", self.call(op, Bulk::FromServer(buf))?, len);
        }
        let data = expect("Read", self.call(op, Bulk::None)?, |r| match r {
            Res::Data(d) => Some(d),
            _ => None,
        })?;
        if data.len() > len {
            return Err(wire::protocol_error(format!(
                "Read returned {} of {len} bytes",
                data.len()
            )));
        }
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    /// One Write request; `writer` is the group of a writer without CAP_FSETID.
    fn write_piece(&self, oid: Oid, at: u64, data: &[u8], writer: Option<u32>) -> DfsResult<()> {
        let inline = self.inline(data.len());
        let op = Op::Write(proto::Write {
            oid,
            offset: at,
            len: data.len() as u32,
            data: if inline { data.to_vec() } else { Vec::new() },
            kill_suidgid: writer.is_some(),
            writer_gid: writer.unwrap_or(0),
        });
        let bulk = if inline {
            Bulk::None
        } else {
            Bulk::ToServer(data)
        };
        let n = Self::bytes_of("Write", self.change(&[oid], op, bulk)?, data.len())?;
        if n != data.len() {
            return Err(wire::protocol_error(format!(
                "wrote {n} of {} bytes",
                data.len()
            )));
        }
        Ok(())
    }

    /// Runs `one` on every piece, `depth` at a time; results in piece order.
    fn pipelined<T: Send>(
        &self,
        count: usize,
        one: impl Fn(usize) -> DfsResult<T> + Sync,
    ) -> Vec<DfsResult<T>> {
        let results: Vec<Mutex<Option<DfsResult<T>>>> =
            (0..count).map(|_| Mutex::new(None)).collect();
        let next = AtomicU64::new(0);
        let worker = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed) as usize;
            if i >= count {
                break;
            }
            *results[i].lock().expect("result slot") = Some(one(i));
        };
        std::thread::scope(|s| {
            for _ in 1..self.depth.min(count) {
                s.spawn(worker);
            }
            worker();
        });
        results
            .into_iter()
            .map(|r| {
                r.into_inner()
                    .expect("result slot")
                    .expect("every piece ran")
            })
            .collect()
    }
}

mod calls;

#[cfg(test)]
mod tests;
