// Over 600 lines: one differential suite whose cases share one harness and one allow-list.
//! The POSIX differential suite: the same cases, made of real syscalls, run on a plain local
//! directory and on a dpufs mount served by a real `dpufs-csi worker --backend local:<dir>`
//! child process. Every observation (data, errno, stat fields) must match, except the
//! differences listed in [`allow`], which must then be exactly what that list says.

mod common;

use common::{Backing, EngineBacking, Opts, WorkerProc, can_mount, errno_of, tempdir};
use dpufs_e2e::dfuse::Dfuse;
use std::ffi::OsStr;
use std::fmt::Debug;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;

/// The accepted differences between a dpufs mount and a local directory, in one place.
mod allow {
    use std::fs::Metadata;
    use std::os::unix::fs::MetadataExt;

    /// What of stat(2) is compared: file type, permission bits, uid, gid, size and link
    /// count. Never compared: st_dev and st_ino (different file systems), st_blocks and
    /// st_blksize (allocation is the backend's business), atime (the mount is noatime).
    /// For directories, nlink and size are not compared either: DFS reports size 0 and does
    /// not count subdirectories in nlink.
    pub fn stat_view(m: &Metadata) -> String {
        let kind = match m.mode() & libc::S_IFMT {
            libc::S_IFDIR => "dir",
            libc::S_IFREG => "file",
            libc::S_IFLNK => "symlink",
            _ => "other",
        };
        let mut s = format!(
            "{kind} mode={:o} uid={} gid={}",
            m.mode() & 0o7777,
            m.uid(),
            m.gid()
        );
        if kind != "dir" {
            s += &format!(" size={} nlink={}", m.size(), m.nlink());
        }
        s
    }

    /// Observations that differ by design: (case/label, what the mount gives, why).
    pub const DIFFERENCES: &[(&str, &str, &str)] = &[
        (
            "errnos/link",
            "Err(EPERM)",
            "DFS has no hard links: link(2) says the file system does not support them",
        ),
        (
            "errnos/mkfifo",
            "Err(EPERM)",
            "DFS has no FIFOs, sockets or device nodes",
        ),
        (
            "errnos/non-utf8-name",
            "Err(EILSEQ)",
            "the Dfs API takes UTF-8 names",
        ),
        (
            "errnos/read-after-unlink-open",
            "Err(ESTALE)",
            "DFS removes an object at unlink; a descriptor still open on it goes stale",
        ),
        (
            "rename/exchange",
            "Err(EINVAL)",
            "DFS has no RENAME_EXCHANGE",
        ),
        (
            "readdir/has-dot-entries",
            "false",
            "DFS directories have no . and .. entries; POSIX lets readdir omit them",
        ),
        (
            "sparse/seek-hole-from-0",
            "Ok(10485763)",
            "SEEK_HOLE/SEEK_DATA are not passed to DFS: the whole file reads as data (a hole \
             at its end), which POSIX allows",
        ),
    ];
    /// Where a volume on real DAOS (libdfs) differs besides: DFS's own limits, which dfuse
    /// has too (docs/real-daos.md).
    pub const LIBDFS: &[(&str, &str, &str)] = &[
        ("sparse/fallocate-extend", "Err(EOPNOTSUPP)", NO_FALLOCATE),
        (
            "sparse/fallocate-keep-size",
            "Err(EOPNOTSUPP)",
            NO_FALLOCATE,
        ),
        (
            "sparse/after-fallocate",
            "Ok(\"file mode=644 uid=0 gid=0 size=0 nlink=1\")",
            NO_FALLOCATE,
        ),
        (
            "sparse/after-keep-size",
            "Ok(\"file mode=644 uid=0 gid=0 size=0 nlink=1\")",
            NO_FALLOCATE,
        ),
        (
            "sparse/after-punch-stat",
            "Ok(\"file mode=644 uid=0 gid=0 size=8192 nlink=1\")",
            NO_FALLOCATE,
        ),
        ("errnos/sticky-set", "Err(EOPNOTSUPP)", NO_STICKY),
        ("errnos/sticky-other-user-unlink", "Ok", NO_STICKY),
        ("errnos/sticky-owner-unlink", "Err(ENOENT)", NO_STICKY),
    ];

    /// Where DAOS's dfuse answers differently from a dpufs volume on the same container:
    /// (label, what dfuse gives, why).
    ///
    /// In every entry dpufs gives what a local file system gives (or one of the
    /// differences listed above); dfuse, with its default options, gives this.
    pub const DFUSE: &[(&str, &str, &str)] = &[
        (
            "files/after-trunc",
            "Ok(\"file mode=644 uid=0 gid=0 size=21 nlink=1\")",
            "dfuse's attribute cache still has the size from before an O_TRUNC open",
        ),
        (
            "files/name-256",
            "Err(EINVAL)",
            "dfuse passes DFS's EINVAL on, not ENAMETOOLONG",
        ),
        (
            "rename/exchange",
            "Err(EOPNOTSUPP)",
            "dfuse says EOPNOTSUPP, Linux EINVAL",
        ),
        ("xattrs/create-existing", "Ok", XATTR_FLAGS),
        ("xattrs/replace-missing", "Ok", XATTR_FLAGS),
        (
            "xattrs/list",
            "Ok([\"user.a\", \"user.b\", \"user.big\", \"user.empty\"])",
            XATTR_FLAGS,
        ),
        (
            "xattrs/list-after-remove",
            "Ok([\"user.b\", \"user.big\", \"user.empty\"])",
            XATTR_FLAGS,
        ),
        (
            "xattrs/remove-missing",
            "Err(ENOENT)",
            "dfuse passes DFS's ENOENT on, not ENODATA",
        ),
        (
            "xattrs/bad-namespace",
            "Ok",
            "dfuse stores names outside Linux's namespaces",
        ),
        (
            "set-id/sgid-no-x-after-user-write",
            "Ok(\"file mode=2766 uid=0 gid=0 size=2 nlink=1\")",
            SET_ID,
        ),
        (
            "set-id/after-user-open-trunc",
            "Ok(\"file mode=4777 uid=0 gid=0 size=0 nlink=1\")",
            SET_ID,
        ),
        (
            "sparse/punch-hole",
            "Err(EOPNOTSUPP)",
            "dfuse has no FALLOC_FL_PUNCH_HOLE",
        ),
        (
            "sparse/after-punch",
            "Some(false)",
            "dfuse has no FALLOC_FL_PUNCH_HOLE",
        ),
        (
            "sparse/punch-to-end",
            "Err(EOPNOTSUPP)",
            "dfuse has no FALLOC_FL_PUNCH_HOLE",
        ),
        (
            "sparse/after-punch-to-end",
            "Some(false)",
            "dfuse has no FALLOC_FL_PUNCH_HOLE",
        ),
        (
            "errnos/mkfifo",
            "Err(EINVAL)",
            "dfuse passes DFS's EINVAL on",
        ),
        (
            "errnos/non-utf8-name",
            "Ok",
            "dfuse takes any bytes; dpufs's Dfs API takes UTF-8",
        ),
        (
            "errnos/read-after-unlink-open",
            "Ok(\"\")",
            "through dfuse an unlinked open file reads as empty (DFS punched it); dpufs \
             says ESTALE rather than return wrong data",
        ),
        (
            "errnos/sgid-file",
            "Ok(\"file mode=644 uid=0 gid=0 size=0 nlink=1\")",
            SGID_DIR,
        ),
        (
            "errnos/sgid-dir",
            "Ok(\"dir mode=757 uid=0 gid=0\")",
            SGID_DIR,
        ),
    ];

