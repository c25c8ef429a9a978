//! One DFS request against its connection's namespace: the rights check, then the
//! namespace call its operation names.

use super::wire::{self, attr};
use super::{BulkIo, ConnectionContext, MAX_INLINE, MAX_IO, READDIR_BATCH, Volumes};
use crate::namespace::{DfsError, DfsResult, Errno, IoBuf, Namespace, ROOT, XattrSet};
use dpufs_proto::dfs::READDIR_PLUS_BATCH;
use dpufs_proto::dfs::XATTR_LIST_MAX;
use dpufs_proto::engine::v1::{self as proto, dfs_reply::Result as Res, dfs_request::Op};
use std::cell::RefCell;

/// Writes from this size on are answered once queued for the disk
/// ([`Namespace::write_behind`]): the client's next request then overlaps the disk's work.
/// Smaller ones cost less than the hand-off.
const WRITE_BEHIND_MIN: usize = 64 << 10;

/// Whether an operation changes the namespace.
fn changes(op: &Op) -> bool {
    match op {
        Op::Setattr(_)
        | Op::Create(_)
        | Op::Mkdir(_)
        | Op::Symlink(_)
        | Op::Unlink(_)
        | Op::Rmdir(_)
        | Op::Rename(_)
        | Op::Write(_)
        | Op::Allocate(_)
        | Op::Punch(_)
        | Op::Setxattr(_)
        | Op::Removexattr(_)
        | Op::Syncfs(_) => true,
        Op::Open(o) => o.write,
        Op::Mount(_)
        | Op::Lookup(_)
        | Op::Getattr(_)
        | Op::Readdir(_)
        | Op::Readlink(_)
        | Op::Read(_)
        | Op::Fsync(_)
        | Op::Statfs(_)
        | Op::Getxattr(_)
        | Op::Listxattr(_) => false,
    }
}

/// Runs `f` on this thread's buffer, `len` bytes of it (see [`IoBuf`]).
fn with_buffer<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    thread_local! {
        static BUF: RefCell<Option<IoBuf>> = const { RefCell::new(None) };
    }
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.as_ref().is_none_or(|b| b.len() < len) {
            *b = Some(IoBuf::new(len));
        }
        let buf = b.as_mut().expect("just made").as_mut_slice();
        f(&mut buf[..len])
    })
}

/// Checks a Read or Write length against the limit and the request's buffer.
fn io_len(len: u32, bulk: &dyn BulkIo) -> DfsResult<usize> {
    let len = len as usize;
    if len > MAX_IO {
        return Err(DfsError::new(
            Errno::INVAL,
            format!("{len} bytes exceed max_io {MAX_IO}"),
        ));
    }
    if len > bulk.len() {
        return Err(DfsError::new(
            Errno::INVAL,
            format!(
                "{len} bytes do not fit the request's {}-byte buffer",
                bulk.len()
            ),
        ));
    }
    Ok(len)
}

/// Checks the length of an inline Read or Write against the inline limit.
fn inline_len(len: u32) -> DfsResult<usize> {
    let len = len as usize;
    if len > MAX_INLINE {
        return Err(DfsError::new(
            Errno::INVAL,
            format!("{len} bytes exceed max_inline {MAX_INLINE}"),
        ));
    }
    Ok(len)
}

fn bulk_failed(e: std::io::Error) -> DfsError {
    DfsError::new(Errno::IO, format!("bulk transfer failed: {e}"))
}

/// What a request answers: its result, and the directories it changed (`DfsReply.dirs`).
#[derive(Debug, Default)]
pub struct Answer {
    pub result: Option<Res>,
    pub dirs: Vec<proto::DfsAttr>,
}

/// What a successful `op` changes besides its result: the directories whose entries it
/// changes, and for a Rename the new name of the renamed object (whose ctime changes).
fn touched(op: &Op) -> (Vec<u64>, Option<(u64, String)>) {
    match op {
        Op::Create(c) | Op::Mkdir(c) => (vec![c.parent], None),
        Op::Symlink(s) => (vec![s.parent], None),
        Op::Unlink(r) | Op::Rmdir(r) => (vec![r.parent], None),
        Op::Rename(r) => {
            let mut dirs = vec![r.parent];
            if r.new_parent != r.parent {
                dirs.push(r.new_parent);
            }
            (dirs, Some((r.new_parent, r.new_name.clone())))
        }
        _ => (Vec::new(), None),
    }
}

