//! The `/dev/fuse` device, shared by the keeper and the worker: mounting, per-thread clone
//! descriptors, adopting an inherited descriptor, unmounting, aborting a connection, and the
//! mount's readahead. The request loop that reads the device is the worker's
//! (`worker::channel`).
//!
//! Every reader thread of a worker reads from its own `FUSE_DEV_IOC_CLONE` of the connection's
//! master descriptor ([`clone_fd`]), never from the master: when a worker dies only its own
//! in-flight requests fail (ECONNABORTED), and the connection lives on while any other
//! descriptor of it is open — the keeper's, or the next worker's.

use dpufs_node_api::mountinfo::{self, MountInfo};
use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The file system type of every dpufs FUSE mount, as mount(2) is given it and the mount
/// table shows it.
pub const FSTYPE: &str = "fuse.dpufs";

/// The FUSE device.
pub const FUSE_DEVICE: &str = "/dev/fuse";
/// Largest request payload: 256 pages (the kernel's `max_pages_limit`), i.e. 1 MiB writes.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// How a FUSE file system is mounted.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Source shown in /proc/mounts (`dpufs` or `dpufs:<volume>`).
    pub fsname: String,
    /// Mount read-only.
    pub read_only: bool,
    /// Let users other than the mounter in (pods run as any uid).
    pub allow_other: bool,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Opens `/dev/fuse` and mounts a FUSE file system of type `fuse.dpufs` on `mountpoint`
/// (which must not be a FUSE mount itself: it is stat'ed). Needs CAP_SYS_ADMIN. Returns the
/// connection's master descriptor; the kernel has queued INIT on it.
pub fn mount(mountpoint: &Path, o: &MountOptions) -> io::Result<OwnedFd> {
    let dev: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(FUSE_DEVICE)?
        .into();
    let meta = std::fs::metadata(mountpoint)?;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={},default_permissions,max_read={}",
        dev.as_raw_fd(),
        meta.mode() & libc::S_IFMT,
        // SAFETY: plain getters.
        unsafe { libc::getuid() },
        unsafe { libc::getgid() },
        MAX_PAYLOAD,
    );
    if o.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if o.read_only {
        flags |= libc::MS_RDONLY;
    }
    let (src, target, fstype, cdata) = (
        CString::new(o.fsname.as_str()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        cpath(mountpoint)?,
        CString::new(FSTYPE).expect("no NUL"),
        CString::new(data).expect("no NUL"),
    );
    // SAFETY: all pointers are valid NUL-terminated strings for the call.
    cvt(unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            cdata.as_ptr().cast(),
        )
    })?;
    Ok(dev)
}

/// Whether `fd` is an open `/dev/fuse` (character device 10:229).
pub fn is_fuse_device(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let f = std::fs::File::from(fd.try_clone_to_owned()?);
    let meta = f.metadata()?;
    let rdev = meta.rdev();
    Ok(meta.file_type().is_char_device() && libc::major(rdev) == 10 && libc::minor(rdev) == 229)
}

/// A new descriptor of the same FUSE connection with its own request-processing list
/// (`FUSE_DEV_IOC_CLONE`). Opens `/dev/fuse`, so it needs that permission (root here): clone
/// before dropping privileges.
pub fn clone_fd(master: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let clone: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(FUSE_DEVICE)?
        .into();
    let mut src: u32 = master.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the source descriptor) from the pointer.
    cvt(unsafe { libc::ioctl(clone.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut src as *mut u32) })?;
    Ok(clone)
}

/// Takes over an inherited descriptor number (`--fuse-fd`): checks that it is an open
/// /dev/fuse and marks it close-on-exec.
pub fn adopt_fd(n: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only inspects the descriptor table.
    cvt(unsafe { libc::fcntl(n, libc::F_GETFD) })?;
    // SAFETY: the number is open (checked above) and nothing else in this process owns it:
    // it was inherited for this purpose.
    let fd = unsafe { OwnedFd::from_raw_fd(n) };
    if !is_fuse_device(fd.as_fd())? {
        // Do not close what we were wrongly given.
        std::mem::forget(fd);
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {n} is not /dev/fuse"),
        ));
    }
    // SAFETY: valid descriptor.
    cvt(unsafe { libc::fcntl(n, libc::F_SETFD, libc::FD_CLOEXEC) })?;
    Ok(fd)
}

/// Unmounts `mountpoint`; `lazy` detaches it even while busy (the connection then lives until
/// the last open file is closed).
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let p = cpath(mountpoint)?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::umount2(p.as_ptr(), flags) }).map(drop)
}

/// The topmost mount at exactly `mountpoint`, from /proc/self/mountinfo (no syscall touches
/// the mount itself, so this is safe on a FUSE mount nobody serves).
pub fn find_mount(mountpoint: &Path) -> io::Result<Option<MountInfo>> {
    mountinfo::find(mountpoint)
}

/// The readahead setting of a mount's backing device info (`/sys/class/bdi/MAJ:MIN`), which
/// caps buffered sequential reads (the kernel's 128 KiB default gives 128 KiB requests).
///
/// The attribute is opened once, while the worker may (root only), and written through that
/// descriptor later: the kernel lowers the readahead to what the INIT reply says, so the
/// value must be written again after INIT, possibly after privileges were dropped.
#[derive(Debug)]
pub struct ReadAhead {
    file: std::fs::File,
    kb: u32,
    path: String,
}

impl ReadAhead {
    /// Opens the readahead attribute of the mount at `mountpoint`.
    pub fn open(mountpoint: &Path, kb: u32) -> io::Result<ReadAhead> {
        let m = find_mount(mountpoint)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not a mount point", mountpoint.display()),
            )
        })?;
        let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", m.dev.0, m.dev.1);
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
        Ok(ReadAhead { file, kb, path })
    }

    /// Writes the setting.
    pub fn apply(&self) {
        use std::io::Write;
        if let Err(e) = (&self.file).write_all(format!("{}\n", self.kb).as_bytes()) {
            tracing::warn!("{}: {e}", self.path);
        }
    }
}

/// Where the FUSE control file system lives.
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Mounts the FUSE control file system (fusectl) if it is not mounted yet: some machines and
/// containers do not mount it, and aborting a connection needs it.
pub fn ensure_fusectl() -> io::Result<()> {
    if mountinfo::find(Path::new(FUSECTL))?.is_some() {
        return Ok(());
    }
    let target = CString::new(FUSECTL).expect("no NUL");
    // SAFETY: valid NUL-terminated strings.
    cvt(unsafe {
        libc::mount(
            c"fusectl".as_ptr(),
            target.as_ptr(),
            c"fusectl".as_ptr(),
            0,
            std::ptr::null(),
        )
    })
    .map(drop)
}

/// Aborts a FUSE connection (every request fails with ENOTCONN, the mount is dead), mounting
/// fusectl first if needed.
pub fn abort_connection(connection: u64) -> io::Result<()> {
    ensure_fusectl()?;
    std::fs::write(format!("{FUSECTL}/{connection}/abort"), "1\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_root_mount() {
        let m = find_mount(Path::new("/")).unwrap().expect("/ is mounted");
        assert!(!m.fstype.is_empty());
    }

    #[test]
    fn a_regular_file_is_not_the_fuse_device() {
        let f = tempfile::tempfile().unwrap();
        assert!(!is_fuse_device(f.as_fd()).unwrap());
    }
}
