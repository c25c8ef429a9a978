//! The volume worker: one process per (tenant, volume) on a node, serving a DFS container to
//! the kernel through FUSE (design.md §Node plugin and worker lifetime; docs/worker.md).
//!
//! [`Worker::start`] mounts (or adopts a /dev/fuse descriptor someone else mounted), clones
//! one descriptor per reader thread, binds the control socket, drops privileges when asked,
//! and serves; [`Worker::wait`] returns once the worker has stopped.

pub mod backend;
pub mod control;
pub mod fs;
pub mod fusedev;
pub mod privilege;
pub mod stats;

use anyhow::{Context as _, Result, bail};
use backend::{Backend, BackendSpec};
use fs::{DfsFs, FsConfig, Negotiated};
use fuse_backend_rs::api::server::Server;
use fusedev::ChannelEnd;
use serde_json::{Value, json};
use stats::Stats;
use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::thread::JoinHandleExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
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
}

/// Writes `data` to `path` atomically (temporary file, then rename).
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Serving,
    Stopping,
}

#[derive(Debug)]
struct Shared {
    /// Readers: stop after the request in hand.
    stop_reading: AtomicBool,
    /// Phase, plus the wake-up of [`Worker::wait`].
    phase: Mutex<Phase>,
    changed: Condvar,
    live_readers: AtomicUsize,
    stats: Arc<Stats>,
    negotiated: Arc<Negotiated>,
    info: Value,
}

impl Shared {
    fn notify(&self) {
        let _guard = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        self.changed.notify_all();
    }

    fn request_stop(&self) {
        let mut p = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        *p = Phase::Stopping;
        self.changed.notify_all();
    }

    fn health(&self) -> Value {
        let phase = *self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let mut v = self.info.clone();
        let m = v.as_object_mut().expect("object");
        m.insert("ok".into(), json!(true));
        m.insert(
            "state".into(),
            json!(match phase {
                Phase::Serving => "serving",
                Phase::Stopping => "stopping",
            }),
        );
        m.insert(
            "initialized".into(),
            json!(self.negotiated.done.load(Ordering::Acquire)),
        );
        m.insert(
            "threads_alive".into(),
            json!(self.live_readers.load(Ordering::Acquire)),
        );
        m.insert("in_flight".into(), json!(self.stats.in_flight()));
        m.insert(
            "uptime_secs".into(),
            json!(self.stats.uptime().as_secs_f64()),
        );
        v
    }

    fn answer(self: &Arc<Self>, req: &Value) -> control::Reply {
        match req.get("op").and_then(Value::as_str) {
            Some("health") => self.health().into(),
            Some("stats") => json!({"ok": true, "stats": self.stats.snapshot()}).into(),
            Some("stop") => {
                let me = self.clone();
                control::Reply {
                    answer: json!({"ok": true, "state": "stopping"}),
                    then: Some(Box::new(move || me.request_stop())),
                }
            }
            Some(other) => json!({"ok": false, "error": format!("unknown op {other:?}")}).into(),
            None => json!({"ok": false, "error": "missing \"op\""}).into(),
        }
    }
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
        cfg.fs.validate().map_err(anyhow::Error::msg)?;
        if cfg.threads == 0 {
            bail!("--threads must be at least 1");
        }
        if cfg.run_as.is_some() && matches!(cfg.source, FuseSource::Mount(_)) {
            bail!(
                "--uid/--gid need --fuse-fd or --keeper: a worker that mounts must keep the \
                 privilege to unmount"
            );
        }
        std::fs::create_dir_all(&cfg.state_dir)
            .with_context(|| format!("create state dir {}", cfg.state_dir.display()))?;
        std::fs::set_permissions(&cfg.state_dir, std::fs::Permissions::from_mode(0o700))?;
        let session_record = cfg.state_dir.join("session.json");

