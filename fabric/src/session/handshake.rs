//! The worker's side of the out-of-band connection handshake (what rdma_cm does for verbs
//! applications), over TCP:
//!
//! 0. server → worker: `Challenge` (32 fresh random bytes);
//! 1. worker → server: `Hello { version, depth, max_bulk, signed capability, QP endpoint,
//!    proof }`, the proof being the capability's holder key's signature of the challenge and
//!    the hello before it;
//! 2. the server checks the capability (key id, signature, expiry) and the proof *before* it
//!    creates a QP, then answers `Accept { depth, max_bulk, its endpoint }` (its QP already
//!    RTR) or `Refuse { reason }`;
//! 3. the worker takes its QP through RTR and RTS and sends `READY`;
//! 4. the server takes its QP to RTS and answers `READY`. Calls may start.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use super::capability::SignedCapability;
use super::error::SessionError;
use super::link::Link;
use super::tenant::SessionShared;
use super::wire::{Answer, Challenge, Hello, PROTOCOL_VERSION, READY};
use crate::provider::{QueuePair, RdmaDevice};
use crate::verbs::{Access, QpCaps, QpTransition};

/// A TCP connection to `peer` with reads and writes bounded by `deadline`.
pub(crate) fn dial(peer: SocketAddr, deadline: Instant) -> Result<TcpStream, SessionError> {
    let io = |op: &str, e| SessionError::io(format!("{op} {peer}"), e);
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(std::time::Duration::from_millis(1));
    let stream = TcpStream::connect_timeout(&peer, left).map_err(|e| io("connect to", e))?;
    stream
        .set_read_timeout(Some(left))
        .and_then(|()| stream.set_write_timeout(Some(left)))
        .and_then(|()| stream.set_nodelay(true))
        .map_err(|e| io("configure socket to", e))?;
    Ok(stream)
}

/// Establishes a new QP to `peer` presenting `capability`.
pub(crate) fn connect<D: RdmaDevice>(
    shared: &Arc<SessionShared<D>>,
    peer: SocketAddr,
    capability: &SignedCapability,
    deadline: Instant,
) -> Result<Link<D>, SessionError> {
    let config = &shared.config;
    let block = shared
        .control
        .acquire(deadline)
        .ok_or(SessionError::LimitExceeded {
            resource: "qps",
            requested: config.max_connections as u64 + 1,
            limit: config.max_connections as u64,
        })?;
    let depth = config.depth;
    let wrs = u32::from(depth) * 4 + 16;
    let cq = shared.device.create_cq(wrs + u32::from(depth))?;
    let qp = shared.device.create_qp(
        &shared.pd,
        &cq,
        &cq,
        QpCaps {
            max_send_wr: wrs,
            max_recv_wr: u32::from(depth),
        },
    )?;
    // The server moves data only by RMA into our windows: our QP serves READ and WRITE.
    qp.modify(QpTransition::Init {
        access: Access::REMOTE_READ | Access::REMOTE_WRITE,
    })?;
    let io = |op: &str, e| SessionError::io(format!("handshake with {peer}: {op}"), e);
    let mut stream = dial(peer, deadline)?;
    let challenge = Challenge::read(&mut stream).map_err(|e| io("read challenge", e))?;
    let mut hello = Hello {
        version: PROTOCOL_VERSION,
        depth,
        max_bulk: config.slot_size as u32,
        capability: capability.to_bytes(),
        endpoint: qp.endpoint(),
        proof: Vec::new(),
    };
    // Without the holder key the hello goes unproved, and the server says why it refuses.
    hello.proof = capability
        .prove(&hello.proof_message(&challenge))?
        .unwrap_or_default();
    hello.write(&mut stream).map_err(|e| io("send hello", e))?;
    let (depth, max_bulk, endpoint) = match Answer::read(&mut stream) {
        Ok(Answer::Accept {
            depth: d,
            max_bulk,
            endpoint,
        }) if d >= 1 && d <= depth && max_bulk > 0 => (d, max_bulk as usize, endpoint),
        Ok(Answer::Accept { .. }) => {
            return Err(SessionError::Protocol {
                peer,
                detail: "server accepted with an impossible depth or bulk size".into(),
            });
        }
        Ok(Answer::Refuse { reason }) => return Err(SessionError::Refused { peer, reason }),
        Err(e) => return Err(io("read answer", e)),
    };
    shared.windows.acquire(u64::from(depth), Some(deadline))?;
    let link = match Link::new(
        shared.clone(),
        peer,
        qp,
        cq,
        block,
        depth,
        max_bulk.min(config.slot_size),
    ) {
        Ok(link) => link,
        Err(e) => {
            shared.windows.release(u64::from(depth));
            return Err(e);
        }
    };
    for i in 0..depth {
        link.post_recv(i)?;
    }
    link.qp().modify(QpTransition::Rtr { remote: endpoint })?;
    link.qp().modify(QpTransition::Rts)?;
    stream
        .write_all(&[READY])
        .map_err(|e| io("send ready", e))?;
    let mut ready = [0u8];
    stream
        .read_exact(&mut ready)
        .map_err(|e| io("read ready", e))?;
    if ready[0] != READY {
        return Err(SessionError::Protocol {
            peer,
            detail: "server did not confirm the connection".into(),
        });
    }
    Ok(link)
}
