//! The server's side of each connection and the completion dispatch of the server's shared CQ:
//! request arrival (replay and rights checks, before any RMA), RMA and reply completions, and
//! the death of a connection's QP.
//!
//! Work-request ids: kind (8 bits), connection id (24), buffer index (16: receive buffer or
//! bounce buffer), bounce epoch (16), so a late completion never touches a reused bounce buffer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::Thread;
use std::time::Instant;

use super::bounce::{BounceReleaser, BounceStates};
use super::capability::Capability;
use super::handler::Handler;
use super::policy::Quarantine;
use super::pool::SlotPool;
use super::router::{Router, post_patiently};
use super::server::ServerConfig;
use super::stats::{ServerCounters, bump};
use super::wire::{
    CONTROL_SLOT, LeaseRight, REQUEST_HEADER_LEN, ReplyHeader, ReplyStatus, RequestHeader,
};
use super::worker::Job;
use super::{lock, unpark_after};
use crate::keys::key_index;
use crate::provider::{MemoryRegion, QueuePair, RdmaDevice};
use crate::verbs::{QpTransition, RecvWr, SendOp, SendWr, Sge, WcStatus, WorkCompletion};

pub(crate) const RECV: u64 = 1;
pub(crate) const READ: u64 = 2;
pub(crate) const WRITE: u64 = 3;
pub(crate) const REPLY: u64 = 4;
/// Buffer index meaning "no bounce buffer".
pub(crate) const NO_BOUNCE: u16 = u16::MAX;

pub(crate) fn wr_id(kind: u64, conn: u32, index: u16, epoch: u16) -> u64 {
    (kind << 56) | (u64::from(conn & 0xff_ffff) << 32) | (u64::from(index) << 16) | u64::from(epoch)
}

fn wr_parts(id: u64) -> (u64, u32, u16, u16) {
    (
        id >> 56,
        ((id >> 32) & 0xff_ffff) as u32,
        (id >> 16) as u16,
        id as u16,
    )
}

/// A connection as the server keeps it. Field order is drop order: QP before its buffers.
#[derive(Debug)]
pub(crate) struct ServerConn<D: RdmaDevice> {
    pub qp: D::Qp,
    /// `depth` receive buffers, then `depth` reply buffers (LOCAL_WRITE only).
    pub control: D::Mr,
    pub id: u32,
    pub depth: u16,
    pub max_bulk: usize,
    pub claims: Capability,
    pub peer: SocketAddr,
    pub last_id: AtomicU64,
    pub last_rkey: AtomicU32,
    pub dead: AtomicBool,
    /// Signaled work requests posted and not yet completed.
    pub outstanding: AtomicU32,
    /// Per tag, whether a request on it is being answered: its reply slot then has one writer,
    /// the worker answering it, until the reply is written. A client reuses a tag only once its
    /// reply arrived; a second request on a busy tag is a protocol error that kills the
    /// connection (two workers would write one reply slot at once).
    pub answering: Vec<AtomicBool>,
    /// This connection's share of the workers (see [`ServerShared::claim`]).
    pub share: Mutex<Share<D>>,
    /// Last, so it runs after the QP is destroyed (used only for its `Drop`).
    #[allow(dead_code)]
    pub releaser: BounceReleaser<D::Mr>,
}

impl<D: RdmaDevice> ServerConn<D> {
    pub fn recv_offset(&self, i: u16) -> usize {
        i as usize * CONTROL_SLOT
    }

    pub fn reply_offset(&self, tag: u16) -> usize {
        (self.depth + tag) as usize * CONTROL_SLOT
    }

    pub fn post_recv(&self, i: u16) -> crate::Result<()> {
        self.qp.post_recv(RecvWr {
            wr_id: wr_id(RECV, self.id, i, 0),
            sge: Some(Sge {
                mr: &self.control,
                offset: self.recv_offset(i),
                len: CONTROL_SLOT,
            }),
        })
    }
}

/// The jobs of one connection that hold a worker or a place in the queue, and those waiting
/// for one of them to end.
pub(crate) struct Share<D: RdmaDevice> {
    claimed: usize,
    waiting: std::collections::VecDeque<Job<D>>,
}

