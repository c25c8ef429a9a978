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

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, TryLockError};
use std::thread;

use super::channel::Channel;
use super::qp::{Cause, QpShared, THREAD_NAP};
use super::responder::readable;
use super::wire::{Frame, NakCode, Op, Queued, discard, recv_into, try_read_frame};
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
        let ended = drain_ready(qp, stream);
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
pub(crate) fn drain_ready(qp: &QpShared, stream: &Channel) -> bool {
    let fd = stream.as_raw_fd();
    loop {
        match try_read_frame(fd) {
            Ok(Queued::Frame(frame)) => {
                if !handle(qp, fd, stream.is_local(), &frame) {
                    tracing::warn!(qp = qp.num, ?frame, "protocol error on the request channel");
                    return true;
                }
            }
            Ok(Queued::Nothing) => return false,
            Ok(Queued::Ended) | Err(_) => return true,
        }
    }
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
