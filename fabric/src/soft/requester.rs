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
//! A caller never waits for a payload still on the wire: that is the thread's (see
//! [`drain_ready`]).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, TryLockError};
use std::thread;

use super::channel::Channel;
use super::qp::{Cause, QpShared, THREAD_NAP};
use super::responder::{Mode, readable};
use super::wire::{
    Frame, NakCode, Op, Queued, discard, queued_at_least, recv_into, try_read_frame,
};
use crate::verbs::{QpState, WcStatus};

/// The completion thread: waits until responses are readable, then processes them unless a
/// waiting caller already is.
pub(crate) fn run(qp: &Arc<QpShared>, stream: &Channel) {
    let fd = stream.as_raw_fd();
    loop {
        if !qp.has_unfinished_response() && qp.step_aside() {
            // A waiter reads the responses itself: waking up for each of them would only take
            // a core from it.
            if crate::soft::lock(&qp.reader).is_none() {
                // The QP is being destroyed or reset.
                return;
            }
            continue;
        }
        // A response a waiter left half-read is ours to finish, readable yet or not.
        if !qp.has_unfinished_response() && !readable(fd, THREAD_NAP.as_millis() as i32) {
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
/// response's payload still on the wire: it leaves the response to this QP's completion thread
/// and goes on. Otherwise a peer behind a slow link, its payload trickling in, would hold the
/// waiter, and with it the completions of every other QP it drives.
pub(crate) fn drain_ready(qp: &QpShared, stream: &Channel, mode: Mode) -> bool {
    let fd = stream.as_raw_fd();
    let local = stream.is_local();
    if mode == Mode::Waiter && qp.has_unfinished_response() {
        // Responses complete in order: the thread finishes that one first.
        return false;
    }
    let mut unfinished = qp.take_unfinished_response();
    loop {
        let frame = match unfinished
            .take()
            .map_or_else(|| try_read_frame(fd), |f| Ok(Queued::Frame(f)))
        {
            Ok(Queued::Frame(frame)) => frame,
            Ok(Queued::Nothing) => return false,
            Ok(Queued::Ended) | Err(_) => return true,
        };
        if mode == Mode::Waiter && !payload_arrived(fd, local, &frame) {
            qp.leave_unfinished_response(frame);
            return false;
        }
        if !handle(qp, fd, local, &frame) {
            tracing::warn!(qp = qp.num, ?frame, "protocol error on the request channel");
            return true;
        }
    }
}

/// Whether all of `frame`'s payload is already in the socket: reading it cannot block.
fn payload_arrived(fd: RawFd, local: bool, frame: &Frame) -> bool {
    let on_socket = frame.op == Op::ReadResp && !local;
    !on_socket || queued_at_least(fd, frame.len as usize)
}

/// Applies one response; false on a protocol error. `local`: READ responses carry no payload.
fn handle(qp: &QpShared, fd: RawFd, local: bool, frame: &Frame) -> bool {
    if qp.state() == QpState::Error {
        // Already failed: drain whatever still arrives until the peer closes, so its responder
        // never blocks on a response we will not read.
        let payload = if frame.op == Op::ReadResp && !local {
            frame.len
        } else {
            0
        };
        return discard(fd, payload as usize).is_ok();
    }
    match frame.op {
        Op::Ack => {
            qp.ack_through(frame.psn);
            true
        }
        Op::ReadResp => {
            let Some(seg) = qp.read_target(frame.psn, frame.len) else {
                return false;
            };
            if local {
                qp.read_done(frame.psn, frame.len);
                return true;
            }
            // SAFETY: `dst` is `seg.len` bytes inside the mapping `seg` keeps alive.
            match seg.ptr() {
                Some(dst) if unsafe { recv_into(fd, dst, seg.len) }.is_ok() => {
                    qp.read_done(frame.psn, frame.len);
                    true
                }
                _ => false,
            }
        }
        Op::Nak => {
            let status = match NakCode::from_u8(frame.code) {
                Some(NakCode::InvalidRequest) => WcStatus::RemInvReqErr,
                Some(NakCode::RemoteAccess) => WcStatus::RemAccessErr,
                Some(NakCode::RemoteOperational) => WcStatus::RemOpErr,
                Some(NakCode::Sequence) | None => WcStatus::RetryExcErr,
            };
            qp.nak(frame.psn, status);
            true
        }
        // A request on the response direction: the peer is broken.
        Op::Send | Op::SendInv | Op::Write | Op::ReadReq => false,
    }
}
