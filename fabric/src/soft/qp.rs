// Over 600 lines: one RC queue pair state machine: send queue, receive queue and the NIC checks in order.
//! RC queue pairs of the software device: the verbs state machine, the send queue with its
//! in-order completions, the receive queue, and the error semantics (a failed work request or
//! a NAK moves the QP to ERROR, flushes everything outstanding, and tells the peer by closing
//! the channels, whose QP then fails too).
//!
//! Threads: posting happens in the caller's thread (frames are written directly, no hand-off).
//! Reading is done by whoever waits on the QP's completion queue: it serves the peer's
//! requests ([`super::responder`]) and reads the responses to our own ([`super::requester`])
//! in its own thread, sleeping in `poll(2)` on the QP's sockets ([`super::cq`]). Each
//! connected QP also has a responder thread and a completion thread, which step aside while
//! waiters drive the QP and do the job when none does (a NIC makes progress whether or not the
//! application polls). A SEND's ACK is held back and sent right behind the QP's next request
//! (usually the reply), so the peer wakes up once for both.
//!
//! Lock order, outermost first: `control` → `tx` → `serving` → {`sq`, `rq`, `channels`,
//! `threads`}, and `reader` → `sq`; `sq`, `rq`, `channels` and `threads` are leaves apart from
//! the completion queues, which are leaves below `sq` and `rq`. A send queue's state changes
//! only under `sq`.

use std::collections::{HashSet, VecDeque};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use super::channel::{Channel, LocalRef, send_with_fd};
use super::cm::{self, HelloStatus, PeerInfo};
use super::cq::Progress;
use super::memory::Memory;
use super::mr::{BindingQp, MrInner, SoftMr, SoftMw, invalidate};
use super::requester::Arriving;
use super::responder::{Mode, Serving};
use super::table::Counter;
use super::wire::{Frame, Op, send_frame, send_header};
use super::{Context, SoftCq, SoftDevice, lock};
use crate::checks::{MAX_MESSAGE, ResponderQp};
use crate::error::{FabricError, Result};
use crate::provider::{QueuePair, RecvWrOf, SendWrOf};
use crate::verbs::{
    Access, AsyncEvent, Endpoint, QpCaps, QpCounters, QpState, QpTransition, SendOp, Sge, WcOpcode,
    WcStatus, WorkCompletion,
};

/// An RC queue pair. Dropping it destroys it: its connection closes (the peer QP fails), no
/// completions are generated for what was outstanding, and windows bound to it become unusable.
#[derive(Debug)]
pub struct SoftQp {
    shared: Arc<QpShared>,
}

/// Why a QP went to ERROR (decides the async event and the status of the head request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// A work request failed locally or was NAKed; its completion already says so.
    WorkRequest,
    /// As responder, this QP refused a request with a remote access error.
    Access,
    /// As responder, this QP refused an invalid request.
    InvalidRequest,
    /// The connection broke or the peer went to ERROR.
    Transport,
    /// `modify(Error)`.
    User,
}

/// Registered memory named by a local SGE, checked at post time.
#[derive(Debug)]
pub(crate) struct LocalSeg {
    pub mem: Arc<Memory>,
    pub mem_id: u64,
    pub offset: u64,
    pub len: usize,
}

impl LocalSeg {
    pub fn ptr(&self) -> Option<*mut u8> {
        self.mem.range(self.offset, self.len as u64)
    }
}

#[derive(Debug)]
struct Pending {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    /// PSN of a request on the wire; `None` for local work (bind, invalidate).
    psn: Option<u32>,
    byte_len: u32,
    /// Known outcome; the request completes once everything before it has.
    status: Option<WcStatus>,
    /// Where a READ response lands.
    read_into: Option<Arc<LocalSeg>>,
    /// A LOCAL_INV waiting for the peer's access to its window to end
    /// ([`QpShared::finish_invalidation`]).
    after_access: bool,
}

impl Pending {
    /// Local work (bind, invalidate, a request refused before the wire).
    fn local(wr_id: u64, opcode: WcOpcode, signaled: bool, status: Option<WcStatus>) -> Pending {
        Pending {
            wr_id,
            opcode,
            signaled,
            psn: None,
            byte_len: 0,
            status,
            read_into: None,
            after_access: false,
        }
    }
}

/// The key a peer's READ or WRITE names while the responder checks it and moves its payload.
/// A LOCAL_INV of that key completes only once the access is over, as a NIC's invalidation
/// fences the DMA already under way: after the completion the owner reuses the memory, and a
/// payload still landing would write into its next use.
#[derive(Debug, Default)]
struct WindowAccess {
    key: Option<u32>,
    /// A LOCAL_INV of `key` was posted meanwhile; its completion waits in the send queue.
    invalidation_waits: bool,
}

/// A peer's access in progress ([`QpShared::begin_access`]); it ends when this drops.
pub(crate) struct AccessGuard<'a> {
    qp: &'a QpShared,
}

impl Drop for AccessGuard<'_> {
    fn drop(&mut self) {
        self.qp.end_access();
    }
}

