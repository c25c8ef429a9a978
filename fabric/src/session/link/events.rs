//! Completion dispatch of a link, and what happens when its QP dies: every waiting call fails,
//! the failure is classified once (access error, late RMA, lost transport), counted, logged
//! and fed to the quarantine policy.

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use super::{Failure, INV, Link, Outcome, Phase, RECV, wr_parts};
use crate::provider::{MemoryRegion, QueuePair, RdmaDevice};
use crate::session::error::SessionError;
use crate::session::stats::bump;
use crate::session::wire::{REPLY_HEADER_LEN, ReplyHeader};
use crate::session::{lock, unpark_after};
use crate::verbs::{AsyncEvent, QpTransition, WcStatus, WorkCompletion};

impl<D: RdmaDevice> Link<D> {
    /// Handles one completion of this link's CQ (called by the polling thread).
    pub(super) fn dispatch(&self, wc: &WorkCompletion) {
        let (kind, idx, low) = wr_parts(wc.wr_id);
        if matches!(wc.status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr) {
            self.access_status.store(true, Ordering::Release);
        }
        match kind {
            RECV if wc.status == WcStatus::Success => self.on_reply(idx, wc),
            INV => {
                if let Some(ctx) = self.ctxs.get(idx as usize) {
                    let mut st = lock(&ctx.state);
                    if st.rotation.is_current(low) {
                        st.inv = Some(wc.status);
                        unpark_after(st, |st| st.waiter.clone());
                    }
                }
                if wc.status != WcStatus::Success {
                    self.fail(Some(wc.status), "window invalidation failed");
                }
            }
            _ if wc.status != WcStatus::Success => {
                self.fail(Some(wc.status), "a work request failed");
            }
            _ => {}
        }
    }

    pub(super) fn on_reply(&self, recv: u16, wc: &WorkCompletion) {
        let mut raw = [0u8; REPLY_HEADER_LEN];
        // SAFETY: receive slot `recv` is this completion's until it is posted again, which
        // only its dispatch (this call and the caller it wakes) does.
        let header = unsafe { self.block.mr().read_at(self.recv_offset(recv), &mut raw) }
            .ok()
            .and_then(|()| ReplyHeader::decode(&raw))
            .filter(|h| h.tag < self.depth && wc.byte_len as usize >= REPLY_HEADER_LEN);
        let Some(header) = header else {
            self.fail(None, "malformed reply");
            return;
        };
        self.replied();
        let ctx = &self.ctxs[header.tag as usize];
        let mut st = lock(&ctx.state);
        if st.request_id != header.request_id || st.phase == Phase::Idle || st.answered {
            drop(st);
            self.repost(recv);
            return;
        }
        if st.phase == Phase::Parked {
            let revoked = st.revoked;
            drop(st);
            self.repost(recv);
            self.parked.fetch_sub(1, Ordering::AcqRel);
            self.release_parked(header.tag, revoked);
            return;
        }
        st.answered = true;
        st.outcome = Some(Outcome::Reply {
            recv,
            byte_len: wc.byte_len,
            header,
            invalidated: wc.invalidated_rkey,
        });
        unpark_after(st, |st| st.waiter.clone());
    }

    /// Marks the link dead (once): the QP goes to ERROR and every waiting call fails.
    pub fn fail(&self, status: Option<WcStatus>, why: &str) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(peer = %self.peer, qp = self.qp_num, ?status, why, "connection QP failed");
        let _ = self.qp.modify(QpTransition::Error);
        for ctx in self.ctxs.iter() {
            let mut st = lock(&ctx.state);
            if matches!(st.phase, Phase::InFlight | Phase::Revoking) {
                st.outcome.get_or_insert(Outcome::Failed);
                st.inv.get_or_insert(WcStatus::WrFlushErr);
                if let Some(t) = &st.waiter {
                    t.unpark();
                }
            }
        }
        self.freed.notify_all();
        self.router.wake_all();
    }

    /// What killed the QP, classified once from the QP's async event, our completions and
    /// counters (the event may trail the completions by a moment).
    pub(super) fn classify(&self) -> Failure {
        let late = |detail: &str| {
            if self.revoked.load(Ordering::Acquire) > 0 {
                Failure::LateRma(format!("{detail} (a late RMA after a timed-out call)"))
            } else {
                Failure::Access(detail.into())
            }
        };
        // The event is posted just after the completions that woke us; allow it a moment.
        for _ in 0..200 {
            match self.shared.qp_event(self.qp_num) {
                Some(AsyncEvent::QpAccessErr { .. }) => {
                    return late("our QP refused a remote access (probe, stale or foreign rkey)");
                }
                Some(AsyncEvent::QpReqErr { .. }) => {
                    return late("our QP refused an invalid request (bad invalidation or opcode)");
                }
                Some(AsyncEvent::QpFatal { .. }) => {
                    return Failure::Lost("the transport failed".into());
                }
                None => {}
            }
            if self.access_status.load(Ordering::Acquire)
                || self.qp.counters().remote_access_errors > 0
            {
                return late("a request completed with a remote access error");
            }
            thread::sleep(Duration::from_millis(1));
        }
        Failure::Lost("the QP went to ERROR".into())
    }

    /// The error for calls on this dead link; the first caller counts, logs and feeds the
    /// quarantine policy.
    pub fn failure_error(&self) -> SessionError {
        let failure = self.failure.get_or_init(|| self.classify()).clone();
        let first = !self.reported.swap(true, Ordering::AcqRel);
        let counters = &self.shared.counters;
        match failure {
            Failure::LateRma(detail) => {
                if first {
                    bump(&counters.late_rma_errors);
                    tracing::info!(peer = %self.peer, qp = self.qp_num, %detail, "QP killed by a late RMA");
                }
                self.access_error(detail)
            }
            Failure::Access(detail) => {
                if first {
                    bump(&counters.access_errors);
                    tracing::warn!(
                        tenant = %lock(&self.shared.tenant),
                        peer = %self.peer,
                        qp = self.qp_num,
                        %detail,
                        "RDMA access error; QP dead, its windows unusable"
                    );
                    self.shared.record_access_error(self.peer);
                }
                self.access_error(detail)
            }
            Failure::Lost(detail) => SessionError::ConnectionLost {
                peer: self.peer,
                detail,
            },
        }
    }

    pub(super) fn access_error(&self, detail: String) -> SessionError {
        SessionError::AccessError {
            peer: self.peer,
            qp_num: self.qp_num,
            detail,
        }
    }

    /// Makes sure a dead link's failure is accounted for (a link can die while idle).
    pub fn report_if_dead(&self) {
        if !self.alive() {
            self.fail(None, "found dead");
            let _ = self.failure_error();
        }
    }
}
