//! The [`Dfs`] calls over libdfs, each with the translation POSIX needs and the reason for
//! every pointer's validity.

use super::{LibDfs, Object, attr_of, check, name_c, queue, stale_if_gone, sys, zeroed_stat};
use crate::dfs::{
    Attr, Dfs, DfsError, DfsResult, DirPage, Errno, Oid, S_IFDIR, S_IFLNK, S_IFREG, SYMLINK_MAX,
    SetAttr, StatFs, TimeSet, XattrMode,
};
use dpufs_proto::dfs::{check_xattr_name, without_set_id, xattr_allowed_on};
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::Arc;

impl LibDfs {
    /// Creates `name` in `parent` with type and permission bits `mode` (a symlink to
    /// `target`), owned by `uid`:`gid`, and holds it. `dfs_open_stat` (exported by libdfs
    /// 2.6 and 2.8, though not in its public header; dfuse's call) sets the owner in the
    /// same request.
    fn make(
        &self,
        parent: Oid,
        name: &str,
        mode: u32,
        target: Option<&CString>,
        (uid, gid): (u32, u32),
    ) -> DfsResult<Attr> {
        self.writable()?;
        let cname = name_c(name)?;
        let parent = self.object(parent)?;
        let mut obj: *mut sys::DfsObj = std::ptr::null_mut();
        // Owner in, the new entry's stat out: one round trip, as dfuse creates.
        let mut st = zeroed_stat();
        st.st_uid = uid;
        st.st_gid = gid;
        // SAFETY: the mount and `parent` are live; `cname` and `target` are NUL-terminated
        // and outlive the call; `obj` and `st` are written (`st` read first for the owner).
        let errno = unsafe {
            (self.lib.sym.dfs_open_stat)(
                self.mount,
                parent.ptr,
                cname.as_ptr(),
                mode,
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0,
                0,
                target.map_or(std::ptr::null(), |t| t.as_ptr()),
                &mut obj,
                &mut st,
            )
        };
        check(errno, format_args!("create {name:?}"))?;
        let (oid, _) = self.hold(self.adopt(obj, mode, parent.oid)?)?;
        Ok(attr_of(oid, &st))
    }

    fn osetattr(&self, object: &Object, st: &mut libc::stat, flags: c_int) -> DfsResult<()> {
        // SAFETY: the mount and the object are live; `st` is read, then overwritten with
        // the resulting stat.
        let errno = unsafe { (self.lib.sym.dfs_osetattr)(self.mount, object.ptr, st, flags) };
        stale_if_gone(check(errno, "setattr"))
    }

    /// Removes the non-directory (`dir` false) or empty directory `name`; libdfs removes
    /// either, so the type is checked first for POSIX's EISDIR and ENOTDIR.
    fn remove(&self, parent: Oid, name: &str, dir: bool) -> DfsResult<()> {
        self.writable()?;
        let cname = name_c(name)?;
        let parent = self.object(parent)?;
        let (oid, kind) = self.peek(&parent, name)?;
        match (dir, kind == S_IFDIR) {
            (false, true) => return Err(DfsError::new(Errno::ISDIR, format!("{name:?}"))),
            (true, false) => return Err(DfsError::new(Errno::NOTDIR, format!("{name:?}"))),
            _ => {}
        }
        // SAFETY: the mount and `parent` are live; `cname` is NUL-terminated; a NULL oid
        // pointer asks for no id back.
        let errno = unsafe {
            (self.lib.sym.dfs_remove)(
                self.mount,
                parent.ptr,
                cname.as_ptr(),
                false,
                std::ptr::null_mut(),
            )
        };
        check(errno, format_args!("remove {name:?}"))?;
        // libdfs punches the object's data at once: its oid is stale from now on (as for
        // LocalDfs), rather than a file that reads as empty.
        self.forget(oid);
        Ok(())
    }

    /// rename(2)'s refusals that libdfs does not make (or makes with other errnos), checked
    /// before the move: EEXIST for `noreplace`, EISDIR for a non-directory over a directory,
    /// ENOTDIR for a directory over a non-directory. `Ok(true)`: the target is the source.
    fn check_rename(
        &self,
        source: (Oid, u32),
        new_parent: &Object,
        new_name: &str,
        noreplace: bool,
    ) -> DfsResult<bool> {
        let refuse = |errno, why: &str| Err(DfsError::new(errno, format!("{new_name:?}: {why}")));
        if source.1 == S_IFDIR && self.is_within(new_parent.oid, source.0) {
            return refuse(Errno::INVAL, "a directory cannot move below itself");
        }
        let target = match self.peek(new_parent, new_name) {
            Ok(t) => t,
            Err(e) if e.errno == Errno::NOENT => return Ok(false),
            Err(e) => return Err(e),
        };
        if noreplace {
            return refuse(Errno::EXIST, "exists");
        }
        if target.0 == source.0 {
            return Ok(true);
        }
        match (source.1 == S_IFDIR, target.1 == S_IFDIR) {
            (false, true) => refuse(Errno::ISDIR, "is a directory"),
            (true, false) => refuse(Errno::NOTDIR, "is not a directory"),
            _ => Ok(false),
        }
    }

