//! The [`Dfs`] calls of [`LocalDfs`]: each one syscall (or a few) relative to held descriptors.

use super::{LocalDfs, name_c, os_err, sys, timespec};
use crate::dfs::{
    Attr, Dfs, DfsError, DfsResult, DirEntry, DirPage, Errno, Oid, ROOT_OID, S_IFDIR, S_IFLNK,
    S_IFMT, S_IFREG, SetAttr, StatFs, XattrMode,
};
use std::os::fd::AsFd;

impl Dfs for LocalDfs {
    fn lookup(&self, parent: Oid, name: &str) -> DfsResult<Attr> {
        let cname = name_c(name)?;
        let pfd = self.obj(parent)?;
        self.open_entry(&pfd, &cname, &format!("lookup {name:?}"))
    }

    fn getattr(&self, oid: Oid) -> DfsResult<Attr> {
        let fd = self.obj(oid)?;
        self.stat_obj(oid, &fd)
    }

    fn setattr(&self, oid: Oid, set: &SetAttr) -> DfsResult<Attr> {
        let fd = self.obj(oid)?;
        self.stat_obj(oid, &fd)?;
        // Owner first: chown clears set-id bits, which an explicit mode then restores.
        if set.uid.is_some() || set.gid.is_some() {
            let (uid, gid) = (set.uid.unwrap_or(u32::MAX), set.gid.unwrap_or(u32::MAX));
            sys::chown(fd.as_fd(), uid, gid).map_err(|e| os_err(e, "chown"))?;
        }
        if let Some(mode) = set.mode {
            sys::chmod(fd.as_fd(), mode & 0o7777).map_err(|e| os_err(e, "chmod"))?;
        }
        if let Some(size) = set.size {
            let w = self.io_fd(oid, libc::O_WRONLY)?;
            sys::ftruncate(w.as_fd(), size).map_err(|e| os_err(e, "truncate"))?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = [timespec(set.atime), timespec(set.mtime)];
            sys::utimens(fd.as_fd(), &times).map_err(|e| os_err(e, "utimens"))?;
        }
        self.stat_obj(oid, &fd)
    }