impl<D: RdmaDevice> std::fmt::Debug for Share<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Share")
            .field("claimed", &self.claimed)
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

impl<D: RdmaDevice> Default for Share<D> {
    fn default() -> Self {
        Share {
            claimed: 0,
            waiting: std::collections::VecDeque::new(),
        }
    }
}

/// The request an idle worker found while polling, which it runs itself.
pub(crate) type OwnJob<D> = std::cell::RefCell<Option<Job<D>>>;

/// Queued requests and the workers waiting for one.
#[derive(Debug)]
pub(crate) struct Jobs<D: RdmaDevice> {
    pub queue: std::collections::VecDeque<Job<D>>,
    pub idle: Vec<Thread>,
}

/// Everything the server's threads share. Field order is drop order.
pub(crate) struct ServerShared<D: RdmaDevice> {
    pub config: ServerConfig,
    pub handler: Box<dyn Handler>,
    pub trusted: RwLock<super::agent::TrustedAgents>,
    pub conns: RwLock<HashMap<u32, Arc<ServerConn<D>>>>,
    /// Tenants of handshakes admitted and not yet in `conns` (see `accept::Admission`).
    pub admitting: Mutex<Vec<String>>,
    pub next_conn: AtomicU32,
    pub jobs: Mutex<Jobs<D>>,
    pub queued: AtomicUsize,
    pub router: Router<D::Cq>,
    pub bounce: Arc<SlotPool<D::Mr>>,
    pub bounce_state: BounceStates<D::Mr>,
    /// Workers waiting for a bounce buffer (woken when one comes back).
    pub bounce_waiters: AtomicUsize,
    pub bodies: Mutex<Vec<Vec<u8>>>,
    pub counters: ServerCounters,
    pub quarantine: Mutex<HashMap<(String, String), Quarantine>>,
    pub shutdown: Arc<AtomicBool>,
    pub handshakes: AtomicUsize,
    /// Test hook: every reply is sent twice ([`super::SessionServer::duplicate_replies`]).
    #[cfg(feature = "testing")]
    pub duplicate_replies: AtomicBool,
    pub cq: D::Cq,
    pub pd: D::Pd,
    pub device: D,
}