        // 1. The connection.
        let mut session = None;
        let (master, owned_mount, mountpoint) = match &cfg.source {
            FuseSource::Mount(mp) => {
                let mp = mp
                    .canonicalize()
                    .with_context(|| format!("mountpoint {}", mp.display()))?;
                let fd = fusedev::mount(
                    &mp,
                    &fusedev::MountOptions {
                        fsname: cfg.fsname.clone(),
                        read_only: cfg.fs.access == fs::AccessMode::ReadOnly,
                        allow_other: cfg.allow_other,
                    },
                )
                .with_context(|| format!("mount FUSE on {}", mp.display()))?;
                (fd, Some(mp.clone()), Some(mp))
            }
            FuseSource::Fd { fd, mountpoint } => (
                fusedev::adopt_fd(*fd).with_context(|| format!("--fuse-fd {fd}"))?,
                None,
                mountpoint.clone(),
            ),
            FuseSource::Keeper { socket, volume } => {
                let (handover, fd) = crate::keeper::take_over(socket, volume)
                    .with_context(|| format!("take volume {volume} from the keeper"))?;
                session = handover.session;
                (fd, None, Some(handover.mountpoint))
            }
        };
        // From here on a failure must not leave our own mount behind.
        let cleanup = |e: anyhow::Error| -> anyhow::Error {
            if let Some(mp) = &owned_mount {
                let _ = fusedev::unmount(mp, true);
            }
            e
        };

        // 2. One clone per reader, while /dev/fuse may still be opened.
        let clones = (0..cfg.threads)
            .map(|_| fusedev::clone_fd(master.as_fd()))
            .collect::<io::Result<Vec<_>>>()
            .context("clone /dev/fuse (FUSE_DEV_IOC_CLONE)")
            .map_err(cleanup)?;

        // 3. Readahead (sysfs, root only): written now (for a connection initialised
        // before us) and again after INIT, which lowers it to the INIT reply's value.
        let read_ahead = match (&mountpoint, cfg.read_ahead_kb) {
            (_, 0) => None,
            (Some(mp), kb) => match fusedev::ReadAhead::open(mp, kb) {
                Ok(ra) => {
                    ra.apply();
                    Some(ra)
                }
                Err(e) => {
                    tracing::warn!("readahead not set: {e}");
                    None
                }
            },
            (None, _) => {
                tracing::warn!("readahead not set: mountpoint unknown");
                None
            }
        };
        let read_ahead = Arc::new(read_ahead);

        // 4. Control socket and state record.
        let listener = control::bind(&cfg.state_dir.join("control.sock"))
            .context("bind the control socket")
            .map_err(cleanup)?;
        let info = json!({
            "version": 1,
            "pid": std::process::id(),
            "backend": cfg.backend.to_string(),
            "mountpoint": mountpoint,
            "owns_mount": owned_mount.is_some(),
            "fsname": cfg.fsname,
            "threads": cfg.threads,
            "uid": cfg.run_as.map(|(u, _)| u).unwrap_or_else(|| unsafe { libc::geteuid() }),
            "gid": cfg.run_as.map(|(_, g)| g).unwrap_or_else(|| unsafe { libc::getegid() }),
            "access": format!("{:?}", cfg.fs.access),
            "data_cache": cfg.fs.data_cache,
            "writeback_cache": cfg.fs.writeback_cache,
        });
        write_atomic(
            &cfg.state_dir.join("worker.json"),
            info.to_string().as_bytes(),
        )
        .map_err(|e| cleanup(e.into()))?;

        // 5. Least privilege.
        if let Some(limits) = &cfg.limits {
            privilege::apply_limits(limits).map_err(|e| cleanup(e.into()))?;
        }
        if let Some((uid, gid)) = cfg.run_as {
            // The state dir stays writable for the session record and our own clean-up;
            // the control socket stays root's.
            std::os::unix::fs::chown(&cfg.state_dir, Some(uid), Some(gid))?;
            privilege::drop_privileges(uid, gid).context("drop privileges")?;
            tracing::info!("running as uid {uid} gid {gid}");
        }

