//! Completion queues of the software provider.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::time::{Duration, Instant};

use super::channel::Channel;
use crate::provider::CompletionQueue;
use crate::verbs::WorkCompletion;

/// How long a waiter keeps looking before it sleeps, yielding the core between looks: a reply
/// that comes back within this is read without a sleep and a wake-up of an idle vCPU, which on
/// a VM cost tens to hundreds of microseconds each. It covers the engine's longer small
/// requests (a 4 KiB write into a new file, a create, an unlink: 50–250 µs of service):
/// measured side by side against 50 µs, 4 KiB random reads with one job went from ~12,000
/// to ~22,000–26,000 IOPS at less CPU per request, and creating small files from ~1,600 to
/// ~3,000 per second (docs/benchmarks.md). Yielding keeps the look cheap when the core is
/// wanted, and a queue idle for [`IDLE_AFTER`] is not looked at at all.
const SPIN: Duration = Duration::from_micros(200);

/// A queue that has delivered nothing for this long is idle: its waiters sleep at once. A
/// leader waiting on an idle connection comes back every few milliseconds; looking each time
/// would keep a tenth of a core busy per idle connection.
const IDLE_AFTER: Duration = Duration::from_millis(10);

/// Longest a waiter sleeps while a source holds back an ACK (see [`Progress::flush_acks`]).
const ACK_DELAY: Duration = Duration::from_micros(500);

/// Something a waiter can drive: a QP whose completions land in this queue.
///
/// Why waiters drive: on a small machine a thread hand-off per message (the QP's thread reads a
/// message, then wakes the waiting caller) costs more than the message itself. So a caller
/// waiting on the queue reads and serves what its QPs received itself, and sleeps in `poll(2)`
/// on their sockets, not on a condition variable: one wake-up per message, in the thread that
/// needs it. The QPs' own threads step aside while a waiter drives and take over when none
/// does, so progress never depends on the application waiting (as with a NIC).
pub(crate) trait Progress: Send + Sync + std::fmt::Debug {
    /// Processes whatever has arrived (responses to our requests, the peer's requests), without
    /// blocking; does nothing where another thread is at it.
    fn progress(&self);

    /// The channels to sleep on while waiting for this source.
    fn channels(&self, out: &mut Vec<Arc<Channel>>);

    /// A waiter starts (`true`) or stops (`false`) driving this source.
    fn set_driven(&self, driven: bool);

    /// Sends the ACKs this source holds back (a waiter about to sleep long).
    fn flush_acks(&self);

    /// Whether this source holds back an ACK.
    fn acks_pending(&self) -> bool;
}

/// A completion queue; clones share the queue.
#[derive(Clone, Debug)]
pub struct SoftCq {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    queue: Mutex<VecDeque<WorkCompletion>>,
    /// Wakes a waiter sleeping in `poll(2)` when another thread pushes a completion.
    ready: EventFd,
    /// Length mirror read by spinning waiters without taking the lock.
    len: AtomicUsize,
    /// Waiters asleep in `poll(2)`; pushes only notify when there is one.
    sleepers: AtomicUsize,
    /// QPs whose completions land here.
    sources: Mutex<Vec<Weak<dyn Progress>>>,
    /// When a waiter last took a completion, in nanoseconds after `born`.
    last_taken: AtomicU64,
    born: Instant,
}

