//! A call on a link: lease the bulk slot, send the request, wait for the reply, make sure the
//! window is dead, hand out reply and data.

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use super::{CallGuard, Link, Outcome, Phase, REVOKE_WAIT, SEND, SIGNAL_EVERY, wr_id};
use crate::provider::{MemoryRegion, RdmaDevice};
use crate::session::connection::Bulk;
#[cfg(feature = "testing")]
use crate::session::connection::Forgery;
use crate::session::error::SessionError;
use crate::session::lock;
use crate::session::stats::{LeaseEventKind, add, bump};
use crate::session::tenant::Invalidation;
use crate::session::wire::{
    FLAG_INVALIDATE_WITH_REPLY, LeaseClaim, LeaseRight, MAX_CONTROL_MESSAGE, REPLY_HEADER_LEN,
    REQUEST_HEADER_LEN, ReplyHeader, ReplyStatus, RequestHeader,
};
use crate::verbs::{SendOp, SendWr, Sge};

impl<D: RdmaDevice> Link<D> {
    /// One call (see [`Connection::call`](super::Connection::call)); returns the bulk length.
    pub fn call(
        &self,
        request: &[u8],
        bulk: Bulk<'_>,
        reply: &mut Vec<u8>,
        deadline: Instant,
    ) -> Result<usize, SessionError> {
        let started = Instant::now();
        let mut call = self.prepare(request, &bulk, deadline, started)?;
        let claim = call.lease.map(|l| l.claim());
        let tag = call.idx;
        let request_id = self.send(&mut call, tag, claim, request.len(), next_id, deadline)?;
        self.complete(call, request_id, bulk, reply, deadline, started)
    }

    /// **Test facility** (feature `testing`): [`Link::call`] with the request header naming
    /// what `forgery` says (see [`Forgery`]).
    #[cfg(feature = "testing")]
    pub fn call_forged(
        &self,
        request: &[u8],
        bulk: Bulk<'_>,
        reply: &mut Vec<u8>,
        deadline: Instant,
        forgery: &Forgery,
    ) -> Result<usize, SessionError> {
        let started = Instant::now();
        let mut call = self.prepare(request, &bulk, deadline, started)?;
        let claim = forgery.lease.or_else(|| call.lease.map(|l| l.claim()));
        let len = request.len();
        let tag = forgery.tag.unwrap_or(call.idx);
        let request_id = match forgery.request_id {
            // Sent as it is; later calls still get ids above every one sent.
            Some(id) => {
                let forced = |last: &mut u64| {
                    *last = (*last).max(id);
                    id
                };
                self.send(&mut call, tag, claim, len, forced, deadline)?
            }
            None => self.send(&mut call, tag, claim, len, next_id, deadline)?,
        };
        self.complete(call, request_id, bulk, reply, deadline, started)
    }