impl<D: RdmaDevice> std::fmt::Debug for ServerShared<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerShared")
            .field("config", &self.config)
            .field("counters", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

/// Why a connection died.
#[derive(Debug)]
pub(crate) enum Death {
    /// An RMA or SEND_WITH_INV was refused by the worker's NIC checks.
    Access(WcStatus),
    /// The worker broke the protocol.
    Protocol(&'static str),
    /// The transport broke or the worker went away.
    Transport(WcStatus),
}

impl<D: RdmaDevice> ServerShared<D> {
    fn conn(&self, id: u32) -> Option<Arc<ServerConn<D>>> {
        self.conns
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// Handles one completion of the shared CQ. `own` is the slot of an idle worker polling:
    /// the first request it finds is its own to run, with no hand-off to another thread.
    pub fn dispatch(&self, wc: &WorkCompletion, own: Option<&OwnJob<D>>) {
        let (kind, conn_id, index, epoch) = wr_parts(wc.wr_id);
        let conn = self.conn(conn_id);
        match kind {
            RECV => {
                let Some(conn) = conn else { return };
                if wc.status == WcStatus::Success {
                    self.on_request(&conn, index, wc.byte_len as usize, own);
                } else {
                    self.conn_failed(&conn, Death::Transport(wc.status));
                }
                self.remove_if_done(&conn);
                return;
            }
            READ => {
                if let Some(state) = self.bounce_state.get(index as usize) {
                    let mut st = lock(state);
                    if st.epoch == epoch && st.owner == conn_id {
                        st.read_done = Some(wc.status);
                        unpark_after(st, |st| st.waiter.clone());
                    }
                }
                if let Some(c) = &conn {
                    c.outstanding.fetch_sub(1, Ordering::AcqRel);
                }
            }
            REPLY => {
                self.release_bounce(index, epoch, conn_id);
                if let Some(c) = &conn {
                    c.outstanding.fetch_sub(1, Ordering::AcqRel);
                }
            }
            _ => {}
        }
        if let Some(conn) = conn {
            match wc.status {
                WcStatus::Success => {}
                WcStatus::RemAccessErr | WcStatus::RemInvReqErr => {
                    self.conn_failed(&conn, Death::Access(wc.status));
                }
                other => self.conn_failed(&conn, Death::Transport(other)),
            }
            self.remove_if_done(&conn);
        }
    }

    pub fn release_bounce(&self, index: u16, epoch: u16, owner: u32) {
        if let Some(state) = self.bounce_state.get(index as usize) {
            let slot = {
                let mut st = lock(state);
                if st.epoch != epoch || st.owner != owner {
                    return;
                }
                st.held.take()
            };
            if slot.is_some() {
                drop(slot);
                if self.bounce_waiters.load(Ordering::Acquire) > 0 {
                    self.router.wake_all();
                }
            }
        }
    }

    /// A request arrived in receive buffer `recv`: parse, check the request id and rights
    /// (refusing without any RMA), then queue it for a worker.
    fn on_request(
        &self,
        conn: &Arc<ServerConn<D>>,
        recv: u16,
        byte_len: usize,
        own: Option<&OwnJob<D>>,
    ) {
        let mut raw = [0u8; REQUEST_HEADER_LEN];
        let offset = conn.recv_offset(recv);
        // SAFETY: receive slot `recv` is this dispatch's until it posts it again (below).
        let header = unsafe { conn.control.read_at(offset, &mut raw) }
            .ok()
            .and_then(|()| RequestHeader::decode(&raw));
        let Some(header) = header
            .filter(|h| h.tag < conn.depth && REQUEST_HEADER_LEN + h.msg_len as usize <= byte_len)
        else {
            self.conn_failed(conn, Death::Protocol("malformed request"));
            return;
        };
        if conn.answering[header.tag as usize].swap(true, Ordering::AcqRel) {
            self.conn_failed(
                conn,
                Death::Protocol("a request on a tag still being answered"),
            );
            return;
        }
        let mut body = lock(&self.bodies).pop().unwrap_or_default();
        body.clear();
        body.resize(header.msg_len as usize, 0);
        // SAFETY: as above; the slot is posted again only after this copy.
        let read = unsafe { conn.control.read_at(offset + REQUEST_HEADER_LEN, &mut body) };
        if read.is_err() || conn.post_recv(recv).is_err() {
            self.conn_failed(conn, Death::Protocol("request buffer unusable"));
            return;
        }
        let last = conn.last_id.load(Ordering::Acquire);
        if header.request_id <= last {
            bump(&self.counters.replays_refused);
            let reason = format!(
                "replayed or old request id {} (this connection already accepted id {last}); \
                 nothing was done",
                header.request_id
            );
            self.queue(conn, header, body, Some(reason), own);
            return;
        }
        conn.last_id.store(header.request_id, Ordering::Release);
        let refusal = self
            .expiry_refusal(conn)
            .or_else(|| self.lease_refusal(conn, &header));
        if refusal.is_some() {
            bump(&self.counters.requests_refused);
        }
        self.queue(conn, header, body, refusal, own);
    }

    /// The most workers one connection's jobs may hold (or be queued for) at once: all but
    /// one. A worker answering a request waits on its connection's link (its RMA, its reply);
    /// a client behind a slow link would otherwise hold every worker, and every other client
    /// would wait behind it (docs/fabric.md, "A worker for the others").
    fn share_cap(&self) -> usize {
        self.config.workers.saturating_sub(1).max(1)
    }

    /// Takes one of `job`'s connection's claims on the workers and gives the job back, or, the
    /// connection having its share, keeps it until one of its claims ends.
    pub fn claim(&self, job: Job<D>) -> Option<Job<D>> {
        let conn = job.conn.clone();
        let mut share = lock(&conn.share);
        if share.claimed < self.share_cap() && share.waiting.is_empty() {
            share.claimed += 1;
            return Some(job);
        }
        share.waiting.push_back(job);
        None
    }

    /// One of `conn`'s jobs ended: its claim passes to the connection's next waiting job, which
    /// is returned to be run, or is given back.
    pub fn release(&self, conn: &ServerConn<D>) -> Option<Job<D>> {
        let mut share = lock(&conn.share);
        let next = share.waiting.pop_front();
        if next.is_none() {
            share.claimed -= 1;
        }
        next
    }

    /// Hands a request (or its refusal, which must not be posted from the poller) to a worker:
    /// the polling one if it has none yet, else the queue, waking an idle worker.
    fn queue(
        &self,
        conn: &Arc<ServerConn<D>>,
        header: RequestHeader,
        body: Vec<u8>,
        refusal: Option<String>,
        own: Option<&OwnJob<D>>,
    ) {
        let job = Job {
            conn: conn.clone(),
            header,
            body,
            refusal,
        };
        let Some(job) = self.claim(job) else {
            return;
        };
        let job = match own {
            Some(slot) if slot.borrow().is_none() => {
                *slot.borrow_mut() = Some(job);
                return;
            }
            _ => job,
        };
        self.enqueue(job);
    }

    /// Puts a claimed job in the queue, waking an idle worker.
    pub fn enqueue(&self, job: Job<D>) {
        let mut jobs = lock(&self.jobs);
        jobs.queue.push_back(job);
        self.queued.fetch_add(1, Ordering::AcqRel);
        // Not the polling worker itself: it is about to run its own job.
        let me = std::thread::current().id();
        let idle = jobs
            .idle
            .iter()
            .rposition(|t| t.id() != me)
            .map(|i| jobs.idle.swap_remove(i));
        // Unparked after the lock is released: the woken worker takes it first.
        drop(jobs);
        if let Some(t) = idle {
            t.unpark();
        }
    }

    /// A connection outlives the handshake that checked its capability, but not the
    /// capability: past its expiry every request is refused, and the worker reconnects with
    /// the one its node agent renewed (the client moves to it before this happens).
    fn expiry_refusal(&self, conn: &ServerConn<D>) -> Option<String> {
        let skew = self.config.clock_skew;
        let now = super::capability::unix_now();
        conn.claims.expired_at(now, skew).then(|| {
            format!(
                "the connection's capability expired at unix time {} (server time {now}, \
                 allowed skew {} s); reconnect with a fresh one",
                conn.claims.not_after,
                skew.as_secs()
            )
        })
    }

    fn lease_refusal(&self, conn: &ServerConn<D>, header: &RequestHeader) -> Option<String> {
        let lease = header.lease?;
        let rights = conn.claims.rights;
        match lease.right {
            LeaseRight::RemoteRead if !rights.write => {
                return Some("the capability grants no write access to the volume".into());
            }
            LeaseRight::RemoteWrite if !rights.read => {
                return Some("the capability grants no read access to the volume".into());
            }
            _ => {}
        }
        if lease.len == 0 || lease.len as usize > conn.max_bulk {
            return Some(format!(
                "bulk of {} bytes outside 1..={} (the connection's maximum)",
                lease.len, conn.max_bulk
            ));
        }
        None
    }

    /// Replies `Refused` with `reason`; no RMA is done and the window is left to the worker.
    pub fn refuse(&self, conn: &ServerConn<D>, header: &RequestHeader, reason: &str) {
        let reply = ReplyHeader {
            status: ReplyStatus::Refused,
            tag: header.tag,
            request_id: header.request_id,
            bulk_len: 0,
            msg_len: reason.len() as u32,
        };
        self.send_reply(conn, &reply, reason.as_bytes(), None, (NO_BOUNCE, 0));
    }

    /// Writes and posts a reply (SEND_WITH_INV when `invalidate` names a window).
    pub fn send_reply(
        &self,
        conn: &ServerConn<D>,
        header: &ReplyHeader,
        body: &[u8],
        invalidate: Option<u32>,
        bounce: (u16, u16),
    ) {
        let offset = conn.reply_offset(header.tag);
        // SAFETY: the reply slot of tag `header.tag` belongs to the request being answered,
        // which one worker handles: `on_request` kills a connection that sends a second
        // request on the tag before `answering` is cleared (below, once the reply is written).
        let written = unsafe {
            conn.control
                .write_at(offset, &header.encode())
                .and_then(|()| {
                    conn.control
                        .write_at(offset + super::wire::REPLY_HEADER_LEN, body)
                })
        };
        // Done writing: from here the slot's bytes are the SEND's (DMA), and the tag may carry
        // the client's next request as soon as the reply reaches it, which can be before
        // `post_patiently` returns.
        conn.answering[header.tag as usize].store(false, Ordering::Release);
        let sge = Some(Sge {
            mr: &conn.control,
            offset,
            len: super::wire::REPLY_HEADER_LEN + body.len(),
        });
        let op = || match invalidate {
            Some(rkey) => SendOp::SendWithInv {
                sge,
                invalidate_rkey: rkey,
            },
            None => SendOp::Send { sge },
        };
        conn.outstanding.fetch_add(1, Ordering::AcqRel);
        let deadline = Instant::now() + self.config.rma_timeout;
        let dispatch = |wc: &WorkCompletion| self.dispatch(wc, None);
        let posted = written.and_then(|()| {
            post_patiently::<D>(&self.router, &conn.qp, deadline, &dispatch, || SendWr {
                wr_id: wr_id(REPLY, conn.id, bounce.0, bounce.1),
                op: op(),
                signaled: true,
            })
        });
        if posted.is_err() {
            conn.outstanding.fetch_sub(1, Ordering::AcqRel);
            self.release_bounce(bounce.0, bounce.1, conn.id);
            self.conn_failed(conn, Death::Protocol("posting a reply failed"));
        }
        #[cfg(feature = "testing")]
        if posted.is_ok() && self.duplicate_replies.load(Ordering::Acquire) {
            // A broken server's second SEND of the reply (no invalidation, no bounce).
            conn.outstanding.fetch_add(1, Ordering::AcqRel);
            let again =
                post_patiently::<D>(&self.router, &conn.qp, deadline, &dispatch, || SendWr {
                    wr_id: wr_id(REPLY, conn.id, NO_BOUNCE, 0),
                    op: SendOp::Send { sge },
                    signaled: true,
                });
            if again.is_err() {
                conn.outstanding.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Kills a connection's QP (once), counts and logs why; an access error also feeds the
    /// tenant's quarantine.
    pub fn conn_failed(&self, conn: &ServerConn<D>, death: Death) {
        if conn.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = conn.qp.modify(QpTransition::Error);
        let (tenant, volume) = (&conn.claims.tenant, &conn.claims.volume);
        match death {
            Death::Access(status) => {
                bump(&self.counters.access_errors);
                tracing::warn!(
                    tenant = %tenant,
                    volume = %volume,
                    peer = %conn.peer,
                    qp = conn.qp.qp_num(),
                    rkey_index = key_index(conn.last_rkey.load(Ordering::Acquire)),
                    ?status,
                    "RDMA access error: the worker's NIC refused our access; connection QP killed"
                );
                let now = self.config.clock.now();
                let key = (tenant.clone(), volume.clone());
                if lock(&self.quarantine)
                    .entry(key)
                    .or_default()
                    .record(&self.config.quarantine, now)
                {
                    bump(&self.counters.quarantines);
                    tracing::warn!(
                        tenant = %tenant,
                        volume = %volume,
                        duration = ?self.config.quarantine.duration,
                        "tenant volume quarantined after repeated RDMA access errors"
                    );
                }
            }
            Death::Protocol(what) => {
                bump(&self.counters.protocol_errors);
                tracing::warn!(tenant = %tenant, peer = %conn.peer, what, "protocol error; connection QP killed");
            }
            Death::Transport(status) => {
                tracing::debug!(tenant = %tenant, peer = %conn.peer, ?status, "connection closed");
            }
        }
    }

    /// Drops a dead connection from the table once nothing it posted is outstanding.
    pub fn remove_if_done(&self, conn: &ServerConn<D>) {
        if conn.dead.load(Ordering::Acquire) && conn.outstanding.load(Ordering::Acquire) == 0 {
            self.conns
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&conn.id);
        }
    }
}