#[derive(Debug, Default)]
struct SendQueue {
    entries: VecDeque<Pending>,
    /// Set in ERROR: new requests complete as flushed at once.
    closed: bool,
}

/// A posted receive.
#[derive(Debug)]
pub(crate) struct PostedRecv {
    pub wr_id: u64,
    pub sge: Option<(Arc<MrInner>, usize, usize)>,
}

#[derive(Debug, Default)]
struct RecvQueue {
    entries: VecDeque<PostedRecv>,
    closed: bool,
}

#[derive(Debug)]
struct Control {
    access: Access,
    local_psn: u32,
    peer: Option<PeerInfo>,
}

/// The requester's write side.
#[derive(Debug)]
struct Tx {
    stream: Arc<Channel>,
    next_psn: u32,
    /// Buffers whose descriptor a same-device peer already has (see [`super::channel`]).
    handed_over: HashSet<u64>,
}

#[derive(Debug, Default)]
struct Channels {
    /// Our requests out, their responses in.
    request: Option<Arc<Channel>>,
    /// Their requests in, our responses out.
    response: Option<Arc<Channel>>,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub bytes_sent: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_served: AtomicU64,
    pub remote_access_errors: AtomicU64,
    pub invalid_requests: AtomicU64,
    pub flushed_wrs: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The QP state shared by its handle and its threads.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub ctx: Arc<Context>,
    /// QP number, also its device-wide id.
    pub num: u32,
    pub pd: u32,
    send_cq: SoftCq,
    pub recv_cq: SoftCq,
    caps: QpCaps,
    state: AtomicU8,
    control: Mutex<Control>,
    tx: Mutex<Option<Tx>>,
    sq: Mutex<SendQueue>,
    rq: Mutex<RecvQueue>,
    rq_ready: Condvar,
    channels: Mutex<Channels>,
    /// The request channel, for whoever processes its responses: the completion thread, or a
    /// caller waiting on the send CQ (see [`super::requester`]). Above `sq` in the lock order.
    pub reader: Mutex<Option<Arc<Channel>>>,
    /// A READ response whose payload is still arriving (see
    /// [`super::requester::drain_ready`]); taken under the reader lock.
    arriving: Mutex<Option<Arriving>>,
    /// The responder's state, for whoever serves the peer's requests: the responder thread, or
    /// a caller waiting on the receive CQ (see [`super::responder`]).
    serving: Mutex<Option<Serving>>,
    /// The peer's access in progress. Below `sq` in the lock order.
    window_access: Mutex<WindowAccess>,
    /// Waiters currently driving this QP (see [`Progress`]); its threads step aside meanwhile.
    pub driven: AtomicUsize,
    /// When the last waiter stopped driving ([`since_start`] nanoseconds).
    last_driven: AtomicU64,
    /// A waiter left the responder thread work only it can do (a stalled request, an end).
    responder_call: AtomicBool,
    /// `post_send` wants the ACK held back by the responder sent (see [`QpShared::piggyback_ack`]).
    ack_wanted: AtomicBool,
    /// The QP's threads, to wake them.
    completion: Mutex<Option<Thread>>,
    responder: Mutex<Option<Thread>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub counters: Counters,
}

fn state_code(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Error => 4,
    }
}

fn state_from(code: u8) -> QpState {
    match code {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        _ => QpState::Error,
    }
}

/// `a` is at or before `b` in PSN order (modulo 2³²).
pub(crate) fn psn_le(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) >= 0
}

fn random_psn() -> u32 {
    // A random start PSN, as rdma_cm picks: a forged request must guess it.
    rand::random::<u32>() & 0x00ff_ffff
}

impl SoftQp {
    pub(crate) fn create(
        ctx: &Arc<Context>,
        pd: u32,
        send_cq: &SoftCq,
        recv_cq: &SoftCq,
        caps: QpCaps,
    ) -> SoftQp {
        let shared = Arc::new(QpShared {
            ctx: ctx.clone(),
            num: ctx.table.new_qp_id(),
            pd,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            caps,
            state: AtomicU8::new(state_code(QpState::Reset)),
            control: Mutex::new(Control {
                access: Access::NONE,
                local_psn: random_psn(),
                peer: None,
            }),
            tx: Mutex::new(None),
            sq: Mutex::default(),
            rq: Mutex::default(),
            rq_ready: Condvar::new(),
            channels: Mutex::default(),
            reader: Mutex::default(),
            arriving: Mutex::default(),
            serving: Mutex::default(),
            window_access: Mutex::default(),
            driven: AtomicUsize::new(0),
            last_driven: AtomicU64::new(0),
            responder_call: AtomicBool::new(false),
            ack_wanted: AtomicBool::new(false),
            completion: Mutex::default(),
            responder: Mutex::default(),
            threads: Mutex::default(),
            counters: Counters::default(),
        });
        ctx.qps.insert(&shared);
        let progress: Arc<dyn Progress> = shared.clone();
        send_cq.add_source(Arc::downgrade(&progress));
        if !recv_cq.same(send_cq) {
            recv_cq.add_source(Arc::downgrade(&progress));
        }
        SoftQp { shared }
    }