    /// The object and C name of xattr `name` of `oid`, to change it (`write`) or read it:
    /// refused as Linux refuses it (EROFS, ERANGE, EOPNOTSUPP; a `user.` attribute of
    /// anything but a file or directory is EPERM to change and ENODATA to read).
    fn xattr_of(&self, oid: Oid, name: &str, write: bool) -> DfsResult<(Arc<Object>, CString)> {
        if write {
            self.writable()?;
        }
        let object = self.object(oid)?;
        check_xattr_name(name)?;
        let cname =
            CString::new(name).map_err(|_| DfsError::new(Errno::INVAL, "NUL in an xattr name"))?;
        if !xattr_allowed_on(object.kind, name) {
            let errno = if write { Errno::PERM } else { Errno::NODATA };
            return Err(DfsError::new(
                errno,
                format!("{name:?}: user attributes only on files and directories"),
            ));
        }
        Ok((object, cname))
    }

    /// The size of xattr `name` of `object` (ENODATA if absent).
    fn xattr_size(&self, object: &Object, name: &CString) -> DfsResult<u64> {
        let mut size = 0u64;
        // SAFETY: a NULL value asks only for the size, written into `size`.
        let errno = unsafe {
            (self.lib.sym.dfs_getxattr)(
                self.mount,
                object.ptr,
                name.as_ptr(),
                std::ptr::null_mut(),
                &mut size,
            )
        };
        check(errno, "getxattr")?;
        Ok(size)
    }
}

/// EISDIR for I/O on a directory, EINVAL on a symlink (libdfs says EINVAL or EIO for both).
fn check_kind(object: &Object, what: &str) -> DfsResult<()> {
    match object.kind {
        S_IFREG => Ok(()),
        S_IFDIR => Err(DfsError::new(Errno::ISDIR, format!("{what}: a directory"))),
        _ => Err(DfsError::new(
            Errno::INVAL,
            format!("{what}: not a regular file"),
        )),
    }
}

/// libdfs says ENOENT for an absent xattr where POSIX says ENODATA.
fn nodata_if_absent(r: DfsResult<()>) -> DfsResult<()> {
    r.map_err(|e| match e.errno {
        Errno::NOENT => DfsError::new(Errno::NODATA, e.detail),
        _ => e,
    })
}

fn now() -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the current time into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts
}

/// One buffer as a scatter-gather list of one.
fn one_iov(buf: *mut u8, len: usize) -> sys::Iov {
    sys::Iov {
        iov_buf: buf.cast(),
        iov_buf_len: len,
        iov_len: len,
    }
}

impl Dfs for LibDfs {
    fn lookup(&self, parent: Oid, name: &str) -> DfsResult<Attr> {
        let parent = self.object(parent)?;
        let (object, st) = self.lookup_rel(&parent, name)?;
        let (oid, _) = self.hold(object)?;
        Ok(attr_of(oid, &st))
    }

    fn getattr(&self, oid: Oid) -> DfsResult<Attr> {
        let object = self.object(oid)?;
        Ok(attr_of(oid, &self.ostat(&object)?))
    }

    fn holds(&self, oid: Oid) -> DfsResult<()> {
        self.object(oid).map(drop)
    }

