//! The phases of [`Worker::start`](super::Worker::start), in the order they must run. Each
//! phase needs what the one before it opened, and everything that needs root happens before
//! the privilege drop.

use super::channel;
use super::control::Shared;
use super::fs::{self, DfsFs};
use super::stats::Stats;
use super::throttle::Throttle;
use super::{Backend, FuseSource, Worker, WorkerConfig, privilege, write_atomic};
use crate::fuse::{self, ReadAhead};
use crate::ipc;
use anyhow::{Context as _, Result, bail};
use dpufs_node_api::control::WorkerInfo;
use dpufs_node_api::handover::SessionRecord;
use dpufs_node_api::qos::QosLimits;
use dpufs_node_api::transport::Transport;
use dpufs_node_api::wire;
use fuse_backend_rs::api::server::Server;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub(super) fn start(cfg: WorkerConfig, backend: Backend) -> Result<Worker> {
    check(&cfg)?;
    prepare_state_dir(&cfg.state_dir)?;
    let conn = Connection::open(&cfg)?;
    let clones = clone_readers(&conn.master, cfg.threads)?;
    let read_ahead = open_read_ahead(conn.mountpoint.as_deref(), cfg.read_ahead_kb);
    let info = worker_info(&cfg, &conn);
    let listener = bind_control(&cfg.state_dir, &info)?;
    least_privilege(&cfg)?;
    serve(cfg, backend, conn, clones, read_ahead, listener, info)
}

/// Refuses a configuration that cannot work before anything is opened or mounted.
fn check(cfg: &WorkerConfig) -> Result<()> {
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
    Ok(())
}

