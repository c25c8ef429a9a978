//! The `/dev/fuse` transport: mounting, per-thread clone descriptors, the request loop,
//! unmounting, and the mount's readahead.
//!
//! fuse-backend-rs's `FuseSession` is not used (spec/fuse-backend-rs.md, gaps 1, 2 and 5): its
//! constructor stats the mountpoint (a deadlock when nobody serves the connection yet), its
//! channels are dups of one descriptor (a dead worker's in-flight requests then hang), and its
//! Drop unmounts. The pieces it is built from are public, so this module does the same
//! with the crate's `Server`, `Reader` and `FuseDevWriter`:
//! - the master descriptor comes from [`mount`] or from whoever mounted (the mount keeper);
//! - every reader thread reads from its own `FUSE_DEV_IOC_CLONE` of it ([`clone_fd`]), so when
//!   a worker dies only its own in-flight requests fail (ECONNABORTED), and the connection
//!   lives on while any other descriptor of it is open;
//! - reads are blocking: the kernel wakes one reader per request (no poll, no thundering herd).
//!   A reader stops when the connection goes away (ENODEV, or ECONNABORTED when it went
//!   while a request was being read) or when it is asked to stop and woken by a signal
//!   ([`WAKE_SIGNAL`]) between requests; a request it has read is always answered first,
//!   which is what a drain needs.

use super::fs::DfsFs;
use super::stats::Stats;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FuseBuf, FuseDevWriter, Reader};
use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The FUSE device.
pub const FUSE_DEVICE: &str = "/dev/fuse";
/// Largest request payload: 256 pages (the kernel's `max_pages_limit`), i.e. 1 MiB writes.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// A request buffer: the payload plus room for the request headers.
pub const BUF_SIZE: usize = MAX_PAYLOAD + 4096;
/// The signal that interrupts a reader blocked in read(2) so it can see a stop request.
pub const WAKE_SIGNAL: libc::c_int = libc::SIGUSR2;
/// The INIT opcode.
const FUSE_INIT: u32 = 26;
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
        CString::new("fuse.dpufs").expect("no NUL"),
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

/// Unmounts `mountpoint`; `lazy` detaches it even while busy (the connection then lives until
/// the last open file is closed).
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let p = cpath(mountpoint)?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::umount2(p.as_ptr(), flags) }).map(drop)
}

/// A mountinfo field with its octal escapes (blanks, backslashes) undone.
pub fn unescape_mountinfo(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// A mount as /proc/self/mountinfo lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// Device number (major, minor) of the mounted file system.
    pub dev: (u32, u32),
    /// File system type (`fuse.dpufs`).
    pub fstype: String,
    /// Mount source (`dpufs`).
    pub source: String,
}

impl MountInfo {
    /// The FUSE connection's number (its directory under /sys/fs/fuse/connections): the
    /// kernel's own encoding of the device number (major << 20 | minor), which differs from
    /// glibc's `makedev` once the minor passes 255.
    pub fn connection(&self) -> u64 {
        (u64::from(self.dev.0) << 20) | u64::from(self.dev.1)
    }
}

/// The topmost mount at exactly `mountpoint`, read from /proc/self/mountinfo (no syscall
/// touches the mount itself, so this is safe on a FUSE mount nobody serves).
pub fn find_mount(mountpoint: &Path) -> io::Result<Option<MountInfo>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut found = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < sep + 3 || fields.len() < 5 {
            continue;
        }
        if unescape_mountinfo(fields[4]) != mountpoint {
            continue;
        }
        let Some((maj, min)) = fields[2].split_once(':') else {
            continue;
        };
        let (Ok(maj), Ok(min)) = (maj.parse(), min.parse()) else {
            continue;
        };
        found = Some(MountInfo {
            dev: (maj, min),
            fstype: fields[sep + 1].to_string(),
            source: fields[sep + 2].to_string(),
        });
    }
    Ok(found)
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
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    if text.lines().any(|l| l.split(' ').nth(4) == Some(FUSECTL)) {
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

/// Why a reader stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelEnd {
    /// The connection is gone (unmounted or aborted): ENODEV or ECONNABORTED.
    Unmounted,
    /// The worker asked it to stop; every request it had read was answered.
    Stopped,
}

extern "C" fn wake(_: libc::c_int) {}