        // 6. Serve.
        fusedev::install_wake_handler()?;
        let stats = Arc::new(Stats::new());
        let fs = DfsFs::new(
            backend.dfs,
            backend.forget,
            cfg.fs.clone(),
            stats.clone(),
            Some(session_record),
        );
        if let Some(record) = &session {
            fs.restore(record).context("the handover's session")?;
        }
        let negotiated = fs.negotiated();
        let server = Arc::new(Server::new(Arc::new(fs)));
        let shared = Arc::new(Shared {
            stop_reading: AtomicBool::new(false),
            phase: Mutex::new(Phase::Serving),
            changed: Condvar::new(),
            live_readers: AtomicUsize::new(clones.len()),
            stats,
            negotiated,
            info,
        });
        let mut readers = Vec::new();
        for (i, clone) in clones.into_iter().enumerate() {
            let (server, shared, read_ahead) = (server.clone(), shared.clone(), read_ahead.clone());
            let h = std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || {
                    let after_init = || {
                        if let Some(ra) = read_ahead.as_ref() {
                            ra.apply();
                        }
                    };
                    let r = fusedev::serve_channel(
                        &clone,
                        &server,
                        &shared.stop_reading,
                        &shared.stats,
                        &after_init,
                    );
                    match &r {
                        Ok(end) => tracing::debug!("reader {i}: {end:?}"),
                        Err(e) => tracing::error!("reader {i}: {e}"),
                    }
                    shared.live_readers.fetch_sub(1, Ordering::AcqRel);
                    shared.notify();
                    r
                })?;
            readers.push(h);
        }
        {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("control".into())
                .spawn(move || control::serve(listener, |req| shared.answer(req)))?;
        }
        tracing::info!(
            "serving {} on {} with {} threads",
            cfg.backend,
            mountpoint
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "an inherited descriptor".into()),
            cfg.threads
        );
        Ok(Worker {
            shared,
            readers,
            _master: master,
            owned_mount,
            state_dir: cfg.state_dir,
        })
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
    pub fn wait(mut self) -> Result<()> {
        let mut unmounted = false;
        loop {
            {
                let phase = self.shared.phase.lock().unwrap_or_else(|e| e.into_inner());
                let phase = self
                    .shared
                    .changed
                    .wait_while(phase, |p| {
                        *p == Phase::Serving
                            && self.shared.live_readers.load(Ordering::Acquire)
                                == self.readers.len()
                    })
                    .unwrap_or_else(|e| e.into_inner());
                if *phase == Phase::Serving {
                    // A reader ended on its own: the connection is gone or failed.
                    drop(phase);
                    self.shared.request_stop();
                }
            }
            if self.shared.live_readers.load(Ordering::Acquire) == 0 {
                break;
            }
            match &self.owned_mount {
                Some(mp) if !unmounted => {
                    unmounted = true;
                    match fusedev::unmount(mp, false) {
                        Ok(()) => tracing::info!("unmounted {}", mp.display()),
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                            tracing::info!(
                                "{} is busy: detached; serving open files until they are closed",
                                mp.display()
                            );
                            fusedev::unmount(mp, true)?;
                        }
                        // Already gone (unmounted by someone else).
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                        Err(e) => {
                            tracing::warn!("unmount {}: {e}; detaching", mp.display());
                            let _ = fusedev::unmount(mp, true);
                        }
                    }
                }
                Some(_) => {
                    // Wait for the kernel to end the connection.
                    let phase = self.shared.phase.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = self
                        .shared
                        .changed
                        .wait_timeout(phase, Duration::from_millis(200))
                        .unwrap_or_else(|e| e.into_inner());
                }
                None => {
                    // Drain: readers finish the request in hand, then see the flag.
                    self.shared.stop_reading.store(true, Ordering::Release);
                    for h in &self.readers {
                        if !h.is_finished() {
                            // SAFETY: the thread is alive (not finished, not joined), so its
                            // pthread_t is valid.
                            unsafe { libc::pthread_kill(h.as_pthread_t(), fusedev::WAKE_SIGNAL) };
                        }
                    }
                    let phase = self.shared.phase.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = self
                        .shared
                        .changed
                        .wait_timeout(phase, Duration::from_millis(5))
                        .unwrap_or_else(|e| e.into_inner());
                }
            }
        }
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
