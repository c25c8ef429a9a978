//! Connection management, the software counterpart of exchanging QP numbers and PSNs out of
//! band and moving both QPs through RTR and RTS.
//!
//! A QP's [`Endpoint`] names its context's listener, its QP number and its start PSN. Going RTR
//! records the peer's endpoint and from then on accepts the peer's request channel; going RTS
//! connects this QP's own request channel to the peer's listener with a hello naming both QPs
//! and the PSN, which the peer checks against the endpoint it was given.
//!
//! Every context listens twice: on TCP for other nodes, and on a unix socket in the device
//! directory for contexts of the same device (see [`super::channel`]). The endpoint names the
//! device and the context, so a peer on the same device takes the unix socket.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use super::channel::Channel;
use super::lock;
use super::qp::QpShared;
use crate::error::{FabricError, Result};
use crate::verbs::Endpoint;

const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"DPQP");
/// Bound on a connection handshake; the listener serves handshakes one at a time.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long RTS keeps trying while the peer QP is not RTR yet.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Handshake answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HelloStatus {
    Ok = 0,
    NoSuchQp = 1,
    NotReady = 2,
    WrongPeer = 3,
    AlreadyConnected = 4,
}

impl HelloStatus {
    fn describe(code: u8) -> &'static str {
        match code {
            1 => "no such QP",
            2 => "QP not ready to receive",
            3 => "QP expects another peer",
            4 => "QP already connected",
            _ => "unknown status",
        }
    }
}

/// What a QP learns about its peer at RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub addr: SocketAddr,
    pub qp_num: u32,
    pub psn: u32,
    /// The peer's device ([`super::table::DeviceTable::nonce`]).
    pub device: u64,
    /// The peer's context on that device (names its unix socket).
    pub ctx: u32,
}

impl PeerInfo {
    pub fn encode(&self) -> Endpoint {
        Endpoint(
            format!(
                "tcp:{}/qp={}/psn={}/dev={:x}/ctx={}",
                self.addr, self.qp_num, self.psn, self.device, self.ctx
            )
            .into_bytes(),
        )
    }

    pub fn decode(ep: &Endpoint) -> Result<PeerInfo> {
        let bad = || FabricError::InvalidArgument("malformed software endpoint".into());
        let text = std::str::from_utf8(&ep.0).map_err(|_| bad())?;
        let rest = text.strip_prefix("tcp:").ok_or_else(bad)?;
        let mut parts = rest.split('/');
        let addr = parts.next().and_then(|a| a.parse().ok()).ok_or_else(bad)?;
        let mut field = |name: &str, radix: u32| {
            parts
                .next()
                .and_then(|p| p.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v, radix).ok())
                .ok_or_else(bad)
        };
        let small = |v: u64| u32::try_from(v).map_err(|_| bad());
        Ok(PeerInfo {
            addr,
            qp_num: small(field("qp=", 10)?)?,
            psn: small(field("psn=", 10)?)?,
            device: field("dev=", 16)?,
            ctx: small(field("ctx=", 10)?)?,
        })
    }
}

/// Where context `ctx` of a device accepts same-device connections.
pub(crate) fn local_socket(qp_dir: &Path, ctx: u32) -> PathBuf {
    qp_dir.join(format!("{ctx}.sock"))
}

/// A context's listening socket.
#[derive(Debug)]
pub(crate) enum Listener {
    Tcp(TcpListener),
    Local(UnixListener, PathBuf),
}

impl Listener {
    /// Binds context `ctx`'s same-device socket, replacing one a dead context left behind.
    pub fn local(qp_dir: &Path, ctx: u32) -> std::io::Result<Listener> {
        std::fs::create_dir_all(qp_dir)?;
        let path = local_socket(qp_dir, ctx);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Ok(Listener::Local(UnixListener::bind(&path)?, path))
    }

    pub fn try_clone(&self) -> std::io::Result<Listener> {
        Ok(match self {
            Listener::Tcp(l) => Listener::Tcp(l.try_clone()?),
            Listener::Local(l, path) => Listener::Local(l.try_clone()?, path.clone()),
        })
    }

    fn accept(&self) -> std::io::Result<Channel> {
        match self {
            Listener::Tcp(l) => {
                let (stream, _) = l.accept()?;
                stream.set_nodelay(true)?;
                Ok(Channel::Tcp(stream))
            }
            Listener::Local(l, _) => Ok(Channel::Local(l.accept()?.0)),
        }
    }

