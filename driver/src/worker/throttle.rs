//! The worker's QoS: caps on bytes per second (reads and writes) and requests per second
//! (reads, writes and metadata requests, see `super::fs`), taken from the volume's QoS file and
//! changed while the worker serves.
//!
//! Each cap is a generic cell-rate pacer: a request of cost `c` moves the theoretical
//! arrival time `tat` forward by `c / rate`, and waits until `tat - burst`. Requests may run
//! ahead of the rate by at most [`BURST`] worth of it, so a volume that was idle gets a short
//! burst, never more than its cap over any longer stretch. The reader thread that carries the
//! request sleeps; the kernel queues the volume's other requests behind the busy threads,
//! which is the back-pressure a cap is meant to give, and other volumes (other workers) are
//! untouched.

use dpufs_node_api::qos::QosLimits;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How far ahead of its rate a volume may run.
pub const BURST: Duration = Duration::from_millis(100);

const MIB: f64 = (1u64 << 20) as f64;

/// One cap.
#[derive(Debug, Clone, Copy)]
struct Pacer {
    /// Units per second.
    rate: f64,
    /// When the work admitted so far would end at exactly `rate`.
    tat: Instant,
}

impl Pacer {
    fn new(rate: u64, now: Instant) -> Pacer {
        Pacer {
            rate: rate as f64,
            tat: now,
        }
    }

    /// Admits `cost` units at `now`; the wait before the request may run.
    fn admit(&mut self, cost: f64, now: Instant) -> Duration {
        let start = self.tat.max(now);
        self.tat = start + Duration::from_secs_f64(cost / self.rate);
        self.tat.saturating_duration_since(now + BURST)
    }
}

#[derive(Debug)]
struct State {
    limits: QosLimits,
    bytes: Option<Pacer>,
    requests: Option<Pacer>,
}

/// The caps of one worker, shared by its reader threads.
#[derive(Debug)]
pub struct Throttle {
    /// Whether any cap is set: an uncapped volume's reads and writes (the usual case) pass
    /// without taking the lock every reader thread would otherwise share.
    limited: AtomicBool,
    state: Mutex<State>,
}

