//! The [`Dfs`] calls of [`EngineDfs`]: one request each; large reads and writes pipelined.

use super::{EngineDfs, attr_of, expect, pieces, wire};
use crate::dfs::transport::Bulk;
use crate::dfs::{
    Attr, Dfs, DfsError, DfsResult, DirPage, Errno, Oid, SetAttr, StatFs, XATTR_VALUE_MAX,
    XattrMode,
};
use dpufs_proto::dfs::check_xattr_name;
use dpufs_proto::engine::v1::{self as proto, dfs_reply::Result as Res, dfs_request::Op};
use std::sync::Mutex;
use std::time::Instant;

impl Dfs for EngineDfs {
    fn lookup(&self, parent: Oid, name: &str) -> DfsResult<Attr> {
        let op = Op::Lookup(proto::Lookup {
            parent,
            name: name.to_string(),
        });
        attr_of("Lookup", self.call(op, Bulk::None)?)
    }

    fn getattr(&self, oid: Oid) -> DfsResult<Attr> {
        attr_of(
            "GetAttr",
            self.call(Op::Getattr(proto::GetAttr { oid }), Bulk::None)?,
        )
    }

    fn setattr(&self, oid: Oid, set: &SetAttr) -> DfsResult<Attr> {
        attr_of(
            "SetAttr",
            self.change(&[oid], Op::Setattr(wire::set_attr(oid, set)), Bulk::None)?,
        )
    }