/// The state directory is private (mode 0700): the control socket and the session record
/// are only for root.
fn prepare_state_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create state dir {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// A mount the worker made itself: detached again if start-up fails after it, so a failed
/// start never leaves a mount nobody serves.
struct OwnMount(Option<PathBuf>);

impl OwnMount {
    /// Start-up succeeded: the worker unmounts when it stops.
    fn keep(mut self) -> Option<PathBuf> {
        self.0.take()
    }
}

impl Drop for OwnMount {
    fn drop(&mut self) {
        if let Some(mp) = &self.0 {
            let _ = fuse::unmount(mp, true);
        }
    }
}

/// The FUSE connection and what is known about it.
struct Connection {
    /// Held, never read: the readers use clones.
    master: OwnedFd,
    owned: OwnMount,
    mountpoint: Option<PathBuf>,
    /// What INIT negotiated before this worker, from the keeper's handover.
    session: Option<SessionRecord>,
}

impl Connection {
    /// First, because everything else hangs off the connection: mount, adopt the inherited
    /// descriptor, or take the volume from the keeper.
    fn open(cfg: &WorkerConfig) -> Result<Connection> {
        Ok(match &cfg.source {
            FuseSource::Mount(mp) => {
                let mp = mp
                    .canonicalize()
                    .with_context(|| format!("mountpoint {}", mp.display()))?;
                let opts = fuse::MountOptions {
                    fsname: cfg.fsname.clone(),
                    read_only: cfg.fs.access == fs::AccessMode::ReadOnly,
                    allow_other: cfg.allow_other,
                };
                let master = fuse::mount(&mp, &opts)
                    .with_context(|| format!("mount FUSE on {}", mp.display()))?;
                Connection {
                    master,
                    owned: OwnMount(Some(mp.clone())),
                    mountpoint: Some(mp),
                    session: None,
                }
            }
            FuseSource::Fd { fd, mountpoint } => Connection {
                master: fuse::adopt_fd(*fd).with_context(|| format!("--fuse-fd {fd}"))?,
                owned: OwnMount(None),
                mountpoint: mountpoint.clone(),
                session: None,
            },
            FuseSource::Keeper { socket, volume } => {
                let (handover, master) = ipc::keeper::take_over(socket, volume)
                    .with_context(|| format!("take volume {volume} from the keeper"))?;
                let Some(mountpoint) = handover.attachment.mountpoint() else {
                    bail!(
                        "the keeper exports volume {volume}: {}",
                        handover.attachment
                    );
                };
                Connection {
                    master,
                    owned: OwnMount(None),
                    mountpoint: Some(mountpoint.to_path_buf()),
                    session: handover.session,
                }
            }
        })
    }
}

/// One clone of the master per reader, now: cloning opens /dev/fuse, which the worker may
/// no longer do after the privilege drop.
fn clone_readers(master: &OwnedFd, threads: usize) -> Result<Vec<OwnedFd>> {
    (0..threads)
        .map(|_| fuse::clone_fd(master.as_fd()))
        .collect::<io::Result<Vec<_>>>()
        .context("clone /dev/fuse (FUSE_DEV_IOC_CLONE)")
}

/// The readahead attribute is in sysfs (root only): opened now and written now (for a
/// connection initialised before us), and written again after INIT, which lowers it to the
/// INIT reply's value. Not fatal: the mount works without it, only slower.
fn open_read_ahead(mountpoint: Option<&Path>, kb: u32) -> Arc<Option<ReadAhead>> {
    let ra = match (mountpoint, kb) {
        (_, 0) => None,
        (Some(mp), kb) => match ReadAhead::open(mp, kb) {
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
    Arc::new(ra)
}

/// What `health` reports of this worker for its whole life (and `worker.json` records).
fn worker_info(cfg: &WorkerConfig, conn: &Connection) -> WorkerInfo {
    // SAFETY: plain getters.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    WorkerInfo {
        version: 1,
        pid: std::process::id(),
        backend: cfg.backend.to_string(),
        transport: Transport::Fuse,
        mountpoint: conn.mountpoint.clone(),
        socket: None,
        owns_mount: conn.owned.0.is_some(),
        fsname: cfg.fsname.clone(),
        threads: cfg.threads as u64,
        uid: cfg.run_as.map_or(euid, |(u, _)| u),
        gid: cfg.run_as.map_or(egid, |(_, g)| g),
        access: format!("{:?}", cfg.fs.access),
        data_cache: cfg.fs.data_cache,
        writeback_cache: cfg.fs.writeback_cache,
    }
}

/// The control socket is bound while the worker is root, so it stays root's (mode 0600)
/// after the drop; `worker.json` goes next to it.
fn bind_control(state_dir: &Path, info: &WorkerInfo) -> Result<UnixListener> {
    let listener = ipc::bind(&state_dir.join("control.sock")).context("bind the control socket")?;
    write_atomic(
        &state_dir.join("worker.json"),
        wire::encode(info).as_bytes(),
    )?;
    Ok(listener)
}

/// Last of the set-up: limits, then the identity drop, after which nothing needs root.
fn least_privilege(cfg: &WorkerConfig) -> Result<()> {
    if let Some(limits) = &cfg.limits {
        privilege::apply_limits(limits)?;
    }
    if let Some((uid, gid)) = cfg.run_as {
        // The state dir stays writable for the session record and our own clean-up;
        // the control socket stays root's.
        std::os::unix::fs::chown(&cfg.state_dir, Some(uid), Some(gid))?;
        privilege::drop_privileges(uid, gid).context("drop privileges")?;
        tracing::info!("running as uid {uid} gid {gid}");
    }
    Ok(())
}

/// Starts the reader threads and the control thread. The session of a handover is restored
/// first: the kernel will not send INIT again, and a reader must not answer a request
/// before the file system knows what was negotiated.
fn serve(
    cfg: WorkerConfig,
    backend: Backend,
    conn: Connection,
    clones: Vec<OwnedFd>,
    read_ahead: Arc<Option<ReadAhead>>,
    listener: UnixListener,
    info: WorkerInfo,
) -> Result<Worker> {
    channel::install_wake_handler()?;
    let stats = Arc::new(Stats::new());
    let throttle = Arc::new(Throttle::new(QosLimits::UNLIMITED));
    if let Some(path) = &cfg.qos {
        watch_qos(path.clone(), throttle.clone())?;
    }
    let fs = DfsFs::new(
        backend.dfs,
        backend.forget,
        cfg.fs.clone(),
        stats.clone(),
        Some(cfg.state_dir.join("session.json")),
        throttle.clone(),
    );
    if let Some(record) = &conn.session {
        fs.restore(record).context("the handover's session")?;
    }
    let shared = Arc::new(Shared::new(
        clones.len(),
        stats,
        fs.negotiated(),
        throttle,
        info,
    ));
    let server = Arc::new(Server::new(Arc::new(fs)));
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
                let r = channel::serve_channel(
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
            .spawn(move || ipc::line::serve(listener, |line| shared.answer(line)))?;
    }
    tracing::info!(
        "serving {} on {} with {} threads",
        cfg.backend,
        conn.mountpoint
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "an inherited descriptor".into()),
        cfg.threads
    );
    Ok(Worker {
        shared,
        readers,
        _master: conn.master,
        owned_mount: conn.owned.keep(),
        state_dir: cfg.state_dir,
    })
}

/// How often the QoS file is read for new limits.
const QOS_POLL: Duration = Duration::from_secs(1);

/// Puts the QoS file's limits in force now, then re-reads it every [`QOS_POLL`] for the
/// node plugin's changes. A file that cannot be read keeps the limits in force (and says so
/// once per distinct error); a file that does not exist is no limit.
fn watch_qos(path: PathBuf, throttle: Arc<Throttle>) -> Result<()> {
    let apply = move |last_error: &mut Option<String>| match QosLimits::load(&path) {
        Ok(limits) => {
            *last_error = None;
            if limits != throttle.limits() {
                tracing::info!("QoS from {}: {limits}", path.display());
                throttle.set(limits);
            }
        }
        Err(e) => {
            let e = format!("QoS file {}: {e}; the limits in force stay", path.display());
            if last_error.as_ref() != Some(&e) {
                tracing::warn!("{e}");
                *last_error = Some(e);
            }
        }
    };
    let mut last_error = None;
    apply(&mut last_error);
    std::thread::Builder::new()
        .name("qos".into())
        .spawn(move || {
            loop {
                std::thread::sleep(QOS_POLL);
                apply(&mut last_error);
            }
        })?;
    Ok(())
}