impl Throttle {
    pub fn new(limits: QosLimits) -> Throttle {
        Throttle {
            limited: AtomicBool::new(limits.is_limited()),
            state: Mutex::new(State::of(limits, Instant::now())),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> QosLimits {
        self.lock().limits
    }

    /// Puts new limits in force at once; work admitted before keeps its place.
    pub fn set(&self, limits: QosLimits) {
        let mut state = self.lock();
        if state.limits != limits {
            *state = State::of(limits, Instant::now());
            self.limited.store(limits.is_limited(), Ordering::Release);
        }
    }

    /// Blocks the calling thread until a request moving `bytes` may run.
    pub fn admit(&self, bytes: u64) {
        if !self.limited.load(Ordering::Acquire) {
            return;
        }
        let wait = self.wait_for(bytes, Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// How long a request moving `bytes` at `now` has to wait (and admits it). A request
    /// that moves none (metadata) waits for the request cap only, never behind the bytes of
    /// the reads and writes admitted before it.
    fn wait_for(&self, bytes: u64, now: Instant) -> Duration {
        let mut state = self.lock();
        let by_bytes = (state.bytes.as_mut())
            .filter(|_| bytes > 0)
            .map(|p| p.admit(bytes as f64, now));
        let by_requests = state.requests.as_mut().map(|p| p.admit(1.0, now));
        by_bytes.max(by_requests).unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a reader panicked while admitting; the state is
        // still a valid pair of times.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn of(limits: QosLimits, now: Instant) -> State {
        State {
            limits,
            bytes: limits
                .max_throughput_mibps
                .map(|m| Pacer::new(((m as f64) * MIB) as u64, now)),
            requests: limits.max_iops.map(|n| Pacer::new(n, now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(mibps: Option<u64>, iops: Option<u64>) -> QosLimits {
        QosLimits {
            max_throughput_mibps: mibps,
            max_iops: iops,
        }
    }

    #[test]
    fn unlimited_never_waits() {
        let t = Throttle::new(QosLimits::UNLIMITED);
        let now = Instant::now();
        for _ in 0..1000 {
            assert_eq!(t.wait_for(1 << 20, now), Duration::ZERO);
        }
    }

    /// 1 MiB/s: the first 100 ms worth passes, then every MiB costs a second.
    #[test]
    fn throughput_cap_paces_bytes_after_the_burst() {
        let t = Throttle::new(limits(Some(1), None));
        let now = Instant::now();
        let chunk = 1 << 17; // 128 KiB: 125 ms at 1 MiB/s
        assert_eq!(t.wait_for(chunk, now), Duration::from_millis(25));
        assert_eq!(t.wait_for(chunk, now), Duration::from_millis(150));
        // Eight more chunks (1 MiB) end 1 s later.
        let mut last = Duration::ZERO;
        for _ in 0..8 {
            last = t.wait_for(chunk, now);
        }
        assert_eq!(last, Duration::from_millis(1150));
        // After a long idle stretch only the burst is left, not the idle time.
        let later = now + Duration::from_secs(60);
        assert_eq!(t.wait_for(chunk, later), Duration::from_millis(25));
    }

    #[test]
    fn iops_cap_counts_requests_whatever_their_size() {
        let t = Throttle::new(limits(None, Some(100)));
        let now = Instant::now();
        let waits: Vec<Duration> = (0..12).map(|_| t.wait_for(1, now)).collect();
        // 10 ms each, 100 ms of burst.
        assert_eq!(waits[9], Duration::ZERO);
        assert_eq!(waits[10], Duration::from_millis(10));
        assert_eq!(waits[11], Duration::from_millis(20));
    }

    #[test]
    fn a_request_moving_no_bytes_waits_for_the_request_cap_only() {
        let t = Throttle::new(limits(Some(1), None));
        let now = Instant::now();
        // Two seconds of bytes admitted ahead.
        t.wait_for(2 << 20, now);
        assert_eq!(t.wait_for(0, now), Duration::ZERO);
        let t = Throttle::new(limits(Some(1), Some(10)));
        let now = Instant::now();
        t.wait_for(2 << 20, now);
        let waits: Vec<Duration> = (0..2).map(|_| t.wait_for(0, now)).collect();
        // The request cap's burst went to the write: 100 ms per request after it.
        assert_eq!(
            waits,
            [Duration::from_millis(100), Duration::from_millis(200)]
        );
    }

    #[test]
    fn the_stricter_cap_decides() {
        let t = Throttle::new(limits(Some(1000), Some(10)));
        let now = Instant::now();
        let waits: Vec<Duration> = (0..3).map(|_| t.wait_for(4096, now)).collect();
        assert_eq!(
            waits,
            [
                Duration::ZERO,
                Duration::from_millis(100),
                Duration::from_millis(200)
            ]
        );
    }

    #[test]
    fn new_limits_apply_at_once_and_lifting_them_ends_the_waits() {
        let t = Throttle::new(QosLimits::UNLIMITED);
        assert!(
            !t.limited.load(Ordering::Acquire),
            "uncapped: admit takes no lock"
        );
        t.set(limits(None, Some(1)));
        assert!(t.limited.load(Ordering::Acquire));
        assert_eq!(t.limits(), limits(None, Some(1)));
        let now = Instant::now() + Duration::from_millis(1);
        t.wait_for(1, now);
        assert!(t.wait_for(1, now) > Duration::from_millis(800));
        t.set(QosLimits::UNLIMITED);
        assert!(!t.limited.load(Ordering::Acquire));
        assert_eq!(t.wait_for(1, now), Duration::ZERO);
    }
}