impl SoftCq {
    pub(crate) fn new(depth: u32) -> SoftCq {
        SoftCq {
            inner: Arc::new(Inner {
                queue: Mutex::new(VecDeque::with_capacity(depth as usize)),
                ready: EventFd::new(),
                len: AtomicUsize::new(0),
                sleepers: AtomicUsize::new(0),
                sources: Mutex::new(Vec::new()),
                last_taken: AtomicU64::new(0),
                born: Instant::now(),
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
        if self.inner.sleepers.load(Ordering::SeqCst) > 0 {
            self.inner.ready.signal();
        }
    }

    pub(crate) fn push(&self, wc: WorkCompletion) {
        self.push_all([wc]);
    }

    /// Registers a QP whose completions land here, so waiters can drive it.
    pub(crate) fn add_source(&self, source: Weak<dyn Progress>) {
        let mut sources = self
            .inner
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sources.retain(|s| s.strong_count() > 0);
        if !sources.iter().any(|s| Weak::ptr_eq(s, &source)) {
            sources.push(source);
        }
    }

    /// Whether `other` is this queue (a QP's send and receive queues may be one).
    pub(crate) fn same(&self, other: &SoftCq) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Applies `f` to every live source.
    fn each_source(&self, mut f: impl FnMut(&dyn Progress)) {
        let sources = self
            .inner
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for source in sources.iter().filter_map(Weak::upgrade) {
            f(&*source);
        }
    }

    /// Lets every live source process what is ready, unless another thread is at it (then
    /// this one would only wait for it).
    fn drive(&self) {
        let sources = match self.inner.sources.try_lock() {
            Ok(sources) => sources,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        for source in sources.iter().filter_map(Weak::upgrade) {
            source.progress();
        }
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
        drop(q);
        if n > 0 {
            self.taken();
        }
        n
    }

    fn wait(&self, timeout: Duration) -> Option<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        let ready = || self.inner.len.load(Ordering::Acquire) > 0;
        if !ready() {
            self.each_source(|s| s.set_driven(true));
            self.drive_until(&ready, deadline);
            self.each_source(|s| s.set_driven(false));
        }
        let mut q = self.lock();
        let wc = q.pop_front();
        self.inner.len.store(q.len(), Ordering::Release);
        drop(q);
        if wc.is_some() {
            self.taken();
        }
        wc
    }
}

impl SoftCq {
    /// Drives the sources, sleeping in `poll(2)` on their channels and the queue's event
    /// between rounds, until `ready()` or `deadline`.
    fn drive_until(&self, ready: &dyn Fn() -> bool, deadline: Instant) {
        let look = if self.idle() { Duration::ZERO } else { SPIN };
        let spin_until = (Instant::now() + look).min(deadline);
        loop {
            self.drive();
            if ready() || Instant::now() >= spin_until {
                break;
            }
            std::thread::yield_now();
        }
        let mut channels = Vec::new();
        loop {
            self.drive();
            if ready() {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            channels.clear();
            let mut holding_acks = false;
            self.each_source(|s| {
                s.channels(&mut channels);
                holding_acks |= s.acks_pending();
            });
            let sleep = if holding_acks {
                ACK_DELAY.min(deadline - now)
            } else {
                deadline - now
            };
            self.inner.sleepers.fetch_add(1, Ordering::SeqCst);
            // A push between our last look and the count above would not have signalled.
            let woke = ready() || self.sleep(&channels, sleep);
            self.inner.sleepers.fetch_sub(1, Ordering::SeqCst);
            if !woke && holding_acks {
                // Nothing came back for a while: the peer may be waiting for those ACKs.
                self.each_source(|s| s.flush_acks());
            }
        }
    }

    /// A completion was taken: the queue is active.
    fn taken(&self) {
        self.inner
            .last_taken
            .store(self.since_born(), Ordering::Relaxed);
    }

    fn since_born(&self) -> u64 {
        self.inner.born.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }

    /// Whether no completion was taken for [`IDLE_AFTER`].
    fn idle(&self) -> bool {
        let last = self.inner.last_taken.load(Ordering::Relaxed);
        self.since_born().saturating_sub(last) > IDLE_AFTER.as_nanos() as u64
    }

    /// Sleeps until a channel is readable, a completion is pushed, or `timeout`; false on
    /// timeout.
    fn sleep(&self, channels: &[Arc<Channel>], timeout: Duration) -> bool {
        let mut fds: Vec<libc::pollfd> = channels
            .iter()
            .map(|c| c.as_raw_fd())
            .chain(std::iter::once(self.inner.ready.fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // Rounded up, so a short wait does not become a busy loop.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: poll on a valid array of pollfds, whose descriptors the Arcs keep open.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if fds.last().is_some_and(|p| p.revents != 0) {
            self.inner.ready.clear();
        }
        n != 0
    }
}

/// A non-blocking eventfd: the queue's doorbell for waiters asleep in `poll(2)`.
#[derive(Debug)]
struct EventFd(OwnedFd);

impl EventFd {
    fn new() -> EventFd {
        // SAFETY: eventfd with valid flags; the result is checked before it is owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(
            fd >= 0,
            "eventfd failed: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh descriptor nobody else owns.
        EventFd(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write to an eventfd; a full counter (EAGAIN) is still signalled.
        unsafe { libc::write(self.fd(), one.as_ptr().cast(), one.len()) };
    }

    fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: an 8-byte read from a non-blocking eventfd into a stack buffer.
        unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{WcOpcode, WcStatus};

    fn completion() -> WorkCompletion {
        WorkCompletion {
            wr_id: 1,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            qp_num: 0,
            invalidated_rkey: None,
        }
    }

    #[test]
    fn a_queue_is_idle_once_nothing_was_taken_for_a_while() {
        let cq = SoftCq::new(4);
        cq.push(completion());
        assert!(cq.wait(Duration::ZERO).is_some());
        assert!(!cq.idle(), "a completion was just taken: waiters look");
        std::thread::sleep(IDLE_AFTER * 2);
        assert!(
            cq.idle(),
            "nothing taken for twice IDLE_AFTER: waiters sleep at once"
        );
        let mut out = [completion()];
        cq.push(completion());
        assert_eq!(cq.poll(&mut out), 1);
        assert!(!cq.idle(), "a poll that takes one counts too");
    }
}
