//! The phases of [`Worker::start`](super::Worker::start), in the order they must run. Each
//! phase needs what the one before it opened, and everything that needs root happens before
//! the privilege drop.

use super::control::Shared;
use super::fs::{self, DfsFs};
use super::readers::FuseReaders;
use super::stats::Stats;
use super::throttle::Throttle;
use super::vhost_user::{Frontends, VhostUserServer};
use super::{
    Backend, PendingBackend, Serving, Source, Worker, WorkerConfig, privilege, write_atomic,
};
use crate::fuse::{self, ReadAhead};
use crate::ipc;
use anyhow::{Context as _, Result, bail};
use dpufs_node_api::control::WorkerInfo;
use dpufs_node_api::handover::SessionRecord;
use dpufs_node_api::qos::QosLimits;
use dpufs_node_api::transport::{Attachment, Transport};
use dpufs_node_api::wire;
use fuse_backend_rs::api::server::Server;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub(super) fn start(cfg: WorkerConfig, backend: PendingBackend) -> Result<Worker> {
    check(&cfg)?;
    prepare_state_dir(&cfg.state_dir)?;
    let endpoint = Endpoint::open(&cfg)?;
    let info = worker_info(&cfg, &endpoint);
    let listener = bind_control(&cfg.state_dir, &info)?;
    least_privilege(&cfg)?;
    let backend = backend.open()?;
    serve(cfg, backend, endpoint, listener, info)
}

