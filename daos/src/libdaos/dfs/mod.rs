//! [`LibDfs`]: the [`Dfs`](crate::dfs::Dfs) interface over libdfs, a DFS container of a
//! real DAOS system mounted the way dfuse mounts one (docs/real-daos.md, "Volumes").
//!
//! Objects are `dfs_obj_t` handles kept in a table by oid, as dfuse keeps one per inode:
//! looked up (or created) once, released when the kernel forgets the inode
//! ([`LibDfs::forget`]). Like `LocalDfs`, a fresh mount knows only the root, so an oid of an
//! earlier worker is ESTALE until looked up again. Oids are derived from DAOS's 128-bit object
//! ids as dfuse derives inode numbers; the root's is [`ROOT_OID`].
//!
//! Where libdfs's answers are not POSIX's, the calls here translate (EISDIR and ENOTDIR
//! before removing or renaming, ENODATA for absent xattrs, ERANGE never: buffers are sized
//! first). What cannot be translated is in docs/real-daos.md: no fallocate (EOPNOTSUPP, so
//! `posix_fallocate` falls back to writing), no stored atime, no sticky bit, and an unlinked
//! file's data goes at once even while it is open.

mod calls;
mod listing;
mod queue;

use super::{LibDaos, PoolHandle, sys};
use crate::dfs::{Attr, DfsError, DfsResult, Errno, Oid, ROOT_OID, S_IFDIR, S_IFMT, Timespec};
use crate::error::Result;
use std::collections::HashMap;
use std::ffi::{CString, c_int};
use std::sync::{Arc, RwLock};
use sys::{DfsMount, DfsObj, Handle, ObjId};

/// Deepest directory chain the rename loop check follows.
const MAX_DEPTH: usize = 4096;

/// A DFS container mounted through libdfs. See the module documentation.
pub struct LibDfs {
    lib: &'static LibDaos,
    mount: *mut DfsMount,
    read_only: bool,
    root_id: ObjId,
    /// Every object the kernel may name, by oid (the root included, never forgotten).
    objects: RwLock<HashMap<Oid, Arc<Object>>>,
    listings: listing::Listings,
    container: Handle,
    /// Disconnected last (field drop, after `Drop::drop` unmounted and closed).
    pool: PoolHandle,
}

// SAFETY: libdfs serves concurrent calls on one mount from many threads (dfuse's FUSE threads
// share one `dfs_t`, docs/real-daos.md "Threading"); the pointer is only unmounted in Drop,
// when no other reference exists.
unsafe impl Send for LibDfs {}
// SAFETY: as above; every `&self` call is one of libdfs's thread-safe calls.
unsafe impl Sync for LibDfs {}

impl std::fmt::Debug for LibDfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibDfs")
            .field("pool", &self.pool.uuid())
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// A `dfs_obj_t`, released when the last reference drops (so never while a call uses it).
struct Object {
    lib: &'static LibDaos,
    ptr: *mut DfsObj,
    id: ObjId,
    oid: Oid,
    /// File type bits, fixed for the object's life.
    kind: u32,
    /// The directory it was found in (itself for the root), for the rename loop check.
    parent: Oid,
}

// SAFETY: libdfs allows concurrent reads, writes, stats and setattrs through one object
// (dfuse does all of them at once); the calls that are not thread-safe on an object
// (`dfs_update_parent`) are never made: a renamed object is looked up afresh instead.
unsafe impl Send for Object {}
// SAFETY: as above.
unsafe impl Sync for Object {}

impl Drop for Object {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from dfs_lookup_rel/dfs_open_stat/dfs_lookup and is released once,
        // here, after every user (each held an Arc) is done.
        let errno = unsafe { (self.lib.sym.dfs_release)(self.ptr) };
        if errno != 0 {
            tracing::warn!("dfs_release: {}", std::io::Error::from_raw_os_error(errno));
        }
    }
}

