//! Completion processing of a connected QP: reads the responses to this QP's requests (ACK,
//! NAK, READ response) and completes work requests in order. READ data is received straight
//! into the registered buffer the work request named (or, from a same-device peer, is already
//! there when the response arrives: the peer's responder copied it, see [`super::channel`]).
//!
//! Two parties may do the reading, one at a time under the QP's reader lock: a caller waiting
//! on the CQ ([`SoftCq::wait`](super::SoftCq) / `poll`), which reads the response in its own
//! thread, and the QP's completion thread, which does it when no caller waits (see
//! [`super::cq::Progress`]). The first saves the hand-off from a reading thread to the caller,
//! which dominates a small round trip (a thread wake-up costs more than the whole syscall path).
//! A caller never waits for a payload still on the wire (see [`drain_ready`]).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, TryLockError};
use std::thread;

use super::channel::Channel;
use super::qp::{Cause, LocalSeg, QpShared, THREAD_NAP};
use super::responder::{Mode, readable, receive};
use super::wire::{Frame, NakCode, Op, Queued, discard, try_read_frame};
use crate::verbs::{QpState, WcStatus};

/// The completion thread: waits until responses are readable, then processes them unless a
/// waiting caller already is.
pub(crate) fn run(qp: &Arc<QpShared>, stream: &Channel) {
    let fd = stream.as_raw_fd();
    loop {
        if qp.step_aside() {
            // A waiter reads the responses itself: waking up for each of them would only take
            // a core from it.
            if crate::soft::lock(&qp.reader).is_none() {
                // The QP is being destroyed or reset.
                return;
            }
            continue;
        }
        if !readable(fd, THREAD_NAP.as_millis() as i32) {
            continue;
        }
        let reader = match qp.reader.try_lock() {
            Ok(reader) => reader,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // A caller is reading; look again once it had the chance to finish.
                thread::yield_now();
                continue;
            }
        };
        if reader.is_none() {
            return;
        }
        let ended = drain_ready(qp, stream, Mode::Thread);
        drop(reader);
        if ended {
            break;
        }
    }
    // The peer closed (it went to ERROR or away) or broke the protocol.
    qp.enter_error(Cause::Transport);
}

/// Processes every response already waiting on `fd`; the caller holds the QP's reader lock.
/// True once the channel ended (EOF, error, or a protocol violation).
///
/// A waiter ([`Mode::Waiter`], driving every QP of the CQ it waits on) never waits for a READ
/// response's payload still on the wire: it takes what has arrived and leaves the rest
/// ([`Arriving`]) to whoever drives the QP next, itself included. Otherwise a peer behind a
/// slow link, its payload trickling in, would hold the waiter, and with it the completions of
/// every other QP it drives.
pub(crate) fn drain_ready(qp: &QpShared, stream: &Channel, mode: Mode) -> bool {
    let fd = stream.as_raw_fd();
    let local = stream.is_local();
    if let Some(arriving) = qp.take_arriving() {
        match receive_payload(qp, fd, mode, arriving) {
            Handled::Done => {}
            Handled::Waiting => return false,
            Handled::Broken => return true,
        }
    }
    loop {
        let frame = match try_read_frame(fd) {
            Ok(Queued::Frame(frame)) => frame,
            Ok(Queued::Nothing) => return false,
            Ok(Queued::Ended) | Err(_) => return true,
        };
        match handle(qp, fd, local, mode, &frame) {
            Handled::Done => {}
            Handled::Waiting => return false,
            Handled::Broken => {
                tracing::warn!(qp = qp.num, ?frame, "protocol error on the request channel");
                return true;
            }
        }
    }
}

/// What became of a response.
enum Handled {
    Done,
    /// Part of its payload is still on the wire ([`Arriving`]).
    Waiting,
    /// A protocol violation, or the channel broke.
    Broken,
}

/// A READ response whose payload is still arriving: where it lands, and how much has.
#[derive(Debug)]
pub(crate) struct Arriving {
    frame: Frame,
    seg: Arc<LocalSeg>,
    done: usize,
}

/// Receives the rest of a READ response's payload: all of it for the thread, what has arrived
/// for a waiter (keeping the rest for later). Completes the READ once it is all in.
fn receive_payload(qp: &QpShared, fd: RawFd, mode: Mode, mut a: Arriving) -> Handled {
    let Some(dst) = a.seg.ptr() else {
        return Handled::Broken;
    };
    let rest = a.seg.len - a.done;
    // SAFETY: `dst` is `seg.len` bytes inside the mapping `seg` keeps alive, so `dst + done`
    // is valid for `rest`.
    let got = unsafe { receive(fd, dst.add(a.done), rest, mode) };
    let Ok(got) = got else {
        return Handled::Broken;
    };
    a.done += got;
    if a.done < a.seg.len {
        qp.set_arriving(a);
        return Handled::Waiting;
    }
    qp.read_done(a.frame.psn, a.frame.len);
    Handled::Done
}

/// Applies one response. `local`: READ responses carry no payload.
fn handle(qp: &QpShared, fd: RawFd, local: bool, mode: Mode, frame: &Frame) -> Handled {
    let ok = |ok: bool| if ok { Handled::Done } else { Handled::Broken };
    if qp.state() == QpState::Error {
        // Already failed: drain whatever still arrives until the peer closes, so its responder
        // never blocks on a response we will not read.
        let payload = if frame.op == Op::ReadResp && !local {
            frame.len
        } else {
            0
        };
        return ok(discard(fd, payload as usize).is_ok());
    }
    match frame.op {
        Op::Ack => {
            qp.ack_through(frame.psn);
            Handled::Done
        }
        Op::ReadResp => {
            let Some(seg) = qp.read_target(frame.psn, frame.len) else {
                return Handled::Broken;
            };
            if local {
                qp.read_done(frame.psn, frame.len);
                return Handled::Done;
            }
            let arriving = Arriving {
                frame: *frame,
                seg,
                done: 0,
            };
            receive_payload(qp, fd, mode, arriving)
        }
        Op::Nak => {
            let status = match NakCode::from_u8(frame.code) {
                Some(NakCode::InvalidRequest) => WcStatus::RemInvReqErr,
                Some(NakCode::RemoteAccess) => WcStatus::RemAccessErr,
                Some(NakCode::RemoteOperational) => WcStatus::RemOpErr,
                Some(NakCode::Sequence) | None => WcStatus::RetryExcErr,
            };
            qp.nak(frame.psn, status);
            Handled::Done
        }
        // A request on the response direction: the peer is broken.
        Op::Send | Op::SendInv | Op::Write | Op::ReadReq => Handled::Broken,
    }
}
