//! The error policy (docs/fabric.md, "Error policy, caps"): reconnect with exponential backoff,
//! quarantine a peer after K access errors per minute; and the per-tenant resource caps
//! (ReDMArk M7).
//!
//! Why quarantine: every wrong rkey guess costs the guesser a QP (class-C error), so probing
//! means reconnecting; refusing a peer for a while after a few access errors turns a cheap
//! brute force into a slow one, and a broken path into a loud one.
//!
//! Time comes from a [`Clock`] so tests can drive the policy without sleeping.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::error::SessionError;

/// A source of monotonic time.
pub trait Clock: Send + Sync + Debug {
    /// Now.
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Instant>,
}

impl ManualClock {
    /// Starts at the current instant.
    pub fn new() -> ManualClock {
        ManualClock {
            now: Mutex::new(Instant::now()),
        }
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// When to quarantine a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuarantinePolicy {
    /// Access errors within `window` that trigger a quarantine (K; 3 by default).
    pub max_errors: u32,
    /// The sliding window (one minute).
    pub window: Duration,
    /// How long the quarantine lasts.
    pub duration: Duration,
}

impl Default for QuarantinePolicy {
    fn default() -> Self {
        QuarantinePolicy {
            max_errors: 3,
            window: Duration::from_secs(60),
            duration: Duration::from_secs(60),
        }
    }
}

/// Access-error history of one peer under a [`QuarantinePolicy`].
#[derive(Debug, Default)]
pub struct Quarantine {
    errors: VecDeque<Instant>,
    until: Option<(Instant, u32)>,
}

impl Quarantine {
    /// Records an access error at `now`; true if it starts a quarantine.
    pub fn record(&mut self, policy: &QuarantinePolicy, now: Instant) -> bool {
        self.errors.push_back(now);
        while self
            .errors
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= policy.window)
        {
            self.errors.pop_front();
        }
        let count = self.errors.len() as u32;
        if policy.max_errors == 0 || count < policy.max_errors || self.active(now).is_some() {
            return false;
        }
        self.until = Some((now + policy.duration, count));
        self.errors.clear();
        true
    }

    /// Time left and the error count that caused it, while quarantined.
    pub fn active(&self, now: Instant) -> Option<(Duration, u32)> {
        self.until
            .filter(|(until, _)| now < *until)
            .map(|(until, errors)| (until - now, errors))
    }
}

/// Exponential backoff between reconnect attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Upper bound.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_secs(5),
        }
    }
}

impl Backoff {
    /// Delay before the next attempt after `failures` consecutive failures (0: none).
    pub fn delay(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32 << (failures - 1).min(20);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Per-tenant caps on RDMA resources (ReDMArk M7; `rdma.max` of the worker's cgroup on hardware).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Queue pairs (one per connection, counting one being torn down).
    pub max_qps: u64,
    /// Memory regions.
    pub max_mrs: u64,
    /// Memory windows.
    pub max_windows: u64,
    /// Registered bytes.
    pub max_registered_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_qps: 16,
            max_mrs: 8,
            max_windows: 256,
            max_registered_bytes: 256 << 20,
        }
    }
}

/// One capped resource: a count that `acquire` raises and the returned token lowers again.
#[derive(Debug)]
pub(crate) struct Budget {
    name: &'static str,
    limit: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    pub fn new(name: &'static str, limit: u64) -> Budget {
        Budget {
            name,
            limit,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Takes `n` units, waiting until `wait_until` for others to be returned (a connection
    /// being torn down) before failing with `LimitExceeded`.
    pub fn acquire(&self, n: u64, wait_until: Option<Instant>) -> Result<(), SessionError> {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if used.saturating_add(n) <= self.limit {
                *used += n;
                return Ok(());
            }
            let now = Instant::now();
            match wait_until {
                Some(until) if now < until && n <= self.limit => {
                    used = self
                        .freed
                        .wait_timeout(used, until - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                _ => {
                    return Err(SessionError::LimitExceeded {
                        resource: self.name,
                        requested: used.saturating_add(n),
                        limit: self.limit,
                    });
                }
            }
        }
    }

    /// Returns `n` units.
    pub fn release(&self, n: u64) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        *used = used.saturating_sub(n);
        drop(used);
        self.freed.notify_all();
    }

    /// Units in use.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        *self.used.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_after_k_errors_within_the_window() {
        let clock = ManualClock::new();
        let policy = QuarantinePolicy::default();
        let mut q = Quarantine::default();
        assert!(!q.record(&policy, clock.now()));
        clock.advance(Duration::from_secs(59));
        assert!(!q.record(&policy, clock.now()));
        // The first error left the window: still two.
        clock.advance(Duration::from_secs(2));
        assert!(!q.record(&policy, clock.now()));
        assert!(q.active(clock.now()).is_none());
        clock.advance(Duration::from_secs(1));
        assert!(
            q.record(&policy, clock.now()),
            "third error within a minute"
        );
        let (left, errors) = q.active(clock.now()).unwrap();
        assert_eq!((left, errors), (policy.duration, 3));
        // Errors while quarantined do not restart it.
        clock.advance(Duration::from_secs(30));
        assert!(!q.record(&policy, clock.now()));
        assert_eq!(q.active(clock.now()).unwrap().0, Duration::from_secs(30));
        clock.advance(Duration::from_secs(30));
        assert!(q.active(clock.now()).is_none(), "quarantine expires");
    }

    #[test]
    fn zero_disables_quarantine() {
        let clock = ManualClock::new();
        let policy = QuarantinePolicy {
            max_errors: 0,
            ..QuarantinePolicy::default()
        };
        let mut q = Quarantine::default();
        for _ in 0..10 {
            assert!(!q.record(&policy, clock.now()));
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
        };
        let delays: Vec<u128> = (0..6).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(delays, [0, 10, 20, 40, 50, 50]);
        assert_eq!(b.delay(u32::MAX), Duration::from_millis(50));
    }

    #[test]
    fn budget_caps_and_waits_for_returns() {
        let budget = std::sync::Arc::new(Budget::new("qps", 2));
        budget.acquire(2, None).unwrap();
        let err = budget.acquire(1, None).unwrap_err();
        assert!(
            matches!(
                err,
                SessionError::LimitExceeded {
                    resource: "qps",
                    requested: 3,
                    limit: 2
                }
            ),
            "{err}"
        );
        let b = budget.clone();
        let t = std::thread::spawn(move || b.release(1));
        budget
            .acquire(1, Some(Instant::now() + Duration::from_secs(10)))
            .unwrap();
        t.join().unwrap();
        assert_eq!(budget.used(), 2);
        assert!(budget.acquire(3, Some(Instant::now())).is_err());
    }
}
