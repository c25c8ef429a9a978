//! One established QP of a connection and the calls riding on it.
//!
//! A link has `depth` call contexts. Context `i` owns memory window `i`, send buffer `i` of the
//! connection's control block, and is the request's `tag`, so replies are demultiplexed by tag
//! and request id, and completions by work-request id, without a table lookup. Whoever waits
//! polls (see [`Router`]); a completion for another thread's call wakes exactly that thread.
//!
//! Lease rules (module [`lease`](super::lease)): a window is bound just before its request is
//! sent and invalidated after the reply (by the server's SEND_WITH_INV, or our LOCAL_INV). A
//! call that times out revokes its window with LOCAL_INV *before* its buffer slot goes back to
//! the pool; if that fails the QP is killed and the slot stays with the link until the QP is
//! destroyed. Either way a late RMA finds a dead window, never a reused buffer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::error::SessionError;
use super::lease::{KeyRotation, ScopedRkey};
use super::pool::Slot;
use super::router::{Router, post_patiently};
use super::tenant::SessionShared;
use super::wire::{CONTROL_SLOT, ReplyHeader};
use crate::provider::{MemoryRegion, MemoryWindow, QueuePair, RdmaDevice, SendWrOf};
use crate::verbs::{QpState, RecvWr, Sge, WcStatus};

use super::lock;

mod call;
mod events;
mod revoke;

/// How long a timed-out call waits for the LOCAL_INV that revokes its window.
const REVOKE_WAIT: Duration = Duration::from_secs(2);
/// A link without replies for this long is checked with its QP's state before use.
const QUIET_NS: u64 = 1_000_000;
/// One request SEND in this many is signaled, so a hardware send queue gets its slots back.
const SIGNAL_EVERY: u64 = 16;

/// Work-request kinds (top byte of the wr_id; then a 16-bit index, then 40 bits of generation).
const RECV: u64 = 1;
const SEND: u64 = 2;
const BIND: u64 = 3;
const INV: u64 = 4;

fn wr_id(kind: u64, index: u16, low: u64) -> u64 {
    (kind << 56) | (u64::from(index) << 40) | (low & ((1 << 40) - 1))
}

fn wr_parts(wr_id: u64) -> (u64, u16, u64) {
    (wr_id >> 56, (wr_id >> 40) as u16, wr_id & ((1 << 40) - 1))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    InFlight,
    /// Timed out; its window is being revoked.
    Revoking,
    /// Timed out and revoked (or the QP killed); waiting for the late reply or the QP's end.
    Parked,
}

#[derive(Debug)]
enum Outcome {
    Reply {
        recv: u16,
        byte_len: u32,
        header: ReplyHeader,
        invalidated: Option<u32>,
    },
    Failed,
}

#[derive(Debug)]
struct CtxState<M: MemoryRegion> {
    phase: Phase,
    request_id: u64,
    waiter: Option<Thread>,
    outcome: Option<Outcome>,
    /// The current request's reply has come: a second one (a broken server's) is dropped,
    /// its receive slot posted again, instead of taking the first one's place.
    answered: bool,
    rotation: KeyRotation,
    /// Outcome of the LOCAL_INV of the current binding.
    inv: Option<WcStatus>,
    /// The window of this timed-out call was revoked; a late RMA is expected.
    revoked: bool,
    /// A slot that may still be written by a late RMA: freed with the link.
    parked_slot: Option<Slot<M>>,
}

#[derive(Debug)]
struct CallCtx<D: RdmaDevice> {
    window: D::Mw,
    state: Mutex<CtxState<D::Mr>>,
}

/// Why the QP failed, as classified once.
#[derive(Clone, Debug)]
enum Failure {
    Access(String),
    LateRma(String),
    Lost(String),
}

/// An established QP with its call contexts. Field order is drop order: the QP is destroyed
/// before windows and slots are released.
pub(crate) struct Link<D: RdmaDevice> {
    qp: D::Qp,
    router: Router<D::Cq>,
    ctxs: Box<[CallCtx<D>]>,
    block: Slot<D::Mr>,
    shared: Arc<SessionShared<D>>,
    peer: SocketAddr,
    qp_num: u32,
    depth: u16,
    max_bulk: usize,
    free: Mutex<Vec<u16>>,
    freed: Condvar,
    next_id: Mutex<u64>,
    sends: AtomicU64,
    dead: AtomicBool,
    access_status: AtomicBool,
    revoked: AtomicU32,
    parked: AtomicU32,
    failure: OnceLock<Failure>,
    reported: AtomicBool,
    /// When the link was made, and the last reply after it (nanoseconds): a link that replied
    /// just now is known alive without asking the QP (`ibv_query_qp` is a system call).
    born: Instant,
    last_reply: AtomicU64,
}

impl<D: RdmaDevice> std::fmt::Debug for Link<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("peer", &self.peer)
            .field("qp_num", &self.qp_num)
            .field("depth", &self.depth)
            .field("dead", &self.dead.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A call's hold on its context and slot; frees the context unless it was parked.
struct CallGuard<'a, D: RdmaDevice> {
    link: &'a Link<D>,
    idx: u16,
    slot: Option<Slot<D::Mr>>,
    lease: Option<ScopedRkey>,
    parked: bool,
}