    /// Wakes the listener thread out of `accept` for good (the registry is closed already)
    /// and removes the socket file.
    pub fn shut(&self) {
        match self {
            // SAFETY: shutdown on a listening socket this context owns; accept fails (EINVAL).
            Listener::Tcp(l) => unsafe {
                libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR);
            },
            Listener::Local(_, path) => {
                // One connection wakes `accept`; the thread then sees the registry closed.
                let _ = UnixStream::connect(path);
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// The QPs of one context, by number, for the listener.
#[derive(Debug, Default)]
pub(crate) struct QpRegistry {
    qps: Mutex<HashMap<u32, Weak<QpShared>>>,
    closing: AtomicBool,
}

impl QpRegistry {
    pub fn insert(&self, qp: &Arc<QpShared>) {
        lock(&self.qps).insert(qp.num, Arc::downgrade(qp));
    }

    pub fn remove(&self, num: u32) {
        lock(&self.qps).remove(&num);
    }

    fn get(&self, num: u32) -> Option<Arc<QpShared>> {
        lock(&self.qps).get(&num).and_then(Weak::upgrade)
    }

    /// Tells the listener thread to stop.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }
}

/// Serves incoming request channels until the context closes.
pub(crate) fn spawn_listener(listener: Listener, qps: Arc<QpRegistry>) -> std::io::Result<()> {
    thread::Builder::new()
        .name("fabric-listen".into())
        .spawn(move || {
            loop {
                match listener.accept() {
                    Ok(_) if qps.closing.load(Ordering::Acquire) => return,
                    Ok(stream) => {
                        if let Err(e) = accept_channel(&qps, stream) {
                            tracing::debug!(error = %e, "refused a QP connection");
                        }
                    }
                    Err(_) if qps.closing.load(Ordering::Acquire) => return,
                    Err(e) => {
                        // Out of descriptors or a connection aborted before accept: try again
                        // shortly rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        })
        .map(drop)
}

fn accept_channel(qps: &QpRegistry, mut stream: Channel) -> std::io::Result<()> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut hello = [0u8; 16];
    stream.read_exact(&mut hello)?;
    let word = |i: usize| u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]);
    if word(0) != HELLO_MAGIC {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a QP hello",
        ));
    }
    let (target, source, psn) = (word(4), word(8), word(12));
    stream.set_read_timeout(None)?;
    let status = match qps.get(target) {
        None => HelloStatus::NoSuchQp,
        Some(qp) => qp.attach_responder(source, psn, &stream)?,
    };
    stream.write_all(&[status as u8])
}

/// Connects the request channel of QP `source` (start PSN `psn`) to peer `peer`, through the
/// unix socket `local` when the peer is on the same device.
pub(crate) fn connect(
    peer: &PeerInfo,
    local: Option<&Path>,
    source: u32,
    psn: u32,
) -> Result<Channel> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let mut hello = [0u8; 16];
    hello[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello[4..8].copy_from_slice(&peer.qp_num.to_le_bytes());
    hello[8..12].copy_from_slice(&source.to_le_bytes());
    hello[12..16].copy_from_slice(&psn.to_le_bytes());
    loop {
        let io = |op: &str| {
            let op = format!("{op} {}", peer.addr);
            move |e| FabricError::io(op, e)
        };
        let mut stream = open_channel(peer, local).map_err(io("connect to"))?;
        stream
            .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(io("configure"))?;
        stream.write_all(&hello).map_err(io("hello to"))?;
        let mut status = [0u8; 1];
        stream.read_exact(&mut status).map_err(io("hello from"))?;
        match status[0] {
            s if s == HelloStatus::Ok as u8 => {
                // The data path uses blocking recv on the raw descriptor: no timeout there.
                stream.set_read_timeout(None).map_err(io("configure"))?;
                return Ok(stream);
            }
            s if s == HelloStatus::NotReady as u8 && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(2));
            }
            s => {
                return Err(FabricError::Connect(format!(
                    "peer QP {} at {}: {}",
                    peer.qp_num,
                    peer.addr,
                    HelloStatus::describe(s)
                )));
            }
        }
    }
}

fn open_channel(peer: &PeerInfo, local: Option<&Path>) -> std::io::Result<Channel> {
    if let Some(path) = local {
        match UnixStream::connect(path) {
            Ok(stream) => return Ok(Channel::Local(stream)),
            // The peer may run in another mount namespace or without a socket (path too
            // long for sun_path): TCP works everywhere.
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "no same-device socket; TCP")
            }
        }
    }
    let stream = TcpStream::connect_timeout(&peer.addr, HANDSHAKE_TIMEOUT)?;
    stream.set_nodelay(true)?;
    Ok(Channel::Tcp(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trip() {
        let p = PeerInfo {
            addr: "127.0.0.1:4242".parse().unwrap(),
            qp_num: 17,
            psn: 0xabcdef,
            device: 0xfeed_f00d_dead_beef,
            ctx: 3,
        };
        assert_eq!(PeerInfo::decode(&p.encode()).unwrap(), p);
        assert!(PeerInfo::decode(&Endpoint(b"tcp:nonsense".to_vec())).is_err());
    }
}
