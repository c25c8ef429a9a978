//! The volume worker: one process per (tenant, volume) on a node, serving a DFS container
//! through one of two transports (docs/architecture.md, "Worker lifetime"; docs/worker.md):
//! FUSE on this node's kernel (`/dev/fuse`), or virtio-fs to a vhost-user-fs frontend (a VMM,
//! or DOCA SNAP on a DPU), whose guest kernel sends the same FUSE requests over virtqueues.
//! Both hand every request to one fuse-backend-rs `Server` over one [`fs::DfsFs`].
//!
//! [`Worker::start`] goes through the phases of `setup.rs` — the endpoint (a mount, an
//! inherited descriptor, a vhost-user listening socket, or the keeper's handover of either),
//! one clone per FUSE reader, readahead, the control socket, least privilege — and serves;
//! [`Worker::wait`] returns once the worker has stopped.

pub mod backend;
pub mod channel;
pub mod control;
mod dfs_io;
mod entry_cache;
pub mod fs;
mod known_dirs;
pub mod privilege;
mod readers;
mod setup;
pub mod stats;
pub mod throttle;
pub mod vhost_user;

use anyhow::Result;
use backend::{Backend, BackendSpec, PendingBackend};
use control::Shared;
use dpufs_node_api::transport::Transport;
use fs::FsConfig;
use readers::FuseReaders;
use stats::Stats;
use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vhost_user::VhostUserServer;

/// Where the worker's endpoint comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// FUSE: mount at this path (needs CAP_SYS_ADMIN); the worker owns the mount and
    /// unmounts it when it stops.
    Mount(PathBuf),
    /// FUSE: serve an already mounted connection through this inherited /dev/fuse
    /// descriptor. The mountpoint, if known, is only used to find the mount's readahead
    /// setting and for reports; it is never stat'ed.
    Fd {
        /// The descriptor number.
        fd: RawFd,
        /// Where the connection is mounted.
        mountpoint: Option<PathBuf>,
    },
    /// vhost-user-fs: bind a listening socket here (a stale socket file is replaced) and
    /// serve the frontends that connect, one at a time; the worker unlinks it when it stops.
    Listen(PathBuf),
    /// Take the volume from the mount keeper listening on `socket`: its FUSE connection with
    /// what INIT negotiated, or its export's listening socket (see [`crate::keeper`]).
    Keeper { socket: PathBuf, volume: String },
}

/// Everything a worker needs to start.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The DFS to serve (reported by `health`; the backend itself is opened by the caller).
    pub backend: BackendSpec,
    /// The transport; [`Source::Keeper`] must hand over a volume attached for it.
    pub transport: Transport,
    /// Where the endpoint comes from.
    pub source: Source,
    /// Control socket and state files.
    pub state_dir: PathBuf,
    /// Request threads: FUSE readers (one cloned /dev/fuse descriptor each), or the threads
    /// that answer a vhost-user-fs frontend's requests.
    pub threads: usize,
    /// Caching and semantics.
    pub fs: FsConfig,
    /// Mount source name shown in /proc/mounts.
    pub fsname: String,
    /// Let other users into the mount (when the worker mounts).
    pub allow_other: bool,
    /// Readahead of the mount's bdi in KiB; 0 leaves the kernel's default.
    pub read_ahead_kb: u32,
    /// Drop to this uid/gid after setup (not with [`Source::Mount`]).
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
    serving: Serving,
    state_dir: PathBuf,
}

/// What serves the requests.
#[derive(Debug)]
enum Serving {
    Fuse(FuseReaders),
    VhostUser(VhostUserServer),
}

impl Worker {
    /// Sets up and starts serving. When this returns, the mount is being served (or the
    /// vhost-user socket listened on) and the control socket answers.
    pub fn start(cfg: WorkerConfig, backend: PendingBackend) -> Result<Worker> {
        setup::start(cfg, backend)
    }

    /// Asks the worker to stop (what the control socket's `stop` and SIGTERM do).
    pub fn request_stop(&self) {
        self.shared.request_stop();
    }

    /// A handle that can ask the worker to stop from another thread. It does not keep the
    /// worker's state alive: once [`Worker::wait`] returns, the backend is closed (a DAOS
    /// container is closed and its pool disconnected, as DAOS expects of a client that
    /// ends), and the handle does nothing.
    pub fn stopper(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = Arc::downgrade(&self.shared);
        move || {
            if let Some(shared) = shared.upgrade() {
                shared.request_stop()
            }
        }
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }

    /// Serves until stopped (or, with FUSE, until the connection ends), then cleans up.
    ///
    /// FUSE: stopping a worker that owns its mount unmounts it (lazily when it is busy: the
    /// worker then serves the files still open until the kernel ends the connection) and
    /// ends when the kernel says the connection is gone. Stopping a worker serving an
    /// inherited descriptor stops its readers after the requests they hold are answered
    /// (a drain) and leaves the mount and its queued requests to the next worker.
    ///
    /// vhost-user-fs: a stop answers the requests taken from the virtqueues and takes no
    /// more; the frontend's connection closes when the process exits.
    pub fn wait(self) -> Result<()> {
        let (result, owned_mount) = match self.serving {
            Serving::Fuse(readers) => {
                let owned = readers.owns_mount();
                (readers.wait(&self.shared), owned)
            }
            Serving::VhostUser(server) => (server.wait(&self.shared), false),
        };
        let _ = std::fs::remove_file(self.state_dir.join("control.sock"));
        let _ = std::fs::remove_file(self.state_dir.join("worker.json"));
        if owned_mount {
            // The session ended with the mount.
            let _ = std::fs::remove_file(self.state_dir.join("session.json"));
        }
        result?;
        tracing::info!("stopped");
        Ok(())
    }
}
