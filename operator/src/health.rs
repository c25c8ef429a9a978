//! What `/healthz` answers: whether the leader-election loop still hears from the
//! Kubernetes API. Leader and standbys alike call the API every third of the lease
//! duration; each answered call is a beat. An operator whose loop hangs, or that has not
//! reached the API server for two lease durations, is unhealthy, so a liveness probe
//! restarts it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The time of the last answered Lease call, and how old it may grow.
#[derive(Debug)]
pub struct Liveness {
    last: Mutex<Instant>,
    window: Duration,
}

impl Liveness {
    /// Healthy while a beat came within `window` (from creation before the first).
    pub fn new(window: Duration) -> Liveness {
        Liveness {
            last: Mutex::new(Instant::now()),
            window,
        }
    }

    /// The Kubernetes API answered a Lease call.
    pub fn beat(&self) {
        *self.last.lock().expect("lock") = Instant::now();
    }

    /// `Ok` while healthy; else why not.
    pub fn check(&self) -> Result<(), String> {
        let since = self.last.lock().expect("lock").elapsed();
        if since <= self.window {
            Ok(())
        } else {
            Err(format!(
                "no answer from the Kubernetes API to the leader election for {}s (limit {}s)",
                since.as_secs(),
                self.window.as_secs()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_while_beats_come_within_the_window() {
        let l = Liveness::new(Duration::from_millis(200));
        assert_eq!(l.check(), Ok(()));
        std::thread::sleep(Duration::from_millis(250));
        let err = l.check().unwrap_err();
        assert!(err.contains("no answer from the Kubernetes API"), "{err}");
        l.beat();
        assert_eq!(l.check(), Ok(()));
    }
}