    fn readdir(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage> {
        let fd = self.obj(dir)?;
        if self.stat_obj(dir, &fd)?.kind() != S_IFDIR {
            return Err(DfsError::new(
                Errno::NOTDIR,
                format!("{dir:#x} is not a directory"),
            ));
        }
        let dfd = sys::reopen(fd.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(|e| os_err(e, "opendir"))?;
        let max = max.max(1);
        let mut page = DirPage::default();
        let mut buf = vec![0u8; 32 << 10];
        let mut pos = cookie;
        loop {
            let batch =
                sys::getdents(dfd.as_fd(), pos, &mut buf).map_err(|e| os_err(e, "readdir"))?;
            if batch.is_empty() {
                page.end = true;
                return Ok(page);
            }
            for d in batch {
                pos = d.next;
                if d.name == b"." || d.name == b".." {
                    continue;
                }
                if page.entries.len() == max {
                    return Ok(page);
                }
                let kind = match d.d_type {
                    libc::DT_DIR => S_IFDIR,
                    libc::DT_LNK => S_IFLNK,
                    libc::DT_REG => S_IFREG,
                    _ => sys::cstring(&String::from_utf8_lossy(&d.name))
                        .and_then(|n| sys::stat_at(dfd.as_fd(), &n))
                        .map(|st| st.st_mode & S_IFMT)
                        .unwrap_or(0),
                };
                page.entries.push(DirEntry {
                    name: String::from_utf8_lossy(&d.name).into_owned(),
                    oid: self.oid_of(d.ino),
                    kind,
                    cookie: d.next,
                    attr: None,
                });
            }
        }
    }

    fn create(&self, parent: Oid, name: &str, mode: u32, uid: u32, gid: u32) -> DfsResult<Attr> {
        let cname = name_c(name)?;
        let pfd = self.obj(parent)?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW;
        let file = sys::openat(pfd.as_fd(), &cname, flags, mode & 0o7777)
            .map_err(|e| os_err(e, format!("create {name:?}")))?;
        // The O_PATH handle comes from the new file itself, not its name, which may change.
        let path_fd = sys::reopen(file.as_fd(), libc::O_PATH).map_err(|e| os_err(e, "reopen"))?;
        let attr = self.register(path_fd, name)?;
        self.init_owner(attr, Some(mode), uid, gid)
    }

    fn open(&self, oid: Oid, write: bool) -> DfsResult<Attr> {
        let fd = self.obj(oid)?;
        let attr = self.stat_obj(oid, &fd)?;
        match attr.kind() {
            S_IFDIR if write => Err(DfsError::new(
                Errno::ISDIR,
                format!("{oid:#x} is a directory"),
            )),
            S_IFLNK => Err(DfsError::new(
                Errno(libc::ELOOP),
                format!("{oid:#x} is a symlink"),
            )),
            _ => Ok(attr),
        }
    }

    fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> DfsResult<usize> {
        let fd = self.io_fd(oid, libc::O_RDONLY)?;
        sys::pread_full(fd.as_fd(), offset, buf).map_err(|e| os_err(e, format!("read {oid:#x}")))
    }

    fn write(&self, oid: Oid, offset: u64, data: &[u8]) -> DfsResult<()> {
        let fd = self.io_fd(oid, libc::O_WRONLY)?;
        sys::pwrite_all(fd.as_fd(), offset, data).map_err(|e| os_err(e, format!("write {oid:#x}")))
    }

    fn allocate(&self, oid: Oid, offset: u64, len: u64, keep_size: bool) -> DfsResult<()> {
        let fd = self.io_fd(oid, libc::O_WRONLY)?;
        let mode = if keep_size {
            libc::FALLOC_FL_KEEP_SIZE
        } else {
            0
        };
        sys::fallocate(fd.as_fd(), mode, offset, len)
            .map_err(|e| os_err(e, format!("allocate {oid:#x}")))
    }

    fn punch(&self, oid: Oid, offset: u64, len: u64) -> DfsResult<()> {
        let fd = self.io_fd(oid, libc::O_WRONLY)?;
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        sys::fallocate(fd.as_fd(), mode, offset, len)
            .map_err(|e| os_err(e, format!("punch {oid:#x}")))
    }

    fn fsync(&self, oid: Oid, datasync: bool) -> DfsResult<()> {
        let fd = self.obj(oid)?;
        if self.stat_obj(oid, &fd)?.kind() == S_IFLNK {
            // A symlink has no data of its own and cannot be opened; its creation is made
            // durable by its directory's fsync.
            return Ok(());
        }
        let fd = sys::reopen(fd.as_fd(), libc::O_RDONLY).map_err(|e| os_err(e, "open"))?;
        sys::fsync(fd.as_fd(), datasync).map_err(|e| os_err(e, format!("fsync {oid:#x}")))
    }

    fn rename(
        &self,
        parent: Oid,
        name: &str,
        new_parent: Oid,
        new_name: &str,
        noreplace: bool,
    ) -> DfsResult<()> {
        let (cname, cnew) = (name_c(name)?, name_c(new_name)?);
        let (pfd, nfd) = (self.obj(parent)?, self.obj(new_parent)?);
        let victim = self.entry_oid(&nfd, &cnew);
        sys::renameat2(pfd.as_fd(), &cname, nfd.as_fd(), &cnew, noreplace)
            .map_err(|e| os_err(e, format!("rename {name:?} to {new_name:?}")))?;
        self.reap(victim);
        Ok(())
    }

    fn unlink(&self, parent: Oid, name: &str) -> DfsResult<()> {
        self.remove(parent, name, false)
    }

    fn mkdir(&self, parent: Oid, name: &str, mode: u32, uid: u32, gid: u32) -> DfsResult<Attr> {
        let cname = name_c(name)?;
        let pfd = self.obj(parent)?;
        sys::mkdirat(pfd.as_fd(), &cname, mode & 0o7777)
            .map_err(|e| os_err(e, format!("mkdir {name:?}")))?;
        let attr = self.open_entry(&pfd, &cname, name)?;
        self.init_owner(attr, Some(mode), uid, gid)
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
        let cname = name_c(name)?;
        let ctarget = sys::cstring(target).map_err(|e| os_err(e, "symlink target"))?;
        let pfd = self.obj(parent)?;
        sys::symlinkat(&ctarget, pfd.as_fd(), &cname)
            .map_err(|e| os_err(e, format!("symlink {name:?}")))?;
        let attr = self.open_entry(&pfd, &cname, name)?;
        self.init_owner(attr, None, uid, gid)
    }

    fn readlink(&self, oid: Oid) -> DfsResult<String> {
        let fd = self.obj(oid)?;
        if self.stat_obj(oid, &fd)?.kind() != S_IFLNK {
            return Err(DfsError::new(
                Errno::INVAL,
                format!("{oid:#x} is not a symlink"),
            ));
        }
        let target = sys::readlink(fd.as_fd()).map_err(|e| os_err(e, "readlink"))?;
        String::from_utf8(target)
            .map_err(|_| DfsError::new(Errno::IO, "symlink target is not UTF-8"))
    }

    fn setxattr(&self, oid: Oid, name: &str, value: &[u8], mode: XattrMode) -> DfsResult<()> {
        let fd = self.obj(oid)?;
        let cname = sys::cstring(name).map_err(|e| os_err(e, "xattr name"))?;
        let flags = match mode {
            XattrMode::Any => 0,
            XattrMode::Create => libc::XATTR_CREATE,
            XattrMode::Replace => libc::XATTR_REPLACE,
        };
        sys::setxattr(fd.as_fd(), &cname, value, flags)
            .map_err(|e| os_err(e, format!("setxattr {name:?}")))
    }

    fn getxattr(&self, oid: Oid, name: &str) -> DfsResult<Vec<u8>> {
        let fd = self.obj(oid)?;
        let cname = sys::cstring(name).map_err(|e| os_err(e, "xattr name"))?;
        sys::getxattr(fd.as_fd(), &cname).map_err(|e| os_err(e, format!("getxattr {name:?}")))
    }

    fn listxattr(&self, oid: Oid) -> DfsResult<Vec<String>> {
        let fd = self.obj(oid)?;
        sys::listxattr(fd.as_fd()).map_err(|e| os_err(e, "listxattr"))
    }

    fn removexattr(&self, oid: Oid, name: &str) -> DfsResult<()> {
        let fd = self.obj(oid)?;
        let cname = sys::cstring(name).map_err(|e| os_err(e, "xattr name"))?;
        sys::removexattr(fd.as_fd(), &cname).map_err(|e| os_err(e, format!("removexattr {name:?}")))
    }

    fn statfs(&self) -> DfsResult<StatFs> {
        let fd = self.obj(ROOT_OID)?;
        let st = sys::statvfs(fd.as_fd()).map_err(|e| os_err(e, "statfs"))?;
        Ok(StatFs {
            total_bytes: st.f_blocks * st.f_frsize,
            free_bytes: st.f_bavail * st.f_frsize,
            files: st.f_files.saturating_sub(st.f_ffree),
        })
    }
}
