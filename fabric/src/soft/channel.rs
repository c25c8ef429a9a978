//! The byte stream one direction of a connected QP pair runs on.
//!
//! Between nodes it is TCP. Between two contexts of the same device (two processes on one
//! node sharing one NIC) it is a unix socket in the device directory, and RDMA payloads do not
//! cross it at all: the responder copies straight between the two registered buffers, as a NIC
//! loops a transfer between two of its own QPs back by DMA without putting it on the wire. The
//! requester names its side of the transfer with a [`LocalRef`]; the first time a buffer is
//! named on a channel, its descriptor travels with the reference (`SCM_RIGHTS`), so the
//! responder can map exactly the buffers its peer handed over and nothing else, whatever the
//! file permissions or uids of the two processes.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use super::memory::Memory;
use super::wire::received;

/// A connected stream: TCP to another node, or a unix socket to a context of the same device.
#[derive(Debug)]
pub(crate) enum Channel {
    Tcp(TcpStream),
    Local(UnixStream),
}

impl Channel {
    /// Whether RDMA payloads move by [`LocalRef`] instead of through the stream.
    pub fn is_local(&self) -> bool {
        matches!(self, Channel::Local(_))
    }

    pub fn try_clone(&self) -> io::Result<Channel> {
        Ok(match self {
            Channel::Tcp(s) => Channel::Tcp(s.try_clone()?),
            Channel::Local(s) => Channel::Local(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Channel::Tcp(s) => s.shutdown(how),
            Channel::Local(s) => s.shutdown(how),
        }
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Channel::Tcp(s) => s.set_read_timeout(timeout),
            Channel::Local(s) => s.set_read_timeout(timeout),
        }
    }

    /// Handshake I/O (the data path uses the raw descriptor).
    pub fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Channel::Tcp(s) => s.read_exact(buf),
            Channel::Local(s) => s.read_exact(buf),
        }
    }

    pub fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Channel::Tcp(s) => s.write_all(buf),
            Channel::Local(s) => s.write_all(buf),
        }
    }
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Channel::Tcp(s) => s.as_raw_fd(),
            Channel::Local(s) => s.as_raw_fd(),
        }
    }
}

/// Size of an encoded [`LocalRef`].
pub(crate) const LOCAL_REF_LEN: usize = 16;

/// The requester's side of a same-device transfer: which of its registered buffers, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalRef {
    pub mem_id: u64,
    pub offset: u64,
}

impl LocalRef {
    pub fn encode(&self) -> [u8; LOCAL_REF_LEN] {
        let mut b = [0u8; LOCAL_REF_LEN];
        b[..8].copy_from_slice(&self.mem_id.to_le_bytes());
        b[8..].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    fn decode(b: &[u8; LOCAL_REF_LEN]) -> LocalRef {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        LocalRef {
            mem_id: word(0),
            offset: word(8),
        }
    }
}

/// Sends `bytes` with descriptor `pass` attached, in a message of its own: a receiver reading
/// the preceding header with plain `recv` would otherwise take (and drop) the descriptor.
pub(crate) fn send_with_fd(fd: RawFd, bytes: &[u8], pass: RawFd) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = CmsgBuffer::new();
    // SAFETY: an all-zero msghdr is a valid empty message; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as _;
    // SAFETY: msg_control points at a buffer of CMSG_SPACE(one fd) bytes, so the first header
    // and its data fit.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), pass);
    }
    loop {
        // SAFETY: the iovec and control buffer outlive the call.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n == bytes.len() as isize {
            return Ok(());
        }
        if n >= 0 {
            // A unix stream socket takes a 16-byte message whole or blocks; a short send
            // means the peer is gone.
            return Err(io::ErrorKind::WriteZero.into());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Space for one `SCM_RIGHTS` descriptor, aligned for `cmsghdr`.
struct CmsgBuffer([u64; 4]);

impl CmsgBuffer {
    fn new() -> CmsgBuffer {
        const _: () = assert!(size_of::<CmsgBuffer>() >= 24, "CMSG_SPACE(4) on 64-bit");
        CmsgBuffer([0; 4])
    }
}

/// Receives a [`LocalRef`] and the descriptor that came with it, if any.
fn recv_ref(fd: RawFd) -> io::Result<(LocalRef, Option<OwnedFd>)> {
    let mut b = [0u8; LOCAL_REF_LEN];
    let mut done = 0;
    let mut passed = None;
    while done < LOCAL_REF_LEN {
        let mut iov = libc::iovec {
            // SAFETY: done < LOCAL_REF_LEN, inside the buffer.
            iov_base: unsafe { b.as_mut_ptr().add(done) }.cast(),
            iov_len: LOCAL_REF_LEN - done,
        };
        let mut control = CmsgBuffer::new();
        // SAFETY: as in send_with_fd.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<CmsgBuffer>() as _;
        // SAFETY: the iovec and control buffer outlive the call. MSG_CMSG_CLOEXEC: a passed
        // descriptor never leaks into a child process.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_WAITALL | libc::MSG_CMSG_CLOEXEC) };
        let Some(n) = received(n)? else {
            continue;
        };
        done += n;
        // SAFETY: the kernel filled msg_control; CMSG_FIRSTHDR/CMSG_NXTHDR walk within it.
        let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        while !cmsg.is_null() {
            // SAFETY: a non-null cmsg from the iteration points at a complete header.
            let c = unsafe { &*cmsg };
            if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_RIGHTS {
                // SAFETY: SCM_RIGHTS data holds at least one descriptor, now ours to close.
                let raw =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>()) };
                // SAFETY: the kernel installed `raw` in our table for us alone.
                passed = Some(unsafe { OwnedFd::from_raw_fd(raw) });
            }
            // SAFETY: as above.
            cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
        }
    }
    Ok((LocalRef::decode(&b), passed))
}