    /// dfuse 2.8 refuses locks by default (2.6 kept them node-local, as dpufs does).
    pub const DFUSE_2_8: &[(&str, &str, &str)] = &[
        ("errnos/flock-ex", "Err(EOPNOTSUPP)", NO_LOCKS),
        ("errnos/flock-conflict", "Err(EOPNOTSUPP)", NO_LOCKS),
        ("errnos/flock-unlock", "Err(EOPNOTSUPP)", NO_LOCKS),
        ("errnos/flock-after-unlock", "Err(EOPNOTSUPP)", NO_LOCKS),
        ("errnos/ofd-lock", "Err(EOPNOTSUPP)", NO_LOCKS),
        ("errnos/ofd-lock-conflict", "Err(EOPNOTSUPP)", NO_LOCKS),
    ];

    const XATTR_FLAGS: &str = "dfuse does not honour XATTR_CREATE/XATTR_REPLACE (libdfs \
         ignores them), so the attribute \"replaced\" while missing exists afterwards";
    const SET_ID: &str = "dfuse does not clear set-ID bits when an unprivileged user writes \
         or truncates";
    const SGID_DIR: &str = "dfuse ignores a set-group-ID directory: new entries get the \
         creator's group, and the directory loses the bit";
    const NO_LOCKS: &str = "dfuse 2.8 refuses flock and fcntl locks unless started with \
         --enable-local-flock; dpufs keeps them node-local";

    const NO_FALLOCATE: &str = "DFS cannot reserve space: fallocate(2) is EOPNOTSUPP (glibc's \
         posix_fallocate then writes), so the file is not extended for the later steps";
    const NO_STICKY: &str = "DFS refuses the sticky bit, so any user with write access to the \
         directory may remove others' files (the next step finds the file gone)";

    // Also by design, and not observable on one node: flock and fcntl locks are node-local
    // (the kernel's own lock tables; no FUSE lock requests), so processes on different nodes
    // do not see each other's locks. The cases below check that on one node they behave as
    // on a local file system.

