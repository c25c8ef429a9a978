//! Wire format of a connected QP and the raw socket I/O of the data path.
//!
//! Each QP pair uses two byte streams, one per direction of requests: the requester of side A
//! writes its requests on A's channel and reads the responses to them from the same channel;
//! the responder of side B reads those requests and writes the responses. A responder thus only
//! ever waits for its own peer to drain responses, and a completion reader only reads, so no
//! cycle of full socket buffers can form however both sides post.
//!
//! Every message is a 24-byte header, followed by a payload for SEND, WRITE and READ responses.
//! Payloads move between the socket and registered memory directly (`recv` into the buffer,
//! `sendmsg` from it): no intermediate copy in user space.

use std::io;
use std::os::fd::RawFd;

/// Size of a frame header.
pub(crate) const HEADER_LEN: usize = 24;

/// Frame opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Send = 1,
    SendInv = 2,
    Write = 3,
    ReadReq = 4,
    Ack = 0x81,
    Nak = 0x82,
    ReadResp = 0x83,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Send,
            2 => Op::SendInv,
            3 => Op::Write,
            4 => Op::ReadReq,
            0x81 => Op::Ack,
            0x82 => Op::Nak,
            0x83 => Op::ReadResp,
            _ => return None,
        })
    }
}

/// NAK codes (the syndromes the requester turns into completion statuses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NakCode {
    /// → `RemInvReqErr`.
    InvalidRequest = 1,
    /// → `RemAccessErr`.
    RemoteAccess = 2,
    /// → `RemOpErr`.
    RemoteOperational = 3,
    /// PSN out of sequence → `RetryExcErr` (there is no retransmission over a stream).
    Sequence = 4,
}

impl NakCode {
    pub fn from_u8(v: u8) -> Option<NakCode> {
        Some(match v {
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccess,
            3 => NakCode::RemoteOperational,
            4 => NakCode::Sequence,
            _ => return None,
        })
    }
}

/// A frame header. Requests carry the PSN, rkey (or the rkey to invalidate), length and remote
/// address; responses echo the PSN and carry a NAK code or the READ response length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub op: Op,
    pub code: u8,
    pub psn: u32,
    pub key: u32,
    pub len: u32,
    pub addr: u64,
}

impl Frame {
    pub fn new(op: Op, psn: u32) -> Frame {
        Frame {
            op,
            code: 0,
            psn,
            key: 0,
            len: 0,
            addr: 0,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.op as u8;
        b[1] = self.code;
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..12].copy_from_slice(&self.key.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> io::Result<Frame> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let op = Op::from_u8(b[0]).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad opcode {:#x}", b[0]),
            )
        })?;
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[16..24]);
        Ok(Frame {
            op,
            code: b[1],
            psn: u32_at(4),
            key: u32_at(8),
            len: u32_at(12),
            addr: u64::from_le_bytes(addr),
        })
    }
}

/// What a look at a channel without waiting found.
#[derive(Debug)]
pub(crate) enum Queued {
    Frame(Frame),
    Nothing,
    /// The peer closed the stream.
    Ended,
}

/// Reads one frame header if one has arrived, without waiting for one. One `recv` where a
/// readiness check and a read would take two.
pub(crate) fn try_read_frame(fd: RawFd) -> io::Result<Queued> {
    let mut b = [0u8; HEADER_LEN];
    let got = loop {
        // SAFETY: the stack buffer is valid for HEADER_LEN bytes.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), HEADER_LEN, libc::MSG_DONTWAIT) };
        match received(n) {
            Ok(Some(got)) => break got,
            Ok(None) => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Queued::Nothing),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Queued::Ended),
            Err(e) => return Err(e),
        }
    };
    // The rest of a header that started to arrive is in flight: wait for it.
    // SAFETY: got < HEADER_LEN, so the tail stays inside the buffer.
    unsafe { recv_into(fd, b.as_mut_ptr().add(got), HEADER_LEN - got) }?;
    Frame::decode(&b).map(Queued::Frame)
}

/// Whether at least `len` bytes wait in `fd`'s receive queue, so reading them cannot block.
pub(crate) fn queued_at_least(fd: RawFd, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let ok = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) } == 0;
    ok && usize::try_from(queued).is_ok_and(|q| q >= len)
}