    fn setattr(&self, oid: Oid, set: &SetAttr) -> DfsResult<Attr> {
        let object = self.object(oid)?;
        if set.size.is_some() {
            check_kind(&object, "truncate")?;
        }
        let mut st = zeroed_stat();
        let mut flags = 0;
        // libdfs wants the type bits it has; a chown of a file drops its set-ID bits, as
        // chown(2) does, which libdfs does not.
        let mode = match set.mode {
            None if (set.uid.is_some() || set.gid.is_some()) && object.kind == S_IFREG => {
                let now = self.ostat(&object)?.st_mode;
                let kept = without_set_id(now, true);
                (kept != now).then_some(kept)
            }
            mode => mode,
        };
        if let Some(mode) = mode {
            st.st_mode = object.kind | (mode & 0o7777);
            flags |= sys::SET_ATTR_MODE;
        }
        if let Some(uid) = set.uid {
            st.st_uid = uid;
            flags |= sys::SET_ATTR_UID;
        }
        if let Some(gid) = set.gid {
            st.st_gid = gid;
            flags |= sys::SET_ATTR_GID;
        }
        if let Some(size) = set.size {
            st.st_size = size as i64;
            flags |= sys::SET_ATTR_SIZE;
        }
        if let Some(mtime) = set.mtime {
            let ts = match mtime {
                TimeSet::Now => now(),
                TimeSet::At(t) => libc::timespec {
                    tv_sec: t.secs,
                    tv_nsec: i64::from(t.nanos),
                },
            };
            st.st_mtime = ts.tv_sec;
            st.st_mtime_nsec = ts.tv_nsec;
            flags |= sys::SET_ATTR_MTIME;
        }
        // DFS stores no atime (it reports the later of mtime and ctime): a set atime is
        // dropped, as dfuse drops it.
        if flags == 0 {
            return self.getattr(oid);
        }
        self.writable()?;
        self.osetattr(&object, &mut st, flags)?;
        Ok(attr_of(oid, &st))
    }

