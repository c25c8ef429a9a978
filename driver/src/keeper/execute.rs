//! Running what a volume's state machine asks for. Each action that ends in something the
//! machine must know (a worker serves or not, the mount is gone or not) feeds that back as an
//! event, and runs the actions the event brings, in order.

use super::Keeper;
use super::process::Worker;
use super::state::{Action, Event, StartSpec, WorkerHandle};
use crate::fuse;
use anyhow::{Result, anyhow};
use dpufs_node_api::handover::SessionRecord;
use dpufs_node_api::transport::Attachment;
use std::collections::VecDeque;
use std::path::Path;

/// What the actions of one request came to.
#[derive(Debug, Default)]
pub(super) struct Done {
    /// The pid of the worker started, or why none serves.
    started: Option<Result<u32, String>>,
    /// Why a worker drained had to be killed.
    drain_failed: Option<String>,
    unmounted: Option<Result<(), String>>,
}

impl Done {
    pub fn started(&self) -> Result<u32> {
        outcome(&self.started, "started no worker")
    }

    /// Why the worker drained had to be killed, if it had to.
    pub fn drain_error(&self) -> Result<()> {
        match &self.drain_failed {
            Some(e) => Err(anyhow!("{e}")),
            None => Ok(()),
        }
    }

    pub fn unmounted(&self) -> Result<()> {
        outcome(&self.unmounted, "did not unmount")
    }
}

fn outcome<T: Copy>(o: &Option<Result<T, String>>, missing: &str) -> Result<T> {
    match o {
        Some(Ok(v)) => Ok(*v),
        Some(Err(e)) => Err(anyhow!("{e}")),
        None => Err(anyhow!("the keeper {missing}")),
    }
}

impl Keeper {
    /// Runs `actions` of `volume`, and those the outcomes bring, to the end.
    pub(super) fn execute(&self, volume: &str, actions: Vec<Action<Worker>>) -> Done {
        let mut queue = VecDeque::from(actions);
        let mut done = Done::default();
        while let Some(action) = queue.pop_front() {
            let next = match action {
                Action::Start(spec) => self.start(volume, &spec, &mut done),
                Action::Reap(worker) => {
                    self.reap(volume, worker);
                    continue;
                }
                Action::Drain(worker) => {
                    let pid = worker.pid();
                    if let Err(e) = worker.drain() {
                        tracing::warn!("{volume}: worker {pid}: {e:#}");
                        done.drain_failed = Some(format!("worker {pid}: {e:#}"));
                    }
                    continue;
                }
                Action::Unmount => {
                    let r = self.unmount_now(volume);
                    let ok = r.is_ok();
                    done.unmounted = Some(r);
                    self.feed(volume, Event::Unmounted { ok })
                }
            };
            match next {
                Ok(more) => queue.extend(more),
                Err(e) => tracing::warn!("{volume}: {e:?}"),
            }
        }
        done
    }

    /// Starts a worker and tells the machine whether it serves.
    fn start(
        &self,
        volume: &str,
        spec: &StartSpec,
        done: &mut Done,
    ) -> Result<Vec<Action<Worker>>, super::state::Refused> {
        if let Some(g) = spec.session_from {
            self.harvest_session(volume, &self.worker_dir(volume, g));
        }
        let dir = self.worker_dir(volume, spec.generation);
        let socket = Self::socket(&self.state_dir);
        let transport = self
            .volumes()
            .get(volume)
            .map(|v| v.machine.attachment().transport())
            .ok_or_else(|| super::state::Refused::No(format!("no volume {volume}")))?;
        match Worker::start(spec, transport, &socket, volume, dir.clone()) {
            Ok(worker) => {
                done.started = Some(Ok(worker.pid()));
                let session = read_session(&dir);
                let generation = spec.generation;
                self.feed(
                    volume,
                    Event::Started {
                        generation,
                        worker,
                        session,
                    },
                )
            }
            Err(e) => {
                tracing::warn!(
                    "{volume}: worker generation {} did not start: {e:#}",
                    spec.generation
                );
                done.started = Some(Err(format!("{e:#}")));
                // What it recorded of INIT before failing is the connection's.
                self.harvest_session(volume, &dir);
                let _ = std::fs::remove_dir_all(&dir);
                let generation = spec.generation;
                self.feed(volume, Event::StartFailed { generation })
            }
        }
    }

    /// Collects a worker that died; its record of INIT is kept before its directory goes.
    fn reap(&self, volume: &str, worker: Worker) {
        let (pid, dir) = (worker.pid(), worker.dir().to_path_buf());
        match worker.reap() {
            Ok(status) => tracing::warn!("worker {pid} of {volume} ended ({status})"),
            Err(e) => tracing::warn!("worker {pid} of {volume}: {e}"),
        }
        self.harvest_session(volume, &dir);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Gives the machine the session record in a worker's directory, if there is one.
    fn harvest_session(&self, volume: &str, dir: &Path) {
        if let Some(record) = read_session(dir) {
            let _ = self.feed(volume, Event::Session(record));
        }
    }

    /// Unmounts the volume (lazily if busy), or unlinks its export's socket, and removes its
    /// state. An export's listener is closed when the volume is forgotten, right after.
    fn unmount_now(&self, volume: &str) -> Result<(), String> {
        let attachment = self
            .volumes()
            .get(volume)
            .map(|v| v.machine.attachment().clone())
            .ok_or_else(|| format!("no volume {volume}"))?;
        match &attachment {
            Attachment::Mount(mountpoint) => unmount(mountpoint)?,
            Attachment::VhostUser { socket } => match std::fs::remove_file(socket) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!("unlink {}: {e}", socket.display()));
                }
                _ => {}
            },
        }
        let _ = std::fs::remove_dir_all(self.volume_dir(volume));
        Ok(())
    }
}

/// Unmounts at once when idle, else lazily.
fn unmount(mountpoint: &Path) -> Result<(), String> {
    if fuse::unmount(mountpoint, false).is_err() {
        match fuse::unmount(mountpoint, true) {
            // Not mounted any more (someone unmounted it): gone all the same.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(format!("unmount {}: {e}", mountpoint.display())),
            Ok(()) => {}
        }
    }
    Ok(())
}

fn read_session(dir: &Path) -> Option<SessionRecord> {
    let text = std::fs::read_to_string(dir.join("session.json")).ok()?;
    serde_json::from_str(&text).ok()
}