    fn go_rts(&self) -> Result<()> {
        let sh = &self.shared;
        let (peer, psn) = {
            let ctl = lock(&sh.control);
            let state = sh.state();
            if state != QpState::Rtr {
                return Err(FabricError::InvalidTransition {
                    from: state,
                    to: "RTS",
                });
            }
            let peer = ctl.peer.ok_or(FabricError::InvalidTransition {
                from: state,
                to: "RTS",
            })?;
            (peer, ctl.local_psn)
        };
        // Not under `control`: the peer may be connecting to us at the same moment, and our
        // listener needs `control` to accept it.
        let local = (peer.device == sh.ctx.table.nonce())
            .then(|| cm::local_socket(&sh.ctx.qp_dir, peer.ctx));
        let stream = Arc::new(cm::connect(&peer, local.as_deref(), sh.num, psn)?);
        let _ctl = lock(&sh.control);
        if sh.state() != QpState::Rtr {
            let _ = stream.shutdown(Shutdown::Both);
            return Err(FabricError::InvalidTransition {
                from: sh.state(),
                to: "RTS",
            });
        }
        *lock(&sh.tx) = Some(Tx {
            stream: stream.clone(),
            next_psn: psn,
            handed_over: HashSet::new(),
        });
        lock(&sh.channels).request = Some(stream.clone());
        *lock(&sh.reader) = Some(stream.clone());
        let qp = sh.clone();
        let handle = thread::Builder::new()
            .name(format!("fabric-cq-{}", sh.num))
            .spawn(move || super::requester::run(&qp, &stream))
            .map_err(|e| FabricError::io("spawn completion thread", e))?;
        *lock(&sh.completion) = Some(handle.thread().clone());
        lock(&sh.threads).push(handle);
        // Under the queue lock: if the responder failed the QP meanwhile, ERROR stays.
        let sq = lock(&sh.sq);
        if !sq.closed {
            sh.set_state(QpState::Rts);
        }
        Ok(())
    }

    fn reset(&self) {
        let sh = &self.shared;
        let mut ctl = lock(&sh.control);
        sh.close_quietly();
        sh.stop();
        *lock(&sh.sq) = SendQueue::default();
        *lock(&sh.rq) = RecvQueue::default();
        ctl.peer = None;
        ctl.local_psn = random_psn();
        sh.set_state(QpState::Reset);
    }

    /// Checks a local SGE: the lkey's PD, the range, and LOCAL_WRITE where the device writes.
    fn local_seg(&self, sge: &Sge<'_, SoftMr>, device_writes: bool) -> Result<LocalSeg, WcStatus> {
        let mr = &sge.mr.inner;
        let fits = sge
            .offset
            .checked_add(sge.len)
            .is_some_and(|end| end <= mr.len);
        if mr.ctx.uid != self.shared.ctx.uid
            || mr.pd != self.shared.pd
            || !mr.is_registered()
            || !fits
            || (device_writes && !mr.access.contains(Access::LOCAL_WRITE))
        {
            return Err(WcStatus::LocProtErr);
        }
        Ok(LocalSeg {
            mem: mr.mem.clone(),
            mem_id: mr.mem_id,
            offset: sge.offset as u64,
            len: sge.len,
        })
    }
}

/// Sends a WRITE or READ request to a same-device peer: the header and a reference to the local
/// side of the transfer, with the buffer's descriptor the first time this channel names it.
fn send_local(tx: &mut Tx, frame: &Frame, seg: &LocalSeg) -> std::io::Result<()> {
    let fd = tx.stream.as_raw_fd();
    let reference = LocalRef {
        mem_id: seg.mem_id,
        offset: seg.offset,
    }
    .encode();
    if tx.handed_over.insert(seg.mem_id) {
        send_header(fd, frame)?;
        return send_with_fd(fd, &reference, seg.mem.fd());
    }
    // SAFETY: the "payload" is the reference on our stack.
    unsafe { send_frame(fd, frame, Some((reference.as_ptr(), reference.len()))) }
}