    /// What the mount must give for `label`, if it is a known difference (of every
    /// backend, or of this one: `extra`).
    pub fn expected(label: &str, extra: &[(&str, &'static str, &str)]) -> Option<&'static str> {
        DIFFERENCES
            .iter()
            .chain(extra)
            .find(|(l, _, _)| *l == label)
            .map(|(_, v, _)| *v)
    }
}

/// Thin wrappers of the syscalls the cases use, returning the errno unchanged.
mod sys {
    use std::ffi::CString;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    pub fn c(p: &Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    fn cvt_size(r: isize) -> io::Result<usize> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    pub fn open(p: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let fd = cvt(unsafe { libc::open(c(p).as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn pread(fd: &OwnedFd, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let n = cvt_size(unsafe {
            libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), len, off as i64)
        })?;
        buf.truncate(n);
        Ok(buf)
    }

    pub fn pwrite(fd: &OwnedFd, off: u64, data: &[u8]) -> io::Result<usize> {
        cvt_size(unsafe {
            libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), off as i64)
        })
    }

    pub fn read(fd: &OwnedFd, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let n = cvt_size(unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), len) })?;
        buf.truncate(n);
        Ok(buf)
    }

    pub fn write(fd: &OwnedFd, data: &[u8]) -> io::Result<usize> {
        cvt_size(unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) })
    }

    pub fn renameat2(a: &Path, b: &Path, flags: u32) -> io::Result<()> {
        cvt(unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                c(a).as_ptr(),
                libc::AT_FDCWD,
                c(b).as_ptr(),
                flags,
            )
        })
        .map(drop)
    }

    pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
        let n = CString::new(name).unwrap();
        cvt(unsafe {
            libc::setxattr(
                c(p).as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
        .map(drop)
    }

    pub fn lsetxattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
        let n = CString::new(name).unwrap();
        cvt(unsafe {
            libc::lsetxattr(
                c(p).as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        })
        .map(drop)
    }

    /// getxattr with a buffer of `size` bytes (0: ask for the size).
    pub fn getxattr(p: &Path, name: &str, size: usize) -> io::Result<Vec<u8>> {
        let n = CString::new(name).unwrap();
        let mut buf = vec![0u8; size];
        let got = cvt_size(unsafe {
            libc::getxattr(c(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size)
        })?;
        if size == 0 {
            return Ok(vec![0; got]);
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// Sorted names (user.* only: the local file system may add security.* ones).
    pub fn listxattr(p: &Path) -> io::Result<Vec<String>> {
        let mut buf = vec![0u8; 65536];
        let n = cvt_size(unsafe {
            libc::listxattr(c(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        })?;
        let mut names: Vec<String> = buf[..n]
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .filter(|s| s.starts_with("user."))
            .collect();
        names.sort();
        Ok(names)
    }

    pub fn listxattr_small(p: &Path, size: usize) -> io::Result<usize> {
        let mut buf = vec![0u8; size.max(1)];
        cvt_size(unsafe { libc::listxattr(c(p).as_ptr(), buf.as_mut_ptr().cast(), size) })
    }

    pub fn removexattr(p: &Path, name: &str) -> io::Result<()> {
        let n = CString::new(name).unwrap();
        cvt(unsafe { libc::removexattr(c(p).as_ptr(), n.as_ptr()) }).map(drop)
    }

    pub fn link(a: &Path, b: &Path) -> io::Result<()> {
        cvt(unsafe { libc::link(c(a).as_ptr(), c(b).as_ptr()) }).map(drop)
    }

    pub fn mkfifo(p: &Path) -> io::Result<()> {
        cvt(unsafe { libc::mkfifo(c(p).as_ptr(), 0o644) }).map(drop)
    }

    pub fn utimens(p: &Path, atime: (i64, i64), mtime: (i64, i64)) -> io::Result<()> {
        let ts = [
            libc::timespec {
                tv_sec: atime.0,
                tv_nsec: atime.1,
            },
            libc::timespec {
                tv_sec: mtime.0,
                tv_nsec: mtime.1,
            },
        ];
        cvt(unsafe { libc::utimensat(libc::AT_FDCWD, c(p).as_ptr(), ts.as_ptr(), 0) }).map(drop)
    }

    pub fn fallocate(fd: &OwnedFd, mode: i32, off: u64, len: u64) -> io::Result<()> {
        cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, off as i64, len as i64) }).map(drop)
    }

    pub fn flock(fd: &OwnedFd, op: i32) -> io::Result<()> {
        cvt(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
    }

    pub fn setlk(fd: &OwnedFd, kind: i32) -> io::Result<()> {
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = 0;
        fl.l_len = 100;
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) }).map(drop)
    }

    pub fn truncate(p: &Path, len: u64) -> io::Result<()> {
        cvt(unsafe { libc::truncate(c(p).as_ptr(), len as i64) }).map(drop)
    }

    pub fn ftruncate(fd: &OwnedFd, len: u64) -> io::Result<()> {
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) }).map(drop)
    }

    pub fn fsync(fd: &OwnedFd) -> io::Result<()> {
        cvt(unsafe { libc::fsync(fd.as_raw_fd()) }).map(drop)
    }

    pub fn fdatasync(fd: &OwnedFd) -> io::Result<()> {
        cvt(unsafe { libc::fdatasync(fd.as_raw_fd()) }).map(drop)
    }

    pub fn lseek(fd: &OwnedFd, off: i64, whence: i32) -> io::Result<i64> {
        let r = unsafe { libc::lseek(fd.as_raw_fd(), off, whence) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    pub fn rmdir(p: &Path) -> io::Result<()> {
        cvt(unsafe { libc::rmdir(c(p).as_ptr()) }).map(drop)
    }

    pub fn unlink(p: &Path) -> io::Result<()> {
        cvt(unsafe { libc::unlink(c(p).as_ptr()) }).map(drop)
    }

    pub fn mkdir(p: &Path, mode: u32) -> io::Result<()> {
        cvt(unsafe { libc::mkdir(c(p).as_ptr(), mode) }).map(drop)
    }

    pub fn chmod(p: &Path, mode: u32) -> io::Result<()> {
        cvt(unsafe { libc::chmod(c(p).as_ptr(), mode) }).map(drop)
    }

    pub fn chown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
        cvt(unsafe { libc::chown(c(p).as_ptr(), uid, gid) }).map(drop)
    }

    pub fn statfs_ok(p: &Path) -> io::Result<()> {
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        cvt(unsafe { libc::statfs(c(p).as_ptr(), &mut st) }).map(drop)
    }

    /// Every name readdir returns, in order, with `.` and `..`.
    pub fn raw_names(p: &Path) -> io::Result<Vec<Vec<u8>>> {
        let d = unsafe { libc::opendir(c(p).as_ptr()) };
        if d.is_null() {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        loop {
            let e = unsafe { libc::readdir(d) };
            if e.is_null() {
                break;
            }
            let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
            out.push(name.to_bytes().to_vec());
        }
        unsafe { libc::closedir(d) };
        Ok(out)
    }
}

/// Observations of one run, in order.
#[derive(Default)]
struct Rec {
    case: String,
    obs: Vec<(String, String)>,
}

fn show_err(e: &io::Error) -> String {
    format!("Err({})", errno_of(e))
}

impl Rec {
    fn label(&self, l: &str) -> String {
        format!("{}/{l}", self.case)
    }

    fn val(&mut self, l: &str, v: impl Debug) {
        let label = self.label(l);
        self.obs.push((label, format!("{v:?}")));
    }

    fn raw(&mut self, l: &str, v: String) {
        let label = self.label(l);
        self.obs.push((label, v));
    }

    /// Records `Ok(value)` or `Err(ERRNO)`, and returns the value.
    fn res<T: Debug>(&mut self, l: &str, r: io::Result<T>) -> Option<T> {
        match r {
            Ok(v) => {
                self.raw(l, format!("Ok({v:?})"));
                Some(v)
            }
            Err(e) => {
                self.raw(l, show_err(&e));
                None
            }
        }
    }

    /// Records success or the errno, without the value.
    fn ok<T>(&mut self, l: &str, r: io::Result<T>) -> Option<T> {
        match r {
            Ok(v) => {
                self.raw(l, "Ok".into());
                Some(v)
            }
            Err(e) => {
                self.raw(l, show_err(&e));
                None
            }
        }
    }

    fn lstat(&mut self, l: &str, p: &Path) {
        let v = fs::symlink_metadata(p)
            .map(|m| allow::stat_view(&m))
            .map_err(|e| show_err(&e));
        self.raw(l, format!("{v:?}"));
    }

    fn stat(&mut self, l: &str, p: &Path) {
        let v = fs::metadata(p)
            .map(|m| allow::stat_view(&m))
            .map_err(|e| show_err(&e));
        self.raw(l, format!("{v:?}"));
    }

    fn text(&mut self, l: &str, p: &Path) {
        let v = fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned());
        self.res(l, v);
    }
}

/// Deterministic pseudo-random bytes.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Runs `f` on a thread whose file-system identity is uid/gid (setfsuid/setfsgid are per
/// thread, and dropping fsuid 0 drops the file capabilities of that thread only).
fn as_user<T: Send>(uid: u32, gid: u32, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            unsafe {
                libc::setfsgid(gid);
                libc::setfsuid(uid);
            }
            f()
        })
        .join()
        .unwrap()
    })
}

const O_RDONLY: i32 = libc::O_RDONLY;
const O_WRONLY: i32 = libc::O_WRONLY;
const O_RDWR: i32 = libc::O_RDWR;
const O_CREAT: i32 = libc::O_CREAT;