/// Installs the no-op handler of [`WAKE_SIGNAL`] without SA_RESTART, so a reader blocked in
/// read(2) returns EINTR and checks its stop flag.
pub fn install_wake_handler() -> io::Result<()> {
    // SAFETY: sigaction with a handler that does nothing (async-signal-safe).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = wake as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        cvt(libc::sigaction(WAKE_SIGNAL, &sa, std::ptr::null_mut()))?;
    }
    Ok(())
}

/// Serves requests from one clone descriptor until the connection ends or `stop` is set
/// (and the thread woken with [`WAKE_SIGNAL`]).
/// `after_init` runs once this reader has answered FUSE_INIT (the kernel has applied the
/// reply by then).
pub fn serve_channel(
    fd: &OwnedFd,
    server: &Server<Arc<DfsFs>>,
    stop: &AtomicBool,
    stats: &Stats,
    after_init: &dyn Fn(),
) -> io::Result<ChannelEnd> {
    let raw: RawFd = fd.as_raw_fd();
    // Separate request and reply buffers, placed so that the payloads land on page
    // boundaries: a WRITE's data follows 80 bytes of headers, a READ reply's data follows
    // a 16-byte header. The backend then copies between page-aligned buffers (misaligned
    // copies run several times slower on some CPUs, AMD Zen's `rep movsb` among them).
    let mut request = AlignedBuf::new(BUF_SIZE, WRITE_HEADERS);
    let mut reply = AlignedBuf::new(BUF_SIZE, REPLY_HEADER);
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(ChannelEnd::Stopped);
        }
        let buf = request.as_mut_slice();
        // SAFETY: reading into our own buffer of buf.len() bytes.
        let n = unsafe { libc::read(raw, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // EINTR: woken (maybe to stop); ENOENT: the request was interrupted before
                // we read it; EAGAIN: a non-blocking descriptor with nothing queued.
                Some(libc::EINTR | libc::ENOENT | libc::EAGAIN) => continue,
                // ENODEV: the connection is gone. ECONNABORTED: it went away while this
                // reader was copying a request out (the kernel takes the request back), which
                // a normal unmount can cause as well as an abort: gone all the same.
                Some(libc::ENODEV | libc::ECONNABORTED) => return Ok(ChannelEnd::Unmounted),
                _ => return Err(e),
            }
        }
        let n = n as usize;
        // fuse_in_header: len (u32), opcode (u32), ...
        let opcode = if n >= 8 {
            u32::from_ne_bytes(buf[4..8].try_into().expect("4 bytes"))
        } else {
            0
        };
        let reader = match Reader::<()>::from_fuse_buffer(FuseBuf::new(&mut buf[..n])) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("undecodable FUSE request: {e}");
                stats.transport_error();
                continue;
            }
        };
        let writer = match FuseDevWriter::<()>::new(raw, reply.as_mut_slice()) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!("cannot build a FUSE reply: {e}");
                stats.transport_error();
                continue;
            }
        };
        if let Err(e) = server.handle_message(reader, writer.into(), None, None) {
            // Typically ENOENT: the request was interrupted or aborted before the reply.
            tracing::debug!("FUSE request not answered: {e}");
            stats.transport_error();
        } else if opcode == FUSE_INIT {
            after_init();
        }
    }
}

/// `fuse_in_header` + `fuse_write_in`: what precedes a WRITE's data.
const WRITE_HEADERS: usize = 40 + 40;
/// `fuse_out_header`: what precedes a READ reply's data.
const REPLY_HEADER: usize = 16;
const PAGE: usize = 4096;

/// A zeroed buffer of `len` bytes starting `lead` bytes before a page boundary.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize, lead: usize) -> AlignedBuf {
        assert!(lead <= PAGE);
        let layout = std::alloc::Layout::from_size_align(len + PAGE, PAGE).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            layout,
            start: PAGE - lead,
            len,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: start + len is within the allocation, which lives as long as self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(self.start), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape_mountinfo("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape_mountinfo("/x\\134y"), PathBuf::from("/x\\y"));
    }

    #[test]
    fn connection_numbers_use_the_kernels_device_encoding() {
        let m = |dev| MountInfo {
            dev,
            fstype: "fuse.dpufs".into(),
            source: "dpufs".into(),
        };
        assert_eq!(m((0, 42)).connection(), 42);
        assert_eq!(m((0, 300)).connection(), 300);
        assert_eq!(m((1, 2)).connection(), (1 << 20) | 2);
    }

    #[test]
    fn finds_the_root_mount() {
        let m = find_mount(Path::new("/")).unwrap().expect("/ is mounted");
        assert!(!m.fstype.is_empty());
    }
}
