//! Connection management, the software counterpart of exchanging QP numbers and PSNs out of
//! band and moving both QPs through RTR and RTS.
//!
//! A QP's [`Endpoint`] names its context's listener, its QP number and its start PSN. Going RTR
//! records the peer's endpoint and from then on accepts the peer's request channel; going RTS
//! connects this QP's own request channel to the peer's listener with a hello naming both QPs
//! and the PSN, which the peer checks against the endpoint it was given.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

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
}

impl PeerInfo {
    pub fn encode(&self) -> Endpoint {
        Endpoint(format!("tcp:{}/qp={}/psn={}", self.addr, self.qp_num, self.psn).into_bytes())
    }

    pub fn decode(ep: &Endpoint) -> Result<PeerInfo> {
        let bad = || FabricError::InvalidArgument("malformed software endpoint".into());
        let text = std::str::from_utf8(&ep.0).map_err(|_| bad())?;
        let rest = text.strip_prefix("tcp:").ok_or_else(bad)?;
        let mut parts = rest.split('/');
        let addr = parts.next().and_then(|a| a.parse().ok()).ok_or_else(bad)?;
        let mut field = |name: &str| {
            parts
                .next()
                .and_then(|p| p.strip_prefix(name))
                .and_then(|v| v.parse::<u32>().ok())
                .ok_or_else(bad)
        };
        Ok(PeerInfo {
            addr,
            qp_num: field("qp=")?,
            psn: field("psn=")?,
        })
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
pub(crate) fn spawn_listener(listener: TcpListener, qps: Arc<QpRegistry>) -> std::io::Result<()> {
    thread::Builder::new()
        .name("fabric-listen".into())
        .spawn(move || {
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
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

/// Wakes the listener thread out of `accept` for good.
pub(crate) fn shutdown_listener(listener: &TcpListener) {
    // SAFETY: shutdown on a listening socket this context owns; it makes accept fail (EINVAL).
    unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
}

fn accept_channel(qps: &QpRegistry, mut stream: TcpStream) -> std::io::Result<()> {
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
    stream.set_nodelay(true)?;
    let status = match qps.get(target) {
        None => HelloStatus::NoSuchQp,
        Some(qp) => qp.attach_responder(source, psn, &stream)?,
    };
    stream.write_all(&[status as u8])
}

/// Connects the request channel of QP `source` (start PSN `psn`) to peer `peer`.
pub(crate) fn connect(peer: &PeerInfo, source: u32, psn: u32) -> Result<TcpStream> {
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
        let mut stream =
            TcpStream::connect_timeout(&peer.addr, HANDSHAKE_TIMEOUT).map_err(io("connect to"))?;
        stream.set_nodelay(true).map_err(io("configure"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trip() {
        let p = PeerInfo {
            addr: "127.0.0.1:4242".parse().unwrap(),
            qp_num: 17,
            psn: 0xabcdef,
        };
        assert_eq!(PeerInfo::decode(&p.encode()).unwrap(), p);
        assert!(PeerInfo::decode(&Endpoint(b"tcp:nonsense".to_vec())).is_err());
    }
}