/// Refuses a configuration that cannot work before anything is opened or mounted.
fn check(cfg: &WorkerConfig) -> Result<()> {
    cfg.fs.validate().map_err(anyhow::Error::msg)?;
    if cfg.threads == 0 {
        bail!("--threads must be at least 1");
    }
    if cfg.run_as.is_some() && matches!(cfg.source, Source::Mount(_)) {
        bail!(
            "--uid/--gid need --fuse-fd, --vhost-user-socket or --keeper: a worker that \
             mounts must keep the privilege to unmount"
        );
    }
    let needs = match cfg.source {
        Source::Mount(_) | Source::Fd { .. } => Some(Transport::Fuse),
        Source::Listen(_) => Some(Transport::VhostUserFs),
        Source::Keeper { .. } => None,
    };
    if let Some(t) = needs.filter(|t| *t != cfg.transport) {
        bail!(
            "--transport {} cannot serve what was given: that needs --transport {t}",
            cfg.transport
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

/// What the worker serves: a FUSE connection, or a vhost-user listening socket.
enum Endpoint {
    Fuse {
        conn: Connection,
        /// One clone of the master per reader.
        clones: Vec<OwnedFd>,
        read_ahead: Arc<Option<ReadAhead>>,
    },
    VhostUser {
        listener: UnixListener,
        socket: PathBuf,
        /// The worker bound the socket (and unlinks it when it stops); a keeper's export
        /// stays.
        owned: bool,
        /// What the guest's INIT negotiated, from the keeper's handover.
        session: Option<SessionRecord>,
    },
}

impl Endpoint {
    /// First, because everything else hangs off it: mount, adopt the inherited descriptor,
    /// bind the vhost-user socket, or take the volume from the keeper. Then, for FUSE, one
    /// clone per reader and the readahead attribute, while the worker still may open them.
    fn open(cfg: &WorkerConfig) -> Result<Endpoint> {
        let conn = match &cfg.source {
            Source::Mount(mp) => Connection::mount(cfg, mp)?,
            Source::Fd { fd, mountpoint } => Connection {
                master: fuse::adopt_fd(*fd).with_context(|| format!("--fuse-fd {fd}"))?,
                owned: OwnMount(None),
                mountpoint: mountpoint.clone(),
                session: None,
            },
            Source::Listen(socket) => {
                let listener = ipc::bind(socket)
                    .with_context(|| format!("bind the vhost-user socket {}", socket.display()))?;
                return Ok(Endpoint::VhostUser {
                    listener,
                    socket: socket.clone(),
                    owned: true,
                    session: None,
                });
            }
            Source::Keeper { socket, volume } => {
                let (handover, fd) = ipc::keeper::take_over(socket, volume)
                    .with_context(|| format!("take volume {volume} from the keeper"))?;
                if handover.attachment.transport() != cfg.transport {
                    bail!(
                        "the keeper has volume {volume} {}: that needs --transport {}",
                        handover.attachment,
                        handover.attachment.transport()
                    );
                }
                match handover.attachment {
                    Attachment::Mount(mountpoint) => Connection {
                        master: fd,
                        owned: OwnMount(None),
                        mountpoint: Some(mountpoint),
                        session: handover.session,
                    },
                    Attachment::VhostUser { socket } => {
                        return Ok(Endpoint::VhostUser {
                            listener: UnixListener::from(fd),
                            socket,
                            owned: false,
                            session: handover.session,
                        });
                    }
                }
            }
        };
        let clones = clone_readers(&conn.master, cfg.threads)?;
        let read_ahead = open_read_ahead(conn.mountpoint.as_deref(), cfg.read_ahead_kb);
        Ok(Endpoint::Fuse {
            conn,
            clones,
            read_ahead,
        })
    }

    /// What INIT negotiated before this worker, from the keeper's handover.
    fn session(&self) -> Option<&SessionRecord> {
        match self {
            Endpoint::Fuse { conn, .. } => conn.session.as_ref(),
            Endpoint::VhostUser { session, .. } => session.as_ref(),
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
    /// Mounts at `mp`: the worker owns this mount.
    fn mount(cfg: &WorkerConfig, mp: &Path) -> Result<Connection> {
        let mp = mp
            .canonicalize()
            .with_context(|| format!("mountpoint {}", mp.display()))?;
        let opts = fuse::MountOptions {
            fsname: cfg.fsname.clone(),
            read_only: cfg.fs.access == fs::AccessMode::ReadOnly,
            allow_other: cfg.allow_other,
        };
        let master =
            fuse::mount(&mp, &opts).with_context(|| format!("mount FUSE on {}", mp.display()))?;
        Ok(Connection {
            master,
            owned: OwnMount(Some(mp.clone())),
            mountpoint: Some(mp),
            session: None,
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
fn worker_info(cfg: &WorkerConfig, endpoint: &Endpoint) -> WorkerInfo {
    // SAFETY: plain getters.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (mountpoint, owns_mount, socket) = match endpoint {
        Endpoint::Fuse { conn, .. } => (conn.mountpoint.clone(), conn.owned.0.is_some(), None),
        Endpoint::VhostUser { socket, .. } => (None, false, Some(socket.clone())),
    };
    WorkerInfo {
        version: 1,
        pid: std::process::id(),
        backend: cfg.backend.to_string(),
        transport: cfg.transport,
        mountpoint,
        socket,
        owns_mount,
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

/// Starts the request threads (FUSE readers, or the vhost-user-fs server) and the control
/// thread. The session of a handover is restored first: INIT will not come again, and no
/// request may be answered before the file system knows what was negotiated.
fn serve(
    cfg: WorkerConfig,
    backend: Backend,
    endpoint: Endpoint,
    listener: UnixListener,
    info: WorkerInfo,
) -> Result<Worker> {
    let stats = Arc::new(Stats::new());
    let throttle = Arc::new(Throttle::new(QosLimits::UNLIMITED));
    if let Some(path) = &cfg.qos {
        watch_qos(path.clone(), throttle.clone())?;
    }
    let dfs = backend.dfs.clone();
    let fs = DfsFs::new(
        backend.dfs,
        backend.forget,
        cfg.fs.clone(),
        stats.clone(),
        Some(cfg.state_dir.join("session.json")),
        throttle.clone(),
    );
    if let Some(record) = endpoint.session() {
        fs.restore(record).context("the handover's session")?;
        // The predecessor's answered changes no fsync covered were tracked in its memory
        // (docs/dfs.md, "Durability"): made durable now, an engine crash can no longer take
        // them unreported.
        if let Err(e) = dfs.sync_all() {
            tracing::warn!("syncing the predecessor's changes: {e}");
        }
    }
    let fs = Arc::new(fs);
    let server = Arc::new(Server::new(fs.clone()));
    let shared = |threads, frontends| {
        Arc::new(Shared::new(
            threads,
            stats.clone(),
            fs.negotiated(),
            throttle.clone(),
            frontends,
            fs.clone(),
            info.clone(),
        ))
    };
    let (shared, serving, serves) = match endpoint {
        Endpoint::Fuse {
            conn,
            clones,
            read_ahead,
        } => {
            let shared = shared(clones.len(), None);
            let serves = conn
                .mountpoint
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "an inherited descriptor".into());
            let readers = FuseReaders::start(
                &server,
                &shared,
                conn.master,
                clones,
                read_ahead,
                conn.owned.keep(),
            )?;
            (shared, Serving::Fuse(readers), serves)
        }
        Endpoint::VhostUser {
            listener,
            socket,
            owned,
            ..
        } => {
            let frontends = Arc::new(Frontends::default());
            let shared = shared(cfg.threads, Some(frontends.clone()));
            let serves = format!("vhost-user socket {}", socket.display());
            let owned = owned.then_some(socket);
            let server =
                VhostUserServer::start(listener, owned, server, cfg.threads, &shared, frontends)?;
            (shared, Serving::VhostUser(server), serves)
        }
    };
    {
        // Weak, as the stopper: the control thread never ends, and must not keep the
        // backend open after the worker has stopped.
        let shared = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                ipc::line::serve(listener, |line| match shared.upgrade() {
                    Some(shared) => shared.answer(line),
                    None => Shared::stopped_answer(line),
                })
            })?;
    }
    tracing::info!(
        "serving {} on {serves} with {} threads",
        cfg.backend,
        cfg.threads
    );
    Ok(Worker {
        shared,
        serving,
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
