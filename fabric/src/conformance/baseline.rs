//! Plain TCP between the same two processes, the yardstick for the software provider's
//! throughput and round trips (benches/rma.rs).
//!
//! A connection starts with a 17-byte request: mode, then two little-endian `u64`s.
//! - sink (1, n): the server reads `n` bytes, then answers one byte; repeatable.
//! - source (2, n): the server writes `n` bytes; repeatable.
//! - ping-pong (3, req, resp): until EOF, the server reads `req` bytes and writes `resp` bytes.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::thread;

/// Buffer size for the stream modes, as a 1 MiB RDMA transfer.
const CHUNK: usize = 1 << 20;

const SINK: u8 = 1;
const SOURCE: u8 = 2;
const PING_PONG: u8 = 3;

/// Starts a baseline server on loopback; it serves every connection in its own thread until the
/// process exits.
pub fn serve() -> io::Result<SocketAddr> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = listener.local_addr()?;
    thread::Builder::new()
        .name("baseline-accept".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = thread::Builder::new()
                    .name("baseline-conn".into())
                    .spawn(move || serve_connection(stream));
            }
        })?;
    Ok(addr)
}

fn serve_connection(mut s: TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let mut head = [0u8; 17];
        match s.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let a = u64_at(&head, 1) as usize;
        let b = u64_at(&head, 9) as usize;
        match head[0] {
            SINK => {
                let mut left = a;
                while left > 0 {
                    let n = left.min(CHUNK);
                    s.read_exact(&mut buf[..n])?;
                    left -= n;
                }
                s.write_all(&[1])?;
            }
            SOURCE => {
                let mut left = a;
                while left > 0 {
                    let n = left.min(CHUNK);
                    s.write_all(&buf[..n])?;
                    left -= n;
                }
            }
            PING_PONG => {
                if a > CHUNK || b > CHUNK {
                    return Err(io::Error::other("ping-pong sizes above 1 MiB"));
                }
                loop {
                    match s.read_exact(&mut buf[..a]) {
                        Ok(()) => s.write_all(&buf[..b])?,
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
            }
            other => return Err(io::Error::other(format!("unknown baseline mode {other}"))),
        }
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(x)
}

fn request(mode: u8, a: u64, b: u64) -> [u8; 17] {
    let mut head = [0u8; 17];
    head[0] = mode;
    head[1..9].copy_from_slice(&a.to_le_bytes());
    head[9..17].copy_from_slice(&b.to_le_bytes());
    head
}

/// Client side of a baseline connection.
#[derive(Debug)]
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Connects to a baseline server.
    pub fn connect(addr: &str) -> io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: vec![0x5a; CHUNK],
        })
    }

    /// Sends `bytes` (in 1 MiB writes) and waits until the server has read them all.
    pub fn sink(&mut self, bytes: u64) -> io::Result<()> {
        self.stream.write_all(&request(SINK, bytes, 0))?;
        let mut left = bytes as usize;
        while left > 0 {
            let n = left.min(CHUNK);
            self.stream.write_all(&self.buf[..n])?;
            left -= n;
        }
        let mut done = [0u8; 1];
        self.stream.read_exact(&mut done)
    }

    /// Receives `bytes` the server writes (in 1 MiB reads).
    pub fn source(&mut self, bytes: u64) -> io::Result<()> {
        self.stream.write_all(&request(SOURCE, bytes, 0))?;
        let mut left = bytes as usize;
        while left > 0 {
            let n = left.min(CHUNK);
            self.stream.read_exact(&mut self.buf[..n])?;
            left -= n;
        }
        Ok(())
    }

    /// Switches the connection to ping-pong with these sizes.
    pub fn start_ping_pong(&mut self, req: usize, resp: usize) -> io::Result<()> {
        self.stream
            .write_all(&request(PING_PONG, req as u64, resp as u64))
    }

    /// One request/response round trip.
    pub fn ping(&mut self, req: usize, resp: usize) -> io::Result<()> {
        self.stream.write_all(&self.buf[..req])?;
        self.stream.read_exact(&mut self.buf[..resp])
    }
}
