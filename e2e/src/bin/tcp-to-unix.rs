//! `tcp-to-unix LISTEN SOCKET`: accepts TCP connections on `LISTEN` (`0.0.0.0:10000`) and
//! joins each to a new connection to the unix socket `SOCKET`, bytes passed through unchanged
//! both ways until either side closes.
//!
//! The DPU-mode guest test runs it in the QEMU guest that stands in for the host: the CSI
//! shim serves kubelet on a unix socket only, and the test, outside the guest, reaches that
//! socket through QEMU's port forward and this relay. A connection made before the socket
//! listens is closed at once; the client connects again.

use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(socket), None) = (args.next(), args.next(), args.next()) else {
        eprintln!("usage: tcp-to-unix LISTEN_ADDR UNIX_SOCKET");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(&listen).unwrap_or_else(|e| {
        eprintln!("tcp-to-unix: listening on {listen}: {e}");
        std::process::exit(1);
    });
    let socket = PathBuf::from(socket);
    for tcp in listener.incoming().flatten() {
        match UnixStream::connect(&socket) {
            Ok(unix) => join(tcp, unix),
            Err(e) => eprintln!("tcp-to-unix: {}: {e}", socket.display()),
        }
    }
}

/// Copies each way on a thread of its own; the end of one side's stream is passed on as a
/// shutdown of the other side's writing half, so each side sees the other close.
fn join(mut tcp: TcpStream, mut unix: UnixStream) {
    let _ = tcp.set_nodelay(true);
    let (Ok(mut tcp_out), Ok(mut unix_out)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut tcp, &mut unix_out);
        let _ = unix_out.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut unix, &mut tcp_out);
        let _ = tcp_out.shutdown(Shutdown::Write);
    });
}