pub fn run(
    volumes: &Volumes,
    ctx: &ConnectionContext,
    req: proto::DfsRequest,
    bulk: &mut dyn BulkIo,
) -> DfsResult<Answer> {
    let op = req
        .op
        .ok_or_else(|| DfsError::new(Errno::NOSYS, "unknown or missing operation"))?;
    if ctx.read_only() && changes(&op) {
        let why = if ctx.snapshot.is_some() {
            "a snapshot"
        } else {
            "a read-only connection"
        };
        return Err(DfsError::new(
            Errno::ROFS,
            format!("{why} cannot change anything"),
        ));
    }
    let ns = volumes.volume(&ctx.key())?;
    let (dirs, renamed) = touched(&op);
    let result = run_op(volumes, ctx, &ns, op, bulk)?;
    // Read after the change, in a transaction of their own: a change that lands in between
    // is in them too, which is still what the directory was after this one.
    let mut after: Vec<_> = dirs
        .into_iter()
        .filter_map(|d| ns.getattr(d).ok())
        .collect();
    // A renamed directory's ctime changed too: a client holding its attributes from an
    // earlier change inside it must not answer with those.
    if let Some((parent, name)) = renamed
        && let Ok(dir) = ns.lookup(parent, &name)
        && dir.is_dir()
    {
        after.push(dir);
    }
    let dirs = after.iter().map(attr).collect();
    Ok(Answer { result, dirs })
}

/// Runs one operation on `ns`, its connection's namespace; `None` is a success without a
/// result.
fn run_op(
    volumes: &Volumes,
    ctx: &ConnectionContext,
    ns: &Namespace,
    op: Op,
    bulk: &mut dyn BulkIo,
) -> DfsResult<Option<Res>> {
    let res = match op {
        Op::Mount(_) => Res::Mount(proto::MountInfo {
            root: ROOT,
            chunk_size: ns.chunk_size(),
            read_only: ctx.read_only(),
            max_io: MAX_IO as u32,
            max_inline: MAX_INLINE as u32,
        }),
        Op::Lookup(l) => Res::Attr(attr(&ns.lookup(l.parent, &l.name)?)),
        Op::Getattr(g) => Res::Attr(attr(&ns.getattr(g.oid)?)),
        Op::Setattr(s) => Res::Attr(attr(&ns.setattr(s.oid, wire::set_attr(&s))?)),
        Op::Readdir(r) => {
            let batch = if r.plus {
                READDIR_PLUS_BATCH
            } else {
                READDIR_BATCH
            };
            let max = match r.max as usize {
                0 => batch,
                n => n.min(batch),
            };
            let page = ns.readdir(r.dir, r.cookie, max)?;
            Res::Entries(proto::DirEntries {
                entries: page
                    .entries
                    .into_iter()
                    .map(|e| wire::entry(e, r.plus))
                    .collect(),
                end: page.end,
            })
        }
        Op::Create(c) => Res::Attr(attr(&ns.create(c.parent, &c.name, c.mode, c.uid, c.gid)?)),
        Op::Mkdir(c) => Res::Attr(attr(&ns.mkdir(c.parent, &c.name, c.mode, c.uid, c.gid)?)),
        Op::Symlink(s) => Res::Attr(attr(
            &ns.symlink(s.parent, &s.name, &s.target, s.uid, s.gid)?,
        )),
        Op::Readlink(r) => Res::Target(ns.readlink(r.oid)?),
        Op::Unlink(r) => return ns.unlink(r.parent, &r.name).map(|()| None),
        Op::Rmdir(r) => return ns.rmdir(r.parent, &r.name).map(|()| None),
        Op::Rename(r) => {
            ns.rename(r.parent, &r.name, r.new_parent, &r.new_name, r.noreplace)?;
            return Ok(None);
        }
        Op::Open(o) => Res::Attr(attr(&ns.open_object(o.oid, o.write)?)),
        Op::Read(r) if r.inline => {
            let mut data = vec![0; inline_len(r.len)?];
            let n = ns.read(r.oid, r.offset, &mut data)?;
            data.truncate(n);
            Res::Data(data)
        }
        Op::Read(r) => {
            let len = io_len(r.len, bulk)?;
            // Read straight into the transfer's memory; nothing read (end of file, an empty
            // read, an error) moves nothing.
            let mut read = Ok(0);
            let mut produce = |buf: &mut [u8]| {
                read = ns.read(r.oid, r.offset, buf);
                *read.as_ref().unwrap_or(&0)
            };
            bulk.push_from(0, len, &mut produce).map_err(bulk_failed)?;
            Res::Bytes(read? as u32)
        }
        Op::Write(w) => Res::Bytes(write(ns, w, bulk)?),
        Op::Allocate(a) => {
            ns.allocate(a.oid, a.offset, a.len, a.keep_size)?;
            return Ok(None);
        }
        Op::Punch(p) => {
            ns.punch(p.oid, p.offset, p.len)?;
            return Ok(None);
        }
        Op::Fsync(f) => {
            ns.getattr(f.oid)?;
            if !ns.read_only() {
                // Data and metadata together: fdatasync is no cheaper here.
                ns.fsync(f.oid)?;
            }
            return Ok(None);
        }
        Op::Syncfs(_) => {
            ns.sync_all()?;
            return Ok(None);
        }
        Op::Statfs(_) => Res::Statfs(statfs(volumes, ctx, ns)?),
        Op::Setxattr(s) => {
            let how = match (s.create, s.replace) {
                (false, false) => XattrSet::Any,
                (true, false) => XattrSet::Create,
                (false, true) => XattrSet::Replace,
                (true, true) => {
                    return Err(DfsError::new(
                        Errno::INVAL,
                        "both XATTR_CREATE and XATTR_REPLACE",
                    ));
                }
            };
            ns.setxattr(s.oid, &s.name, &s.value, how)?;
            return Ok(None);
        }
        Op::Getxattr(g) => Res::Value(ns.getxattr(g.oid, &g.name)?),
        Op::Listxattr(l) => {
            let names = ns.listxattr(l.oid)?;
            if names.iter().map(|n| n.len() + 1).sum::<usize>() > XATTR_LIST_MAX {
                return Err(DfsError::new(
                    Errno::TOOBIG,
                    "attribute names exceed the list limit",
                ));
            }
            Res::Xattrs(proto::XattrNames { names })
        }
        Op::Removexattr(r) => {
            ns.removexattr(r.oid, &r.name)?;
            return Ok(None);
        }
    };
    Ok(Some(res))
}

