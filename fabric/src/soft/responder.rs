//! The responder of a connected QP: the part of the NIC that serves the peer's requests.
//!
//! For each incoming request it makes the NIC's checks ([`check_rma`]) before touching memory,
//! then moves the payload between the socket and the registered buffer directly, or, for a
//! same-device peer, between the peer's registered buffer and ours (see [`super::channel`]).
//! A failed check
//! NAKs the request and moves the QP to ERROR (class C), which closes the connection so the
//! requester's QP fails too; later requests are never served.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::channel::{Channel, HandedOver};
use super::memory::Memory;
use super::qp::{Cause, Counters, QpShared};
use super::table::Counter;
use super::wire::{
    Frame, NakCode, Op, Queued, queued_at_least, recv_arrived, recv_into, send_frame, send_header,
    try_read_frame,
};
use crate::checks::{Nak, Rejection, ResponderQp, RmaOp, check_rma};
use crate::verbs::{Access, QpState, WcStatus};

/// What a served request still needs.
enum Reply {
    /// An ACK (may be deferred and merged with later ones).
    Ack,
    /// Nothing: a READ response was sent, which acknowledges everything before it.
    Sent,
    /// The QP is closing; stop serving.
    Stop,
    /// A WRITE whose payload is still arriving: nothing more is served until it is in.
    Landing(Landing),
}

/// A WRITE whose payload a waiter started to land but is still on the wire. Its window access
/// stays open (a LOCAL_INV of its key waits) until the rest is in, and whoever serves the QP
/// next takes the rest first.
#[derive(Debug)]
pub(crate) struct Landing {
    frame: Frame,
    mem: Arc<Memory>,
    /// Where the payload lands in `mem`.
    offset: u64,
    done: usize,
}

/// Why serving stopped with an error.
struct Fatal {
    /// NAK to send, if the connection still works.
    nak: Option<NakCode>,
    cause: Cause,
    check: &'static str,
}

impl Fatal {
    fn transport() -> Fatal {
        Fatal {
            nak: None,
            cause: Cause::Transport,
            check: "connection",
        }
    }

    fn access(check: &'static str) -> Fatal {
        Fatal {
            nak: Some(NakCode::RemoteAccess),
            cause: Cause::Access,
            check,
        }
    }

    fn invalid(check: &'static str) -> Fatal {
        Fatal {
            nak: Some(NakCode::InvalidRequest),
            cause: Cause::InvalidRequest,
            check,
        }
    }
}

impl From<Rejection> for Fatal {
    fn from(r: Rejection) -> Fatal {
        match r.nak {
            Nak::RemoteAccess => Fatal::access(r.check),
            Nak::InvalidRequest => Fatal::invalid(r.check),
        }
    }
}

/// What the responder keeps between requests. One party serves at a time, under the QP's
/// `serving` lock: the responder thread, or a caller waiting on the QP's completion queue
/// (see [`super::cq`]), which serves what has arrived instead of waiting for the thread to
/// hand it over.
#[derive(Debug)]
pub(crate) struct Serving {
    stream: Arc<Channel>,
    me: ResponderQp,
    expected: u32,
    /// The last request served and not acknowledged yet (ACKs are cumulative).
    unacked: Option<u32>,
    /// Whether that request was a SEND, whose ACK may wait (see [`Serving::defer_ack`]).
    unacked_send: bool,
    /// The peer's buffers, when it shares our device; None over TCP, where no reference is
    /// ever accepted.
    peer_memory: Option<HandedOver>,
    /// A request a waiter read but left to the thread: a SEND it could not land (no receive
    /// posted), which the thread serves waiting for the receive as a NIC retries after an RNR
    /// NAK, or a SEND whose payload was still arriving.
    stalled: Option<Frame>,
    /// A WRITE whose payload is still arriving.
    landing: Option<Landing>,
    /// Serving is over; the thread finishes the job.
    end: Option<End>,
}

/// Why serving stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The peer closed its request channel (or it broke).
    Closed,
    /// A request was refused: read and drop the rest until the peer closes.
    Refused,
    /// The QP is being destroyed.
    Stop,
}

/// How far one pass of serving may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The responder thread: may wait for a receive to be posted, and acknowledges what it
    /// served before it goes back to waiting.
    Thread,
    /// A waiter driving the QP: never blocks on the application, and leaves the ACK of a SEND
    /// for later (see [`Serving::defer_ack`]).
    Waiter,
}

