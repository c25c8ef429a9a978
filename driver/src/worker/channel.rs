//! The request loop: one reader thread per cloned `/dev/fuse` descriptor.
//!
//! fuse-backend-rs's `FuseSession` is not used (docs/worker.md, "Process layout"): its
//! constructor stats the mountpoint (a deadlock when nobody serves the connection yet), its
//! channels are dups of one descriptor (a dead worker's in-flight requests then hang), and its
//! Drop unmounts. The pieces it is built from are public, so this module does the same with
//! the crate's `Server`, `Reader` and `FuseDevWriter`, on the clones of [`crate::fuse::clone_fd`].
//!
//! Reads are blocking: the kernel wakes one reader per request (no poll, no thundering herd).
//! A reader stops when the connection goes away (ENODEV, or ECONNABORTED when it went while a
//! request was being read) or when it is asked to stop and woken by a signal
//! ([`WAKE_SIGNAL`]) between requests; a request it has read is always answered first, which
//! is what a drain needs.

use super::fs::DfsFs;
use super::stats::Stats;
use crate::fuse::MAX_PAYLOAD;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FuseBuf, FuseDevWriter, Reader};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A request buffer: the payload plus room for the request headers.
pub const BUF_SIZE: usize = MAX_PAYLOAD + 4096;
/// The signal that interrupts a reader blocked in read(2) so it can see a stop request.
pub const WAKE_SIGNAL: libc::c_int = libc::SIGUSR2;
/// The INIT opcode.
const FUSE_INIT: u32 = 26;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
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
