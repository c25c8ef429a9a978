//! [`LocalDfs`]: the [`Dfs`] interface over a directory of the local file system.
//!
//! It is the reference the differential POSIX suite compares every backend with, and the volume
//! worker's local-mode backend. Objects are named by inode number and held open as `O_PATH`
//! descriptors, and every call goes through the *at() syscalls relative to those descriptors,
//! so an object stays reachable however it (or any directory above it) is renamed.
//!
//! Differences from a real DFS container, kept small on purpose:
//! - Oids are inode numbers (the root directory's is swapped with [`ROOT_OID`]); a fresh
//!   `LocalDfs` knows only the root, so an oid from an earlier instance is ESTALE until looked
//!   up again.
//! - One descriptor is held per object ever looked up or created, until [`LocalDfs::forget`]
//!   or the object's removal through this `LocalDfs` (removal by someone else is noticed on
//!   the next use: ESTALE).
//! - Objects on another file system below the root (mount points) are refused with EXDEV.
//! - Directories report size 0, as DFS does; nlink and blocks are the local file system's.

mod sys;

use super::{
    Attr, DfsError, DfsResult, Errno, Oid, ROOT_OID, S_IFDIR, S_IFLNK, S_IFMT, TimeSet, Timespec,
    check_name,
};
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// A local directory as a DFS namespace. See the module documentation.
#[derive(Debug)]
pub struct LocalDfs {
    root_path: PathBuf,
    root_ino: u64,
    dev: u64,
    /// Every object known by oid, as an O_PATH descriptor.
    objects: RwLock<HashMap<Oid, Arc<OwnedFd>>>,
}

/// Attaches what was being done to an OS error, keeping its errno.
fn os_err(e: io::Error, what: impl std::fmt::Display) -> DfsError {
    DfsError::new(
        Errno(e.raw_os_error().unwrap_or(libc::EIO)),
        format!("{what}: {e}"),
    )
}

fn name_c(name: &str) -> DfsResult<CString> {
    check_name(name)?;
    sys::cstring(name).map_err(|e| os_err(e, format!("name {name:?}")))
}

fn time(secs: i64, nanos: i64) -> Timespec {
    Timespec {
        secs,
        nanos: nanos as u32,
    }
}

fn timespec(t: Option<TimeSet>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeSet::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeSet::At(t)) => libc::timespec {
            tv_sec: t.secs,
            tv_nsec: t.nanos as i64,
        },
    }
}

impl LocalDfs {
    /// Serves the directory `root` (which must exist).
    pub fn open(root: &Path) -> DfsResult<LocalDfs> {
        let fd: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(root)
            .map_err(|e| os_err(e, format!("open {}", root.display())))?
            .into();
        let st = sys::stat(fd.as_fd()).map_err(|e| os_err(e, root.display()))?;
        let mut objects = HashMap::new();
        objects.insert(ROOT_OID, Arc::new(fd));
        Ok(LocalDfs {
            root_path: root.to_path_buf(),
            root_ino: st.st_ino,
            dev: st.st_dev,
            objects: RwLock::new(objects),
        })
    }

    /// The directory served.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Drops the descriptor held for `oid` (FUSE's forget): its oid is ESTALE until the object
    /// is looked up again. The root is never forgotten.
    pub fn forget(&self, oid: Oid) {
        if oid != ROOT_OID {
            self.objects.write().expect("object map").remove(&oid);
        }
    }

    /// The oid of an inode number: the root's inode and ROOT_OID trade places, so the mapping
    /// stays one-to-one.
    fn oid_of(&self, ino: u64) -> Oid {
        if ino == self.root_ino {
            ROOT_OID
        } else if ino == ROOT_OID {
            self.root_ino
        } else {
            ino
        }
    }

    fn obj(&self, oid: Oid) -> DfsResult<Arc<OwnedFd>> {
        self.objects
            .read()
            .expect("object map")
            .get(&oid)
            .cloned()
            .ok_or_else(|| DfsError::new(Errno::STALE, format!("unknown object {oid:#x}")))
    }

    fn attr(&self, st: &libc::stat) -> Attr {
        let mode = st.st_mode;
        Attr {
            oid: self.oid_of(st.st_ino),
            mode,
            uid: st.st_uid,
            gid: st.st_gid,
            size: if mode & S_IFMT == S_IFDIR {
                0
            } else {
                st.st_size as u64
            },
            blocks: st.st_blocks as u64,
            nlink: st.st_nlink as u32,
            atime: time(st.st_atime, st.st_atime_nsec),
            mtime: time(st.st_mtime, st.st_mtime_nsec),
            ctime: time(st.st_ctime, st.st_ctime_nsec),
        }
    }