    /// Checks the sizes, takes a call context, writes the request into its send buffer and,
    /// if there is bulk, leases a slot (filled for [`Bulk::ToServer`]) and binds the context's
    /// window over it.
    fn prepare(
        &self,
        request: &[u8],
        bulk: &Bulk<'_>,
        deadline: Instant,
        started: Instant,
    ) -> Result<CallGuard<'_, D>, SessionError> {
        if request.len() > MAX_CONTROL_MESSAGE {
            return Err(SessionError::MessageTooLarge {
                len: request.len(),
                max: MAX_CONTROL_MESSAGE,
            });
        }
        if bulk.len() > self.max_bulk {
            return Err(SessionError::BulkTooLarge {
                len: bulk.len(),
                max: self.max_bulk,
            });
        }
        let idx = self.take_ctx(deadline, started)?;
        let mut call = CallGuard {
            link: self,
            idx,
            slot: None,
            lease: None,
            parked: false,
        };
        let mr = self.block.mr();
        // SAFETY: send slot `idx` is this call's: it took the index off the free list.
        unsafe { mr.write_at(self.send_offset(idx) + REQUEST_HEADER_LEN, request)? };
        if !bulk.is_empty() {
            let (pool, right) = match bulk {
                Bulk::ToServer(_) => (&self.shared.write_pool, LeaseRight::RemoteRead),
                _ => (&self.shared.read_pool, LeaseRight::RemoteWrite),
            };
            let slot = pool
                .acquire(deadline)
                .ok_or_else(|| self.timeout(0, started))?;
            if let Bulk::ToServer(data) = bulk {
                // SAFETY: the pool hands a slot to one call at a time; nothing is posted on it
                // yet.
                unsafe { slot.mr().write_at(slot.offset(), data)? };
            }
            call.lease = Some(self.bind(idx, &slot, bulk.len(), right, deadline)?);
            call.slot = Some(slot);
        }
        Ok(call)
    }

    /// Sends the prepared call's request naming `claim`, with the id `assign_id` takes from
    /// the last one assigned (see [`Link::post_request`]).
    fn send(
        &self,
        call: &mut CallGuard<'_, D>,
        tag: u16,
        claim: Option<LeaseClaim>,
        msg_len: usize,
        assign_id: impl FnOnce(&mut u64) -> u64,
        deadline: Instant,
    ) -> Result<u64, SessionError> {
        let flags = match (call.lease, self.shared.config.invalidation) {
            (Some(_), Invalidation::WithReply) => FLAG_INVALIDATE_WITH_REPLY,
            _ => 0,
        };
        self.post_request((call.idx, tag), flags, claim, msg_len, assign_id, deadline)
            .inspect_err(|_| {
                // The window may be bound: keep its slot until the QP is gone.
                self.fail(None, "posting a request failed");
                lock(&self.ctxs[call.idx as usize].state).parked_slot = call.slot.take();
            })
    }

    /// Waits for the reply to request `request_id` (or times out, revoking the window), then
    /// finishes the call.
    fn complete(
        &self,
        mut call: CallGuard<'_, D>,
        request_id: u64,
        bulk: Bulk<'_>,
        reply: &mut Vec<u8>,
        deadline: Instant,
        started: Instant,
    ) -> Result<usize, SessionError> {
        let ctx = &self.ctxs[call.idx as usize];
        let done = || lock(&ctx.state).outcome.is_some();
        if !self.router.wait(&done, deadline, &|wc| self.dispatch(wc))
            && let Some(err) = self.time_out(&mut call, request_id, started)
        {
            return Err(err);
        }
        let outcome = lock(&ctx.state).outcome.take();
        match outcome {
            Some(Outcome::Reply {
                recv,
                byte_len,
                header,
                invalidated,
            }) => {
                let result =
                    self.finish(&mut call, header, byte_len, recv, invalidated, bulk, reply);
                self.repost(recv);
                result
            }
            _ => {
                // The QP failed: a late RMA could still be in flight until it is destroyed.
                lock(&ctx.state).parked_slot = call.slot.take();
                Err(self.failure_error())
            }
        }
    }

    /// Assigns the request id (`assign_id` gets the last one assigned, and is [`next_id`]
    /// except for forged calls) and posts the SEND, under one lock so ids reach the server in
    /// increasing order.
    fn post_request(
        &self,
        (idx, tag): (u16, u16),
        flags: u8,
        lease: Option<LeaseClaim>,
        msg_len: usize,
        assign_id: impl FnOnce(&mut u64) -> u64,
        deadline: Instant,
    ) -> Result<u64, SessionError> {
        let mut next = lock(&self.next_id);
        let request_id = assign_id(&mut next);
        let header = RequestHeader {
            flags,
            tag,
            request_id,
            lease,
            msg_len: msg_len as u32,
        };
        let offset = self.send_offset(idx);
        // SAFETY: send slot `idx` is this call's (see `call`), and not yet posted.
        unsafe { self.block.mr().write_at(offset, &header.encode())? };
        {
            let mut st = lock(&self.ctxs[idx as usize].state);
            st.phase = Phase::InFlight;
            st.request_id = request_id;
            st.outcome = None;
            st.answered = false;
            st.waiter = Some(thread::current());
        }
        let signaled = self
            .sends
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SIGNAL_EVERY);
        self.post(deadline, || SendWr {
            wr_id: wr_id(SEND, idx, 0),
            op: SendOp::Send {
                sge: Some(Sge {
                    mr: self.block.mr(),
                    offset,
                    len: REQUEST_HEADER_LEN + msg_len,
                }),
            },
            signaled,
        })?;
        Ok(request_id)
    }

    /// After the reply: make sure the window is invalidated, then hand out the reply and data.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish(
        &self,
        call: &mut CallGuard<'_, D>,
        header: ReplyHeader,
        byte_len: u32,
        recv: u16,
        invalidated: Option<u32>,
        bulk: Bulk<'_>,
        reply: &mut Vec<u8>,
    ) -> Result<usize, SessionError> {
        if let Some(lease) = call.lease {
            if invalidated == Some(lease.rkey) {
                bump(&self.shared.counters.remote_invalidations);
                self.log(
                    LeaseEventKind::RemoteInvalidate,
                    lease.rkey,
                    lease.generation,
                );
            } else {
                let deadline = Instant::now() + REVOKE_WAIT;
                if let Err(e) = self.invalidate(call.idx, &lease, deadline) {
                    // The window may still be bound: the QP goes, the slot stays until it has.
                    self.fail(None, "could not invalidate a window after the reply");
                    lock(&self.ctxs[call.idx as usize].state).parked_slot = call.slot.take();
                    return Err(e);
                }
                bump(&self.shared.counters.local_invalidations);
                self.log(
                    LeaseEventKind::LocalInvalidate,
                    lease.rkey,
                    lease.generation,
                );
            }
        }
        let msg_len = header.msg_len as usize;
        if msg_len > MAX_CONTROL_MESSAGE || REPLY_HEADER_LEN + msg_len > byte_len as usize {
            return Err(self.protocol("reply longer than its message"));
        }
        let body = self.recv_offset(recv) + REPLY_HEADER_LEN;
        reply.clear();
        reply.resize(msg_len, 0);
        // SAFETY: the receive slot holding this call's reply is its own until posted again.
        unsafe { self.block.mr().read_at(body, reply)? };
        if header.status == ReplyStatus::Refused {
            bump(&self.shared.counters.refused);
            return Err(SessionError::RequestRefused {
                reason: String::from_utf8_lossy(reply).into_owned(),
            });
        }
        let bulk_len = header.bulk_len as usize;
        match (bulk, &call.slot) {
            (Bulk::FromServer(out), Some(slot)) if bulk_len <= out.len() => {
                // SAFETY: the call's slot; the server's WRITE into it completed before the reply.
                unsafe { slot.mr().read_at(slot.offset(), &mut out[..bulk_len])? };
                add(&self.shared.counters.bytes_from_server, bulk_len as u64);
            }
            (Bulk::ToServer(data), _) => {
                add(&self.shared.counters.bytes_to_server, data.len() as u64);
            }
            _ if bulk_len == 0 => {}
            _ => return Err(self.protocol("reply claims more bulk data than was leased")),
        }
        Ok(bulk_len)
    }

    pub(super) fn protocol(&self, detail: &str) -> SessionError {
        SessionError::Protocol {
            peer: self.peer,
            detail: detail.into(),
        }
    }
}

/// The id of a call's request: the one after the last assigned.
fn next_id(last: &mut u64) -> u64 {
    *last += 1;
    *last
}