impl Serving {
    pub fn new(stream: Arc<Channel>, me: ResponderQp, first_psn: u32) -> Serving {
        Serving {
            peer_memory: stream.is_local().then(HandedOver::default),
            stream,
            me,
            expected: first_psn,
            unacked: None,
            unacked_send: false,
            stalled: None,
            landing: None,
            end: None,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub fn ended(&self) -> Option<End> {
        self.end
    }

    pub fn stop(&mut self) {
        self.end.get_or_insert(End::Stop);
    }

    /// Whether the ACK of what was served may wait. The ACK of a SEND may: the peer's next
    /// completion that needs it is the reply's, and this QP posts that reply soon after, with
    /// the ACK right behind it ([`Serving::flush_ack`] from `post_send`), so the peer wakes up
    /// once for both instead of once for each. At most the peer's queue depth of SENDs waits
    /// so, and the responder thread flushes what a quiet QP left. Anything else (RDMA WRITEs
    /// whose sender may be waiting for room) is acknowledged when nothing more is queued.
    fn defer_ack(&self, mode: Mode) -> bool {
        mode == Mode::Waiter && self.unacked_send
    }

    /// Sends the pending ACK, if any.
    pub fn flush_ack(&mut self) -> std::io::Result<()> {
        if let Some(psn) = self.unacked.take() {
            send_header(self.fd(), &Frame::new(Op::Ack, psn))?;
        }
        Ok(())
    }

    /// The next request to serve: a stalled one, or one already queued; `None` when nothing is.
    fn next(&mut self, mode: Mode) -> Option<Frame> {
        if let Some(frame) = self.stalled.take() {
            return Some(frame);
        }
        match try_read_frame(self.fd()) {
            Ok(Queued::Frame(frame)) => Some(frame),
            Ok(Queued::Nothing) => {
                if !self.defer_ack(mode) && self.flush_ack().is_err() {
                    self.end = Some(End::Closed);
                }
                None
            }
            Ok(Queued::Ended) | Err(_) => {
                self.end = Some(End::Closed);
                None
            }
        }
    }

    /// Serves every request that has arrived (the thread also waits for a receive a SEND
    /// needs). Stops at the end of what is queued, or when serving is over; a waiter that
    /// leaves work only the thread can do calls it.
    pub fn serve_ready(&mut self, qp: &QpShared, mode: Mode) {
        self.serve_queued(qp, mode);
        if mode == Mode::Waiter && self.end.is_some() {
            qp.call_responder();
        }
    }

    /// Whether an ACK waits (see [`Serving::defer_ack`]).
    pub fn ack_pending(&self) -> bool {
        self.unacked.is_some()
    }

    fn serve_queued(&mut self, qp: &QpShared, mode: Mode) {
        if let Some(landing) = self.landing.take()
            && !self.land_rest(qp, landing, mode)
        {
            return;
        }
        while self.end.is_none() {
            let Some(frame) = self.next(mode) else {
                return;
            };
            let is_send = matches!(frame.op, Op::Send | Op::SendInv);
            if mode == Mode::Waiter && is_send && !queued_at_least(self.fd(), frame.len as usize) {
                // Its payload is still on the wire: waiting for it is the thread's job. A peer
                // behind a slow link would otherwise hold the waiter, and with it every other
                // QP the waiter drives. (A WRITE's payload lands piece by piece instead.)
                self.stalled = Some(frame);
                qp.call_responder();
                return;
            }
            if is_send && !qp.has_recv() {
                if mode == Mode::Waiter {
                    // Landing it means waiting for the application: the thread's job.
                    self.stalled = Some(frame);
                    qp.call_responder();
                    return;
                }
                // A SEND may wait for a receive to be posted: acknowledge what came before it
                // first, so the requester's earlier completions never depend on our application.
                if self.flush_ack().is_err() {
                    self.end = Some(End::Closed);
                    return;
                }
            }
            if qp.state() == QpState::Error {
                // Failed meanwhile (e.g. a local bind error): serve nothing more.
                self.end = Some(End::Refused);
                return;
            }
            self.serve_one(qp, &frame, is_send, mode);
            if self.landing.is_some() {
                return;
            }
        }
    }

    /// Lands what has arrived of a WRITE's payload (all of it for the thread); true once it
    /// is all in, the window access closed and the WRITE acknowledged.
    fn land_rest(&mut self, qp: &QpShared, mut landing: Landing, mode: Mode) -> bool {
        let fd = self.fd();
        let rest = landing.frame.len as usize - landing.done;
        let at = landing.offset + landing.done as u64;
        let got = match landing.mem.range(at, rest as u64) {
            // SAFETY: `dst` is `rest` bytes inside the mapping `landing.mem` keeps alive.
            Some(dst) => unsafe { receive(fd, dst, rest, mode) }.map_err(|_| Fatal::transport()),
            None => Err(Fatal::access("outside registered memory")),
        };
        match got {
            Ok(got) if got < rest => {
                landing.done += got;
                self.landing = Some(landing);
                false
            }
            Ok(_) => {
                qp.end_access();
                Counters::add(&qp.counters.bytes_received, u64::from(landing.frame.len));
                self.unacked = Some(landing.frame.psn);
                self.unacked_send = false;
                true
            }
            Err(fatal) => {
                qp.end_access();
                fail(qp, fd, &landing.frame, &fatal);
                self.end = Some(End::Refused);
                false
            }
        }
    }

    fn serve_one(&mut self, qp: &QpShared, frame: &Frame, is_send: bool, mode: Mode) {
        let fd = self.fd();
        let outcome = if frame.psn == self.expected {
            self.expected = self.expected.wrapping_add(1);
            serve(qp, fd, &self.me, frame, self.peer_memory.as_mut(), mode)
        } else {
            Err(Fatal {
                nak: Some(NakCode::Sequence),
                cause: Cause::InvalidRequest,
                check: "psn sequence",
            })
        };
        match outcome {
            Ok(Reply::Ack) => {
                self.unacked = Some(frame.psn);
                self.unacked_send = is_send;
            }
            Ok(Reply::Sent) => self.unacked = None,
            Ok(Reply::Stop) => self.end = Some(End::Stop),
            Ok(Reply::Landing(landing)) => self.landing = Some(landing),
            Err(fatal) => {
                fail(qp, fd, frame, &fatal);
                self.end = Some(End::Refused);
            }
        }
    }
}

/// The responder thread: serves requests whenever no waiter does, and finishes serving once it
/// is over.
pub(crate) fn run(qp: &Arc<QpShared>) {
    let poll = qp.ctx.responder_poll;
    loop {
        if qp.responder_stopped() {
            return;
        }
        // A waiter that left a stalled request or an end for us asked for the thread explicitly.
        if !qp.take_responder_call() {
            if qp.step_aside() {
                continue;
            }
            // Nobody drives the QP: acknowledge what a waiter left, then sleep on the socket.
            let Some((fd, end)) = qp.with_serving(|s| {
                s.serve_ready(qp, Mode::Thread);
                (s.fd(), s.ended())
            }) else {
                return;
            };
            if end.is_none() && !wait_request(fd, poll) {
                continue;
            }
        }
        let end = qp.with_serving(|s| {
            s.serve_ready(qp, Mode::Thread);
            s.ended()
        });
        match end.flatten() {
            None => {}
            Some(End::Stop) => return,
            Some(End::Refused) => {
                if let Some(fd) = qp.with_serving(|s| s.fd()) {
                    drain(fd);
                }
                return;
            }
            Some(End::Closed) => {
                // The peer closed its request channel: it failed or was destroyed. If this QP
                // has its own request channel, the completion thread reads the rest of the
                // story there (a NAK for one of our requests may still be queued before the
                // close) and fails the QP itself.
                if !qp.has_request_channel() {
                    qp.enter_error(Cause::Transport);
                }
                return;
            }
        }
    }
}

fn serve(
    qp: &QpShared,
    fd: RawFd,
    me: &ResponderQp,
    f: &Frame,
    peer_memory: Option<&mut HandedOver>,
    mode: Mode,
) -> Result<Reply, Fatal> {
    let op = match f.op {
        Op::Write => RmaOp::Write,
        Op::ReadReq => RmaOp::Read,
        Op::Send | Op::SendInv => return serve_send(qp, fd, f),
        Op::Ack | Op::Nak | Op::ReadResp => {
            return Err(Fatal::invalid("response on a request channel"));
        }
    };
    let len = u64::from(f.len);
    // Until the payload has moved, a LOCAL_INV of this key waits for it.
    let access = qp.begin_access(f.key);
    // A same-device request names the requester's side of the transfer; it is part of the
    // request, read before the checks decide on it.
    let peer_side = match peer_memory {
        Some(handed) if len > 0 => Some(handed.receive(fd, len).map_err(|_| Fatal::transport())?),
        _ => None,
    };
    let target = check_rma(qp.ctx.checks(), me, op, f.key, f.addr, len, |index| {
        qp.ctx.table.object(index)
    })?;
    // Resolve the memory before consuming any payload: a refused WRITE never lands.
    let place = match target {
        None => None,
        Some(t) => {
            let mem = qp
                .ctx
                .memory(t.mem_id)
                .ok_or(Fatal::access("registered memory gone"))?;
            let ptr = mem
                .range(t.offset, t.len)
                .ok_or(Fatal::access("outside registered memory"))?;
            Some((mem, ptr, t.offset))
        }
    };
    // From a same-device peer the payload moves by one copy here, not through the socket.
    let local = peer_side.is_some();
    if let Some(peer) = peer_side {
        copy_local(
            op,
            place.as_ref().map(|(mem, ptr, _)| (mem, *ptr)),
            peer,
            len,
        )?;
    }
    let through_socket = place.as_ref().filter(|_| !local);
    match op {
        RmaOp::Write => {
            if let Some((mem, dst, offset)) = through_socket {
                // SAFETY: `dst` is `len` bytes inside the mapping `mem` keeps alive.
                let got = unsafe { receive(fd, *dst, f.len as usize, mode) }
                    .map_err(|_| Fatal::transport())?;
                if got < f.len as usize {
                    // The access stays open until the rest has landed (`land_rest`).
                    std::mem::forget(access);
                    return Ok(Reply::Landing(Landing {
                        frame: *f,
                        mem: mem.clone(),
                        offset: *offset,
                        done: got,
                    }));
                }
            }
            Counters::add(&qp.counters.bytes_received, len);
            Ok(Reply::Ack)
        }
        RmaOp::Read => {
            let resp = Frame {
                len: f.len,
                ..Frame::new(Op::ReadResp, f.psn)
            };
            let payload = through_socket.map(|(_mem, src, _)| (*src as *const u8, f.len as usize));
            // SAFETY: the payload is `len` bytes inside the mapping `place` keeps alive.
            unsafe { send_frame(fd, &resp, payload) }.map_err(|_| Fatal::transport())?;
            Counters::add(&qp.counters.bytes_served, len);
            Ok(Reply::Sent)
        }
    }
}

/// Receives a payload into `dst`: all `len` bytes for the thread, what has arrived for a waiter
/// (which never waits for a peer's slow link). The bytes received. The responder's WRITEs and
/// the requester's READ responses both land so.
///
/// # Safety
///
/// `dst` must be valid for writes of `len` bytes for the duration of the call.
pub(crate) unsafe fn receive(
    fd: RawFd,
    dst: *mut u8,
    len: usize,
    mode: Mode,
) -> std::io::Result<usize> {
    // SAFETY: the caller's contract.
    unsafe {
        match mode {
            Mode::Thread => recv_into(fd, dst, len).map(|()| len),
            Mode::Waiter => recv_arrived(fd, dst, len),
        }
    }
}

/// A WRITE or READ from a same-device peer: one copy between its buffer and ours, the loopback
/// DMA of a NIC. `peer` is the requester's side, `None` if it named memory it never handed
/// over.
fn copy_local(
    op: RmaOp,
    place: Option<(&Arc<Memory>, *mut u8)>,
    peer: Option<(Arc<Memory>, *mut u8)>,
    len: u64,
) -> Result<(), Fatal> {
    let Some((_ours, ours)) = place else {
        return Ok(());
    };
    let (_theirs, theirs) = peer.ok_or(Fatal::invalid("same-device reference"))?;
    let (src, dst) = match op {
        RmaOp::Write => (theirs, ours),
        RmaOp::Read => (ours, theirs),
    };
    // SAFETY: both ranges are `len` bytes inside mappings the two Arcs keep alive. They are
    // shared memory others may write (defined contents only after completion, as with DMA),
    // so only raw pointers touch them; `copy` tolerates the overlap a QP looped back on its
    // own buffer could create.
    unsafe { std::ptr::copy(src, dst, len as usize) };
    Ok(())
}

/// SEND and SEND_WITH_INV: consume a posted receive, land the payload in it, and for
/// SEND_WITH_INV invalidate the named window (which must be bound to this QP).
fn serve_send(qp: &QpShared, fd: RawFd, f: &Frame) -> Result<Reply, Fatal> {
    let Some(recv) = qp.take_recv() else {
        return Ok(Reply::Stop);
    };
    let len = f.len as usize;
    let complete = |status, inv| {
        qp.recv_cq
            .push(qp.recv_completion(recv.wr_id, status, f.len, inv));
    };
    if len > recv.sge.as_ref().map_or(0, |s| s.2) {
        complete(WcStatus::LocLenErr, None);
        return Err(Fatal::invalid("receive buffer too small"));
    }
    if let Some((mr, offset, _)) = recv.sge.as_ref().filter(|_| len > 0) {
        let usable = mr.ctx.uid == qp.ctx.uid
            && mr.pd == qp.pd
            && mr.is_registered()
            && mr.access.contains(Access::LOCAL_WRITE);
        let Some(dst) = usable
            .then(|| mr.mem.range(*offset as u64, len as u64))
            .flatten()
        else {
            // The responder's own receive is at fault: LOC_PROT_ERR here, REM_OP_ERR there.
            complete(WcStatus::LocProtErr, None);
            return Err(Fatal {
                nak: Some(NakCode::RemoteOperational),
                cause: Cause::WorkRequest,
                check: "receive buffer protection",
            });
        };
        // SAFETY: `dst` is `len` bytes inside the receive MR's mapping, which `recv` keeps alive.
        unsafe { recv_into(fd, dst, len) }.map_err(|_| Fatal::transport())?;
    }
    Counters::add(&qp.counters.bytes_received, len as u64);
    let invalidated = if f.op == Op::SendInv {
        if let Err(rule) = qp.remote_invalidate(f.key) {
            complete(WcStatus::RemInvReqErr, None);
            return Err(Fatal::invalid(rule));
        }
        Some(f.key)
    } else {
        None
    };
    complete(WcStatus::Success, invalidated);
    Ok(Reply::Ack)
}

/// Reports a fatal request: counts it, then ERROR here, the NAK (if the connection still works) before any
/// completion or event of ours is visible (as a NIC NAKs before its software hears of it, so
/// an application reacting to the error, e.g. destroying the QP, cannot swallow the NAK), then
/// the close that fails the requester's QP, and the audit log.
fn fail(qp: &QpShared, fd: RawFd, f: &Frame, fatal: &Fatal) {
    // Counted first, so whoever sees the ERROR state or the async event also sees the count.
    match fatal.cause {
        Cause::Access => {
            Counters::add(&qp.counters.remote_access_errors, 1);
            qp.ctx.table.bump(Counter::RemoteAccessErrors);
        }
        Cause::InvalidRequest => {
            Counters::add(&qp.counters.invalid_requests, 1);
            qp.ctx.table.bump(Counter::InvalidRequests);
        }
        Cause::WorkRequest | Cause::Transport | Cause::User => {}
    }
    qp.fail_queues_with(fatal.cause, || {
        if let Some(code) = fatal.nak {
            let nak = Frame {
                code: code as u8,
                ..Frame::new(Op::Nak, f.psn)
            };
            // If even the NAK cannot be sent, the requester learns from the closed connection.
            let _ = send_header(fd, &nak);
        }
    });
    qp.shut_write_sides();
    tracing::warn!(
        qp = qp.num,
        op = ?f.op,
        rkey = format_args!("{:#x}", f.key),
        addr = format_args!("{:#x}", f.addr),
        len = f.len,
        check = fatal.check,
        "refused request; QP to ERROR"
    );
}

/// Waits until a request is readable on `fd`, for at most [`super::qp::THREAD_NAP`] so the
/// thread looks at the waiters again. Polls for up to `poll` first (the context's
/// [`DeviceOptions::responder_poll`](super::DeviceOptions)), yielding the core between looks
/// so a thread it would keep from running gets it.
fn wait_request(fd: RawFd, poll: Duration) -> bool {
    // Without polling (the default) no clock is read on the way to sleep.
    if !poll.is_zero() {
        let start = Instant::now();
        while start.elapsed() < poll {
            if readable(fd, 0) {
                return true;
            }
            std::thread::yield_now();
        }
    }
    readable(fd, super::qp::THREAD_NAP.as_millis() as i32)
}

/// Whether `fd` has something to read (data, EOF or an error) within `timeout_ms`.
pub(crate) fn readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    n != 0
}

/// Reads and drops everything until the peer closes, so it never blocks sending to a QP that
/// stopped serving, and learns of the failure from our closed direction instead.
fn drain(fd: RawFd) {
    let mut scratch = [0u8; 16 * 1024];
    loop {
        // SAFETY: receiving into a stack buffer of the given length.
        let n = unsafe { libc::recv(fd, scratch.as_mut_ptr().cast(), scratch.len(), 0) };
        if n > 0 {
            continue;
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return;
    }
}
