//! The client of the mount keeper's socket (`<keeper state>/keeper.sock`): what the
//! launcher asks, and what a worker asks at start ([`take_over`]: a FUSE connection, or an
//! export's listening socket).

use super::fdpass;
use crate::fuse;
use anyhow::{Context as _, Result, bail};
use dpufs_node_api::handover::Handover;
use dpufs_node_api::keeper::{List, Reply, Request};
use dpufs_node_api::transport::Transport;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long the keeper may take to answer (serving waits for the worker to start).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// One request to the keeper at `socket`, and the descriptor that came with the answer. A
/// refusal is an error (`keeper: <why>`).
pub fn request(socket: &Path, req: &Request) -> Result<(Reply, Option<OwnedFd>)> {
    let conn = UnixStream::connect(socket)
        .with_context(|| format!("connect to the keeper at {}", socket.display()))?;
    conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    fdpass::send(&conn, &req.encode(), None)?;
    let (line, fd) = fdpass::recv(&conn)?;
    match req.decode_reply(&line)? {
        Reply::Refused(e) => bail!("keeper: {e}"),
        reply => Ok((reply, fd)),
    }
}

/// The keeper's `list`.
pub fn list(socket: &Path) -> Result<List> {
    match request(socket, &Request::List)?.0 {
        Reply::List(l) => Ok(l),
        other => bail!("the keeper answered list with {other:?}"),
    }
}

/// A worker's side of a handover: the descriptor of `volume` and what to know about it.
pub fn take_over(socket: &Path, volume: &str) -> Result<(Handover, OwnedFd)> {
    let req = Request::Handover {
        volume: volume.to_string(),
    };
    let (reply, fd) = request(socket, &req)?;
    let Reply::Handover(h) = reply else {
        bail!("the keeper answered handover with {reply:?}");
    };
    let fd = fd.context("the keeper sent no descriptor")?;
    let expected = match h.attachment.transport() {
        Transport::Fuse => fuse::is_fuse_device(fd.as_fd())?,
        Transport::VhostUserFs => is_listening_socket(fd.as_fd())?,
    };
    if !expected {
        bail!("the keeper sent a descriptor that is not {}", h.attachment);
    }
    Ok((h, fd))
}

/// Whether `fd` is a socket that listens (what an export's handover carries).
fn is_listening_socket(fd: BorrowedFd<'_>) -> std::io::Result<bool> {
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_ACCEPTCONN writes one int into the buffer of `len` bytes given.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut listening as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    match r {
        0 => Ok(listening != 0),
        _ => match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENOTSOCK) => Ok(false),
            e => Err(e),
        },
    }
}