fn opcode_of(op: &SendOp<'_, SoftMr, SoftMw>) -> WcOpcode {
    match op {
        SendOp::Send { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::BindMw(_) => WcOpcode::BindMw,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
    }
}

impl QpShared {
    pub fn state(&self) -> QpState {
        state_from(self.state.load(Ordering::Acquire))
    }

    fn set_state(&self, s: QpState) {
        self.state.store(state_code(s), Ordering::Release);
    }

    fn binding_qp(&self) -> BindingQp {
        BindingQp {
            ctx_uid: self.ctx.uid,
            pd: self.pd,
            qp_id: self.num,
        }
    }

    fn completion(
        &self,
        wr_id: u64,
        opcode: WcOpcode,
        byte_len: u32,
        status: WcStatus,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            qp_num: self.num,
            invalidated_rkey: None,
        }
    }

    fn pending_completion(&self, e: &Pending, status: WcStatus) -> WorkCompletion {
        self.completion(e.wr_id, e.opcode, e.byte_len, status)
    }

    /// Reports the entries at the head of the send queue whose outcome is known, in order.
    fn complete_front(&self, sq: &mut SendQueue) {
        while let Some(status) = sq.entries.front().and_then(|e| e.status) {
            let Some(e) = sq.entries.pop_front() else {
                break;
            };
            if status != WcStatus::Success || e.signaled {
                self.send_cq.push(self.pending_completion(&e, status));
            }
        }
    }

    /// Queues a work request whose outcome is already known (local work, local errors), reports
    /// whatever completed, then fails the QP if the work failed.
    fn finish_local(
        &self,
        mut sq: MutexGuard<'_, SendQueue>,
        wr_id: u64,
        opcode: WcOpcode,
        signaled: bool,
        status: WcStatus,
    ) {
        sq.entries
            .push_back(Pending::local(wr_id, opcode, signaled, Some(status)));
        self.complete_front(&mut sq);
        drop(sq);
        if status != WcStatus::Success {
            self.enter_error(Cause::WorkRequest);
        }
    }

    /// Queues a LOCAL_INV of `rkey` that the table has carried out: it completes now, or, if
    /// the responder is moving a payload through that window, once that access ends.
    fn finish_invalidation(
        &self,
        mut sq: MutexGuard<'_, SendQueue>,
        wr_id: u64,
        signaled: bool,
        rkey: u32,
    ) {
        let waits = {
            let mut access = lock(&self.window_access);
            let waits = access.key == Some(rkey);
            access.invalidation_waits |= waits;
            waits
        };
        let status = (!waits).then_some(WcStatus::Success);
        sq.entries.push_back(Pending {
            after_access: waits,
            ..Pending::local(wr_id, WcOpcode::LocalInv, signaled, status)
        });
        self.complete_front(&mut sq);
    }

    /// The responder takes a peer's READ or WRITE naming `key`, before its checks read the
    /// key's object: an invalidation the checks did not see then finds the access and waits
    /// for it (both sides take `window_access`).
    pub fn begin_access(&self, key: u32) -> AccessGuard<'_> {
        lock(&self.window_access).key = Some(key);
        AccessGuard { qp: self }
    }

    /// The access is over: complete the invalidation that waited for it, if any. (The guard
    /// calls it; a WRITE still landing when its serving pass ends calls it once landed.)
    pub fn end_access(&self) {
        let waited = {
            let mut access = lock(&self.window_access);
            access.key = None;
            std::mem::take(&mut access.invalidation_waits)
        };
        if waited {
            let mut sq = lock(&self.sq);
            for e in sq.entries.iter_mut() {
                if e.after_access && e.status.is_none() {
                    e.status = Some(WcStatus::Success);
                }
            }
            self.complete_front(&mut sq);
        }
    }

    /// Network requests up to and including `psn` succeeded (an ACK, or implied by a later
    /// response). READs are completed by their own responses only.
    pub fn ack_through(&self, psn: u32) {
        let mut sq = lock(&self.sq);
        self.mark_acked(&mut sq, psn, false);
        self.complete_front(&mut sq);
    }

    fn mark_acked(&self, sq: &mut SendQueue, psn: u32, exclusive: bool) {
        for e in sq.entries.iter_mut() {
            let Some(p) = e.psn else { continue };
            if !psn_le(p, psn) || (exclusive && p == psn) {
                break;
            }
            if e.status.is_none() && e.opcode != WcOpcode::RdmaRead {
                e.status = Some(WcStatus::Success);
            }
        }
    }

    /// Where the READ response for `psn` lands, if `psn` is an outstanding READ of `len` bytes.
    pub fn read_target(&self, psn: u32, len: u32) -> Option<Arc<LocalSeg>> {
        let mut sq = lock(&self.sq);
        self.mark_acked(&mut sq, psn, true);
        self.complete_front(&mut sq);
        let e = sq
            .entries
            .iter()
            .find(|e| e.psn == Some(psn) && e.status.is_none())?;
        let seg = e.read_into.clone()?;
        (seg.len as u64 == u64::from(len)).then_some(seg)
    }

    /// The READ `psn` received its data.
    pub fn read_done(&self, psn: u32, len: u32) {
        Counters::add(&self.counters.bytes_read, u64::from(len));
        let mut sq = lock(&self.sq);
        if let Some(e) = sq.entries.iter_mut().find(|e| e.psn == Some(psn)) {
            e.status = Some(WcStatus::Success);
        }
        self.complete_front(&mut sq);
    }

    /// The responder NAKed request `psn`: earlier requests succeeded, this one failed with
    /// `status`, and the QP goes to ERROR.
    pub fn nak(&self, psn: u32, status: WcStatus) {
        {
            let mut sq = lock(&self.sq);
            self.mark_acked(&mut sq, psn, true);
            if let Some(e) = sq
                .entries
                .iter_mut()
                .find(|e| e.psn == Some(psn) && e.status.is_none())
            {
                e.status = Some(status);
            }
        }
        self.enter_error(Cause::WorkRequest);
    }

    /// Moves the QP to ERROR (once): flushes both queues, raises the async event that fits
    /// `cause`, and shuts our sending directions so the peer learns.
    pub fn enter_error(&self, cause: Cause) {
        self.fail_queues(cause);
        self.shut_write_sides();
    }

    /// The first half of [`QpShared::enter_error`]: ERROR, flushed queues and the event, but the
    /// peer not told yet (a responder sends its NAK in between, so the cause recorded is the
    /// access error, not the peer's reaction to the NAK). False if the QP already was in ERROR.
    pub fn fail_queues(&self, cause: Cause) -> bool {
        self.fail_queues_with(cause, || {})
    }

    /// [`QpShared::fail_queues`] running `tell_peer` once the QP is closed to new work but
    /// before its state, completions or event are visible (and before it can be destroyed,
    /// which needs the send-queue lock held meanwhile).
    pub fn fail_queues_with(&self, cause: Cause, tell_peer: impl FnOnce()) -> bool {
        let mut flushed = 0u64;
        {
            // The state changes under the send-queue lock, together with `closed`: a request
            // posted concurrently either ran before the QP failed or is flushed without running,
            // and whoever sees ERROR also sees new requests flushed.
            let mut sq = lock(&self.sq);
            if sq.closed {
                return false;
            }
            sq.closed = true;
            tell_peer();
            self.set_state(QpState::Error);
            let mut head = true;
            while let Some(e) = sq.entries.pop_front() {
                let status = e.status.unwrap_or_else(|| {
                    if head && e.psn.is_some() && cause == Cause::Transport {
                        WcStatus::RetryExcErr
                    } else {
                        WcStatus::WrFlushErr
                    }
                });
                head &= e.status.is_some();
                flushed += u64::from(status == WcStatus::WrFlushErr);
                if status != WcStatus::Success || e.signaled {
                    self.send_cq.push(self.pending_completion(&e, status));
                }
            }
        }
        {
            let mut rq = lock(&self.rq);
            rq.closed = true;
            flushed += rq.entries.len() as u64;
            let wcs: Vec<_> = rq
                .entries
                .drain(..)
                .map(|r| self.recv_completion(r.wr_id, WcStatus::WrFlushErr, 0, None))
                .collect();
            self.recv_cq.push_all(wcs);
        }
        self.rq_ready.notify_all();
        Counters::add(&self.counters.flushed_wrs, flushed);
        self.ctx.table.bump(Counter::QpErrors);
        let event = match cause {
            Cause::Access => Some(AsyncEvent::QpAccessErr { qp_num: self.num }),
            Cause::InvalidRequest => Some(AsyncEvent::QpReqErr { qp_num: self.num }),
            Cause::Transport => Some(AsyncEvent::QpFatal { qp_num: self.num }),
            Cause::WorkRequest | Cause::User => None,
        };
        if let Some(event) = event {
            self.ctx.post_event(event);
        }
        tracing::info!(qp = self.num, ?cause, "QP entered ERROR");
        true
    }

    /// Shuts the sending direction of both channels: anything already sent (a NAK) still
    /// reaches the peer, followed by EOF, which fails the peer's QP.
    pub fn shut_write_sides(&self) {
        let ch = lock(&self.channels);
        for s in [&ch.request, &ch.response].into_iter().flatten() {
            let _ = s.shutdown(Shutdown::Write);
        }
    }

    pub fn recv_completion(
        &self,
        wr_id: u64,
        status: WcStatus,
        byte_len: u32,
        invalidated_rkey: Option<u32>,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len,
            qp_num: self.num,
            invalidated_rkey,
        }
    }

    /// Takes the next posted receive, waiting while there is none (an RNR NAK retried without
    /// limit, as with `rnr_retry = 7`). `None` once the QP is in ERROR or being destroyed.
    pub fn take_recv(&self) -> Option<PostedRecv> {
        let mut rq = lock(&self.rq);
        loop {
            if rq.closed {
                return None;
            }
            if let Some(r) = rq.entries.pop_front() {
                return Some(r);
            }
            rq = self
                .rq_ready
                .wait(rq)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Whether this QP reached RTS and has its own request channel (and completion thread).
    pub fn has_request_channel(&self) -> bool {
        lock(&self.channels).request.is_some()
    }

    /// Invalidates a window on behalf of an incoming SEND_WITH_INV.
    pub fn remote_invalidate(&self, rkey: u32) -> std::result::Result<(), &'static str> {
        invalidate(&self.ctx.table, self.binding_qp(), rkey)
    }

    /// Accepts the peer's request channel (called by the listener). The hello must name the
    /// peer QP and PSN this QP was given at RTR.
    pub fn attach_responder(
        self: &Arc<Self>,
        source: u32,
        psn: u32,
        stream: &Channel,
    ) -> std::io::Result<HelloStatus> {
        let ctl = lock(&self.control);
        if !matches!(self.state(), QpState::Rtr | QpState::Rts) {
            return Ok(HelloStatus::NotReady);
        }
        if ctl.peer.is_none_or(|p| p.qp_num != source || p.psn != psn) {
            return Ok(HelloStatus::WrongPeer);
        }
        let mut ch = lock(&self.channels);
        if ch.response.is_some() {
            return Ok(HelloStatus::AlreadyConnected);
        }
        let stream = Arc::new(stream.try_clone()?);
        ch.response = Some(stream.clone());
        drop(ch);
        let me = ResponderQp {
            pd: self.pd,
            qp_id: self.num,
            access: ctl.access,
        };
        *lock(&self.serving) = Some(Serving::new(stream, me, psn));
        let qp = self.clone();
        let handle = thread::Builder::new()
            .name(format!("fabric-resp-{}", self.num))
            .spawn(move || super::responder::run(&qp))?;
        *lock(&self.responder) = Some(handle.thread().clone());
        lock(&self.threads).push(handle);
        Ok(HelloStatus::Ok)
    }

    /// ERROR without completions or events (destroy, reset): the QP's threads, still running
    /// until `stop`, then find it closed and stay quiet.
    fn close_quietly(&self) {
        let mut sq = lock(&self.sq);
        sq.closed = true;
        self.set_state(QpState::Error);
    }

    /// Closes both channels and waits for the QP's threads. The caller has set ERROR (or is
    /// destroying the QP), so nothing these threads do afterwards generates completions.
    fn stop(&self) {
        {
            let mut ch = lock(&self.channels);
            for s in [ch.request.take(), ch.response.take()]
                .into_iter()
                .flatten()
            {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        lock(&self.rq).closed = true;
        self.rq_ready.notify_all();
        *lock(&self.tx) = None;
        *lock(&self.reader) = None;
        if let Some(s) = lock(&self.serving).as_mut() {
            s.stop();
        }
        for thread in [&self.completion, &self.responder] {
            if let Some(t) = lock(thread).take() {
                t.unpark();
            }
        }
        let handles = std::mem::take(&mut *lock(&self.threads));
        for h in handles {
            if h.thread().id() != thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Progress for QpShared {
    fn progress(&self) {
        if let Ok(reader) = self.reader.try_lock() {
            let ended = reader
                .as_ref()
                .is_some_and(|stream| super::requester::drain_ready(self, stream, Mode::Waiter));
            drop(reader);
            if ended {
                self.enter_error(Cause::Transport);
            }
        }
        // Someone else serving (or a server that panicked) is left to the responder thread.
        if let Ok(mut serving) = self.serving.try_lock()
            && let Some(s) = serving.as_mut()
        {
            s.serve_ready(self, Mode::Waiter);
            self.send_wanted_ack(s);
        }
    }

    fn channels(&self, out: &mut Vec<Arc<Channel>>) {
        let ch = lock(&self.channels);
        out.extend(ch.request.iter().chain(ch.response.iter()).cloned());
    }

    fn set_driven(&self, driven: bool) {
        if driven {
            self.driven.fetch_add(1, Ordering::AcqRel);
        } else {
            self.last_driven.store(since_start(), Ordering::Release);
            self.driven.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn flush_acks(&self) {
        self.with_serving(|s| {
            let _ = s.flush_ack();
        });
    }

    fn acks_pending(&self) -> bool {
        self.serving
            .try_lock()
            .is_ok_and(|s| s.as_ref().is_some_and(Serving::ack_pending))
    }
}

/// How long a QP's threads nap between looks while waiters drive it, and how long after the
/// last waiter left they still leave the QP alone (a waiter comes back within microseconds
/// under load; a thread polling the same socket meanwhile would wake up for every message
/// only to find it taken).
pub(crate) const THREAD_NAP: Duration = Duration::from_millis(5);

/// Nanoseconds since the first call (a process-wide monotonic clock for atomics).
fn since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl QpShared {
    /// Whether a QP thread should leave the QP to its waiters: naps (at most [`THREAD_NAP`])
    /// and returns true while one drives it or did just now.
    pub fn step_aside(&self) -> bool {
        let nap = THREAD_NAP.as_nanos() as u64;
        let quiet = since_start().saturating_sub(self.last_driven.load(Ordering::Acquire));
        if self.driven.load(Ordering::Acquire) == 0 && quiet >= nap {
            return false;
        }
        thread::park_timeout(Duration::from_nanos(nap.saturating_sub(quiet).max(nap / 5)));
        true
    }

    /// Runs `f` on the responder's state (waiting for whoever serves now); `None` before the
    /// peer connected or after the QP stopped.
    pub fn with_serving<R>(&self, f: impl FnOnce(&mut Serving) -> R) -> Option<R> {
        lock(&self.serving).as_mut().map(f)
    }

    /// A waiter leaves the responder thread work only it can do.
    pub fn call_responder(&self) {
        self.responder_call.store(true, Ordering::Release);
        if let Some(t) = lock(&self.responder).as_ref() {
            t.unpark();
        }
    }

    /// Keeps a READ response whose payload is still arriving for whoever drives the QP next.
    pub fn set_arriving(&self, arriving: Arriving) {
        *lock(&self.arriving) = Some(arriving);
    }

    pub fn take_arriving(&self) -> Option<Arriving> {
        lock(&self.arriving).take()
    }

    pub fn take_responder_call(&self) -> bool {
        self.responder_call.swap(false, Ordering::AcqRel)
    }

    /// Whether the QP stopped (destroyed or reset) and its responder thread should end.
    pub fn responder_stopped(&self) -> bool {
        lock(&self.channels).response.is_none()
    }

    /// Whether a receive is posted (a SEND can land without waiting).
    pub fn has_recv(&self) -> bool {
        let rq = lock(&self.rq);
        rq.closed || !rq.entries.is_empty()
    }

    /// Sends the held-back ACK if `post_send` asked for it (see [`QpShared::piggyback_ack`]).
    fn send_wanted_ack(&self, s: &mut Serving) {
        if self.ack_wanted.swap(false, Ordering::AcqRel) {
            let _ = s.flush_ack();
        }
    }

    /// Sends the ACK the responder holds back for a SEND right behind our own request, so
    /// the peer wakes once for both. Whoever serves now sends it when done, if we cannot.
    fn piggyback_ack(&self) {
        self.ack_wanted.store(true, Ordering::Release);
        while let Ok(mut serving) = self.serving.try_lock() {
            if let Some(s) = serving.as_mut() {
                self.send_wanted_ack(s);
            }
            drop(serving);
            // A server may have released the lock between our store and its check.
            if !self.ack_wanted.load(Ordering::Acquire) {
                break;
            }
        }
    }
}

impl SoftQp {
    /// Whether this QP's requests reach a peer on the same device, moving RDMA payloads by one
    /// copy between the two registered buffers instead of through a TCP connection.
    pub fn same_device(&self) -> bool {
        lock(&self.shared.tx)
            .as_ref()
            .is_some_and(|tx| tx.stream.is_local())
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let sh = &self.shared;
        sh.ctx.qps.remove(sh.num);
        sh.close_quietly();
        sh.stop();
    }
}

impl QueuePair<SoftDevice> for SoftQp {
    fn qp_num(&self) -> u32 {
        self.shared.num
    }

    fn state(&self) -> QpState {
        self.shared.state()
    }

    fn endpoint(&self) -> Endpoint {
        PeerInfo {
            addr: self.shared.ctx.listen_addr,
            qp_num: self.shared.num,
            psn: lock(&self.shared.control).local_psn,
            device: self.shared.ctx.table.nonce(),
            ctx: self.shared.ctx.id,
        }
        .encode()
    }

    fn modify(&self, transition: QpTransition) -> Result<()> {
        let sh = &self.shared;
        let from = sh.state();
        let invalid = || {
            Err(FabricError::InvalidTransition {
                from,
                to: transition.name(),
            })
        };
        match &transition {
            QpTransition::Init { access } => {
                let mut ctl = lock(&sh.control);
                if sh.state() != QpState::Reset {
                    return invalid();
                }
                ctl.access = *access;
                sh.set_state(QpState::Init);
            }
            QpTransition::Rtr { remote } => {
                let peer = PeerInfo::decode(remote)?;
                let mut ctl = lock(&sh.control);
                if sh.state() != QpState::Init {
                    return invalid();
                }
                ctl.peer = Some(peer);
                sh.set_state(QpState::Rtr);
            }
            QpTransition::Rts => self.go_rts()?,
            QpTransition::Error => sh.enter_error(Cause::User),
            QpTransition::Reset => self.reset(),
        }
        Ok(())
    }

    fn post_send(&self, wr: SendWrOf<'_, SoftDevice>) -> Result<()> {
        let sh = &self.shared;
        let state = sh.state();
        if !matches!(state, QpState::Rts | QpState::Error) {
            return Err(FabricError::InvalidArgument(format!(
                "post_send on a QP in {state:?}"
            )));
        }
        let opcode = opcode_of(&wr.op);
        // Posts are serialised by `tx`, which fixes their order on the wire and in the queue.
        let mut tx = lock(&sh.tx);
        let mut sq = lock(&sh.sq);
        if sq.closed {
            drop(sq);
            Counters::add(&sh.counters.flushed_wrs, 1);
            sh.send_cq
                .push(sh.completion(wr.wr_id, opcode, 0, WcStatus::WrFlushErr));
            return Ok(());
        }
        if sq.entries.len() >= sh.caps.max_send_wr as usize {
            return Err(FabricError::QueueFull);
        }
        // Local work runs here, under the queue lock, in send-queue order.
        let (op, sge, key, addr, device_writes) = match &wr.op {
            SendOp::BindMw(b) => {
                let status = match SoftMw::bind(sh.binding_qp(), b) {
                    Ok(()) => WcStatus::Success,
                    Err(rule) => {
                        sh.ctx.table.bump(Counter::BindErrors);
                        tracing::warn!(qp = sh.num, rule, "memory window bind refused");
                        WcStatus::MwBindErr
                    }
                };
                sh.finish_local(sq, wr.wr_id, opcode, wr.signaled, status);
                return Ok(());
            }
            SendOp::LocalInv { rkey } => {
                match invalidate(&sh.ctx.table, sh.binding_qp(), *rkey) {
                    Ok(()) => sh.finish_invalidation(sq, wr.wr_id, wr.signaled, *rkey),
                    Err(rule) => {
                        tracing::warn!(qp = sh.num, rule, "local invalidate refused");
                        sh.finish_local(sq, wr.wr_id, opcode, wr.signaled, WcStatus::MwBindErr);
                    }
                }
                return Ok(());
            }
            SendOp::Send { sge } => (Op::Send, *sge, 0, 0, false),
            SendOp::SendWithInv {
                sge,
                invalidate_rkey,
            } => (Op::SendInv, *sge, *invalidate_rkey, 0, false),
            SendOp::RdmaWrite { sge, remote } => {
                (Op::Write, Some(*sge), remote.rkey, remote.addr, false)
            }
            SendOp::RdmaRead { sge, remote } => {
                (Op::ReadReq, Some(*sge), remote.rkey, remote.addr, true)
            }
        };
        let seg = match sge.map(|s| self.local_seg(&s, device_writes)).transpose() {
            Ok(seg) => seg.map(Arc::new),
            Err(status) => {
                sh.finish_local(sq, wr.wr_id, opcode, wr.signaled, status);
                return Ok(());
            }
        };
        let len = seg.as_ref().map_or(0, |s| s.len);
        if len as u64 > MAX_MESSAGE {
            return Err(FabricError::InvalidArgument(format!(
                "message of {len} bytes exceeds 2^31"
            )));
        }
        let Some(tx) = tx.as_mut() else {
            // RTS always has a channel, and ERROR was handled above.
            return Err(FabricError::InvalidArgument("QP has no connection".into()));
        };
        let psn = tx.next_psn;
        tx.next_psn = psn.wrapping_add(1);
        let is_read = op == Op::ReadReq;
        sq.entries.push_back(Pending {
            wr_id: wr.wr_id,
            opcode,
            signaled: wr.signaled,
            psn: Some(psn),
            byte_len: len as u32,
            status: None,
            read_into: if is_read { seg.clone() } else { None },
            after_access: false,
        });
        // Not under the queue lock: the completion thread needs it while we block on a full
        // socket.
        drop(sq);
        let frame = Frame {
            len: len as u32,
            key,
            addr,
            ..Frame::new(op, psn)
        };
        let by_reference = tx.stream.is_local() && matches!(op, Op::Write | Op::ReadReq);
        let sent = match seg.as_ref().filter(|_| by_reference) {
            Some(seg) if len > 0 => send_local(tx, &frame, seg),
            _ => {
                // The payload goes from registered memory straight into the socket.
                let payload = if is_read {
                    None
                } else {
                    seg.as_ref()
                        .and_then(|s| s.ptr())
                        .map(|p| (p as *const u8, len))
                };
                // SAFETY: the payload is `len` bytes inside the mapping `seg` keeps alive.
                unsafe { send_frame(tx.stream.as_raw_fd(), &frame, payload) }
            }
        };
        match sent {
            Ok(()) => {
                if !is_read {
                    Counters::add(&sh.counters.bytes_sent, len as u64);
                }
                sh.piggyback_ack();
            }
            Err(e) => {
                tracing::debug!(qp = sh.num, error = %e, "request channel broke");
                sh.enter_error(Cause::Transport);
            }
        }
        Ok(())
    }

    fn post_recv(&self, wr: RecvWrOf<'_, SoftDevice>) -> Result<()> {
        let sh = &self.shared;
        let state = sh.state();
        if state == QpState::Reset {
            return Err(FabricError::InvalidArgument(
                "post_recv on a QP in RESET".into(),
            ));
        }
        let mut rq = lock(&sh.rq);
        if rq.closed {
            Counters::add(&sh.counters.flushed_wrs, 1);
            sh.recv_cq
                .push(sh.recv_completion(wr.wr_id, WcStatus::WrFlushErr, 0, None));
            return Ok(());
        }
        if rq.entries.len() >= sh.caps.max_recv_wr as usize {
            return Err(FabricError::QueueFull);
        }
        rq.entries.push_back(PostedRecv {
            wr_id: wr.wr_id,
            sge: wr.sge.map(|s| (s.mr.inner.clone(), s.offset, s.len)),
        });
        drop(rq);
        sh.rq_ready.notify_one();
        Ok(())
    }

    fn counters(&self) -> QpCounters {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        QpCounters {
            bytes_sent: get(&c.bytes_sent),
            bytes_read: get(&c.bytes_read),
            bytes_received: get(&c.bytes_received),
            bytes_served: get(&c.bytes_served),
            remote_access_errors: get(&c.remote_access_errors),
            invalid_requests: get(&c.invalid_requests),
            flushed_wrs: get(&c.flushed_wrs),
        }
    }
}