fn case_files(d: &Path, r: &mut Rec) {
    let f = d.join("f");
    r.ok("write-new", fs::write(&f, b"hello world"));
    r.text("read", &f);
    r.ok("chmod-644", sys::chmod(&f, 0o644));
    r.lstat("stat", &f);
    r.ok(
        "append",
        OpenOptions::new()
            .append(true)
            .open(&f)
            .and_then(|mut o| o.write_all(b"!!")),
    );
    r.text("after-append", &f);
    if let Some(fd) = r.ok("open-rdwr", sys::open(&f, O_RDWR, 0)) {
        r.res("pwrite-mid", sys::pwrite(&fd, 3, b"XY"));
        r.res(
            "pread-all",
            sys::pread(&fd, 0, 64).map(|b| String::from_utf8_lossy(&b).into_owned()),
        );
        r.res("pread-past-eof", sys::pread(&fd, 1000, 10));
        r.res("pwrite-past-eof", sys::pwrite(&fd, 20, b"Z"));
        r.res("pread-gap", sys::pread(&fd, 10, 64));
        r.ok("fsync", sys::fsync(&fd));
        r.ok("fdatasync", sys::fdatasync(&fd));
    }
    r.lstat("stat-after-pwrite", &f);
    r.ok(
        "excl-existing",
        sys::open(&f, O_CREAT | libc::O_EXCL | O_WRONLY, 0o644),
    );
    r.ok("creat-existing", sys::open(&f, O_CREAT | O_WRONLY, 0o644));
    r.text("content-kept", &f);
    r.ok("open-trunc", sys::open(&f, O_WRONLY | libc::O_TRUNC, 0));
    r.lstat("after-trunc", &f);
    r.ok("open-missing", sys::open(&d.join("missing"), O_RDONLY, 0));
    r.ok("open-dir-for-write", sys::open(d, O_WRONLY, 0));
    if let Some(fd) = r.ok("open-rdonly", sys::open(&f, O_RDONLY, 0)) {
        r.res("write-on-rdonly", sys::write(&fd, b"x"));
    }
    if let Some(fd) = r.ok("open-dir", sys::open(d, O_RDONLY | libc::O_DIRECTORY, 0)) {
        r.res("read-dir", sys::read(&fd, 10));
        r.ok("fsync-dir", sys::fsync(&fd));
    }
    r.ok(
        "open-file-as-dir",
        sys::open(&f, O_RDONLY | libc::O_DIRECTORY, 0),
    );
    r.ok("mkdir", sys::mkdir(&d.join("sub"), 0o755));
    r.ok("mkdir-existing", sys::mkdir(&d.join("sub"), 0o755));
    r.ok("mkdir-missing-parent", sys::mkdir(&d.join("no/sub"), 0o755));
    r.ok("create-under-file", fs::write(d.join("f/x"), b""));
    r.ok("write-in-sub", fs::write(d.join("sub/g"), b"g"));
    r.ok("rmdir-nonempty", sys::rmdir(&d.join("sub")));
    r.ok("rmdir-file", sys::rmdir(&f));
    r.ok("unlink-dir", sys::unlink(&d.join("sub")));
    r.ok("unlink-missing", sys::unlink(&d.join("missing")));
    r.ok("rmdir-missing", sys::rmdir(&d.join("missing")));
    r.ok("rmdir-dot", sys::rmdir(&d.join("sub/.")));
    r.ok("name-255", fs::write(d.join("n".repeat(255)), b"x"));
    r.ok("name-256", fs::write(d.join("n".repeat(256)), b"x"));
    r.ok("chmod-600", sys::chmod(&f, 0o600));
    r.ok("chmod-suid", sys::chmod(&d.join("sub/g"), 0o4755));
    r.lstat("stat-suid", &d.join("sub/g"));
    r.ok("chown", sys::chown(&f, 1000, 1001));
    r.lstat("stat-chown", &f);
    r.ok(
        "utimens",
        sys::utimens(&f, (1_000_000_000, 5), (1_100_000_000, 123_456_789)),
    );
    r.val(
        "mtime",
        fs::metadata(&f).map(|m| (m.mtime(), m.mtime_nsec())).ok(),
    );
    // mtime moves on write, ctime on chmod.
    let before = fs::metadata(&f).unwrap();
    r.ok("write-again", fs::write(&f, b"again"));
    let after = fs::metadata(&f).unwrap();
    r.val("mtime-moved", after.mtime() > before.mtime());
    r.ok("statfs", sys::statfs_ok(d));
    r.ok("mkdir-mode", sys::mkdir(&d.join("m700"), 0o700));
    r.ok("chmod-dir", sys::chmod(&d.join("m700"), 0o750));
    r.lstat("stat-dir", &d.join("m700"));
    r.ok(
        "create-mode",
        sys::open(&d.join("c640"), O_CREAT | O_WRONLY, 0o640),
    );
    r.lstat("stat-create-mode", &d.join("c640"));
}

fn case_rename(d: &Path, r: &mut Rec) {
    let p = |n: &str| d.join(n);
    fs::write(p("a"), b"A").unwrap();
    r.ok("file-to-new", fs::rename(p("a"), p("b")));
    r.ok("old-gone", fs::metadata(p("a")));
    r.text("new-content", &p("b"));
    fs::write(p("x"), b"X").unwrap();
    r.ok("replace-file", fs::rename(p("x"), p("b")));
    r.text("replaced-content", &p("b"));
    r.ok("replaced-source-gone", fs::metadata(p("x")));
    sys::mkdir(&p("d1"), 0o755).unwrap();
    fs::write(p("d1/inner"), b"I").unwrap();
    r.ok("dir-to-new", fs::rename(p("d1"), p("d2")));
    r.text("child-follows", &p("d2/inner"));
    sys::mkdir(&p("empty"), 0o755).unwrap();
    r.ok("dir-over-empty-dir", fs::rename(p("d2"), p("empty")));
    r.text("child-after-over-empty", &p("empty/inner"));
    sys::mkdir(&p("full"), 0o755).unwrap();
    fs::write(p("full/f"), b"F").unwrap();
    sys::mkdir(&p("d3"), 0o755).unwrap();
    r.ok("dir-over-nonempty-dir", fs::rename(p("d3"), p("full")));
    r.ok("file-over-dir", fs::rename(p("b"), p("full")));
    r.ok("dir-over-file", fs::rename(p("d3"), p("b")));
    r.ok("dir-into-own-subdir", fs::rename(p("full"), p("full/f2")));
    r.ok("missing-source", fs::rename(p("nope"), p("nope2")));
    r.ok("same-name", fs::rename(p("b"), p("b")));
    fs::write(p("n1"), b"N1").unwrap();
    r.ok(
        "noreplace-existing",
        sys::renameat2(&p("n1"), &p("b"), libc::RENAME_NOREPLACE),
    );
    r.ok(
        "noreplace-new",
        sys::renameat2(&p("n1"), &p("n2"), libc::RENAME_NOREPLACE),
    );
    r.text("noreplace-content", &p("n2"));
    // (Its outcome differs by design, so nothing after depends on it.)
    fs::write(p("e1"), b"E1").unwrap();
    fs::write(p("e2"), b"E2").unwrap();
    r.ok(
        "exchange",
        sys::renameat2(&p("e1"), &p("e2"), libc::RENAME_EXCHANGE),
    );
    fs::remove_file(p("e1")).unwrap();
    fs::remove_file(p("e2")).unwrap();
    sys::mkdir(&p("other"), 0o755).unwrap();
    r.ok("cross-dir", fs::rename(p("b"), p("other/b")));
    r.lstat("cross-dir-stat", &p("other/b"));
    // An open file keeps working through a rename of itself and of its directory.
    fs::write(p("other/open"), b"OPEN").unwrap();
    let fd = sys::open(&p("other/open"), O_RDWR, 0).unwrap();
    r.ok(
        "rename-open-file",
        fs::rename(p("other/open"), p("other/moved")),
    );
    r.ok("rename-its-dir", fs::rename(p("other"), p("other2")));
    r.res("write-through-renamed", sys::pwrite(&fd, 4, b"!"));
    drop(fd);
    r.text("renamed-open-content", &p("other2/moved"));
    r.res(
        "listing",
        fs::read_dir(d).map(|it| {
            let mut v: Vec<String> = it
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }),
    );
}

