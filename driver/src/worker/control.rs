//! The worker's side of its control socket (`<state-dir>/control.sock`, protocol in
//! `dpufs_node_api::control`), and the state the socket reports and changes: serving or
//! stopping, request threads alive, counters, frontends (vhost-user-fs).
//!
//! The socket is created by root with mode 0600 before the worker drops privileges, so only
//! root (the node plugin, the keeper) can connect. Clients are served one at a time; a
//! connection idle for 5 s is closed ([`crate::ipc::line`]).

use super::fs::{DfsFs, Negotiated};
use super::stats::Stats;
use super::throttle::Throttle;
use super::vhost_user::Frontends;
use crate::ipc::line;
use dpufs_node_api::control::{Health, Reply, Request, WorkerInfo, WorkerState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What the worker's threads share: the phase (with the wake-up of `Worker::wait`), the FUSE
/// readers' stop flag, the request threads alive, and what `health` and `stats` report.
#[derive(Debug)]
pub(super) struct Shared {
    /// FUSE readers: stop after the request in hand.
    pub stop_reading: AtomicBool,
    phase: Mutex<WorkerState>,
    changed: Condvar,
    /// Request threads started.
    threads: usize,
    /// Request threads still running.
    pub live_threads: AtomicUsize,
    pub stats: Arc<Stats>,
    negotiated: Arc<Negotiated>,
    pub throttle: Arc<Throttle>,
    /// The vhost-user-fs frontends (none with FUSE).
    frontends: Option<Arc<Frontends>>,
    /// The file system the readers serve, for the volume's usage (`statfs`).
    fs: Arc<DfsFs>,
    info: WorkerInfo,
}

impl Shared {
    pub fn new(
        threads: usize,
        stats: Arc<Stats>,
        negotiated: Arc<Negotiated>,
        throttle: Arc<Throttle>,
        frontends: Option<Arc<Frontends>>,
        fs: Arc<DfsFs>,
        info: WorkerInfo,
    ) -> Shared {
        Shared {
            stop_reading: AtomicBool::new(false),
            phase: Mutex::new(WorkerState::Serving),
            changed: Condvar::new(),
            threads,
            live_threads: AtomicUsize::new(threads),
            stats,
            negotiated,
            throttle,
            frontends,
            fs,
            info,
        }
    }

    pub fn phase(&self) -> MutexGuard<'_, WorkerState> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request thread ended (the FUSE connection is gone, or it failed): `Worker::wait`
    /// is woken to stop the rest.
    pub fn thread_ended(&self) {
        self.live_threads.fetch_sub(1, Ordering::AcqRel);
        let _guard = self.phase();
        self.changed.notify_all();
    }

    /// Waits until a stop is asked for or a request thread ends on its own (a FUSE
    /// connection gone or failed is a stop too).
    pub fn wait_for_stop(&self) {
        let phase = self
            .changed
            .wait_while(self.phase(), |p| {
                *p == WorkerState::Serving
                    && self.live_threads.load(Ordering::Acquire) == self.threads
            })
            .unwrap_or_else(|e| e.into_inner());
        if *phase == WorkerState::Serving {
            drop(phase);
            self.request_stop();
        }
    }

    /// Waits for the next change, at most `at_most`.
    pub fn wait_changed(&self, at_most: Duration) {
        let _ = self
            .changed
            .wait_timeout(self.phase(), at_most)
            .unwrap_or_else(|e| e.into_inner());
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
            threads_alive: self.live_threads.load(Ordering::Acquire) as u64,
            in_flight: self.stats.in_flight(),
            uptime_secs: self.stats.uptime().as_secs_f64(),
            qos: self.throttle.limits(),
            frontend: self.frontends.as_deref().map(Frontends::status),
            info: self.info.clone(),
        }
    }

    /// Answers one request line.
    /// The answer of a worker that has stopped serving (its state is gone): every request
    /// is refused.
    pub fn stopped_answer(_text: &str) -> line::Reply {
        Reply::Refused("the worker has stopped".into())
            .encode()
            .into()
    }

    pub fn answer(self: &Arc<Self>, text: &str) -> line::Reply {
        match Request::decode(text) {
            Ok(Request::Health) => Reply::Health(self.health()).encode().into(),
            Ok(Request::Stats) => Reply::Stats(self.stats.snapshot()).encode().into(),
            Ok(Request::Statfs) => match self.fs.usage() {
                Ok(u) => Reply::Statfs(u),
                Err(e) => Reply::Refused(format!("statfs: {e}")),
            }
            .encode()
            .into(),
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
