//! Thin, safe wrappers over the *at() syscalls [`super::LocalDfs`] is built on.
//!
//! Objects are held as `O_PATH` descriptors. Calls that refuse `O_PATH` descriptors (chmod,
//! utimensat, xattrs, reopening for I/O) go through `/proc/self/fd/N`, whose magic link
//! resolves to the object itself — never to a path that a concurrent rename could change.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A C string for a name or path; an interior NUL is EINVAL.
pub fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn check_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `/proc/self/fd/N` for a descriptor.
pub fn proc_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)`.
pub fn openat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; the returned descriptor is owned by nobody else.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode,
        )
    })?;
    // SAFETY: `fd` was just opened and is valid.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the object `fd` refers to anew with `flags` (e.g. O_RDONLY from an O_PATH fd).
pub fn reopen(fd: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = proc_path(fd);
    // SAFETY: `path` is NUL-terminated.
    let fd = check(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was just opened and is valid.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dir` itself.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    let flags = libc::AT_SYMLINK_NOFOLLOW
        | if name.is_empty() {
            libc::AT_EMPTY_PATH
        } else {
            0
        };
    // SAFETY: a zeroed `stat` is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `st` is writable.
    check(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `fstat` of the object itself.
pub fn stat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    stat_at(fd, c"")
}

/// `mkdirat`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `unlinkat`, with `AT_REMOVEDIR` for directories.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, remove_dir: bool) -> io::Result<()> {
    let flags = if remove_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `renameat2`, with `RENAME_NOREPLACE` when asked.
pub fn renameat2(
    dir: BorrowedFd<'_>,
    name: &CStr,
    new_dir: BorrowedFd<'_>,
    new_name: &CStr,
    noreplace: bool,
) -> io::Result<()> {
    let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
    // SAFETY: both names are NUL-terminated.
    check(unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            name.as_ptr(),
            new_dir.as_raw_fd(),
            new_name.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// Target of the symlink `fd` refers to (`readlinkat(fd, "")`).
pub fn readlink(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `buf` is writable for its length.
    let n = check_size(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// `fchownat(fd, "", AT_EMPTY_PATH)`: works on O_PATH descriptors, symlinks included.
/// `u32::MAX` (-1) leaves an id alone.
pub fn chown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: the empty path is NUL-terminated.
    check(unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, flags) }).map(drop)
}

/// chmod of the object `fd` refers to.
pub fn chmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let path = proc_path(fd);
    // SAFETY: `path` is NUL-terminated.
    check(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// utimensat of the object `fd` refers to; `[atime, mtime]` may be UTIME_NOW or UTIME_OMIT.
pub fn utimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    let path = proc_path(fd);
    // SAFETY: `path` is NUL-terminated and `times` points at two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) }).map(drop)
}

/// `setxattr` with `XATTR_CREATE` / `XATTR_REPLACE` flags.
pub fn setxattr(
    fd: BorrowedFd<'_>,
    name: &CStr,
    value: &[u8],
    flags: libc::c_int,
) -> io::Result<()> {
    let path = proc_path(fd);
    // SAFETY: strings are NUL-terminated and `value` is readable for its length.
    check(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// Value of an extended attribute.
pub fn getxattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let path = proc_path(fd);
    loop {
        // SAFETY: a null buffer of size 0 asks for the size.
        let size = check_size(unsafe {
            libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0)
        })?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` is writable for its length.
        let r =
            unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), size) };
        match check_size(r) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            // It grew between the two calls: ask again.
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Names of the extended attributes.
pub fn listxattr(fd: BorrowedFd<'_>) -> io::Result<Vec<String>> {
    let path = proc_path(fd);
    loop {
        // SAFETY: a null buffer of size 0 asks for the size.
        let size = check_size(unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) })?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` is writable for its length.
        let r = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), size) };
        match check_size(r) {
            Ok(n) => {
                return Ok(buf[..n]
                    .split(|&b| b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect());
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Removes an extended attribute.
pub fn removexattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let path = proc_path(fd);
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// `fstatvfs` (allowed on O_PATH descriptors).
pub fn statvfs(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs> {
    // SAFETY: a zeroed `statvfs` is a valid out-buffer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable.
    check(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `pread` until `buf` is full or end of file; returns the bytes read.
pub fn pread_full(fd: BorrowedFd<'_>, mut offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is writable for its length.
        let r = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
                offset as libc::off_t,
            )
        };
        match check_size(r) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// `pwrite` all of `data`.
pub fn pwrite_all(fd: BorrowedFd<'_>, mut offset: u64, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is readable for its length.
        let r = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                offset as libc::off_t,
            )
        };
        match check_size(r) {
            Ok(0) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            Ok(n) => {
                data = &data[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `ftruncate`.
pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let size =
        libc::off_t::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain syscall on a valid descriptor.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size) }).map(drop)
}

/// `fallocate` with `mode`.
pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    let efbig = |_| io::Error::from_raw_os_error(libc::EFBIG);
    let offset = libc::off_t::try_from(offset).map_err(efbig)?;
    let len = libc::off_t::try_from(len).map_err(efbig)?;
    // SAFETY: plain syscall on a valid descriptor.
    check(unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset, len) }).map(drop)
}

/// `fsync` or `fdatasync`.
pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: plain syscalls on a valid descriptor.
    check(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

/// One raw directory entry: name, inode, `d_type`, and `d_off` (the position after it).
#[derive(Debug)]
pub struct RawDirent {
    pub name: Vec<u8>,
    pub ino: u64,
    pub d_type: u8,
    pub next: u64,
}

/// Reads a batch of entries starting at directory position `pos` (0 = the start) from an
/// `O_RDONLY|O_DIRECTORY` descriptor. An empty batch is the end of the directory.
pub fn getdents(dir: BorrowedFd<'_>, pos: u64, buf: &mut [u8]) -> io::Result<Vec<RawDirent>> {
    // SAFETY: plain syscall on a valid descriptor.
    let r = unsafe { libc::lseek(dir.as_raw_fd(), pos as libc::off_t, libc::SEEK_SET) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `buf` is writable for its length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    let n = check_size(n as libc::ssize_t)?;
    // linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name (NUL-terminated).
    let mut out = Vec::new();
    let mut at = 0;
    while at + 19 <= n {
        let ino = u64::from_ne_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
        let next = u64::from_ne_bytes(buf[at + 8..at + 16].try_into().expect("8 bytes"));
        let reclen =
            u16::from_ne_bytes(buf[at + 16..at + 18].try_into().expect("2 bytes")) as usize;
        let d_type = buf[at + 18];
        let name_bytes = &buf[at + 19..at + reclen];
        let len = name_bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(name_bytes.len());
        out.push(RawDirent {
            name: name_bytes[..len].to_vec(),
            ino,
            d_type,
            next,
        });
        at += reclen;
    }
    Ok(out)
}
