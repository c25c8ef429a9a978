//! The worker's side of its control socket (`<state-dir>/control.sock`, protocol in
//! `dpufs_node_api::control`), and the state the socket reports and changes: serving or
//! stopping, readers alive, counters.
//!
//! The socket is created by root with mode 0600 before the worker drops privileges, so only
//! root (the node plugin, the keeper) can connect. Clients are served one at a time; a
//! connection idle for 5 s is closed ([`crate::ipc::line`]).

use super::fs::Negotiated;
use super::stats::Stats;
use super::throttle::Throttle;
use crate::ipc::line;
use dpufs_node_api::control::{Health, Reply, Request, WorkerInfo, WorkerState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// What the worker's threads share: the phase (with the wake-up of `Worker::wait`), the
/// readers' stop flag and count, and what `health` and `stats` report.
#[derive(Debug)]
pub(super) struct Shared {
    /// Readers: stop after the request in hand.
    pub stop_reading: AtomicBool,
    phase: Mutex<WorkerState>,
    changed: Condvar,
    pub live_readers: AtomicUsize,
    pub stats: Arc<Stats>,
    negotiated: Arc<Negotiated>,
    pub throttle: Arc<Throttle>,
    info: WorkerInfo,
}

impl Shared {
    pub fn new(
        readers: usize,
        stats: Arc<Stats>,
        negotiated: Arc<Negotiated>,
        throttle: Arc<Throttle>,
        info: WorkerInfo,
    ) -> Shared {
        Shared {
            stop_reading: AtomicBool::new(false),
            phase: Mutex::new(WorkerState::Serving),
            changed: Condvar::new(),
            live_readers: AtomicUsize::new(readers),
            stats,
            negotiated,
            throttle,
            info,
        }
    }

    pub fn phase(&self) -> MutexGuard<'_, WorkerState> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The condition variable of the phase and of `live_readers`.
    pub fn changed(&self) -> &Condvar {
        &self.changed
    }

    /// Wakes `Worker::wait` (a reader ended).
    pub fn notify(&self) {
        let _guard = self.phase();
        self.changed.notify_all();
    }

    pub fn request_stop(&self) {
        let mut p = self.phase();
        *p = WorkerState::Stopping;
        self.changed.notify_all();
    }

    fn health(&self) -> Health {
        Health {
            state: *self.phase(),
            initialized: self.negotiated.done.load(Ordering::Acquire),
            threads_alive: self.live_readers.load(Ordering::Acquire) as u64,
            in_flight: self.stats.in_flight(),
            uptime_secs: self.stats.uptime().as_secs_f64(),
            qos: self.throttle.limits(),
            frontend: None,
            info: self.info.clone(),
        }
    }

    /// Answers one request line.
    pub fn answer(self: &Arc<Self>, text: &str) -> line::Reply {
        match Request::decode(text) {
            Ok(Request::Health) => Reply::Health(self.health()).encode().into(),
            Ok(Request::Stats) => Reply::Stats(self.stats.snapshot()).encode().into(),
            Ok(Request::Stop) => {
                let me = self.clone();
                line::Reply {
                    answer: Reply::Stopping.encode(),
                    then: Some(Box::new(move || me.request_stop())),
                }
            }
            Err(error) => Reply::Refused(error).encode().into(),
        }
    }
}