/// A libdfs return value (0 or a positive errno) as a result.
fn check(errno: c_int, what: impl std::fmt::Display) -> DfsResult<()> {
    if errno == 0 {
        Ok(())
    } else {
        Err(DfsError::new(
            Errno(errno),
            format!("{what}: {}", std::io::Error::from_raw_os_error(errno)),
        ))
    }
}

fn name_c(name: &str) -> DfsResult<CString> {
    crate::dfs::check_name(name)?;
    CString::new(name).map_err(|_| DfsError::new(Errno::INVAL, "NUL in a name"))
}

/// An all-zero `struct stat`, for libdfs to fill.
fn zeroed_stat() -> libc::stat {
    // SAFETY: `struct stat` is plain integers; zero is a valid value of each.
    unsafe { std::mem::zeroed() }
}

fn time(secs: i64, nanos: i64) -> Timespec {
    Timespec {
        secs,
        nanos: nanos as u32,
    }
}

/// What DFS's stat says, as the Dfs interface says it: directories have size 0 and objects
/// one link (DFS reports 104 bytes for a directory and fills neither inode nor device).
fn attr_of(oid: Oid, st: &libc::stat) -> Attr {
    let is_dir = st.st_mode & S_IFMT == S_IFDIR;
    Attr {
        oid,
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        size: if is_dir { 0 } else { st.st_size as u64 },
        blocks: st.st_blocks as u64,
        nlink: 1,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
    }
}

/// The oid dfuse would make of a DFS object id, before the root's swap: the low 32 bits of
/// `hi` (the object's number in its allocation range) with `lo` (the range) above them.
fn raw_oid(id: ObjId) -> Oid {
    (id.lo << 32) ^ (id.hi & 0xffff_ffff)
}

impl LibDfs {
    /// Mounts container `container` (label or UUID) of pool `pool`, as dfuse does: a
    /// read-only pool connection, the container opened for writing unless `read_only`.
    pub fn mount(
        lib: &'static LibDaos,
        pool: &str,
        container: &str,
        read_only: bool,
    ) -> Result<LibDfs> {
        let pool = lib.connect(pool, false)?;
        let cont = pool.open(container, !read_only)?;
        // The mount outlives this borrow: take the handle over (closed in Drop).
        let container_handle = cont.handle;
        std::mem::forget(cont);
        let mut mount: *mut DfsMount = std::ptr::null_mut();
        let flags = if read_only {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        };
        // SAFETY: both handles are open and stay so until Drop unmounts; `mount` is written.
        let errno =
            unsafe { (lib.sym.dfs_mount)(pool.handle, container_handle, flags, &mut mount) };
        if errno != 0 {
            lib.close_container(container_handle);
            return Err(super::from_errno(
                errno,
                &format!("mounting container {container} (is it a POSIX container?)"),
            ));
        }
        let mut dfs = LibDfs {
            lib,
            mount,
            read_only,
            root_id: ObjId::default(),
            objects: RwLock::new(HashMap::new()),
            listings: listing::Listings::default(),
            container: container_handle,
            pool,
        };
        dfs.hold_root().map_err(|e| {
            super::from_errno(e.errno.0, &format!("looking up the root of {container}"))
        })?;
        Ok(dfs)
    }

    fn hold_root(&mut self) -> DfsResult<()> {
        let path = c"/";
        let mut obj: *mut DfsObj = std::ptr::null_mut();
        let mut mode = 0u32;
        // SAFETY: the mount is live; `path` is NUL-terminated; `obj` and `mode` are written.
        let errno = unsafe {
            (self.lib.sym.dfs_lookup)(
                self.mount,
                path.as_ptr(),
                self.access(),
                &mut obj,
                &mut mode,
                std::ptr::null_mut(),
            )
        };
        check(errno, "lookup /")?;
        let mut root = self.adopt(obj, mode, ROOT_OID)?;
        self.root_id = root.id;
        root.oid = ROOT_OID;
        self.objects
            .get_mut()
            .expect("object table")
            .insert(ROOT_OID, Arc::new(root));
        Ok(())
    }

