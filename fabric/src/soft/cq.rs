//! Completion queues of the software provider.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::provider::CompletionQueue;
use crate::verbs::WorkCompletion;

/// How long a waiter keeps driving progress itself before it sleeps. A small round trip
/// completes within tens of microseconds; reading the response in the waiting thread saves two
/// thread hand-offs (completion thread wake-up, then the waiter's), the largest cost of a small
/// round trip on a 2-core VM, where waking a thread on an idle vCPU alone can take tens of
/// microseconds. Yielding between tries keeps the core available to the other threads.
const SPIN: Duration = Duration::from_micros(50);

/// Something a waiter can drive: a QP whose responses complete into this queue.
pub(crate) trait Progress: Send + Sync + std::fmt::Debug {
    /// Processes whatever responses are ready, without blocking; does nothing if another
    /// thread is at it.
    fn progress(&self);

    /// A waiter starts (`true`) or stops (`false`) driving this source. While driven, the
    /// source's own completion thread stays out of the way instead of waking up for every
    /// response; `wake` (a waiter about to sleep) hands the job back to it at once.
    fn set_driven(&self, driven: bool, wake: bool);
}

/// A completion queue; clones share the queue.
#[derive(Clone, Debug)]
pub struct SoftCq {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    queue: Mutex<VecDeque<WorkCompletion>>,
    ready: Condvar,
    /// Length mirror read by spinning waiters without taking the lock.
    len: AtomicUsize,
    /// Waiters asleep on `ready`; pushes only notify when there is one.
    sleepers: AtomicUsize,
    /// QPs whose send completions land here.
    sources: Mutex<Vec<Weak<dyn Progress>>>,
}

impl SoftCq {
    pub(crate) fn new(depth: u32) -> SoftCq {
        SoftCq {
            inner: Arc::new(Inner {
                queue: Mutex::new(VecDeque::with_capacity(depth as usize)),
                ready: Condvar::new(),
                len: AtomicUsize::new(0),
                sleepers: AtomicUsize::new(0),
                sources: Mutex::new(Vec::new()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<WorkCompletion>> {
        // A panicking pusher cannot leave the deque inconsistent.
        self.inner
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends completions, keeping their order.
    pub(crate) fn push_all(&self, wcs: impl IntoIterator<Item = WorkCompletion>) {
        let mut q = self.lock();
        let before = q.len();
        q.extend(wcs);
        if q.len() == before {
            return;
        }
        self.inner.len.store(q.len(), Ordering::Release);
        drop(q);
        if self.inner.sleepers.load(Ordering::Acquire) > 0 {
            self.inner.ready.notify_all();
        }
    }

    pub(crate) fn push(&self, wc: WorkCompletion) {
        self.push_all([wc]);
    }

    /// Registers a QP whose send completions land here, so waiters can drive it.
    pub(crate) fn add_source(&self, source: Weak<dyn Progress>) {
        let mut sources = self
            .inner
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sources.retain(|s| s.strong_count() > 0);
        sources.push(source);
    }

    /// Applies `f` to every live source.
    fn each_source(&self, f: impl Fn(&dyn Progress)) {
        let sources = self
            .inner
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for source in sources.iter().filter_map(Weak::upgrade) {
            f(&*source);
        }
    }

    /// Lets every live source process what is ready.
    fn drive(&self) {
        self.each_source(|s| s.progress());
    }
}

impl CompletionQueue for SoftCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if self.inner.len.load(Ordering::Acquire) == 0 {
            self.drive();
            if self.inner.len.load(Ordering::Acquire) == 0 {
                return 0;
            }
        }
        let mut q = self.lock();
        let n = out.len().min(q.len());
        for (slot, wc) in out.iter_mut().zip(q.drain(..n)) {
            *slot = wc;
        }
        self.inner.len.store(q.len(), Ordering::Release);
        n
    }

    fn wait(&self, timeout: Duration) -> Option<WorkCompletion> {
        let start = Instant::now();
        let deadline = start + timeout;
        let spin_until = start + SPIN.min(timeout);
        let ready = || self.inner.len.load(Ordering::Acquire) > 0;
        if !ready() {
            self.each_source(|s| s.set_driven(true, false));
            while !ready() && Instant::now() < spin_until {
                self.drive();
                if !ready() {
                    std::thread::yield_now();
                }
            }
            // Hand the job back at once if this waiter is about to sleep, or others already do.
            let wake = !ready() || self.inner.sleepers.load(Ordering::Acquire) > 0;
            self.each_source(|s| s.set_driven(false, wake));
        }
        let mut q = self.lock();
        loop {
            if let Some(wc) = q.pop_front() {
                self.inner.len.store(q.len(), Ordering::Release);
                return Some(wc);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            self.inner.sleepers.fetch_add(1, Ordering::AcqRel);
            q = match self.inner.ready.wait_timeout(q, deadline - now) {
                Ok((q, _)) => q,
                Err(poisoned) => poisoned.into_inner().0,
            };
            self.inner.sleepers.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