fn case_symlinks(d: &Path, r: &mut Rec) {
    let p = |n: &str| d.join(n);
    fs::write(p("target"), b"T").unwrap();
    r.ok("create", symlink("target", p("l")));
    r.res("readlink", fs::read_link(p("l")));
    r.lstat("lstat", &p("l"));
    r.stat("stat-follows", &p("l"));
    r.text("read-through", &p("l"));
    r.ok("dangling", symlink("nowhere", p("dangling")));
    r.stat("stat-dangling", &p("dangling"));
    r.lstat("lstat-dangling", &p("dangling"));
    r.ok("loop1", symlink("loop2", p("loop1")));
    r.ok("loop2", symlink("loop1", p("loop2")));
    r.ok("open-loop", sys::open(&p("loop1"), O_RDONLY, 0));
    r.ok(
        "open-nofollow",
        sys::open(&p("l"), O_RDONLY | libc::O_NOFOLLOW, 0),
    );
    r.ok("over-existing", symlink("x", p("target")));
    r.ok("absolute", symlink("/nonexistent/abs", p("abs")));
    r.res("readlink-absolute", fs::read_link(p("abs")));
    sys::mkdir(&p("sub"), 0o755).unwrap();
    r.ok("relative-up", symlink("../target", p("sub/up")));
    r.text("read-relative-up", &p("sub/up"));
    let long = "t".repeat(1000);
    r.ok("long-target", symlink(&long, p("long")));
    r.val(
        "readlink-long",
        fs::read_link(p("long")).map(|t| t.as_os_str().len()).ok(),
    );
    r.ok("to-dir", symlink("sub", p("dirlink")));
    r.text("through-dir-link", &p("dirlink/up"));
    r.ok("unlink-link", fs::remove_file(p("l")));
    r.text("target-survives", &p("target"));
    r.ok("readlink-file", fs::read_link(p("target")));
}

fn case_xattrs(d: &Path, r: &mut Rec) {
    let f = d.join("f");
    fs::write(&f, b"x").unwrap();
    r.ok("set", sys::setxattr(&f, "user.a", b"one", 0));
    r.res("get", sys::getxattr(&f, "user.a", 100));
    r.res("get-size", sys::getxattr(&f, "user.a", 0).map(|v| v.len()));
    r.res("get-too-small", sys::getxattr(&f, "user.a", 2));
    r.ok("get-missing", sys::getxattr(&f, "user.missing", 100));
    r.ok(
        "create-existing",
        sys::setxattr(&f, "user.a", b"two", libc::XATTR_CREATE),
    );
    r.ok(
        "replace-missing",
        sys::setxattr(&f, "user.b", b"two", libc::XATTR_REPLACE),
    );
    r.ok(
        "replace-existing",
        sys::setxattr(&f, "user.a", b"two", libc::XATTR_REPLACE),
    );
    r.res("get-replaced", sys::getxattr(&f, "user.a", 100));
    r.ok("set-empty", sys::setxattr(&f, "user.empty", b"", 0));
    r.res("get-empty", sys::getxattr(&f, "user.empty", 100));
    let big = pattern(7, 3000);
    r.ok("set-big", sys::setxattr(&f, "user.big", &big, 0));
    r.val(
        "get-big",
        sys::getxattr(&f, "user.big", 65536).map(|v| v == big).ok(),
    );
    r.res("list", sys::listxattr(&f));
    r.ok("list-too-small", sys::listxattr_small(&f, 3));
    r.ok("remove", sys::removexattr(&f, "user.a"));
    r.ok("remove-missing", sys::removexattr(&f, "user.a"));
    r.res("list-after-remove", sys::listxattr(&f));
    sys::mkdir(&d.join("dir"), 0o755).unwrap();
    r.ok(
        "set-on-dir",
        sys::setxattr(&d.join("dir"), "user.d", b"D", 0),
    );
    r.res("get-on-dir", sys::getxattr(&d.join("dir"), "user.d", 10));
    symlink("f", d.join("link")).unwrap();
    r.ok(
        "user-on-symlink",
        sys::lsetxattr(&d.join("link"), "user.l", b"L"),
    );
    r.res(
        "get-through-symlink",
        sys::getxattr(&d.join("link"), "user.big", 0).map(|v| v.len()),
    );
    r.ok("bad-namespace", sys::setxattr(&f, "nonsense.x", b"1", 0));
    r.ok("trusted", sys::setxattr(&f, "trusted.t", b"T", 0));
    r.res("get-trusted", sys::getxattr(&f, "trusted.t", 10));
}

fn case_truncate(d: &Path, r: &mut Rec) {
    let f = d.join("f");
    let data = pattern(3, 10_000);
    fs::write(&f, &data).unwrap();
    r.ok("shrink", sys::truncate(&f, 4000));
    r.lstat("after-shrink", &f);
    r.val(
        "shrunk-content",
        fs::read(&f).map(|b| b == data[..4000]).ok(),
    );
    r.ok("extend", sys::truncate(&f, 20_000));
    r.lstat("after-extend", &f);
    r.val(
        "extended-content",
        fs::read(&f)
            .map(|b| b[..4000] == data[..4000] && b[4000..].iter().all(|x| *x == 0))
            .ok(),
    );
    if let Some(fd) = r.ok("open-rw", sys::open(&f, O_RDWR, 0)) {
        r.ok("ftruncate-0", sys::ftruncate(&fd, 0));
        r.res("read-after-ftruncate", sys::pread(&fd, 0, 10));
        r.ok("ftruncate-big", sys::ftruncate(&fd, 3 << 30));
        r.res("read-far", sys::pread(&fd, (3 << 30) - 4, 10));
    }
    r.lstat("after-ftruncate", &f);
    if let Some(fd) = r.ok("open-ro", sys::open(&f, O_RDONLY, 0)) {
        r.ok("ftruncate-on-rdonly", sys::ftruncate(&fd, 5));
    }
    r.ok("truncate-dir", sys::truncate(d, 0));
    r.ok("truncate-missing", sys::truncate(&d.join("missing"), 0));
    r.ok("truncate-negative", unsafe {
        if libc::truncate(sys::c(&f).as_ptr(), -1) < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    });
}

fn case_sparse(d: &Path, r: &mut Rec) {
    let f = d.join("sparse");
    let fd = sys::open(&f, O_CREAT | O_RDWR, 0o644).unwrap();
    r.res("write-at-10MiB", sys::pwrite(&fd, 10 << 20, b"end"));
    r.lstat("stat", &f);
    r.val(
        "hole-reads-zero",
        sys::pread(&fd, 5 << 20, 8192)
            .map(|b| b.len() == 8192 && b.iter().all(|x| *x == 0))
            .ok(),
    );
    r.res("read-boundary", sys::pread(&fd, (10 << 20) - 2, 10));
    r.res("seek-hole-from-0", sys::lseek(&fd, 0, libc::SEEK_HOLE));
    let far = 5u64 << 30;
    r.res("write-at-5GiB", sys::pwrite(&fd, far, b"far"));
    r.lstat("stat-5GiB", &f);
    r.res("read-at-5GiB", sys::pread(&fd, far - 1, 10));
    drop(fd);
    let g = d.join("falloc");
    let fd = sys::open(&g, O_CREAT | O_RDWR, 0o644).unwrap();
    r.ok("fallocate-extend", sys::fallocate(&fd, 0, 0, 1 << 20));
    r.lstat("after-fallocate", &g);
    r.ok(
        "fallocate-keep-size",
        sys::fallocate(&fd, libc::FALLOC_FL_KEEP_SIZE, 0, 4 << 20),
    );
    r.lstat("after-keep-size", &g);
    sys::pwrite(&fd, 0, &[0xAB; 8192]).unwrap();
    r.ok(
        "punch-hole",
        sys::fallocate(
            &fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            1000,
            3000,
        ),
    );
    r.val(
        "after-punch",
        sys::pread(&fd, 0, 8192)
            .map(|b| {
                b[..1000].iter().all(|x| *x == 0xAB)
                    && b[1000..4000].iter().all(|x| *x == 0)
                    && b[4000..].iter().all(|x| *x == 0xAB)
            })
            .ok(),
    );
    // To past the end: the size stays (libdfs's dfs_punch truncates such a range).
    r.ok(
        "punch-to-end",
        sys::fallocate(
            &fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            6000,
            2 << 20,
        ),
    );
    r.val(
        "after-punch-to-end",
        sys::pread(&fd, 0, 8192)
            .map(|b| {
                b.len() == 8192
                    && b[4000..6000].iter().all(|x| *x == 0xAB)
                    && b[6000..].iter().all(|x| *x == 0)
            })
            .ok(),
    );
    r.lstat("after-punch-stat", &g);
}

