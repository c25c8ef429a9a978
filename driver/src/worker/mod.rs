//! The volume worker: one process per (tenant, volume) on a node, serving a DFS container to
//! the kernel through FUSE (docs/architecture.md, "Worker lifetime"; docs/worker.md).
//!
//! [`Worker::start`] goes through the phases of `setup.rs` — the connection (mount, inherited
//! descriptor or the keeper's handover), one clone per reader, readahead, the control socket,
//! least privilege — and serves; [`Worker::wait`] returns once the worker has stopped.

pub mod backend;
pub mod channel;
pub mod control;
pub mod fs;
pub mod privilege;
mod setup;
pub mod stats;
pub mod throttle;

use anyhow::Result;
use backend::{Backend, BackendSpec};
use channel::ChannelEnd;
use control::Shared;
use dpufs_node_api::control::WorkerState;
use fs::FsConfig;
use stats::Stats;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::thread::JoinHandleExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

/// Where the FUSE connection comes from.
#[derive(Clone, Debug)]
pub enum FuseSource {
    /// Mount at this path (needs CAP_SYS_ADMIN); the worker owns the mount and unmounts it
    /// when it stops.
    Mount(PathBuf),
    /// Serve an already mounted connection through this inherited /dev/fuse descriptor. The
    /// mountpoint, if known, is only used to find the mount's readahead setting and for
    /// reports; it is never stat'ed.
    Fd {
        /// The descriptor number.
        fd: RawFd,
        /// Where the connection is mounted.
        mountpoint: Option<PathBuf>,
    },
    /// Take the volume's connection from the mount keeper listening on `socket`, with what
    /// its INIT negotiated (see [`crate::keeper`]).
    Keeper { socket: PathBuf, volume: String },
}

/// Everything a worker needs to start.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The DFS to serve (reported by `health`; the backend itself is opened by the caller).
    pub backend: BackendSpec,
    /// Where the FUSE connection comes from.
    pub source: FuseSource,
    /// Control socket and state files.
    pub state_dir: PathBuf,
    /// Reader threads, one cloned /dev/fuse descriptor each.
    pub threads: usize,
    /// Caching and semantics.
    pub fs: FsConfig,
    /// Mount source name shown in /proc/mounts.
    pub fsname: String,
    /// Let other users into the mount (when the worker mounts).
    pub allow_other: bool,
    /// Readahead of the mount's bdi in KiB; 0 leaves the kernel's default.
    pub read_ahead_kb: u32,
    /// Drop to this uid/gid after setup (only with [`FuseSource::Fd`]).
    pub run_as: Option<(u32, u32)>,
    /// Resource limits applied before serving (`None`: leave them).
    pub limits: Option<privilege::Limits>,
    /// The QoS file (`dpufs_node_api::qos`), re-read while serving; `None`: no caps.
    pub qos: Option<PathBuf>,
}

/// Writes `data` to `path` atomically (`dpufs_node_api::file::write_atomic`), mode 0644.
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    dpufs_node_api::file::write_atomic(path, data, 0o644)
}

/// A running worker.
#[derive(Debug)]
pub struct Worker {
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<io::Result<ChannelEnd>>>,
    /// The connection's master descriptor: held (never read) so the connection outlives
    /// the reader clones; when the worker mounted, closing it last ends the connection.
    _master: OwnedFd,
    /// Set when the worker mounted and must unmount.
    owned_mount: Option<PathBuf>,
    state_dir: PathBuf,
}

impl Worker {
    /// Sets up and starts serving. When this returns, the mount is being served and the
    /// control socket answers.
    pub fn start(cfg: WorkerConfig, backend: Backend) -> Result<Worker> {
        setup::start(cfg, backend)
    }

    /// Asks the worker to stop (what the control socket's `stop` and SIGTERM do).
    pub fn request_stop(&self) {
        self.shared.request_stop();
    }

