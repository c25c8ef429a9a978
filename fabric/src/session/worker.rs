//! The server's request execution: the worker threads (which also take turns polling the
//! shared CQ), each request's bulk accessor, and the reply.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use super::error::SessionError;
use super::handler::{BulkAccess, BulkOps, Request};
use super::lock;
use super::pool::Slot;
use super::router::post_patiently;
use super::server_conn::{NO_BOUNCE, OwnJob, READ, ServerConn, ServerShared, WRITE, wr_id};
use super::stats::{add, bump};
use super::wire::{
    FLAG_INVALIDATE_WITH_REPLY, LeaseClaim, LeaseRight, MAX_CONTROL_MESSAGE, ReplyHeader,
    ReplyStatus, RequestHeader,
};
use crate::provider::{MemoryRegion, QueuePair, RdmaDevice};
use crate::verbs::{RemoteAddr, SendOp, SendWr, Sge, WcStatus, WorkCompletion};

/// Most RDMA WRITEs one request may post (they stay unsignaled until the reply).
pub const MAX_PUSHES: u32 = 16;
/// How long an idle worker polls before looking at the shutdown flag again.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Request bodies kept for reuse.
const BODIES_KEPT: usize = 64;

/// A request waiting for a worker.
#[derive(Debug)]
pub(crate) struct Job<D: RdmaDevice> {
    pub conn: Arc<ServerConn<D>>,
    pub header: RequestHeader,
    pub body: Vec<u8>,
    /// Refuse it with this reason instead of running the handler.
    pub refusal: Option<String>,
}

struct ServerBulk<'a, D: RdmaDevice> {
    shared: &'a ServerShared<D>,
    conn: &'a ServerConn<D>,
    request_id: u64,
    lease: Option<LeaseClaim>,
    bounce: Option<(Slot<D::Mr>, u16)>,
    pushed_end: usize,
    pushes: u32,
}

fn misuse(what: String) -> SessionError {
    SessionError::BulkMisuse(what)
}

impl<D: RdmaDevice> ServerBulk<'_, D> {
    fn checked(
        &self,
        right: LeaseRight,
        offset: usize,
        len: usize,
    ) -> Result<LeaseClaim, SessionError> {
        let lease = self
            .lease
            .ok_or_else(|| misuse("the request has no bulk memory".into()))?;
        if lease.right != right {
            return Err(misuse(format!(
                "the lease grants {:?}, not {right:?}",
                lease.right
            )));
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > lease.len as usize)
        {
            return Err(misuse(format!(
                "{len} bytes at {offset} outside the {}-byte lease",
                lease.len
            )));
        }
        if self.conn.dead.load(Ordering::Acquire) {
            return Err(SessionError::ConnectionLost {
                peer: self.conn.peer,
                detail: "the connection's QP failed".into(),
            });
        }
        Ok(lease)
    }

    /// The request's bounce buffer, taken on first use.
    fn bounce(&mut self) -> Result<(u16, u16), SessionError> {
        if self.bounce.is_none() {
            let slot = self.wait_bounce()?;
            let mut st = lock(&self.shared.bounce_state[slot.index() as usize]);
            st.epoch = st.epoch.wrapping_add(1);
            st.owner = self.conn.id;
            st.read_done = None;
            let epoch = st.epoch;
            drop(st);
            self.bounce = Some((slot, epoch));
        }
        let (slot, epoch) = self
            .bounce
            .as_ref()
            .map(|(s, e)| (s.index() as u16, *e))
            .unwrap_or((NO_BOUNCE, 0));
        Ok((slot, epoch))
    }

    /// A free bounce buffer. Buffers come back when replies complete, so a worker waiting for
    /// one polls the CQ meanwhile (blocking without polling could starve every worker).
    fn wait_bounce(&self) -> Result<Slot<D::Mr>, SessionError> {
        let shared = self.shared;
        if let Some(slot) = shared.bounce.try_acquire() {
            return Ok(slot);
        }
        let wait = shared.config.rma_timeout;
        let deadline = Instant::now() + wait;
        shared.bounce_waiters.fetch_add(1, Ordering::AcqRel);
        let mut slot = None;
        let done = || shared.bounce.has_free();
        while slot.is_none() && Instant::now() < deadline {
            shared
                .router
                .wait(&done, deadline, &|wc| shared.dispatch(wc, None));
            slot = shared.bounce.try_acquire();
        }
        shared.bounce_waiters.fetch_sub(1, Ordering::AcqRel);
        slot.ok_or(SessionError::Timeout {
            peer: self.conn.peer,
            request_id: self.request_id,
            after: wait,
        })
    }

    fn slot(&self) -> &Slot<D::Mr> {
        &self.bounce.as_ref().expect("bounce taken").0
    }

    fn access_failed(&self, status: WcStatus) -> SessionError {
        if matches!(status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr) {
            SessionError::AccessError {
                peer: self.conn.peer,
                qp_num: self.conn.qp.qp_num(),
                detail: "the worker's NIC refused the RDMA access".into(),
            }
        } else {
            SessionError::ConnectionLost {
                peer: self.conn.peer,
                detail: format!("RDMA access ended with {status:?}"),
            }
        }
    }
}