fn case_large(d: &Path, r: &mut Rec) {
    let f = d.join("large");
    let data = pattern(11, 48 << 20);
    {
        let mut o = fs::File::create(&f).unwrap();
        for chunk in data.chunks(1 << 20) {
            o.write_all(chunk).unwrap();
        }
        r.ok("fsync", o.sync_all());
    }
    r.lstat("stat", &f);
    r.val("read-back", fs::read(&f).map(|b| b == data).ok());
    let fd = sys::open(&f, O_RDONLY, 0).unwrap();
    let (off, len) = ((3 << 20) - 3, (1 << 20) + 7);
    r.val(
        "unaligned-read",
        sys::pread(&fd, off as u64, len)
            .map(|b| b == data[off..off + len])
            .ok(),
    );
    r.val("fnv", fnv(&data[..1 << 20]));
}

fn case_readdir(d: &Path, r: &mut Rec) {
    const N: usize = 2500;
    for i in 0..N {
        let name = format!("f{i:05}-{}", "x".repeat(i % 40));
        fs::write(d.join(name), b"").unwrap();
    }
    for i in 0..20 {
        sys::mkdir(&d.join(format!("dir{i}")), 0o755).unwrap();
        symlink("f00000-", d.join(format!("link{i}"))).unwrap();
    }
    let list = |d: &Path| -> io::Result<Vec<(String, String)>> {
        let mut v = Vec::new();
        for e in fs::read_dir(d)? {
            let e = e?;
            let t = e.file_type()?;
            let kind = if t.is_dir() {
                "d"
            } else if t.is_symlink() {
                "l"
            } else {
                "f"
            };
            v.push((
                e.file_name().to_string_lossy().into_owned(),
                kind.to_string(),
            ));
        }
        Ok(v)
    };
    let all = list(d).unwrap();
    let mut sorted = all.clone();
    sorted.sort();
    r.val("count", sorted.len());
    r.val("distinct", {
        let mut s = sorted.clone();
        s.dedup();
        s.len()
    });
    r.val("hash", fnv(format!("{sorted:?}").as_bytes()));
    r.val("first", &sorted[..3]);
    r.val("last", &sorted[sorted.len() - 3..]);
    let raw = sys::raw_names(d).unwrap();
    r.val(
        "has-dot-entries",
        raw.iter().any(|n| n == b".") && raw.iter().any(|n| n == b".."),
    );
    // Change the directory in the middle of a listing: no entry may come twice, and every
    // entry that existed all along must come once.
    let mut it = fs::read_dir(d).unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut dup = false;
    for _ in 0..1000 {
        let n = it.next().unwrap().unwrap().file_name();
        dup |= !seen.insert(n);
    }
    let mut removed = std::collections::HashSet::new();
    for (i, (name, kind)) in sorted.iter().enumerate() {
        if kind == "f" && i % 7 == 0 && !seen.contains(OsStr::new(name)) {
            fs::remove_file(d.join(name)).unwrap();
            removed.insert(name.clone());
        }
    }
    for i in 0..100 {
        fs::write(d.join(format!("new{i}")), b"").unwrap();
    }
    for e in it {
        let n = e.unwrap().file_name();
        dup |= !seen.insert(n);
    }
    let missing = sorted
        .iter()
        .filter(|(n, _)| !removed.contains(n) && !seen.contains(OsStr::new(n)))
        .count();
    r.val("no-duplicates", !dup);
    r.val("none-missing", missing);
    // How many get removed depends on the listing order, which is each file system's own.
    r.val("removed-some", !removed.is_empty());
    sys::mkdir(&d.join("empty"), 0o755).unwrap();
    r.res("empty-dir", list(&d.join("empty")));
}

fn case_errnos(d: &Path, r: &mut Rec) {
    let f = d.join("f");
    fs::write(&f, b"data").unwrap();
    r.ok("link", sys::link(&f, &d.join("hard")));
    r.ok("mkfifo", sys::mkfifo(&d.join("fifo")));
    let bad = d.join(OsStr::from_bytes(b"bad\xffname"));
    r.ok("non-utf8-name", fs::write(&bad, b""));
    // Unlinking an open file.
    let u = d.join("u");
    fs::write(&u, b"still here").unwrap();
    let fd = sys::open(&u, O_RDONLY, 0).unwrap();
    r.ok("unlink-open", fs::remove_file(&u));
    r.res(
        "read-after-unlink-open",
        sys::pread(&fd, 0, 100).map(|b| String::from_utf8_lossy(&b).into_owned()),
    );
    drop(fd);
    // Permissions (the mount checks them: default_permissions).
    sys::chmod(&f, 0o600).unwrap();
    r.ok(
        "other-user-read-0600",
        as_user(1000, 1000, || sys::open(&f, O_RDONLY, 0).map(drop)),
    );
    sys::chmod(d, 0o755).unwrap();
    r.ok(
        "other-user-create-in-0755",
        as_user(1000, 1000, || fs::write(d.join("nope"), b"")),
    );
    let open = d.join("open");
    sys::mkdir(&open, 0o777).unwrap();
    sys::chmod(&open, 0o777).unwrap();
    r.ok(
        "other-user-create-in-0777",
        as_user(1000, 1000, || fs::write(open.join("mine"), b"m")),
    );
    r.lstat("owner-of-created", &open.join("mine"));
    r.ok(
        "other-user-chmod",
        as_user(1001, 1001, || sys::chmod(&open.join("mine"), 0o777)),
    );
    r.ok(
        "other-user-unlink-in-0777",
        as_user(1001, 1001, || fs::remove_file(open.join("mine"))),
    );
    fs::write(open.join("mine2"), b"m").unwrap();
    sys::chown(&open.join("mine2"), 1000, 1000).unwrap();
    r.ok("sticky-set", sys::chmod(&open, 0o1777));
    r.ok(
        "sticky-other-user-unlink",
        as_user(1001, 1001, || fs::remove_file(open.join("mine2"))),
    );
    r.ok(
        "sticky-owner-unlink",
        as_user(1000, 1000, || fs::remove_file(open.join("mine2"))),
    );
    // A set-group-ID directory hands its group down.
    let sg = d.join("sgid");
    sys::mkdir(&sg, 0o755).unwrap();
    sys::chown(&sg, 0, 1234).unwrap();
    sys::chmod(&sg, 0o2775).unwrap();
    r.ok("create-in-sgid", fs::write(sg.join("file"), b""));
    r.lstat("sgid-file", &sg.join("file"));
    r.ok("mkdir-in-sgid", sys::mkdir(&sg.join("dir"), 0o755));
    r.lstat("sgid-dir", &sg.join("dir"));
    // Locks (node-local on the mount; see allow).
    let a = sys::open(&f, O_RDWR, 0).unwrap();
    let b = sys::open(&f, O_RDWR, 0).unwrap();
    r.ok("flock-ex", sys::flock(&a, libc::LOCK_EX | libc::LOCK_NB));
    r.ok(
        "flock-conflict",
        sys::flock(&b, libc::LOCK_EX | libc::LOCK_NB),
    );
    r.ok("flock-unlock", sys::flock(&a, libc::LOCK_UN));
    r.ok(
        "flock-after-unlock",
        sys::flock(&b, libc::LOCK_EX | libc::LOCK_NB),
    );
    r.ok("ofd-lock", sys::setlk(&a, libc::F_WRLCK));
    r.ok("ofd-lock-conflict", sys::setlk(&b, libc::F_WRLCK));
}

