//! The mount keeper (docs/architecture.md, "Worker lifetime"; docs/keeper.md): one process
//! per node that mounts each volume, holds the connection's original /dev/fuse descriptor
//! without ever reading from it, hands it to the volume's worker over a unix socket
//! (SCM_RIGHTS, with a versioned handover), and supervises the workers. A volume may instead
//! be exported over vhost-user-fs: the keeper then holds the export's listening socket, so
//! that every worker it starts for the volume listens on the same path.
//!
//! The kernel keeps a FUSE connection while any descriptor of it is open, and fails only the
//! requests in flight on a descriptor that closes. Workers read from their own clones, so:
//! - a worker that dies loses only its in-flight requests (ECONNABORTED); the keeper starts a
//!   replacement that takes the descriptor and the negotiated session (no INIT) and serves,
//!   and keeps trying, with backoff, while replacements fail to start;
//! - an upgrade starts the new worker first (both serve the queue for a moment), then drains
//!   the old one: no request fails.
//!
//! Each volume is a state machine ([`state`]); requests and the supervisor change it only
//! through one function, `Keeper::feed`, and run the actions it answers with (`execute.rs`).

mod execute;
pub mod placement;
pub mod process;
mod recover;
pub mod state;
mod supervise;

use crate::fuse::{self, MountOptions};
use crate::ipc::{self, fdpass};
use anyhow::{Context as _, Result, anyhow, bail};
use dpufs_node_api::handover::Handover;
use dpufs_node_api::keeper::{
    Attached, List, Recovered, Reply, Request, RequestError, VolumeStatus,
};
use dpufs_node_api::record::{self, VolumeRecord};
use dpufs_node_api::transport::Attachment;
use process::Worker;
use state::{Action, Event, Machine, Refused, WorkerHandle};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long an `unmount` waits for a worker that is starting (or another unmount).
const UNMOUNT_WAIT: Duration = Duration::from_secs(60);

/// One volume the keeper mounted or exported.
#[derive(Debug)]
struct Volume {
    /// What its workers take by handover, held for the volume's life: a FUSE connection's
    /// original descriptor (never read), or an export's listening socket (never accepted on).
    held: OwnedFd,
    machine: Machine<Worker>,
}

type Volumes = BTreeMap<String, Volume>;

/// The keeper's state.
#[derive(Debug)]
pub struct Keeper {
    state_dir: PathBuf,
    worker_binary: PathBuf,
    volumes: Mutex<Volumes>,
    /// Signalled after every event (what an `unmount` waiting for a start waits on).
    changed: Condvar,
    /// Readable after every event: the supervisor then looks at its workers again.
    wake: process::Wake,
    /// What this keeper found of a previous one at start (see [`Keeper::recover`]).
    recovered: Mutex<Vec<Recovered>>,
}

impl Keeper {
    /// A keeper with its socket and volumes under `state_dir`, starting workers from
    /// `worker_binary` unless told otherwise.
    pub fn new(state_dir: &Path, worker_binary: PathBuf) -> Result<Arc<Keeper>> {
        std::fs::create_dir_all(state_dir.join("volumes"))
            .with_context(|| format!("create {}", state_dir.display()))?;
        Ok(Arc::new(Keeper {
            state_dir: state_dir.to_path_buf(),
            worker_binary,
            volumes: Mutex::new(BTreeMap::new()),
            changed: Condvar::new(),
            wake: process::Wake::new().context("eventfd")?,
            recovered: Mutex::new(Vec::new()),
        }))
    }

    /// The socket workers and launchers talk to.
    pub fn socket(state_dir: &Path) -> PathBuf {
        state_dir.join("keeper.sock")
    }

    /// The control socket of the volume's worker of `generation` (its `list` entry says
    /// which serves now).
    pub fn worker_control_socket(state_dir: &Path, volume: &str, generation: u32) -> PathBuf {
        state_dir
            .join("volumes")
            .join(volume)
            .join(format!("worker-{generation}"))
            .join("control.sock")
    }

