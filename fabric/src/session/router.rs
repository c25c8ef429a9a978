//! Completion routing without a completion thread: leader/follower polling of one CQ.
//!
//! Why: a thread hop per completion (a poller thread waking the waiting caller) costs more than
//! the whole software round trip of a 4 KiB I/O on a small VM. So whichever waiting thread finds
//! nobody polling becomes the *leader*: it polls the CQ itself and dispatches every completion
//! (waking the owner of each by its work-request id). When its own wait is over it hands the
//! role to one sleeping *follower*. A lone caller thus never switches threads, and many callers
//! share one poller instead of each spinning.

use std::sync::{Mutex, PoisonError, TryLockError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use crate::error::FabricError;
use crate::provider::{CompletionQueue, QueuePair, RdmaDevice, SendWrOf};
use crate::verbs::{WcOpcode, WcStatus, WorkCompletion};

/// Longest a leader blocks in the CQ before looking at its own condition again.
const LEAD_SLICE: Duration = Duration::from_millis(2);
/// Longest a follower sleeps before looking again (a safety net; wake-ups are explicit).
const SLEEP_SLICE: Duration = Duration::from_millis(10);
/// How long a poster waits (polling) before trying a full send queue again.
const FULL_WAIT: Duration = Duration::from_micros(200);
/// Completions taken per poll.
const BATCH: usize = 16;

const EMPTY: WorkCompletion = WorkCompletion {
    wr_id: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Send,
    byte_len: 0,
    qp_num: 0,
    invalidated_rkey: None,
};

/// A CQ and the leader/follower protocol around it.
#[derive(Debug)]
pub(crate) struct Router<C> {
    cq: C,
    token: Mutex<()>,
    sleepers: Mutex<Vec<Thread>>,
}

impl<C: CompletionQueue> Router<C> {
    pub fn new(cq: C) -> Router<C> {
        Router {
            cq,
            token: Mutex::new(()),
            sleepers: Mutex::new(Vec::new()),
        }
    }

    /// Waits until `done()` or `deadline`, polling the CQ and passing every completion to
    /// `dispatch` while this thread is the leader. Whoever completes something for another
    /// thread must `unpark` it. Returns `done()`.
    pub fn wait(
        &self,
        done: &dyn Fn() -> bool,
        deadline: Instant,
        dispatch: &dyn Fn(&WorkCompletion),
    ) -> bool {
        let mut followed = false;
        loop {
            if done() {
                if followed {
                    self.pass_on();
                }
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                if followed {
                    self.pass_on();
                }
                return done();
            }
            match self.token.try_lock() {
                Ok(guard) => {
                    self.lead(done, deadline, dispatch);
                    drop(guard);
                    self.wake_one();
                    continue;
                }
                Err(TryLockError::Poisoned(p)) => {
                    // A dispatch panicked; the token itself protects nothing.
                    drop(p.into_inner());
                    self.token.clear_poison();
                    continue;
                }
                Err(TryLockError::WouldBlock) => {}
            }
            followed = true;
            let me = thread::current();
            let id = me.id();
            self.lock_sleepers().push(me);
            // The leader may have left between our try and our registration: look once more.
            let token_free = self.token.try_lock().is_ok();
            if !token_free && !done() {
                thread::park_timeout(SLEEP_SLICE.min(deadline - now));
            }
            self.lock_sleepers().retain(|t| t.id() != id);
        }
    }

    fn lead(&self, done: &dyn Fn() -> bool, deadline: Instant, dispatch: &dyn Fn(&WorkCompletion)) {
        let mut batch = [EMPTY; BATCH];
        loop {
            let n = self.cq.poll(&mut batch);
            for wc in &batch[..n] {
                dispatch(wc);
            }
            if done() {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            if n == 0
                && let Some(wc) = self.cq.wait(LEAD_SLICE.min(deadline - now))
            {
                dispatch(&wc);
            }
        }
    }

    fn lock_sleepers(&self) -> std::sync::MutexGuard<'_, Vec<Thread>> {
        self.sleepers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A follower leaving: the wake-up that ended its sleep may have been meant to hand it the
    /// leader's role, so if nobody leads, wake the next follower.
    fn pass_on(&self) {
        if self.token.try_lock().is_ok() {
            self.wake_one();
        }
    }

    /// Wakes one follower so it takes over polling.
    pub fn wake_one(&self) {
        // Not under the lock: the woken thread, often run at once on this core, takes it first.
        let next = self.lock_sleepers().pop();
        if let Some(t) = next {
            t.unpark();
        }
    }

    /// Wakes every follower (shutdown, connection failure).
    pub fn wake_all(&self) {
        let all = std::mem::take(&mut *self.lock_sleepers());
        for t in all {
            t.unpark();
        }
    }
}

/// Posts a send work request built by `make`, waiting until `deadline` while the send queue is
/// full: a full queue (completions or ACKs not processed yet) means "later", never "broken".
/// While waiting, this thread polls like any waiter, so its own completions free the room.
/// Must not be called from `dispatch` (the poller would wait for itself).
pub(crate) fn post_patiently<'a, D: RdmaDevice>(
    router: &Router<D::Cq>,
    qp: &D::Qp,
    deadline: Instant,
    dispatch: &dyn Fn(&WorkCompletion),
    make: impl Fn() -> SendWrOf<'a, D>,
) -> crate::Result<()> {
    loop {
        match qp.post_send(make()) {
            Err(FabricError::QueueFull) if Instant::now() < deadline => {
                let until = (Instant::now() + FULL_WAIT).min(deadline);
                router.wait(&|| false, until, dispatch);
            }
            other => return other,
        }
    }
}
