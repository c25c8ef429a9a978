//! Leases on a link: binding a call's window, invalidating it after the reply, and revoking
//! it when the call times out (the slot goes back to the pool only once the window is dead).

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use super::{BIND, CallGuard, INV, Link, Outcome, Phase, REVOKE_WAIT, wr_id};
use crate::provider::{MemoryRegion, RdmaDevice};
use crate::session::error::SessionError;
use crate::session::lease::ScopedRkey;
use crate::session::lock;
use crate::session::pool::Slot;
use crate::session::stats::{LeaseEvent, LeaseEventKind, bump};
use crate::session::wire::LeaseRight;
use crate::verbs::{Access, MwBind, SendOp, SendWr, WcStatus};

impl<D: RdmaDevice> Link<D> {
    /// Binds the context's window over exactly `len` bytes of `slot` with one right.
    pub(super) fn bind(
        &self,
        idx: u16,
        slot: &Slot<D::Mr>,
        len: usize,
        right: LeaseRight,
        deadline: Instant,
    ) -> Result<ScopedRkey, SessionError> {
        let ctx = &self.ctxs[idx as usize];
        let (rkey, generation) = lock(&ctx.state).rotation.next_bind();
        let mr = slot.mr();
        self.post(deadline, || SendWr {
            wr_id: wr_id(BIND, idx, generation),
            op: SendOp::BindMw(MwBind {
                mw: &ctx.window,
                mr,
                rkey,
                addr: mr.addr() + slot.offset() as u64,
                len: len as u64,
                access: right.access() | Access::ZERO_BASED,
            }),
            signaled: false,
        })?;
        bump(&self.shared.counters.binds);
        self.log(LeaseEventKind::Bind, rkey, generation);
        Ok(ScopedRkey {
            rkey,
            addr: 0,
            len: len as u32,
            right,
            generation,
            qp_num: self.qp_num,
        })
    }

    pub(super) fn log(&self, kind: LeaseEventKind, rkey: u32, generation: u64) {
        self.shared.leases.record(LeaseEvent {
            kind,
            rkey,
            generation,
            qp_num: self.qp_num,
            at: Instant::now(),
        });
    }

    /// LOCAL_INV of `lease` on this QP, waiting for its completion.
    pub(super) fn invalidate(
        &self,
        idx: u16,
        lease: &ScopedRkey,
        deadline: Instant,
    ) -> Result<(), SessionError> {
        let ctx = &self.ctxs[idx as usize];
        {
            let mut st = lock(&ctx.state);
            st.inv = None;
            st.waiter = Some(thread::current());
        }
        self.post(deadline, || SendWr {
            wr_id: wr_id(INV, idx, lease.generation),
            op: SendOp::LocalInv { rkey: lease.rkey },
            signaled: true,
        })?;
        let done = || lock(&ctx.state).inv.is_some() || self.dead.load(Ordering::Acquire);
        self.router.wait(&done, deadline, &|wc| self.dispatch(wc));
        match lock(&ctx.state).inv {
            Some(WcStatus::Success) => Ok(()),
            Some(_) => Err(self.failure_error()),
            None if self.dead.load(Ordering::Acquire) => Err(self.failure_error()),
            None => Err(self.timeout(0, Instant::now())),
        }
    }

    /// The call timed out: revoke its window before its slot can be reused, and park the context
    /// until its late reply. `None` if the reply won the race after all.
    pub(super) fn time_out(
        &self,
        call: &mut CallGuard<'_, D>,
        request_id: u64,
        started: Instant,
    ) -> Option<SessionError> {
        let ctx = &self.ctxs[call.idx as usize];
        {
            let mut st = lock(&ctx.state);
            if st.outcome.is_some() {
                return None;
            }
            st.phase = Phase::Revoking;
        }
        bump(&self.shared.counters.timeouts);
        let mut revoked = false;
        if let Some(lease) = call.lease {
            match self.invalidate(call.idx, &lease, Instant::now() + REVOKE_WAIT) {
                Ok(()) => {
                    revoked = true;
                    self.revoked.fetch_add(1, Ordering::AcqRel);
                    self.log(LeaseEventKind::Revoke, lease.rkey, lease.generation);
                    call.slot = None;
                }
                Err(_) => self.fail(None, "could not revoke the window of a timed-out call"),
            }
        }
        call.parked = true;
        let late = {
            let mut st = lock(&ctx.state);
            st.revoked = revoked;
            st.parked_slot = call.slot.take();
            match st.outcome.take() {
                Some(Outcome::Reply { recv, .. }) => Some(recv),
                _ => {
                    st.phase = Phase::Parked;
                    st.waiter = None;
                    None
                }
            }
        };
        if let Some(recv) = late {
            self.repost(recv);
            self.release_parked(call.idx, revoked);
        } else {
            let parked = self.parked.fetch_add(1, Ordering::AcqRel) + 1;
            if parked * 2 >= u32::from(self.depth) {
                self.fail(None, "too many calls timed out on this connection");
            }
        }
        Some(self.timeout(request_id, started))
    }

    pub(super) fn release_parked(&self, idx: u16, revoked: bool) {
        if revoked {
            self.revoked.fetch_sub(1, Ordering::AcqRel);
        }
        bump(&self.shared.counters.late_replies);
        self.free_ctx(idx);
    }
}