impl<D: RdmaDevice> Drop for CallGuard<'_, D> {
    fn drop(&mut self) {
        if !self.parked {
            self.link.free_ctx(self.idx);
        }
    }
}

impl<D: RdmaDevice> Link<D> {
    /// A link over `qp` (INIT, not yet connected) with `depth` contexts.
    pub fn new(
        shared: Arc<SessionShared<D>>,
        peer: SocketAddr,
        qp: D::Qp,
        cq: D::Cq,
        block: Slot<D::Mr>,
        depth: u16,
        max_bulk: usize,
    ) -> Result<Link<D>, SessionError> {
        let mut ctxs = Vec::with_capacity(depth as usize);
        for _ in 0..depth {
            let window = shared.device.alloc_mw(&shared.pd)?;
            let rotation = KeyRotation::new(window.rkey());
            ctxs.push(CallCtx {
                window,
                state: Mutex::new(CtxState {
                    phase: Phase::Idle,
                    request_id: 0,
                    waiter: None,
                    outcome: None,
                    answered: false,
                    rotation,
                    inv: None,
                    revoked: false,
                    parked_slot: None,
                }),
            });
        }
        Ok(Link {
            qp_num: qp.qp_num(),
            qp,
            router: Router::new(cq),
            ctxs: ctxs.into_boxed_slice(),
            block,
            shared,
            peer,
            depth,
            max_bulk,
            free: Mutex::new((0..depth).rev().collect()),
            freed: Condvar::new(),
            next_id: Mutex::new(0),
            sends: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            access_status: AtomicBool::new(false),
            revoked: AtomicU32::new(0),
            parked: AtomicU32::new(0),
            failure: OnceLock::new(),
            reported: AtomicBool::new(false),
            born: Instant::now(),
            last_reply: AtomicU64::new(0),
        })
    }

    pub fn qp(&self) -> &D::Qp {
        &self.qp
    }

    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn recv_offset(&self, i: u16) -> usize {
        self.block.offset() + i as usize * CONTROL_SLOT
    }

    fn send_offset(&self, i: u16) -> usize {
        self.block.offset() + (self.shared.config.depth + i) as usize * CONTROL_SLOT
    }

    /// Posts (or re-posts) receive buffer `i`.
    pub fn post_recv(&self, i: u16) -> Result<(), SessionError> {
        let sge = Sge {
            mr: self.block.mr(),
            offset: self.recv_offset(i),
            len: CONTROL_SLOT,
        };
        self.qp.post_recv(RecvWr {
            wr_id: wr_id(RECV, i, 0),
            sge: Some(sge),
        })?;
        Ok(())
    }

    fn repost(&self, i: u16) {
        if let Err(e) = self.post_recv(i) {
            self.fail(None, &format!("re-posting a receive failed: {e}"));
        }
    }

    /// Whether calls may use this link.
    pub fn alive(&self) -> bool {
        if self.dead.load(Ordering::Acquire) {
            return false;
        }
        // A link busy with replies learns of its death from its completions; one that went quiet
        // may have died meanwhile (a peer gone, a late RMA refused): ask its QP.
        let now = self.born.elapsed().as_nanos() as u64;
        let quiet = now.saturating_sub(self.last_reply.load(Ordering::Relaxed)) > QUIET_NS;
        !quiet || self.qp.state() != QpState::Error
    }

    /// Posts a send work request, waiting while the send queue is full.
    fn post<'a>(
        &self,
        deadline: Instant,
        make: impl Fn() -> SendWrOf<'a, D>,
    ) -> Result<(), SessionError> {
        post_patiently::<D>(
            &self.router,
            &self.qp,
            deadline,
            &|wc| self.dispatch(wc),
            make,
        )?;
        Ok(())
    }

    /// Notes a reply (called by the poller).
    fn replied(&self) {
        let now = self.born.elapsed().as_nanos() as u64;
        self.last_reply.store(now, Ordering::Relaxed);
    }

    fn take_ctx(&self, deadline: Instant, started: Instant) -> Result<u16, SessionError> {
        let mut free = lock(&self.free);
        loop {
            if self.dead.load(Ordering::Acquire) {
                return Err(self.failure_error());
            }
            if let Some(i) = free.pop() {
                return Ok(i);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.timeout(0, started));
            }
            free = self
                .freed
                .wait_timeout(free, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    fn free_ctx(&self, i: u16) {
        {
            let mut st = lock(&self.ctxs[i as usize].state);
            st.phase = Phase::Idle;
            st.waiter = None;
            st.outcome = None;
        }
        lock(&self.free).push(i);
        self.freed.notify_one();
    }

    fn timeout(&self, request_id: u64, started: Instant) -> SessionError {
        SessionError::Timeout {
            peer: self.peer,
            request_id,
            after: started.elapsed(),
        }
    }
}

impl<D: RdmaDevice> Drop for Link<D> {
    fn drop(&mut self) {
        self.shared.windows.release(u64::from(self.depth));
    }
}