    /// Current attributes of a held object; a removed one is forgotten and ESTALE.
    fn stat_obj(&self, oid: Oid, fd: &OwnedFd) -> DfsResult<Attr> {
        let st = sys::stat(fd.as_fd()).map_err(|e| os_err(e, format!("stat {oid:#x}")))?;
        if st.st_nlink == 0 {
            self.forget(oid);
            return Err(DfsError::new(
                Errno::STALE,
                format!("object {oid:#x} was removed"),
            ));
        }
        Ok(self.attr(&st))
    }

    /// Remembers an object's O_PATH descriptor (keeping the one already held, if any).
    fn register(&self, fd: OwnedFd, what: &str) -> DfsResult<Attr> {
        let st = sys::stat(fd.as_fd()).map_err(|e| os_err(e, what))?;
        if st.st_dev != self.dev {
            return Err(DfsError::new(
                Errno::XDEV,
                format!("{what} is on another file system"),
            ));
        }
        let attr = self.attr(&st);
        self.objects
            .write()
            .expect("object map")
            .entry(attr.oid)
            .or_insert_with(|| Arc::new(fd));
        Ok(attr)
    }

    /// Opens `name` in `dir` as O_PATH and remembers it.
    fn open_entry(&self, dir: &OwnedFd, name: &CString, what: &str) -> DfsResult<Attr> {
        let fd = sys::openat(dir.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)
            .map_err(|e| os_err(e, what))?;
        self.register(fd, what)
    }

    /// The oid an entry names now, if any (to forget it once it is removed).
    fn entry_oid(&self, dir: &OwnedFd, name: &CString) -> Option<Oid> {
        sys::stat_at(dir.as_fd(), name)
            .ok()
            .map(|st| self.oid_of(st.st_ino))
    }

    /// Forgets an object once its last link is gone.
    fn reap(&self, oid: Option<Oid>) {
        let Some(oid) = oid else { return };
        let Ok(fd) = self.obj(oid) else { return };
        if sys::stat(fd.as_fd()).is_ok_and(|st| st.st_nlink == 0) {
            self.forget(oid);
        }
    }

    /// Sets owner and exact permission bits on a new object (creation applies the umask).
    fn init_owner(&self, attr: Attr, mode: Option<u32>, uid: u32, gid: u32) -> DfsResult<Attr> {
        let fd = self.obj(attr.oid)?;
        if attr.uid != uid || attr.gid != gid {
            sys::chown(fd.as_fd(), uid, gid).map_err(|e| os_err(e, "chown"))?;
        }
        if let Some(mode) = mode.filter(|m| m & 0o7777 != attr.mode & 0o7777) {
            sys::chmod(fd.as_fd(), mode & 0o7777).map_err(|e| os_err(e, "chmod"))?;
        }
        self.stat_obj(attr.oid, &fd)
    }

    /// Opens the object for I/O.
    fn io_fd(&self, oid: Oid, flags: libc::c_int) -> DfsResult<OwnedFd> {
        let fd = self.obj(oid)?;
        let attr = self.stat_obj(oid, &fd)?;
        match attr.kind() {
            S_IFDIR if flags & libc::O_ACCMODE != libc::O_RDONLY => Err(DfsError::new(
                Errno::ISDIR,
                format!("{oid:#x} is a directory"),
            )),
            S_IFLNK => Err(DfsError::new(
                Errno::INVAL,
                format!("{oid:#x} is a symlink"),
            )),
            _ => sys::reopen(fd.as_fd(), flags).map_err(|e| os_err(e, format!("open {oid:#x}"))),
        }
    }

    fn remove(&self, parent: Oid, name: &str, dir: bool) -> DfsResult<()> {
        let cname = name_c(name)?;
        let pfd = self.obj(parent)?;
        let victim = self.entry_oid(&pfd, &cname);
        sys::unlinkat(pfd.as_fd(), &cname, dir)
            .map_err(|e| os_err(e, format!("remove {name:?}")))?;
        self.reap(victim);
        Ok(())
    }
}

mod calls;

#[cfg(test)]
mod tests;
