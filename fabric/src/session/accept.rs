//! The server's side of the connection handshake (steps in [`super::handshake`]): everything a
//! worker says is checked — protocol version, capability signature, key and expiry, tenant
//! quarantine, connection limits — *before* a QP or a buffer is created for it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};

use super::agent::holder_proved;
use super::bounce::BounceReleaser;
use super::capability::{Capability, SignedCapability, unix_now};
use super::error::SessionError;
use super::lock;
use super::server_conn::{Death, ServerConn, ServerShared};
use super::stats::bump;
use super::wire::{Answer, CONTROL_SLOT, Challenge, Hello, PROTOCOL_VERSION, READY};
use super::worker::MAX_PUSHES;
use crate::provider::{QueuePair, RdmaDevice};
use crate::verbs::{Access, QpCaps, QpTransition};

pub(crate) fn refuse<D: RdmaDevice>(
    shared: &ServerShared<D>,
    stream: &mut TcpStream,
    reason: &str,
) -> std::io::Result<()> {
    bump(&shared.counters.refused_handshakes);
    let peer = stream.peer_addr().ok();
    tracing::warn!(?peer, reason, "refused a session handshake");
    Answer::Refuse {
        reason: reason.into(),
    }
    .write(stream)
}

const NO_PROOF: &str = "no proof of holding the capability's key: a capability taken off the \
    wire cannot be presented; the worker needs the token as the node agent issued it (its \
    capability file)";
const WRONG_PROOF: &str = "the proof does not verify for the capability's holder key (a \
    capability presented by someone it was not issued to)";

/// A connection counted against the server's and its tenant's limits from the moment it is
/// admitted until it is in the connection table (or its handshake failed): the check and the
/// count are one step under one lock, so concurrent handshakes cannot pass the check together.
struct Admission<'a, D: RdmaDevice> {
    shared: &'a ServerShared<D>,
    tenant: String,
}

impl<'a, D: RdmaDevice> Admission<'a, D> {
    fn take(shared: &'a ServerShared<D>, tenant: &str) -> Result<Self, String> {
        let mut admitting = lock(&shared.admitting);
        let conns = shared.conns.read().unwrap_or_else(PoisonError::into_inner);
        let config = &shared.config;
        if conns.len() + admitting.len() >= config.max_connections {
            return Err(format!(
                "the server has its maximum of {} connections",
                config.max_connections
            ));
        }
        let mine = conns.values().filter(|c| c.claims.tenant == tenant).count()
            + admitting.iter().filter(|t| *t == tenant).count();
        if mine >= config.max_connections_per_tenant {
            return Err(format!(
                "tenant {tenant:?} has its maximum of {} connections",
                config.max_connections_per_tenant
            ));
        }
        admitting.push(tenant.to_string());
        Ok(Admission {
            shared,
            tenant: tenant.to_string(),
        })
    }
}

impl<D: RdmaDevice> Drop for Admission<'_, D> {
    fn drop(&mut self) {
        let mut admitting = lock(&self.shared.admitting);
        if let Some(i) = admitting.iter().position(|t| *t == self.tenant) {
            admitting.swap_remove(i);
        }
    }
}

/// Checks a hello, answering `challenge`, before anything is created for it; the admission
/// holds the connection's place under the limits until it is in the table.
fn admit<'a, D: RdmaDevice>(
    shared: &'a ServerShared<D>,
    hello: &Hello,
    challenge: &Challenge,
) -> Result<(Capability, Admission<'a, D>), String> {
    if hello.version != PROTOCOL_VERSION {
        return Err(format!(
            "session protocol version {} is not supported (this server speaks {PROTOCOL_VERSION})",
            hello.version
        ));
    }
    let cap = SignedCapability::from_bytes(&hello.capability).map_err(|e| e.to_string())?;
    let unix_time = unix_now();
    let config = &shared.config;
    let claims = shared
        .trusted
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .verify(&cap, unix_time, config.clock_skew)
        .map_err(|e| e.to_string())?;
    claims
        .check_lifetime(unix_time, config.max_capability_lifetime, config.clock_skew)
        .map_err(|e| e.to_string())?;
    if hello.proof.is_empty() {
        return Err(NO_PROOF.into());
    }
    if !holder_proved(
        &claims.holder,
        &hello.proof_message(challenge),
        &hello.proof,
    ) {
        return Err(WRONG_PROOF.into());
    }
    let key = (claims.tenant.clone(), claims.volume.clone());
    let now = shared.config.clock.now();
    if let Some((left, errors)) = lock(&shared.quarantine)
        .get(&key)
        .and_then(|q| q.active(now))
    {
        return Err(format!(
            "tenant {:?} volume {:?} is quarantined after {errors} RDMA access errors; retry in {left:?}",
            claims.tenant, claims.volume
        ));
    }
    if shared.shutdown.load(Ordering::Acquire) {
        return Err("the server is shutting down".into());
    }
    if hello.depth == 0 || hello.max_bulk == 0 {
        return Err("depth and bulk size must be positive".into());
    }
    let admission = Admission::take(shared, &claims.tenant)?;
    Ok((claims, admission))
}

