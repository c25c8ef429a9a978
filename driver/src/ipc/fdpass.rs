//! One message with at most one descriptor over a unix stream socket (SCM_RIGHTS): the
//! keeper socket's framing.
//!
//! A message is one line of JSON; the descriptor, when there is one, rides on its first byte.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Longest message accepted.
const MAX_MESSAGE: usize = 64 << 10;

/// Sends `line` (a newline is added) with `fd` attached, if any.
pub fn send(stream: &UnixStream, line: &str, fd: Option<RawFd>) -> io::Result<()> {
    let mut bytes = line.as_bytes().to_vec();
    bytes.push(b'\n');
    let mut sent = 0;
    while sent < bytes.len() {
        // Only the first piece carries the descriptor.
        let attach = if sent == 0 { fd } else { None };
        sent += send_piece(stream, &bytes[sent..], attach)?;
    }
    Ok(())
}

fn send_piece(stream: &UnixStream, bytes: &[u8], fd: Option<RawFd>) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // Room for one descriptor, aligned for cmsghdr.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer is large enough for one header with one descriptor
        // (checked by the assertion), and CMSG_FIRSTHDR/CMSG_DATA point into it.
        unsafe {
            assert!(space <= std::mem::size_of_val(&control));
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
    }
    loop {
        // SAFETY: msg points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one line and the descriptor attached to it, if any.
pub fn recv(stream: &UnixStream) -> io::Result<(String, Option<OwnedFd>)> {
    let mut fd = None;
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let (n, got) = recv_piece(stream, &mut buf)?;
        if got.is_some() {
            fd = got;
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the socket mid-message",
            ));
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|b| *b == b'\n') {
            line.truncate(end);
            break;
        }
        if line.len() > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "message too long",
            ));
        }
    }
    let text = String::from_utf8(line)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "message is not UTF-8"))?;
    Ok((text, fd))
}

/// Reads what is there (a message is never followed by another on the same connection, so
/// reading past its newline cannot happen).
fn recv_piece(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 4];
    // SAFETY: as in send_piece.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: msg points at live buffers; MSG_CMSG_CLOEXEC marks received fds close-on-exec.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fd = None;
    // SAFETY: walking the control messages the kernel wrote into our buffer.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn a_descriptor_travels_with_its_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"shared").unwrap();
        let long = "x".repeat(10_000);
        send(&a, &long, Some(file.as_raw_fd())).unwrap();
        let (text, fd) = recv(&b).unwrap();
        assert_eq!(text, long);
        let mut got = std::fs::File::from(fd.expect("a descriptor"));
        got.rewind().unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "shared");

        send(&a, "{}", None).unwrap();
        let (text, fd) = recv(&b).unwrap();
        assert_eq!(text, "{}");
        assert!(fd.is_none());
        drop(a);
        assert_eq!(recv(&b).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
