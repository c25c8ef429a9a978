//! Completion queues, each with its own completion channel for `wait`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ibverbs_sys as sys;

use super::{Ctx, ffi, last_errno, lock, set_nonblocking, verbs_error};
use crate::error::Result;
use crate::provider::CompletionQueue;
use crate::verbs::WorkCompletion;

/// Completions read from the device per `ibv_poll_cq` call.
const BATCH: usize = 16;
/// Longest single sleep of a waiter, so one that lost the channel event to another waiter on
/// the same queue still notices completions soon.
const WAIT_SLICE: Duration = Duration::from_millis(10);

/// A completion queue (`ibv_cq`); clones share the queue.
#[derive(Clone, Debug)]
pub struct IbvCq {
    pub(crate) inner: Arc<CqInner>,
}

#[derive(Debug)]
pub(crate) struct CqInner {
    pub ctx: Arc<Ctx>,
    raw: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    /// Translated completions not handed out yet (a device batch can exceed the caller's).
    ready: Mutex<VecDeque<WorkCompletion>>,
    /// Work queue entries of the QPs attached (to grow the CQ so they cannot overrun it).
    attached: AtomicU32,
    /// Guards `ibv_resize_cq`.
    resize: Mutex<()>,
}

// SAFETY: the CQ and channel pointers are only passed to thread-safe verbs and freed by Drop.
unsafe impl Send for CqInner {}
// SAFETY: as above; `ready` serialises polling.
unsafe impl Sync for CqInner {}

impl IbvCq {
    pub(crate) fn create(ctx: &Arc<Ctx>, depth: u32) -> Result<IbvCq> {
        // SAFETY: valid context.
        let channel = unsafe { sys::ibv_create_comp_channel(ctx.raw()) };
        if channel.is_null() {
            return Err(verbs_error("ibv_create_comp_channel", last_errno()));
        }
        let destroy_channel = || {
            // SAFETY: the channel was created above and no CQ uses it.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
        };
        // SAFETY: the channel is valid.
        if let Err(e) = set_nonblocking(unsafe { (*channel).fd }, "completion channel") {
            destroy_channel();
            return Err(e);
        }
        let cqe = i32::try_from(depth.max(1)).unwrap_or(i32::MAX);
        // SAFETY: valid context and channel; no CQ context pointer.
        let raw = unsafe { sys::ibv_create_cq(ctx.raw(), cqe, std::ptr::null_mut(), channel, 0) };
        if raw.is_null() {
            let errno = last_errno();
            destroy_channel();
            return Err(verbs_error(&format!("ibv_create_cq({depth})"), errno));
        }
        Ok(IbvCq {
            inner: Arc::new(CqInner {
                ctx: ctx.clone(),
                raw,
                channel,
                ready: Mutex::new(VecDeque::new()),
                attached: AtomicU32::new(0),
                resize: Mutex::new(()),
            }),
        })
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_cq {
        self.inner.raw
    }

    /// A QP with `entries` work queue entries completing here was created: grows the CQ if its
    /// capacity could be exceeded (every send is posted signaled, see the module docs).
    pub(crate) fn attach(&self, entries: u32) {
        let need = self
            .inner
            .attached
            .fetch_add(entries, Ordering::AcqRel)
            .saturating_add(entries);
        let _guard = lock(&self.inner.resize);
        // SAFETY: the CQ is valid; `cqe` is its current capacity, changed only under `resize`.
        let have = u32::try_from(unsafe { (*self.inner.raw).cqe }).unwrap_or(0);
        if need <= have {
            return;
        }
        let want = i32::try_from(need).unwrap_or(i32::MAX);
        // SAFETY: valid CQ; resizing keeps the completions it holds.
        let rc = unsafe { sys::ibv_resize_cq(self.inner.raw, want) };
        if rc != 0 {
            tracing::warn!(
                errno = rc,
                have,
                need,
                "ibv_resize_cq failed; the CQ can overrun if every work request is outstanding"
            );
        }
    }

    /// A QP with `entries` work queue entries completing here was destroyed.
    pub(crate) fn detach(&self, entries: u32) {
        let _ = self
            .inner
            .attached
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(entries))
            });
    }

    /// Reads a batch from the device into `ready`; false if the device had nothing.
    fn fill(&self, ready: &mut VecDeque<WorkCompletion>) -> bool {
        let mut raw = [sys::ibv_wc::default(); BATCH];
        // SAFETY: valid CQ; the array has room for BATCH completions.
        let n = unsafe { ffi::dpufs_ibv_poll_cq(self.inner.raw, BATCH as i32, raw.as_mut_ptr()) };
        if n < 0 {
            tracing::error!(rc = n, "ibv_poll_cq failed");
            return false;
        }
        let n = n as usize;
        ready.extend(raw[..n].iter().filter_map(|wc| self.inner.ctx.complete(wc)));
        n > 0
    }

    /// The next completion, if one is ready.
    fn next(&self) -> Option<WorkCompletion> {
        let mut ready = lock(&self.inner.ready);
        while ready.is_empty() {
            if !self.fill(&mut ready) {
                return None;
            }
        }
        ready.pop_front()
    }

    /// Takes one completion event from the channel, if there is one, and acknowledges it.
    fn consume_event(&self) {
        let mut cq = std::ptr::null_mut();
        let mut cq_context = std::ptr::null_mut();
        // SAFETY: valid channel and out-pointers; the fd is non-blocking, so this fails with
        // EAGAIN when another waiter took the event.
        let rc = unsafe { sys::ibv_get_cq_event(self.inner.channel, &mut cq, &mut cq_context) };
        if rc == 0 {
            // SAFETY: the event is for this channel's only CQ and is acknowledged once.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
        }
    }
}

impl CompletionQueue for IbvCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut ready = lock(&self.inner.ready);
        let mut n = 0;
        while n < out.len() {
            match ready.pop_front() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => {
                    if !self.fill(&mut ready) {
                        break;
                    }
                }
            }
        }
        n
    }

    fn wait(&self, timeout: Duration) -> Option<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(wc) = self.next() {
                return Some(wc);
            }
            // Arm, then poll again: a completion between the poll and the arm raises no event.
            // SAFETY: valid CQ.
            let armed = unsafe { ffi::dpufs_ibv_req_notify_cq(self.inner.raw, 0) } == 0;
            if let Some(wc) = self.next() {
                return Some(wc);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let slice = (deadline - now).min(if armed {
                WAIT_SLICE
            } else {
                Duration::from_millis(1)
            });
            let mut pfd = libc::pollfd {
                // SAFETY: the channel is valid.
                fd: unsafe { (*self.inner.channel).fd },
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = slice.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc > 0 && pfd.revents & libc::POLLIN != 0 {
                self.consume_event();
            }
        }
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: every QP using the CQ holds this CqInner, so none is left; every event taken
        // from the channel was acknowledged.
        let rc = unsafe { sys::ibv_destroy_cq(self.raw) };
        if rc != 0 {
            tracing::error!(errno = rc, "ibv_destroy_cq failed");
            return;
        }
        // SAFETY: its only CQ is destroyed.
        let rc = unsafe { sys::ibv_destroy_comp_channel(self.channel) };
        if rc != 0 {
            tracing::error!(errno = rc, "ibv_destroy_comp_channel failed");
        }
    }
}