/// A Write: its bytes inline, or pulled from the request's rkey and, from
/// [`WRITE_BEHIND_MIN`] on, answered once queued for the disk. Returns the bytes written.
fn write(ns: &Namespace, w: proto::Write, bulk: &mut dyn BulkIo) -> DfsResult<u32> {
    let inline = !w.data.is_empty();
    let len = if inline {
        inline_len(w.len)?
    } else {
        io_len(w.len, bulk)?
    };
    if inline && w.data.len() != len {
        return Err(DfsError::new(
            Errno::INVAL,
            format!("len {len} but {} inline bytes", w.data.len()),
        ));
    }
    if w.kill_suidgid {
        ns.drop_set_id(w.oid, w.writer_gid)?;
    }
    if inline {
        ns.write(w.oid, w.offset, &w.data)?;
    } else if len >= WRITE_BEHIND_MIN {
        let mut buf = IoBuf::new(len);
        bulk.pull(0, buf.as_mut_slice()).map_err(bulk_failed)?;
        ns.write_behind(w.oid, w.offset, buf)?;
    } else {
        with_buffer(len, |buf| -> DfsResult<()> {
            if !buf.is_empty() {
                bulk.pull(0, buf).map_err(bulk_failed)?;
            }
            ns.write(w.oid, w.offset, buf)
        })?;
    }
    Ok(len as u32)
}

/// Usage as the connection sees it: the pool's space, capped by the container's quota.
fn statfs(
    volumes: &Volumes,
    ctx: &ConnectionContext,
    ns: &Namespace,
) -> DfsResult<proto::DfsStatFs> {
    let budget = volumes
        .budget_of(&ctx.pool)
        .ok_or_else(|| DfsError::new(Errno::STALE, "the pool of this connection is gone"))?;
    let pool_free = budget.capacity().saturating_sub(budget.used());
    let quota = ns.quota();
    let total = quota.map_or(budget.capacity(), |q| q.min(budget.capacity()));
    let free = match quota {
        Some(q) => q.saturating_sub(ns.used()?).min(pool_free),
        None => pool_free,
    };
    Ok(proto::DfsStatFs {
        total_bytes: total,
        free_bytes: free,
        files: ns.objects()?,
        quota: quota.is_some(),
    })
}