/// Creates the connection's QP (RTR, receives posted) and buffers.
fn setup<D: RdmaDevice>(
    shared: &ServerShared<D>,
    hello: &Hello,
    claims: Capability,
    peer: SocketAddr,
) -> Result<ServerConn<D>, SessionError> {
    let depth = hello.depth.min(shared.config.max_depth);
    let max_bulk = (hello.max_bulk as usize).min(shared.config.max_bulk);
    let control = shared.device.reg_mr(
        &shared.pd,
        2 * usize::from(depth) * CONTROL_SLOT,
        Access::LOCAL_WRITE,
    )?;
    let qp = shared.device.create_qp(
        &shared.pd,
        &shared.cq,
        &shared.cq,
        QpCaps {
            max_send_wr: u32::from(depth) * (MAX_PUSHES + 2) + 16,
            max_recv_wr: u32::from(depth),
        },
    )?;
    // The server's QP serves no RDMA at all.
    qp.modify(QpTransition::Init {
        access: Access::NONE,
    })?;
    let id = shared.next_conn.fetch_add(1, Ordering::AcqRel) & 0xff_ffff;
    let conn = ServerConn {
        qp,
        control,
        id,
        depth,
        max_bulk,
        claims,
        peer,
        last_id: AtomicU64::new(0),
        last_rkey: AtomicU32::new(0),
        dead: AtomicBool::new(false),
        outstanding: AtomicU32::new(0),
        answering: (0..depth).map(|_| AtomicBool::new(false)).collect(),
        share: Default::default(),
        releaser: BounceReleaser {
            states: shared.bounce_state.clone(),
            conn: id,
        },
    };
    for i in 0..depth {
        conn.post_recv(i)?;
    }
    QueuePair::<D>::modify(
        &conn.qp,
        QpTransition::Rtr {
            remote: hello.endpoint.clone(),
        },
    )?;
    Ok(conn)
}

/// Serves one handshake (see [`super::handshake`] for the steps).
pub(crate) fn accept<D: RdmaDevice>(shared: &Arc<ServerShared<D>>, mut stream: TcpStream) {
    let limit = Some(shared.config.handshake_timeout);
    let peer = match stream.peer_addr() {
        Ok(peer) => peer,
        Err(_) => return,
    };
    if stream.set_read_timeout(limit).is_err()
        || stream.set_write_timeout(limit).is_err()
        || stream.set_nodelay(true).is_err()
    {
        return;
    }
    let challenge = Challenge(rand::random());
    if challenge.write(&mut stream).is_err() {
        return;
    }
    let hello = match Hello::read(&mut stream) {
        Ok(hello) => hello,
        Err(e) => {
            // Also the shutdown wake-up connection.
            tracing::debug!(%peer, error = %e, "unreadable session hello");
            return;
        }
    };
    let (claims, _admission) = match admit(shared, &hello, &challenge) {
        Ok(admitted) => admitted,
        Err(reason) => {
            let _ = refuse(shared, &mut stream, &reason);
            return;
        }
    };
    let conn = match setup(shared, &hello, claims, peer) {
        Ok(conn) => conn,
        Err(e) => {
            let reason = format!("the server could not set up a QP: {e}");
            let _ = refuse(shared, &mut stream, &reason);
            return;
        }
    };
    let answer = Answer::Accept {
        depth: conn.depth,
        max_bulk: conn.max_bulk as u32,
        endpoint: conn.qp.endpoint(),
    };
    let mut ready = [0u8];
    if answer.write(&mut stream).is_err()
        || stream.read_exact(&mut ready).is_err()
        || ready[0] != READY
        || conn.qp.modify(QpTransition::Rts).is_err()
        || shared.shutdown.load(Ordering::Acquire)
    {
        return;
    }
    let conn = Arc::new(conn);
    shared
        .conns
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(conn.id, conn.clone());
    bump(&shared.counters.connections);
    if stream.write_all(&[READY]).is_err() {
        shared.conn_failed(&conn, Death::Protocol("handshake not confirmed"));
        shared.remove_if_done(&conn);
    }
}