    fn readdir(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage> {
        self.list(dir, cookie, max, false)
    }

    fn readdir_plus(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage> {
        self.list(dir, cookie, max, true)
    }

    fn create(&self, parent: Oid, name: &str, mode: u32, uid: u32, gid: u32) -> DfsResult<Attr> {
        self.make(parent, name, S_IFREG | (mode & 0o7777), None, (uid, gid))
    }

    fn open(&self, oid: Oid, write: bool) -> DfsResult<Attr> {
        let object = self.object(oid)?;
        if object.kind == S_IFLNK {
            return Err(DfsError::new(Errno::LOOP, format!("{oid:#x} is a symlink")));
        }
        if write {
            self.writable()?;
        }
        let attr = attr_of(oid, &self.ostat(&object)?);
        if write && attr.is_dir() {
            return Err(DfsError::new(Errno::ISDIR, format!("{oid:#x}")));
        }
        Ok(attr)
    }

    fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> DfsResult<usize> {
        let object = self.object(oid)?;
        check_kind(&object, "read")?;
        let mut iov = one_iov(buf.as_mut_ptr(), buf.len());
        let mut sgl = sys::SgList {
            sg_nr: 1,
            sg_nr_out: 0,
            sg_iovs: &mut iov,
        };
        let mut read = 0u64;
        // SAFETY: the mount and the object are live; the list's one buffer is `buf`, valid
        // for its length, and `read` is written, both before `run` returns (it waits for the
        // event's completion).
        queue::run(self.lib, "read", |ev| unsafe {
            (self.lib.sym.dfs_read)(self.mount, object.ptr, &mut sgl, offset, &mut read, ev)
        })?;
        Ok((read as usize).min(buf.len()))
    }

    fn write(&self, oid: Oid, offset: u64, data: &[u8]) -> DfsResult<()> {
        self.writable()?;
        let object = self.object(oid)?;
        check_kind(&object, "write")?;
        // libdfs only reads a write's buffers.
        let mut iov = one_iov(data.as_ptr().cast_mut(), data.len());
        let mut sgl = sys::SgList {
            sg_nr: 1,
            sg_nr_out: 0,
            sg_iovs: &mut iov,
        };
        // SAFETY: the mount and the object are live; the list's one buffer is `data`, valid
        // for its length until `run` returns (it waits for the event's completion).
        queue::run(self.lib, "write", |ev| unsafe {
            (self.lib.sym.dfs_write)(self.mount, object.ptr, &mut sgl, offset, ev)
        })
    }

    fn allocate(&self, _oid: Oid, _offset: u64, _len: u64, _keep_size: bool) -> DfsResult<()> {
        // DFS cannot reserve space; posix_fallocate(3) falls back to writing zeros.
        Err(DfsError::new(
            Errno::OPNOTSUPP,
            "DFS has no fallocate: space cannot be reserved ahead of writes",
        ))
    }

    fn punch(&self, oid: Oid, offset: u64, len: u64) -> DfsResult<()> {
        self.writable()?;
        let object = self.object(oid)?;
        check_kind(&object, "punch")?;
        let size = self.ostat(&object)?.st_size as u64;
        let end = offset.saturating_add(len).min(size);
        if end <= offset {
            return Ok(());
        }
        // dfs_punch of a range that reaches the end truncates to the range's start: the last
        // byte is written as a zero instead, so the size never moves.
        let hole_end = if end == size { end - 1 } else { end };
        if hole_end > offset {
            // SAFETY: the mount and the object are live; the call takes plain integers.
            let errno = unsafe {
                (self.lib.sym.dfs_punch)(self.mount, object.ptr, offset, hole_end - offset)
            };
            stale_if_gone(check(errno, "punch"))?;
        }
        if hole_end < end {
            self.write(oid, hole_end, &[0])?;
        }
        Ok(())
    }

    fn fsync(&self, oid: Oid, _datasync: bool) -> DfsResult<()> {
        // dfs_write returns once the data is durable on the engines (dfs_sync is a no-op);
        // the object must still exist.
        self.object(oid).map(drop)
    }

    fn rename(
        &self,
        parent: Oid,
        name: &str,
        new_parent: Oid,
        new_name: &str,
        noreplace: bool,
    ) -> DfsResult<()> {
        self.writable()?;
        let (cname, cnew) = (name_c(name)?, name_c(new_name)?);
        let (from, to) = (self.object(parent)?, self.object(new_parent)?);
        let source = self.peek(&from, name)?;
        if self.check_rename(source, &to, new_name, noreplace)? {
            return Ok(());
        }
        // SAFETY: the mount and both directories are live; both names are NUL-terminated;
        // a NULL oid pointer asks for no id back.
        let errno = unsafe {
            (self.lib.sym.dfs_move)(
                self.mount,
                from.ptr,
                cname.as_ptr(),
                to.ptr,
                cnew.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(errno, format_args!("rename {name:?} to {new_name:?}"))?;
        // A held handle of the moved object knows its old name, and libdfs stats by name:
        // hold a fresh one.
        let held = self
            .objects
            .read()
            .expect("object table")
            .contains_key(&source.0);
        if held {
            let (object, _) = self.lookup_rel(&to, new_name)?;
            self.hold(object)?;
        }
        Ok(())
    }

    fn unlink(&self, parent: Oid, name: &str) -> DfsResult<()> {
        self.remove(parent, name, false)
    }

    fn mkdir(&self, parent: Oid, name: &str, mode: u32, uid: u32, gid: u32) -> DfsResult<Attr> {
        self.make(parent, name, S_IFDIR | (mode & 0o7777), None, (uid, gid))
    }

    fn rmdir(&self, parent: Oid, name: &str) -> DfsResult<()> {
        self.remove(parent, name, true)
    }

    fn symlink(
        &self,
        parent: Oid,
        name: &str,
        target: &str,
        uid: u32,
        gid: u32,
    ) -> DfsResult<Attr> {
        if target.is_empty() {
            return Err(DfsError::new(Errno::NOENT, "empty symlink target"));
        }
        if target.len() > SYMLINK_MAX {
            return Err(DfsError::new(Errno::NAMETOOLONG, "symlink target"));
        }
        let value = CString::new(target)
            .map_err(|_| DfsError::new(Errno::INVAL, "NUL in a symlink target"))?;
        self.make(parent, name, S_IFLNK | 0o777, Some(&value), (uid, gid))
    }

    fn readlink(&self, oid: Oid) -> DfsResult<String> {
        let object = self.object(oid)?;
        if object.kind != S_IFLNK {
            return Err(DfsError::new(
                Errno::INVAL,
                format!("{oid:#x} is not a symlink"),
            ));
        }
        let mut size = 0u64;
        // SAFETY: a NULL buffer asks only for the size (with the NUL) into `size`.
        let errno = unsafe {
            (self.lib.sym.dfs_get_symlink_value)(object.ptr, std::ptr::null_mut(), &mut size)
        };
        check(errno, "readlink")?;
        let mut buf = vec![0u8; size as usize];
        // SAFETY: `buf` has `size` writable bytes; libdfs copies at most that many.
        let errno = unsafe {
            (self.lib.sym.dfs_get_symlink_value)(object.ptr, buf.as_mut_ptr().cast(), &mut size)
        };
        check(errno, "readlink")?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8(buf[..end].to_vec())
            .map_err(|_| DfsError::new(Errno::ILSEQ, "symlink target is not UTF-8"))
    }

    fn setxattr(&self, oid: Oid, name: &str, value: &[u8], mode: XattrMode) -> DfsResult<()> {
        let (object, cname) = self.xattr_of(oid, name, true)?;
        // libdfs does not honour XATTR_CREATE and XATTR_REPLACE (checked on DAOS 2.6.5 and
        // 2.8.0): checked here, racing only with another client's change of the same name.
        if mode != XattrMode::Any {
            let exists = match self.xattr_size(&object, &cname) {
                Ok(_) => true,
                Err(e) if e.errno == Errno::NODATA => false,
                Err(e) => return Err(e),
            };
            match (mode, exists) {
                (XattrMode::Create, true) => {
                    return Err(DfsError::new(Errno::EXIST, format!("{name:?}")));
                }
                (XattrMode::Replace, false) => {
                    return Err(DfsError::new(Errno::NODATA, format!("{name:?}")));
                }
                _ => {}
            }
        }
        let flags = 0;
        // SAFETY: the mount and the object are live; `cname` is NUL-terminated; `value` is
        // valid for its length during the call.
        let errno = unsafe {
            (self.lib.sym.dfs_setxattr)(
                self.mount,
                object.ptr,
                cname.as_ptr(),
                value.as_ptr().cast::<c_void>(),
                value.len() as u64,
                flags,
            )
        };
        nodata_if_absent(check(errno, format_args!("setxattr {name:?}")))
    }

    fn getxattr(&self, oid: Oid, name: &str) -> DfsResult<Vec<u8>> {
        let (object, cname) = self.xattr_of(oid, name, false)?;
        loop {
            let mut size = self.xattr_size(&object, &cname)?;
            let mut value = vec![0u8; size as usize];
            // SAFETY: `value` has `size` writable bytes, and `size` says so.
            let errno = unsafe {
                (self.lib.sym.dfs_getxattr)(
                    self.mount,
                    object.ptr,
                    cname.as_ptr(),
                    value.as_mut_ptr().cast(),
                    &mut size,
                )
            };
            // E2BIG: it grew since it was measured.
            if errno == libc::E2BIG {
                continue;
            }
            check(errno, format_args!("getxattr {name:?}"))?;
            value.truncate(size as usize);
            return Ok(value);
        }
    }

    fn listxattr(&self, oid: Oid) -> DfsResult<Vec<String>> {
        let object = self.object(oid)?;
        let mut room = 0u64;
        loop {
            let mut buf = vec![0u8; room as usize];
            let mut size = room;
            let list = if room == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast::<c_char>()
            };
            // SAFETY: `list` is NULL (size only) or `buf` with `size` writable bytes; libdfs
            // writes the names that fit and the full size into `size`.
            let errno =
                unsafe { (self.lib.sym.dfs_listxattr)(self.mount, object.ptr, list, &mut size) };
            check(errno, "listxattr")?;
            if size > room {
                room = size;
                continue;
            }
            buf.truncate(size as usize);
            return Ok(buf
                .split(|&b| b == 0)
                .filter(|n| !n.is_empty())
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect());
        }
    }

    fn removexattr(&self, oid: Oid, name: &str) -> DfsResult<()> {
        let (object, cname) = self.xattr_of(oid, name, true)?;
        // SAFETY: the mount and the object are live; `cname` is NUL-terminated.
        let errno =
            unsafe { (self.lib.sym.dfs_removexattr)(self.mount, object.ptr, cname.as_ptr()) };
        nodata_if_absent(check(errno, format_args!("removexattr {name:?}")))
    }

    fn statfs(&self) -> DfsResult<StatFs> {
        let mut info = sys::PoolInfo::zeroed();
        info.pi_bits = sys::DPI_SPACE;
        // SAFETY: the pool handle is open; `info` is a writable daos_pool_info_t asking for
        // the space; NULL rank list and properties ask for neither.
        let rc = unsafe {
            (self.lib.sym.daos_pool_query)(
                self.pool.handle,
                std::ptr::null_mut(),
                &mut info,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(DfsError::new(
                Errno::IO,
                format!("querying the pool's space: {}", self.lib.der_name(rc)),
            ));
        }
        // The pool's space (DAOS has no per-container quota), SCM and NVMe together.
        Ok(StatFs {
            total_bytes: info.s_total.iter().sum(),
            free_bytes: info.s_free.iter().sum(),
            files: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_xattrs_are_enodata() {
        let absent = nodata_if_absent(check(libc::ENOENT, "removexattr")).unwrap_err();
        assert_eq!(absent.errno, Errno::NODATA);
        let other = nodata_if_absent(check(libc::EPERM, "setxattr")).unwrap_err();
        assert_eq!(other.errno, Errno::PERM);
    }
}