    /// Drops the handle held for `oid` (FUSE's forget): it is ESTALE until looked up again.
    /// The root is never forgotten.
    pub fn forget(&self, oid: Oid) {
        if oid != ROOT_OID {
            self.objects.write().expect("object table").remove(&oid);
        }
    }

    /// The access mode objects are looked up with (and libdfs then enforces on them).
    fn access(&self) -> c_int {
        if self.read_only {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        }
    }

    fn writable(&self) -> DfsResult<()> {
        if self.read_only {
            Err(DfsError::new(
                Errno::ROFS,
                "the volume is mounted read-only",
            ))
        } else {
            Ok(())
        }
    }

    /// Wraps a handle libdfs returned for an entry of `parent`, with its id and oid.
    fn adopt(&self, ptr: *mut DfsObj, mode: u32, parent: Oid) -> DfsResult<Object> {
        let mut object = Object {
            lib: self.lib,
            ptr,
            id: ObjId::default(),
            oid: 0,
            kind: mode & S_IFMT,
            parent,
        };
        // SAFETY: `ptr` is a live object (released by `object`'s Drop, also on error).
        let errno = unsafe { (self.lib.sym.dfs_obj2id)(ptr, &mut object.id) };
        check(errno, "dfs_obj2id")?;
        object.oid = self.oid_of(object.id);
        Ok(object)
    }

    /// The oid of an object id: the root's is [`ROOT_OID`], and an object whose derived oid
    /// is `ROOT_OID` gets the root's derived one, so the mapping stays one-to-one.
    fn oid_of(&self, id: ObjId) -> Oid {
        if id == self.root_id {
            return ROOT_OID;
        }
        match raw_oid(id) {
            ROOT_OID => raw_oid(self.root_id),
            oid => oid,
        }
    }

    /// Keeps `object` as the handle of its oid (replacing an older one, which may have a
    /// stale name after a rename). A different object under the same oid is EIO, as in
    /// dfuse: two objects must never share an inode number.
    fn hold(&self, object: Object) -> DfsResult<(Oid, Arc<Object>)> {
        let oid = object.oid;
        let mut objects = self.objects.write().expect("object table");
        if let Some(old) = objects.get(&oid)
            && old.id != object.id
        {
            return Err(DfsError::new(
                Errno::IO,
                format!(
                    "object ids {:?} and {:?} both map to oid {oid:#x}",
                    old.id, object.id
                ),
            ));
        }
        let object = Arc::new(object);
        objects.insert(oid, object.clone());
        Ok((oid, object))
    }

    /// The handle of `oid`: ESTALE when it is not held (forgotten, or from another mount).
    fn object(&self, oid: Oid) -> DfsResult<Arc<Object>> {
        self.objects
            .read()
            .expect("object table")
            .get(&oid)
            .cloned()
            .ok_or_else(|| DfsError::new(Errno::STALE, format!("object {oid:#x} is not known")))
    }

    /// Looks `name` up in `parent` without following a final symlink: the new handle and
    /// what stat says of it.
    fn lookup_rel(&self, parent: &Object, name: &str) -> DfsResult<(Object, libc::stat)> {
        let cname = name_c(name)?;
        let mut obj: *mut DfsObj = std::ptr::null_mut();
        let mut mode = 0u32;
        let mut st = zeroed_stat();
        // SAFETY: the mount and `parent` are live; `cname` is NUL-terminated; `obj`, `mode`
        // and `st` are written.
        let errno = unsafe {
            (self.lib.sym.dfs_lookup_rel)(
                self.mount,
                parent.ptr,
                cname.as_ptr(),
                self.access() | libc::O_NOFOLLOW,
                &mut obj,
                &mut mode,
                &mut st,
            )
        };
        check(errno, format_args!("lookup {name:?}"))?;
        Ok((self.adopt(obj, mode, parent.oid)?, st))
    }

    /// The oid and type of entry `name` of `parent`, without keeping a handle.
    fn peek(&self, parent: &Object, name: &str) -> DfsResult<(Oid, u32)> {
        let (object, _) = self.lookup_rel(parent, name)?;
        Ok((object.oid, object.kind))
    }