    fn readdir(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage> {
        self.list(dir, cookie, max, false)
    }

    fn readdir_plus(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage> {
        self.list(dir, cookie, max, true)
    }

    fn create(&self, parent: Oid, name: &str, mode: u32, uid: u32, gid: u32) -> DfsResult<Attr> {
        let op = Op::Create(proto::Create {
            parent,
            name: name.to_string(),
            mode,
            uid,
            gid,
        });
        self.made("Create", parent, op)
    }

    fn open(&self, oid: Oid, write: bool) -> DfsResult<Attr> {
        attr_of(
            "Open",
            self.call(Op::Open(proto::Open { oid, write }), Bulk::None)?,
        )
    }

    fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> DfsResult<usize> {
        let max_io = self.mount.max_io;
        if buf.len() <= max_io {
            return self.read_piece(oid, offset, buf);
        }
        let parts = pieces(offset, buf.len(), max_io);
        // Each piece gets its own disjoint slice of the caller's buffer.
        let slices: Vec<Mutex<&mut [u8]>> = buf.chunks_mut(max_io).map(Mutex::new).collect();
        let results = self.pipelined(parts.len(), |i| {
            let mut slice = slices[i].lock().expect("piece buffer");
            self.read_piece(oid, parts[i].file_offset, &mut slice)
        });
        // The file ends at the first short piece; what follows it is not the file's.
        let mut total = 0;
        for (part, result) in parts.iter().zip(results) {
            let n = result?;
            total = part.start + n;
            if n < part.len {
                break;
            }
        }
        Ok(total)
    }

    fn write(&self, oid: Oid, offset: u64, data: &[u8]) -> DfsResult<()> {
        self.write_pieces(oid, offset, data, None)
    }

    fn write_unprivileged(&self, oid: Oid, offset: u64, data: &[u8], gid: u32) -> DfsResult<()> {
        // The engine clears the set-ID bits itself: no extra round trip.
        self.write_pieces(oid, offset, data, Some(gid))
    }

    fn allocate(&self, oid: Oid, offset: u64, len: u64, keep_size: bool) -> DfsResult<()> {
        let op = Op::Allocate(proto::Allocate {
            oid,
            offset,
            len,
            keep_size,
        });
        self.change(&[oid], op, Bulk::None).map(drop)
    }

    fn punch(&self, oid: Oid, offset: u64, len: u64) -> DfsResult<()> {
        let op = Op::Punch(proto::Punch { oid, offset, len });
        self.change(&[oid], op, Bulk::None).map(drop)
    }

    fn fsync(&self, oid: Oid, datasync: bool) -> DfsResult<()> {
        self.sync_object(oid, datasync)
    }

    fn sync_all(&self) -> DfsResult<()> {
        self.sync_container().map(drop)
    }

    fn rename(
        &self,
        parent: Oid,
        name: &str,
        new_parent: Oid,
        new_name: &str,
        noreplace: bool,
    ) -> DfsResult<()> {
        let op = Op::Rename(proto::Rename {
            parent,
            name: name.to_string(),
            new_parent,
            new_name: new_name.to_string(),
            noreplace,
        });
        self.change(&[parent, new_parent], op, Bulk::None).map(drop)
    }

    fn unlink(&self, parent: Oid, name: &str) -> DfsResult<()> {
        let op = Op::Unlink(proto::Remove {
            parent,
            name: name.to_string(),
        });
        self.change(&[parent], op, Bulk::None).map(drop)
    }

    /// The engine keeps no table of objects a client holds: an oid a lookup gave stays valid
    /// until the object is removed, and a removed one answers ESTALE at its next request.
    fn holds(&self, _oid: Oid) -> DfsResult<()> {
        Ok(())
    }

    fn take_changed_dir(&self, dir: Oid) -> Option<(Attr, Instant)> {
        self.changed_dirs.take(dir)
    }

    /// The engine applies the set-group-ID directory rule where it makes the entry.
    fn owner_in(&self, _parent: Oid, mode: u32, gid: u32) -> DfsResult<(u32, u32)> {
        Ok((mode, gid))
    }

    fn mkdir(&self, parent: Oid, name: &str, mode: u32, uid: u32, gid: u32) -> DfsResult<Attr> {
        let op = Op::Mkdir(proto::Create {
            parent,
            name: name.to_string(),
            mode,
            uid,
            gid,
        });
        self.made("Mkdir", parent, op)
    }

    fn rmdir(&self, parent: Oid, name: &str) -> DfsResult<()> {
        let op = Op::Rmdir(proto::Remove {
            parent,
            name: name.to_string(),
        });
        self.change(&[parent], op, Bulk::None).map(drop)
    }

    fn symlink(
        &self,
        parent: Oid,
        name: &str,
        target: &str,
        uid: u32,
        gid: u32,
    ) -> DfsResult<Attr> {
        let op = Op::Symlink(proto::Symlink {
            parent,
            name: name.to_string(),
            target: target.to_string(),
            uid,
            gid,
        });
        self.made("Symlink", parent, op)
    }

    fn readlink(&self, oid: Oid) -> DfsResult<String> {
        let res = self.call(Op::Readlink(proto::ReadLink { oid }), Bulk::None)?;
        expect("ReadLink", res, |r| match r {
            Res::Target(t) => Some(t),
            _ => None,
        })
    }

    fn setxattr(&self, oid: Oid, name: &str, value: &[u8], mode: XattrMode) -> DfsResult<()> {
        check_xattr_name(name)?;
        if value.len() > XATTR_VALUE_MAX {
            return Err(DfsError::new(
                Errno(libc::E2BIG),
                format!(
                    "attribute value of {} bytes (at most {XATTR_VALUE_MAX})",
                    value.len()
                ),
            ));
        }
        let op = Op::Setxattr(proto::SetXattr {
            oid,
            name: name.to_string(),
            value: value.to_vec(),
            create: mode == XattrMode::Create,
            replace: mode == XattrMode::Replace,
        });
        self.change(&[oid], op, Bulk::None).map(drop)
    }

    fn getxattr(&self, oid: Oid, name: &str) -> DfsResult<Vec<u8>> {
        check_xattr_name(name)?;
        let op = Op::Getxattr(proto::XattrName {
            oid,
            name: name.to_string(),
        });
        expect("GetXattr", self.call(op, Bulk::None)?, |r| match r {
            Res::Value(v) => Some(v),
            _ => None,
        })
    }

    fn listxattr(&self, oid: Oid) -> DfsResult<Vec<String>> {
        let res = self.call(Op::Listxattr(proto::ListXattr { oid }), Bulk::None)?;
        expect("ListXattr", res, |r| match r {
            Res::Xattrs(x) => Some(x.names),
            _ => None,
        })
    }

    fn removexattr(&self, oid: Oid, name: &str) -> DfsResult<()> {
        check_xattr_name(name)?;
        let op = Op::Removexattr(proto::XattrName {
            oid,
            name: name.to_string(),
        });
        self.change(&[oid], op, Bulk::None).map(drop)
    }

    fn statfs(&self) -> DfsResult<StatFs> {
        expect(
            "StatFs",
            self.call(Op::Statfs(proto::StatFs {}), Bulk::None)?,
            |r| match r {
                Res::Statfs(s) => Some(wire::statfs(s)),
                _ => None,
            },
        )
    }
}

impl EngineDfs {
    /// One ReadDir request, with attributes if `plus`.
    fn list(&self, dir: Oid, cookie: u64, max: usize, plus: bool) -> DfsResult<DirPage> {
        let op = Op::Readdir(proto::ReadDir {
            dir,
            cookie,
            max: max.min(u32::MAX as usize) as u32,
            plus,
        });
        expect("ReadDir", self.call(op, Bulk::None)?, |r| match r {
            Res::Entries(e) => Some(DirPage {
                entries: e.entries.into_iter().map(wire::entry).collect(),
                end: e.end,
            }),
            _ => None,
        })
    }

    /// A Create, Mkdir or Symlink in `parent`: the new object's attributes, the change
    /// recorded against both.
    fn made(&self, what: &str, parent: Oid, op: Op) -> DfsResult<Attr> {
        let (result, verifier) = self.exchange(op, Bulk::None)?;
        let attr = attr_of(what, result)?;
        self.record(parent, verifier)?;
        self.record(attr.oid, verifier)?;
        Ok(attr)
    }

    /// Writes `data` in `max_io` pieces, pipelined; `writer` as for [`Self::write_piece`].
    fn write_pieces(
        &self,
        oid: Oid,
        offset: u64,
        data: &[u8],
        writer: Option<u32>,
    ) -> DfsResult<()> {
        let max_io = self.mount.max_io;
        if data.len() <= max_io {
            return self.write_piece(oid, offset, data, writer);
        }
        let parts = pieces(offset, data.len(), max_io);
        let results = self.pipelined(parts.len(), |i| {
            let p = &parts[i];
            let piece = &data[p.start..p.start + p.len];
            self.write_piece(oid, p.file_offset, piece, writer)
        });
        results.into_iter().collect()
    }
}