    fn volumes(&self) -> MutexGuard<'_, Volumes> {
        lock(&self.volumes)
    }

    /// Serves requests and supervises workers until the process ends.
    pub fn run(self: &Arc<Self>) -> Result<()> {
        // Bound before recovering: binding fails while another keeper answers, and only a
        // keeper that owns the state directory may clean up what it finds there.
        let listener =
            ipc::bind(&Self::socket(&self.state_dir)).context("bind the keeper socket")?;
        *lock(&self.recovered) = self.recover()?;
        let me = self.clone();
        std::thread::Builder::new()
            .name("supervisor".into())
            .spawn(move || me.supervise())?;
        tracing::info!(
            "keeper serving on {}",
            Self::socket(&self.state_dir).display()
        );
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let me = self.clone();
            std::thread::spawn(move || {
                if let Err(e) = me.answer(&conn) {
                    tracing::warn!("keeper request: {e:#}");
                }
            });
        }
        Ok(())
    }

    /// The one way a volume changes: `event` to its machine, under the lock. The record is
    /// saved, and waiters and the supervisor are woken.
    fn feed(&self, volume: &str, event: Event<Worker>) -> Result<Vec<Action<Worker>>, Refused> {
        let mut vols = self.volumes();
        self.feed_locked(&mut vols, volume, event)
    }

    fn feed_locked(
        &self,
        vols: &mut Volumes,
        volume: &str,
        event: Event<Worker>,
    ) -> Result<Vec<Action<Worker>>, Refused> {
        let Some(v) = vols.get_mut(volume) else {
            return match event {
                // A worker of a volume that is gone: stop it.
                Event::Started { worker, .. } => Ok(vec![Action::Drain(worker)]),
                _ => Err(Refused::No(format!("no volume {volume}"))),
            };
        };
        let result = v.machine.on(event, Instant::now());
        if matches!(v.machine.state(), state::State::Gone) {
            vols.remove(volume);
        } else if result.is_ok()
            && let Err(e) = self.save_record(volume, &v.machine)
        {
            tracing::warn!("{volume}: {e:#}");
        }
        self.changed.notify_all();
        self.wake.wake();
        result
    }

    fn answer(&self, conn: &UnixStream) -> Result<()> {
        let (line, _) = fdpass::recv(conn)?;
        let req = match Request::decode(&line) {
            Ok(req) => Ok(req),
            Err(RequestError::NotJson(e)) => bail!("request is not JSON: {e}"),
            Err(RequestError::Invalid(e)) => Err(anyhow!(e)),
        };
        let mut fd = None;
        let reply = req
            .and_then(|req| self.handle(req, &mut fd))
            .unwrap_or_else(|e| Reply::Refused(format!("{e:#}")));
        fdpass::send(conn, &reply.encode(), fd.as_ref().map(AsRawFd::as_raw_fd))?;
        Ok(())
    }

    fn handle(&self, req: Request, fd: &mut Option<OwnedFd>) -> Result<Reply> {
        match req {
            Request::Mount {
                volume,
                mountpoint,
                fsname,
                read_only,
                allow_other,
            } => {
                let opts = MountOptions {
                    fsname: fsname.unwrap_or_else(|| "dpufs".into()),
                    read_only: read_only.unwrap_or(false),
                    allow_other: allow_other.unwrap_or(true),
                };
                self.mount(&volume, mountpoint, &opts)
            }
            Request::Export { volume, socket } => self.export(&volume, socket),
            Request::Handover { volume } => {
                let (h, f) = self.handover(&volume)?;
                *fd = Some(f);
                Ok(Reply::Handover(h))
            }
            Request::Serve {
                volume,
                args,
                binary,
            } => self.serve(&volume, args, binary),
            Request::Upgrade { volume, binary } => self.upgrade(&volume, binary),
            Request::Unmount { volume } => self.unmount(&volume),
            Request::List => Ok(Reply::List(self.list())),
        }
    }

    /// Mounts `volume` at `mountpoint` (idempotent for the same mountpoint).
    fn mount(&self, volume: &str, mountpoint: PathBuf, opts: &MountOptions) -> Result<Reply> {
        let attached = self.attach(volume, Attachment::Mount(mountpoint), |mp| {
            fuse::mount(mp, opts).with_context(|| format!("mount FUSE on {}", mp.display()))
        })?;
        Ok(Reply::Mounted(attached))
    }

    /// Binds `volume`'s vhost-user listening socket at `socket` and holds it (idempotent for
    /// the same path). A stale socket file there is replaced; a socket someone answers on is
    /// refused.
    fn export(&self, volume: &str, socket: PathBuf) -> Result<Reply> {
        let attached = self.attach(volume, Attachment::VhostUser { socket }, |path| {
            let listener = ipc::bind(path)
                .with_context(|| format!("bind the vhost-user socket {}", path.display()))?;
            Ok(listener.into())
        })?;
        Ok(Reply::Exported(attached))
    }

    /// A new volume attached as `attachment` by `open` (which is given its path and returns
    /// what the keeper holds), or the same attachment of a known volume again.
    fn attach(
        &self,
        volume: &str,
        attachment: Attachment,
        open: impl FnOnce(&Path) -> Result<OwnedFd>,
    ) -> Result<Attached> {
        check_name(volume)?;
        let mut vols = self.volumes();
        if vols.contains_key(volume) {
            self.feed_locked(&mut vols, volume, Event::Attach { attachment })
                .map_err(refusal)?;
            return Ok(Attached::Already);
        }
        let held = open(attachment.path())?;
        let machine = Machine::new(volume, attachment, self.worker_binary.clone());
        let saved = self.save_record(volume, &machine);
        vols.insert(volume.to_string(), Volume { held, machine });
        saved?;
        Ok(Attached::Now)
    }

    /// The handover for a worker taking `volume`, and a duplicate of its descriptor (made
    /// under the lock, sent after it).
    fn handover(&self, volume: &str) -> Result<(Handover, OwnedFd)> {
        let vols = self.volumes();
        let v = vols
            .get(volume)
            .with_context(|| format!("no volume {volume}"))?;
        let h = Handover::new(
            volume,
            v.machine.attachment().clone(),
            v.machine.session().cloned(),
        );
        let fd = v.held.try_clone().context("duplicate the descriptor")?;
        Ok((h, fd))
    }

    /// Starts the volume's worker with `args` (and `binary`, if given), answering once it
    /// serves.
    fn serve(&self, volume: &str, args: Vec<String>, binary: Option<PathBuf>) -> Result<Reply> {
        let actions = self
            .feed(volume, Event::Serve { args, binary })
            .map_err(refusal)?;
        let done = self.execute(volume, actions);
        Ok(Reply::Served {
            pid: done.started()?,
        })
    }

    /// Replaces the volume's worker by one of `binary` (default: the same) with no request
    /// failing: the new one serves before the old one drains. If the new one fails to
    /// start, the old one goes on serving.
    fn upgrade(&self, volume: &str, binary: Option<PathBuf>) -> Result<Reply> {
        let (previous, actions) = {
            let mut vols = self.volumes();
            let previous = vols
                .get(volume)
                .and_then(|v| v.machine.serving().map(WorkerHandle::pid));
            let actions = self
                .feed_locked(&mut vols, volume, Event::Upgrade { binary })
                .map_err(refusal)?;
            (previous.context("no previous worker")?, actions)
        };
        let done = self.execute(volume, actions);
        let pid = done.started()?;
        // A previous worker that died during the upgrade was reaped, not drained.
        done.drain_error()?;
        Ok(Reply::Upgraded { pid, previous })
    }

    /// Drains the worker, unmounts (lazily if busy) and forgets the volume. Waits while a
    /// worker of the volume is starting: that one is drained too.
    fn unmount(&self, volume: &str) -> Result<Reply> {
        let deadline = Instant::now() + UNMOUNT_WAIT;
        let actions = {
            let mut vols = self.volumes();
            loop {
                if !vols.contains_key(volume) {
                    return Ok(Reply::Unmounted);
                }
                match self.feed_locked(&mut vols, volume, Event::Unmount) {
                    Ok(actions) => break actions,
                    Err(Refused::No(e)) => bail!(e),
                    Err(Refused::Busy(why)) => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            bail!("{why}: try again");
                        }
                        vols = self
                            .changed
                            .wait_timeout(vols, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
        };
        self.execute(volume, actions).unmounted()?;
        Ok(Reply::Unmounted)
    }

    fn list(&self) -> List {
        let vols = self.volumes();
        let volumes = vols
            .iter()
            .map(|(name, v)| {
                let m = &v.machine;
                VolumeStatus {
                    volume: name.clone(),
                    attachment: m.attachment().clone(),
                    pid: m.serving().map(WorkerHandle::pid),
                    generation: m.generation(),
                    restarts: m.restarts(),
                    last_failover_ms: m.last_failover_ms(),
                    initialized: m.session().is_some(),
                }
            })
            .collect();
        List {
            pid: std::process::id(),
            volumes,
            recovered: lock(&self.recovered).clone(),
        }
    }

    /// Persists what a later keeper needs to know of `volume`.
    fn save_record(&self, volume: &str, m: &Machine<Worker>) -> Result<()> {
        VolumeRecord {
            volume: volume.to_string(),
            attachment: m.attachment().clone(),
            args: m.args().to_vec(),
            binary: m.binary().to_path_buf(),
            worker_pid: m.serving().map(WorkerHandle::pid),
            pid_namespace: record::pid_namespace(),
            generation: m.generation(),
        }
        .save(&self.volume_dir(volume))
        .context("save the volume's record")
    }

    fn volume_dir(&self, volume: &str) -> PathBuf {
        self.state_dir.join("volumes").join(volume)
    }

    fn worker_dir(&self, volume: &str, generation: u32) -> PathBuf {
        Keeper::worker_control_socket(&self.state_dir, volume, generation)
            .parent()
            .expect("a control socket is in its worker's directory")
            .to_path_buf()
    }
}

fn refusal(r: Refused) -> anyhow::Error {
    match r {
        Refused::No(e) | Refused::Busy(e) => anyhow!(e),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Volume names become directory names.
fn check_name(volume: &str) -> Result<()> {
    let ok = !volume.is_empty()
        && volume.len() <= 128
        && volume
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !volume.starts_with('.');
    if !ok {
        bail!("volume name {volume:?}: use 1-128 of [A-Za-z0-9._-], not starting with '.'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_names_are_checked() {
        for good in ["vol-1", "pvc_9.a", "x"] {
            check_name(good).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "..", "sp ace", &"x".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