    /// Whether directory `dir` is `ancestor` or below it, as far as the held objects tell
    /// (every directory the kernel names was looked up from the root, so the chain is held).
    fn is_within(&self, mut dir: Oid, ancestor: Oid) -> bool {
        let objects = self.objects.read().expect("object table");
        // Bounded: parents recorded before someone else's renames may form a cycle.
        for _ in 0..MAX_DEPTH {
            if dir == ancestor {
                return true;
            }
            match objects.get(&dir) {
                Some(o) if o.parent != dir => dir = o.parent,
                _ => return false,
            }
        }
        false
    }

    /// Stat of a held object. ENOENT from libdfs means its entry is gone or names another
    /// object now (removed or renamed elsewhere): ESTALE, as for `LocalDfs`.
    fn ostat(&self, object: &Object) -> DfsResult<libc::stat> {
        let mut st = zeroed_stat();
        // SAFETY: the mount and the object are live; `st` is written.
        let errno = unsafe { (self.lib.sym.dfs_ostat)(self.mount, object.ptr, &mut st) };
        stale_if_gone(check(errno, "stat"))?;
        Ok(st)
    }
}

/// ENOENT on a held handle as ESTALE.
fn stale_if_gone<T>(r: DfsResult<T>) -> DfsResult<T> {
    r.map_err(|e| {
        if e.errno == Errno::NOENT {
            DfsError::new(Errno::STALE, e.detail)
        } else {
            e
        }
    })
}

impl Drop for LibDfs {
    fn drop(&mut self) {
        // Objects first: libdfs does not check for them, and the container would not close.
        self.objects.get_mut().expect("object table").clear();
        // SAFETY: the mount came from dfs_mount and is unmounted once, here, with no
        // object of it left.
        let errno = unsafe { (self.lib.sym.dfs_umount)(self.mount) };
        if errno != 0 {
            tracing::warn!("dfs_umount: {}", std::io::Error::from_raw_os_error(errno));
        }
        self.lib.close_container(self.container);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oids_follow_dfuses_inode_numbers() {
        // DFS allocates object numbers in ranges: `lo` names the range, the low 32 bits of
        // `hi` the object in it; the high bits of `hi` hold the class, not the identity.
        let a = ObjId {
            lo: 3,
            hi: 0x1200_0000_0000_0007,
        };
        assert_eq!(raw_oid(a), (3 << 32) | 7);
        let b = ObjId { lo: 3, hi: 8 };
        assert_ne!(raw_oid(a), raw_oid(b));
        let c = ObjId { lo: 4, hi: 7 };
        assert_ne!(raw_oid(a), raw_oid(c));
    }

    #[test]
    fn directories_have_size_zero_and_objects_one_link() {
        let mut st = zeroed_stat();
        st.st_mode = S_IFDIR | 0o755;
        st.st_size = 104;
        st.st_nlink = 0;
        let attr = attr_of(9, &st);
        assert_eq!((attr.oid, attr.size, attr.nlink), (9, 0, 1));
        st.st_mode = crate::dfs::S_IFREG | 0o644;
        st.st_size = 5;
        assert_eq!(attr_of(9, &st).size, 5);
    }

    #[test]
    fn errnos_keep_their_value_and_gone_handles_are_stale() {
        let err = check(libc::ENOTEMPTY, "rmdir").unwrap_err();
        assert_eq!(err.errno, Errno::NOTEMPTY);
        assert!(err.detail.starts_with("rmdir: "), "{}", err.detail);
        let stale = stale_if_gone::<()>(check(libc::ENOENT, "stat")).unwrap_err();
        assert_eq!(stale.errno, Errno::STALE);
        let other = stale_if_gone::<()>(check(libc::EIO, "stat")).unwrap_err();
        assert_eq!(other.errno, Errno::IO);
        assert!(check(0, "x").is_ok());
    }
}