impl<D: RdmaDevice> BulkOps for ServerBulk<'_, D> {
    fn lease(&self) -> Option<LeaseClaim> {
        self.lease
    }

    fn pull(&mut self, offset: usize, out: &mut [u8]) -> Result<(), SessionError> {
        let lease = self.checked(LeaseRight::RemoteRead, offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let (index, epoch) = self.bounce()?;
        let (shared, conn) = (self.shared, self.conn);
        let state = &shared.bounce_state[index as usize];
        {
            let mut st = lock(state);
            st.read_done = None;
            st.waiter = Some(thread::current());
        }
        conn.last_rkey.store(lease.rkey, Ordering::Release);
        conn.outstanding.fetch_add(1, Ordering::AcqRel);
        let slot = self.slot();
        let deadline = Instant::now() + shared.config.rma_timeout;
        let dispatch = |wc: &WorkCompletion| shared.dispatch(wc, None);
        let posted =
            post_patiently::<D>(&shared.router, &conn.qp, deadline, &dispatch, || SendWr {
                wr_id: wr_id(READ, conn.id, index, epoch),
                op: SendOp::RdmaRead {
                    sge: Sge {
                        mr: slot.mr(),
                        offset: slot.offset() + offset,
                        len: out.len(),
                    },
                    remote: RemoteAddr {
                        addr: lease.addr + offset as u64,
                        rkey: lease.rkey,
                    },
                },
                signaled: true,
            });
        if let Err(e) = posted {
            conn.outstanding.fetch_sub(1, Ordering::AcqRel);
            shared.conn_failed(
                conn,
                super::server_conn::Death::Protocol("posting an RDMA READ failed"),
            );
            return Err(e.into());
        }
        let done = || lock(state).read_done.is_some();
        shared.router.wait(&done, deadline, &dispatch);
        let status = lock(state).read_done;
        match status {
            Some(WcStatus::Success) => {
                // SAFETY: the bounce slot is this request's until it returns; the READ that
                // filled it has completed.
                unsafe { slot.mr().read_at(slot.offset() + offset, out)? };
                add(&shared.counters.bytes_pulled, out.len() as u64);
                Ok(())
            }
            Some(status) => Err(self.access_failed(status)),
            None => {
                shared.conn_failed(
                    conn,
                    super::server_conn::Death::Transport(WcStatus::RetryExcErr),
                );
                Err(SessionError::Timeout {
                    peer: conn.peer,
                    request_id: self.request_id,
                    after: shared.config.rma_timeout,
                })
            }
        }
    }

    fn push_with(
        &mut self,
        offset: usize,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<usize, SessionError> {
        let lease = self.checked(LeaseRight::RemoteWrite, offset, len)?;
        if offset < self.pushed_end {
            return Err(misuse(format!(
                "push at {offset} goes back before the end of the previous push ({})",
                self.pushed_end
            )));
        }
        if self.pushes >= MAX_PUSHES {
            return Err(misuse(format!(
                "more than {MAX_PUSHES} pushes in one request"
            )));
        }
        if len == 0 {
            fill(&mut []);
            return Ok(0);
        }
        let (index, epoch) = self.bounce()?;
        let (shared, conn) = (self.shared, self.conn);
        let slot = self.slot();
        let mut written = 0;
        let mut produce = |buf: &mut [u8]| written = fill(buf).min(buf.len());
        // SAFETY: the slot is this request's alone while it runs (`bounce`), and this range
        // lies at or past the end of every earlier push, so no posted WRITE reads it; the
        // slot's region grants no remote access.
        unsafe {
            slot.mr()
                .fill_at(slot.offset() + offset, len, &mut produce)?
        };
        if written == 0 {
            return Ok(0);
        }
        conn.last_rkey.store(lease.rkey, Ordering::Release);
        let deadline = Instant::now() + shared.config.rma_timeout;
        let dispatch = |wc: &WorkCompletion| shared.dispatch(wc, None);
        post_patiently::<D>(&shared.router, &conn.qp, deadline, &dispatch, || SendWr {
            wr_id: wr_id(WRITE, conn.id, index, epoch),
            op: SendOp::RdmaWrite {
                sge: Sge {
                    mr: slot.mr(),
                    offset: slot.offset() + offset,
                    len: written,
                },
                remote: RemoteAddr {
                    addr: lease.addr + offset as u64,
                    rkey: lease.rkey,
                },
            },
            signaled: false,
        })?;
        self.pushed_end = offset + written;
        self.pushes += 1;
        add(&shared.counters.bytes_pushed, written as u64);
        Ok(written)
    }
}

/// Runs a job that holds one of its connection's claims on the workers, then passes the claim
/// on: the connection's next waiting job is this worker's next one.
fn run_claimed<D: RdmaDevice>(
    shared: &ServerShared<D>,
    job: Job<D>,
    reply: &mut Vec<u8>,
    own: &OwnJob<D>,
) {
    let conn = job.conn.clone();
    run(shared, job, reply);
    if let Some(next) = shared.release(&conn) {
        let mut slot = own.borrow_mut();
        match slot.as_ref() {
            None => *slot = Some(next),
            Some(_) => shared.enqueue(next),
        }
    }
}

/// Runs one request and posts its reply.
fn run<D: RdmaDevice>(shared: &ServerShared<D>, job: Job<D>, reply: &mut Vec<u8>) {
    let Job {
        conn,
        header,
        body,
        refusal,
    } = job;
    if let Some(reason) = refusal {
        shared.refuse(&conn, &header, &reason);
        recycle(shared, body);
        return;
    }
    let mut bulk = ServerBulk {
        shared,
        conn: &conn,
        request_id: header.request_id,
        lease: header.lease,
        bounce: None,
        pushed_end: 0,
        pushes: 0,
    };
    reply.clear();
    let request = Request {
        claims: &conn.claims,
        peer: conn.peer,
        request_id: header.request_id,
        message: &body,
        lease: header.lease,
    };
    shared
        .handler
        .handle(&request, &mut BulkAccess::new(&mut bulk), reply);
    bump(&shared.counters.requests);
    let pushed = bulk.pushed_end;
    // The bounce buffer stays out until the reply completes (or the QP is gone): RMAs posted
    // from it may still be in flight.
    let bounce = match bulk.bounce.take() {
        Some((slot, epoch)) => {
            let index = slot.index() as u16;
            lock(&shared.bounce_state[index as usize]).held = Some(slot);
            (index, epoch)
        }
        None => (NO_BOUNCE, 0),
    };
    recycle(shared, body);
    if conn.dead.load(Ordering::Acquire) {
        shared.remove_if_done(&conn);
        return;
    }
    let too_large;
    let (status, message) = if reply.len() > MAX_CONTROL_MESSAGE {
        too_large = format!(
            "the server's handler produced a {}-byte reply (limit {MAX_CONTROL_MESSAGE})",
            reply.len()
        );
        (ReplyStatus::Refused, too_large.as_bytes())
    } else {
        (ReplyStatus::Ok, reply.as_slice())
    };
    let invalidate = header
        .lease
        .filter(|_| header.flags & FLAG_INVALIDATE_WITH_REPLY != 0 && status == ReplyStatus::Ok)
        .map(|l| l.rkey);
    let reply_header = ReplyHeader {
        status,
        tag: header.tag,
        request_id: header.request_id,
        bulk_len: pushed as u32,
        msg_len: message.len() as u32,
    };
    shared.send_reply(&conn, &reply_header, message, invalidate, bounce);
}

/// Keeps a request body for reuse.
fn recycle<D: RdmaDevice>(shared: &ServerShared<D>, body: Vec<u8>) {
    let mut bodies = lock(&shared.bodies);
    if bodies.len() < BODIES_KEPT {
        bodies.push(body);
    }
}

/// A worker thread: runs queued requests, and polls the CQ while it has none. The first request
/// it finds while polling is its own; the leader's role passes to another idle worker meanwhile.
pub(crate) fn worker_loop<D: RdmaDevice>(shared: &ServerShared<D>) {
    let mut reply = Vec::with_capacity(4096);
    let own: OwnJob<D> = std::cell::RefCell::new(None);
    while !shared.shutdown.load(Ordering::Acquire) {
        let job = own.borrow_mut().take();
        if let Some(job) = job {
            run_claimed(shared, job, &mut reply, &own);
            continue;
        }
        let job = {
            let mut jobs = lock(&shared.jobs);
            let job = jobs.queue.pop_front();
            if job.is_some() {
                shared.queued.fetch_sub(1, Ordering::AcqRel);
            } else {
                jobs.idle.push(thread::current());
            }
            job
        };
        if let Some(job) = job {
            run_claimed(shared, job, &mut reply, &own);
            continue;
        }
        let done = || {
            own.borrow().is_some()
                || shared.queued.load(Ordering::Acquire) > 0
                || shared.shutdown.load(Ordering::Acquire)
        };
        shared
            .router
            .wait(&done, Instant::now() + IDLE_WAIT, &|wc| {
                shared.dispatch(wc, Some(&own))
            });
        let me = thread::current().id();
        lock(&shared.jobs).idle.retain(|t| t.id() != me);
    }
}