/// Receives what has arrived of `len` bytes into `dst`, without waiting: the bytes received
/// (fewer than `len` when the rest is still on the wire). The end of the stream is an error.
///
/// # Safety
///
/// As [`recv_into`].
pub(crate) unsafe fn recv_arrived(fd: RawFd, dst: *mut u8, len: usize) -> io::Result<usize> {
    let mut done = 0;
    while done < len {
        // SAFETY: dst is valid for `len` bytes (caller contract), so dst+done for len-done.
        let n = unsafe { libc::recv(fd, dst.add(done).cast(), len - done, libc::MSG_DONTWAIT) };
        match received(n) {
            Ok(got) => done += got.unwrap_or(0),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Receives exactly `len` bytes into `dst`.
///
/// # Safety
///
/// `dst` must be valid for writes of `len` bytes for the duration of the call. It may be shared
/// memory that other parties also touch: the bytes are written by the kernel, and no Rust
/// reference to them is formed.
pub(crate) unsafe fn recv_into(fd: RawFd, dst: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        // SAFETY: dst is valid for `len` bytes (caller contract), so dst+done for len-done.
        // MSG_WAITALL lets one call fill a whole payload instead of one socket buffer's worth.
        let n = unsafe { libc::recv(fd, dst.add(done).cast(), len - done, libc::MSG_WAITALL) };
        done += received(n)?.unwrap_or(0);
    }
    Ok(())
}

/// What one `recv`/`recvmsg` call returned `n` means for a read of an exact length: bytes
/// received, `None` when a signal interrupted it (call again), an error at end of stream.
pub(crate) fn received(n: isize) -> io::Result<Option<usize>> {
    match n {
        0 => Err(io::ErrorKind::UnexpectedEof.into()),
        n if n > 0 => Ok(Some(n as usize)),
        _ => {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}

/// Reads and drops `len` bytes.
pub(crate) fn discard(fd: RawFd, mut len: usize) -> io::Result<()> {
    let mut scratch = [0u8; 4096];
    while len > 0 {
        let n = len.min(scratch.len());
        // SAFETY: n <= scratch.len().
        unsafe { recv_into(fd, scratch.as_mut_ptr(), n) }?;
        len -= n;
    }
    Ok(())
}

/// Sends a frame without payload (ACK, NAK, READ request).
pub(crate) fn send_header(fd: RawFd, frame: &Frame) -> io::Result<()> {
    // SAFETY: no payload pointer.
    unsafe { send_frame(fd, frame, None) }
}

/// Sends a header and an optional payload in one `sendmsg` (more only if the socket takes it
/// in parts).
///
/// # Safety
///
/// A `payload` pointer must be valid for reads of its length for the duration of the call
/// (it may be shared memory others write; no Rust reference to it is formed).
pub(crate) unsafe fn send_frame(
    fd: RawFd,
    frame: &Frame,
    payload: Option<(*const u8, usize)>,
) -> io::Result<()> {
    let header = frame.encode();
    let mut parts: [(*const u8, usize); 2] = [
        (header.as_ptr(), HEADER_LEN),
        payload.unwrap_or((std::ptr::null(), 0)),
    ];
    let mut first = 0;
    while first < parts.len() && parts[first].1 > 0 {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let mut count = 0;
        for &(base, len) in &parts[first..] {
            if len > 0 {
                iov[count] = libc::iovec {
                    iov_base: base as *mut libc::c_void,
                    iov_len: len,
                };
                count += 1;
            }
        }
        // SAFETY: an all-zero msghdr is a valid empty message; fields are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = count as _;
        // SAFETY: every iovec points at memory valid for its length (the header on our stack,
        // the payload by the caller's contract). MSG_NOSIGNAL: a peer that went away yields
        // EPIPE instead of killing the process.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        let mut sent = n as usize;
        while sent > 0 && first < parts.len() {
            let (base, len) = parts[first];
            if sent >= len {
                sent -= len;
                parts[first] = (base, 0);
                first += 1;
            } else {
                // SAFETY: sent < len, so the advanced pointer stays inside the part.
                parts[first] = (unsafe { base.add(sent) }, len - sent);
                sent = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let f = Frame {
            op: Op::Write,
            code: 3,
            psn: 0xdead_beef,
            key: 0x1234_5678,
            len: 1 << 20,
            addr: 0x7fff_0000_1000,
        };
        assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
        let mut bad = f.encode();
        bad[0] = 0x55;
        assert!(Frame::decode(&bad).is_err());
    }
}