/// Set-ID bits after writes, truncations and chown by root and by a user without
/// CAP_FSETID (the worker clears them itself: HANDLE_KILLPRIV_V2).
fn case_set_id(d: &Path, r: &mut Rec) {
    const NOBODY: u32 = 65534;
    let user_write = |f: &Path| {
        as_user(NOBODY, NOBODY, || {
            let fd = sys::open(f, O_WRONLY, 0)?;
            sys::pwrite(&fd, 1, b"y")
        })
    };
    // set-user-ID with set-group-ID and group execute; set-group-ID without group execute.
    for (name, mode) in [("both", 0o6777), ("sgid-no-x", 0o2766)] {
        let f = d.join(name);
        fs::write(&f, b"x").unwrap();
        r.ok(&format!("{name}-chmod"), sys::chmod(&f, mode));
        r.res(&format!("{name}-root-write"), fs::write(&f, b"xx"));
        r.lstat(&format!("{name}-after-root-write"), &f);
        r.res(&format!("{name}-user-write"), user_write(&f));
        r.lstat(&format!("{name}-after-user-write"), &f);
    }
    let f = d.join("trunc");
    fs::write(&f, b"0123456789").unwrap();
    r.ok("trunc-chmod", sys::chmod(&f, 0o6777));
    r.ok(
        "user-truncate",
        as_user(NOBODY, NOBODY, || sys::truncate(&f, 3)),
    );
    r.lstat("after-user-truncate", &f);
    r.ok("trunc-chmod-again", sys::chmod(&f, 0o4777));
    r.res(
        "user-open-trunc",
        as_user(NOBODY, NOBODY, || {
            sys::open(&f, O_WRONLY | libc::O_TRUNC, 0).map(drop)
        }),
    );
    r.lstat("after-user-open-trunc", &f);
    let f = d.join("owned");
    fs::write(&f, b"x").unwrap();
    r.ok("owned-chmod", sys::chmod(&f, 0o6755));
    r.ok("root-chown", sys::chown(&f, 4242, 4343));
    r.lstat("after-root-chown", &f);
}

type Case = fn(&Path, &mut Rec);

const CASES: &[(&str, Case)] = &[
    ("files", case_files),
    ("rename", case_rename),
    ("symlinks", case_symlinks),
    ("xattrs", case_xattrs),
    ("truncate", case_truncate),
    ("set-id", case_set_id),
    ("sparse", case_sparse),
    ("large", case_large),
    ("readdir", case_readdir),
    ("errnos", case_errnos),
];

fn run_all(root: &Path) -> Vec<(String, String)> {
    let mut all = Vec::new();
    for (name, case) in CASES {
        let dir = root.join(name);
        fs::create_dir(&dir).unwrap();
        let mut rec = Rec {
            case: name.to_string(),
            obs: Vec::new(),
        };
        case(&dir, &mut rec);
        all.extend(rec.obs);
    }
    all
}

#[test]
fn posix_differential_suite() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-posix-backing-");
    let _ = differential_suite_on(backing.path(), Opts::default(), &[]);
}

/// The same suite on a worker serving a container of a real engine over the fabric.
#[test]
fn posix_differential_suite_on_the_engine() {
    if !can_mount() {
        return;
    }
    let _ = differential_suite_on(&EngineBacking::start(), Opts::default(), &[]);
}

/// And on a single-writer volume of it, whose worker answers lookups of new names in the
/// directories it made itself (docs/worker.md): every case's directory is one.
#[test]
fn posix_differential_suite_on_a_single_writer_engine_volume() {
    if !can_mount() {
        return;
    }
    let single = Opts {
        args: vec!["--access".into(), "single-writer".into()],
        fuse_fd: None,
    };
    let stats = differential_suite_on(&EngineBacking::start(), single, &[]);
    let answered = stats["absent_answers"].as_u64().unwrap();
    assert!(
        answered > 2500,
        "the worker answered {answered} lookups itself: {stats}"
    );
}

/// The same suite on a worker serving a container of a real DAOS 2.8.0 system through
/// libdfs (`--backend daos:`).
#[test]
fn posix_differential_suite_on_daos_2_8_0() {
    suite_on_daos("posix_differential_suite_on_daos_2_8_0", "2.8.0");
}

/// And of DAOS 2.6.5.
#[test]
fn posix_differential_suite_on_daos_2_6_5() {
    suite_on_daos("posix_differential_suite_on_daos_2_6_5", "2.6.5");
}

fn suite_on_daos(test: &str, version: &str) {
    if !can_mount() {
        return;
    }
    let Some(backing) = common::DaosBacking::start(test, version) else {
        return;
    };
    let _ = differential_suite_on(&backing, Opts::default(), allow::LIBDFS);
}

/// DAOS's own FUSE client and a dpufs volume on the same container give the same answers
/// to the suite (apart from `allow::DFUSE`), and each reads what the other wrote.
#[test]
fn dpufs_and_dfuse_agree_on_daos_2_8_0() {
    let known: Vec<_> = allow::DFUSE
        .iter()
        .chain(allow::DFUSE_2_8)
        .copied()
        .collect();
    agree_with_dfuse("dpufs_and_dfuse_agree_on_daos_2_8_0", "2.8.0", &known);
}

/// And on DAOS 2.6.5.
#[test]
fn dpufs_and_dfuse_agree_on_daos_2_6_5() {
    agree_with_dfuse("dpufs_and_dfuse_agree_on_daos_2_6_5", "2.6.5", allow::DFUSE);
}