/// The buffers a peer handed over on one local channel, by memory id. Only these can be the
/// other side of a same-device transfer: a reference to anything else is refused.
#[derive(Debug, Default)]
pub(crate) struct HandedOver {
    buffers: HashMap<u64, Arc<Memory>>,
}

impl HandedOver {
    /// Reads the reference that follows a request header and resolves it to `len` bytes of
    /// the peer's memory. `Ok(None)`: a well-formed request naming memory the peer never
    /// handed over or a range outside it (refused like any bad access).
    pub fn receive(&mut self, fd: RawFd, len: u64) -> io::Result<Option<(Arc<Memory>, *mut u8)>> {
        let (r, passed) = recv_ref(fd)?;
        if let Some(file) = passed {
            self.adopt(r.mem_id, file);
        }
        Ok(self
            .buffers
            .get(&r.mem_id)
            .and_then(|mem| Some((mem.clone(), mem.range(r.offset, len)?))))
    }

    fn adopt(&mut self, mem_id: u64, file: OwnedFd) {
        // Buffers the peer deregistered since are dropped here, so a long-lived channel does
        // not keep every buffer its peer ever had mapped.
        self.buffers.retain(|_, mem| mem.is_registered());
        match Memory::from_fd(std::fs::File::from(file)) {
            Ok(mem) => {
                self.buffers.insert(mem_id, Arc::new(mem));
            }
            Err(e) => tracing::warn!(mem_id, error = %e, "cannot map a handed-over buffer"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ref_round_trip() {
        let r = LocalRef {
            mem_id: 0x0102_0304_0506_0708,
            offset: 1 << 40,
        };
        assert_eq!(LocalRef::decode(&r.encode()), r);
    }

    #[test]
    fn a_passed_descriptor_arrives_with_its_reference_after_a_plain_header() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let r = LocalRef {
            mem_id: 7,
            offset: 4096,
        };
        // A header sent plainly, then the reference with the descriptor.
        (&a).write_all(&[9u8; 24]).unwrap();
        send_with_fd(a.as_raw_fd(), &r.encode(), file.as_raw_fd()).unwrap();
        let mut header = [0u8; 24];
        (&b).read_exact(&mut header).unwrap();
        let (got, fd) = recv_ref(b.as_raw_fd()).unwrap();
        assert_eq!(got, r);
        let fd = fd.expect("descriptor passed");
        let len = std::fs::File::from(fd).metadata().unwrap().len();
        assert_eq!(len, 8192);
        // Without a descriptor, nothing is reported.
        (&a).write_all(&r.encode()).unwrap();
        assert!(recv_ref(b.as_raw_fd()).unwrap().1.is_none());
    }

    #[test]
    fn only_handed_over_buffers_resolve_and_only_within_them() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let mut handed = HandedOver::default();
        let send = |mem_id, offset, pass: Option<RawFd>| {
            let r = LocalRef { mem_id, offset }.encode();
            match pass {
                Some(fd) => send_with_fd(a.as_raw_fd(), &r, fd).unwrap(),
                None => (&a).write_all(&r).unwrap(),
            }
        };
        // Never handed over: refused.
        send(3, 0, None);
        assert!(handed.receive(b.as_raw_fd(), 16).unwrap().is_none());
        send(3, 0, Some(file.as_raw_fd()));
        assert!(handed.receive(b.as_raw_fd(), 8192).unwrap().is_some());
        // Known now, without the descriptor again; but not past its end, nor another id.
        send(3, 4096, None);
        assert!(handed.receive(b.as_raw_fd(), 4096).unwrap().is_some());
        send(3, 4096, None);
        assert!(handed.receive(b.as_raw_fd(), 4097).unwrap().is_none());
        send(4, 0, None);
        assert!(handed.receive(b.as_raw_fd(), 1).unwrap().is_none());
    }
}