    /// A handle that can ask the worker to stop from another thread.
    pub fn stopper(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.request_stop()
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }

    /// Serves until stopped or until the connection ends, then cleans up.
    ///
    /// Stopping a worker that owns its mount unmounts it (lazily when it is busy: the
    /// worker then serves the files still open until the kernel ends the connection) and
    /// ends when the kernel says the connection is gone. Stopping a worker serving an
    /// inherited descriptor stops its readers after the requests they hold are answered
    /// (a drain) and leaves the mount and its queued requests to the next worker.
    pub fn wait(self) -> Result<()> {
        let mut unmounted = false;
        loop {
            self.wait_for_stop();
            if self.shared.live_readers.load(Ordering::Acquire) == 0 {
                break;
            }
            match &self.owned_mount {
                Some(mp) if !unmounted => {
                    unmounted = true;
                    unmount_owned(mp)?;
                }
                // Wait for the kernel to end the connection.
                Some(_) => self.wait_changed(Duration::from_millis(200)),
                None => {
                    self.wake_readers_to_stop();
                    self.wait_changed(Duration::from_millis(5));
                }
            }
        }
        self.finish()
    }

    /// Waits until a stop is asked for or a reader ends on its own (the connection is gone
    /// or failed, which is a stop too).
    fn wait_for_stop(&self) {
        let phase = self.shared.phase();
        let phase = self
            .shared
            .changed()
            .wait_while(phase, |p| {
                *p == WorkerState::Serving
                    && self.shared.live_readers.load(Ordering::Acquire) == self.readers.len()
            })
            .unwrap_or_else(|e| e.into_inner());
        if *phase == WorkerState::Serving {
            drop(phase);
            self.shared.request_stop();
        }
    }

    fn wait_changed(&self, at_most: Duration) {
        let phase = self.shared.phase();
        let _ = self
            .shared
            .changed()
            .wait_timeout(phase, at_most)
            .unwrap_or_else(|e| e.into_inner());
    }

    /// A drain: readers finish the request in hand, then see the flag (woken from read(2)
    /// by the signal).
    fn wake_readers_to_stop(&self) {
        self.shared.stop_reading.store(true, Ordering::Release);
        for h in &self.readers {
            if !h.is_finished() {
                // SAFETY: the thread is alive (not finished, not joined), so its pthread_t
                // is valid.
                unsafe { libc::pthread_kill(h.as_pthread_t(), channel::WAKE_SIGNAL) };
            }
        }
    }

    /// Joins the readers and removes the state files that end with this process.
    fn finish(mut self) -> Result<()> {
        let mut failed = None;
        for h in self.readers.drain(..) {
            match h.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failed = Some(anyhow::Error::from(e)),
                Err(_) => failed = Some(anyhow::anyhow!("a reader thread panicked")),
            }
        }
        let _ = std::fs::remove_file(self.state_dir.join("control.sock"));
        let _ = std::fs::remove_file(self.state_dir.join("worker.json"));
        if self.owned_mount.is_some() {
            // The session ended with the mount.
            let _ = std::fs::remove_file(self.state_dir.join("session.json"));
        }
        match failed {
            Some(e) => Err(e.context("a FUSE reader failed")),
            None => {
                tracing::info!("stopped");
                Ok(())
            }
        }
    }
}

/// Unmounts the worker's own mount: at once when idle, else detached (open files stay
/// served until closed).
fn unmount_owned(mp: &Path) -> Result<()> {
    match crate::fuse::unmount(mp, false) {
        Ok(()) => tracing::info!("unmounted {}", mp.display()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            tracing::info!(
                "{} is busy: detached; serving open files until they are closed",
                mp.display()
            );
            crate::fuse::unmount(mp, true)?;
        }
        // Already gone (unmounted by someone else).
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        Err(e) => {
            tracing::warn!("unmount {}: {e}; detaching", mp.display());
            let _ = crate::fuse::unmount(mp, true);
        }
    }
    Ok(())
}