fn agree_with_dfuse(test: &str, version: &str, known: &[(&str, &str, &str)]) {
    if !can_mount() {
        return;
    }
    let Some(backing) = common::DaosBacking::start(test, version) else {
        return;
    };
    // SAFETY: plain libc call; the same umask for both runs.
    unsafe { libc::umask(0o022) };
    let worker = WorkerProc::start(&backing, Default::default());
    let mnt = tempdir("dpufs-dfuse-");
    let dfuse = Dfuse::mount(&backing.daos, "tank", "vol", mnt.path()).expect("mounting dfuse");
    let (ours, theirs) = (
        worker.path("through-dpufs"),
        mnt.path().join("through-dfuse"),
    );
    fs::create_dir(&ours).unwrap();
    fs::create_dir(&theirs).unwrap();
    let got = run_all(&ours);
    let want = run_all(&theirs);
    assert_eq!(
        want.iter().map(|o| &o.0).collect::<Vec<_>>(),
        got.iter().map(|o| &o.0).collect::<Vec<_>>(),
        "both runs record the same observations"
    );
    let mut failures = Vec::new();
    let mut used = std::collections::HashSet::new();
    for ((label, dfuse), (_, dpufs)) in want.iter().zip(&got) {
        match known.iter().find(|(l, _, _)| l == label) {
            Some((_, expected, _)) => {
                used.insert(label.clone());
                if dfuse != expected {
                    failures.push(format!(
                        "{label}: dfuse gave {dfuse}, the list says {expected} (dpufs: {dpufs})"
                    ));
                }
            }
            None if dfuse != dpufs => {
                failures.push(format!("{label}: dfuse {dfuse}, dpufs {dpufs}"))
            }
            None => {}
        }
    }
    for (label, _, _) in allow::DFUSE {
        assert!(
            used.contains(*label),
            "DFUSE entry {label} matches no observation"
        );
    }
    assert!(failures.is_empty(), "differences:\n{}", failures.join("\n"));
    eprintln!(
        "{} observations agree between dpufs and dfuse on DAOS {version}",
        got.len()
    );

    // Each client reads what the other wrote and closed (close-to-open).
    let data: Vec<u8> = (0..(4u32 << 20) + 123)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(theirs.join("from-dfuse"), &data).unwrap();
    assert_eq!(
        fs::read(worker.path("through-dfuse/from-dfuse")).unwrap(),
        data
    );
    fs::write(ours.join("from-dpufs"), &data).unwrap();
    assert_eq!(
        fs::read(mnt.path().join("through-dpufs/from-dpufs")).unwrap(),
        data
    );
    drop(dfuse);
}

fn differential_suite_on(
    backing: &(impl Backing + ?Sized),
    opts: Opts,
    extra: &[(&str, &'static str, &str)],
) -> serde_json::Value {
    // SAFETY: plain libc call; the same umask for both runs.
    unsafe { libc::umask(0o022) };
    let local = tempdir("dpufs-posix-local-");
    let worker = WorkerProc::start(backing, opts);

    let want = run_all(local.path());
    let got = run_all(&worker.mountpoint);

    assert_eq!(
        want.iter().map(|o| &o.0).collect::<Vec<_>>(),
        got.iter().map(|o| &o.0).collect::<Vec<_>>(),
        "both runs record the same observations"
    );
    if std::env::var_os("DPUFS_POSIX_DUMP").is_some() {
        for ((label, local), (_, mount)) in want.iter().zip(&got) {
            eprintln!("{label}: {local} | {mount}");
        }
    }
    let mut failures = Vec::new();
    let mut used = std::collections::HashSet::new();
    for ((label, local), (_, mount)) in want.iter().zip(&got) {
        match allow::expected(label, extra) {
            Some(expected) => {
                used.insert(label.clone());
                if mount != expected {
                    failures.push(format!(
                        "{label}: mount gave {mount}, the allow-list says {expected} (local: {local})"
                    ));
                }
            }
            None if local != mount => {
                failures.push(format!("{label}: local {local}, mount {mount}"))
            }
            None => {}
        }
    }
    for (label, _, _) in allow::DIFFERENCES.iter().chain(extra) {
        assert!(
            used.contains(*label),
            "allow-list entry {label} matches no observation"
        );
    }
    let cases: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    eprintln!(
        "{} observations in {} cases ({}), {} known differences",
        want.len(),
        CASES.len(),
        cases.join(", "),
        allow::DIFFERENCES.len()
    );
    assert!(failures.is_empty(), "differences:\n{}", failures.join("\n"));

    // The worker saw real traffic and no transport failures.
    let stats = worker.stats();
    assert_eq!(stats["transport_errors"], 0, "{stats}");
    assert!(stats["ops"]["create"]["count"].as_u64().unwrap() > 2500);
    stats
}

/// The Dfs-level differential cases of `dpufs_daos::dfs::conformance`, run through the mount:
/// the subject is a `LocalDfs` opened on the mountpoint, so every step is a real syscall
/// (`openat`, `fstatat`, `getdents64`, `*xattr`, ...) on the FUSE mount, served by the worker,
/// and compared with a `LocalDfs` on a plain directory.
///
/// The worker's backing directory is a tmpfs here. The subject holds O_PATH descriptors of
/// removed objects (so the kernel keeps their inodes), and LocalDfs's oids are inode numbers,
/// which ext4 hands out again as soon as LocalDfs lets go of a removed object: a new object
/// would then arrive under a nodeid the kernel still holds for another one. tmpfs does not
/// reuse inode numbers. (Reported to the DFS owner: LocalDfs should keep a removed object
/// until the worker's forget hook releases it; see docs/worker.md.)
#[test]
fn dfs_conformance_cases_through_the_mount() {
    if !can_mount() {
        return;
    }
    use dpufs_daos::dfs::{LocalDfs, conformance};
    let local = tempdir("dpufs-conf-local-");
    let backing = common::Tmpfs::new("512m");
    let worker = WorkerProc::start(backing.path.as_path(), Default::default());
    let reference = LocalDfs::open(local.path()).unwrap();
    let through_mount = LocalDfs::open(&worker.mountpoint).unwrap();
    let report = conformance::run_all(&reference, &through_mount);
    eprintln!(
        "conformance through the mount: {} passed, {} failed",
        report.passed.len(),
        report.failed.len()
    );
    if !report.failed.is_empty() {
        eprintln!("worker stats: {}", worker.stats());
    }
    report.assert_passed();
}

/// The same cases through a worker serving an engine container over the fabric.
#[test]
fn dfs_conformance_cases_through_an_engine_mount() {
    if !can_mount() {
        return;
    }
    use dpufs_daos::dfs::{LocalDfs, conformance};
    let local = tempdir("dpufs-conf-local-");
    let backing = EngineBacking::start();
    let worker = WorkerProc::start(&backing, Default::default());
    let reference = LocalDfs::open(local.path()).unwrap();
    let through_mount = LocalDfs::open(&worker.mountpoint).unwrap();
    conformance::run_all(&reference, &through_mount).assert_passed();
}
