//! The mount keeper (design.md §Node plugin and worker lifetime; docs/keeper.md): one process
//! per node that mounts each volume, holds the connection's original /dev/fuse descriptor
//! without ever reading from it, hands it to the volume's worker over a unix socket
//! (SCM_RIGHTS, with a versioned [`handover::Handover`]), and supervises the workers.
//!
//! The kernel keeps a FUSE connection while any descriptor of it is open, and fails only the
//! requests in flight on a descriptor that closes. Workers read from their own clones, so:
//! - a worker that dies loses only its in-flight requests (ECONNABORTED); the keeper starts a
//!   replacement that takes the descriptor and the negotiated session (no INIT) and serves;
//! - an upgrade starts the new worker first (both serve the queue for a moment), then drains
//!   the old one: no request fails.

pub mod fdpass;
pub mod handover;
pub mod placement;
pub mod records;

use crate::worker::control;
use crate::worker::fusedev::{self, MountOptions};
use anyhow::{Context as _, Result, bail};
use handover::{HANDOVER_VERSION, Handover, SessionRecord};
use records::VolumeRecord;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a worker may take to serve after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the supervisor looks at its workers.
const SUPERVISE_EVERY: Duration = Duration::from_millis(5);

/// One volume the keeper mounted.
#[derive(Debug)]
struct Volume {
    mountpoint: PathBuf,
    /// The connection's original descriptor: held, never read.
    master: OwnedFd,
    /// The worker's own arguments (backend, caching); the keeper adds the rest.
    args: Vec<String>,
    binary: PathBuf,
    worker: Option<Child>,
    /// Counts workers started, naming each one's state directory.
    generation: u32,
    restarts: u32,
    /// Milliseconds from seeing a worker dead to its replacement serving.
    last_failover_ms: Option<f64>,
    /// What INIT negotiated, once a worker recorded it.
    session: Option<SessionRecord>,
}

/// The keeper's state.
#[derive(Debug)]
pub struct Keeper {
    state_dir: PathBuf,
    worker_binary: PathBuf,
    volumes: Mutex<HashMap<String, Volume>>,
    /// What this keeper found of a previous one at start (see [`Keeper::recover`]).
    recovered: Mutex<Vec<Value>>,
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
            volumes: Mutex::new(HashMap::new()),
            recovered: Mutex::new(Vec::new()),
        }))
    }

    /// The socket workers and launchers talk to.
    pub fn socket(state_dir: &Path) -> PathBuf {
        state_dir.join("keeper.sock")
    }

    fn volumes(&self) -> MutexGuard<'_, HashMap<String, Volume>> {
        lock(&self.volumes)
    }

    /// Serves requests and supervises workers until the process ends.
    pub fn run(self: &Arc<Self>) -> Result<()> {
        // Bound before recovering: binding fails while another keeper answers, and only a
        // keeper that owns the state directory may clean up what it finds there.
        let listener =
            control::bind(&Self::socket(&self.state_dir)).context("bind the keeper socket")?;
        self.recover()?;
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

    fn answer(&self, conn: &UnixStream) -> Result<()> {
        let (line, _) = fdpass::recv(conn)?;
        let req: Value = serde_json::from_str(&line).context("request is not JSON")?;
        let volume = req["volume"].as_str().unwrap_or_default().to_string();
        let mut fd = None;
        let reply = match req["op"].as_str() {
            Some("handover") => self.handover(&volume).map(|(h, f)| {
                fd = Some(f);
                h
            }),
            Some("mount") => self.mount(&volume, &req),
            Some("serve") => self.serve(&volume, &req),
            Some("upgrade") => self.upgrade(&volume, &req),
            Some("unmount") => self.unmount(&volume),
            Some("list") => Ok(self.list()),
            other => Err(anyhow::anyhow!("unknown op {other:?}")),
        };
        let answer = match reply {
            Ok(v) => v,
            Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
        };
        fdpass::send(
            conn,
            &answer.to_string(),
            fd.as_ref().map(AsRawFd::as_raw_fd),
        )?;
        Ok(())
    }

    /// Mounts `volume` at `req.mountpoint` (idempotent for the same mountpoint).
    fn mount(&self, volume: &str, req: &Value) -> Result<Value> {
        check_name(volume)?;
        let mountpoint = PathBuf::from(req["mountpoint"].as_str().context("mountpoint")?);
        let mut vols = self.volumes();
        if let Some(v) = vols.get(volume) {
            if v.mountpoint == mountpoint {
                return Ok(json!({"ok": true, "mounted": "already"}));
            }
            bail!("volume {volume} is mounted at {}", v.mountpoint.display());
        }
        let opts = MountOptions {
            fsname: req["fsname"].as_str().unwrap_or("dpufs").to_string(),
            read_only: req["read_only"].as_bool().unwrap_or(false),
            allow_other: req["allow_other"].as_bool().unwrap_or(true),
        };
        let master = fusedev::mount(&mountpoint, &opts)
            .with_context(|| format!("mount FUSE on {}", mountpoint.display()))?;
        let v = Volume {
            mountpoint,
            master,
            args: Vec::new(),
            binary: self.worker_binary.clone(),
            worker: None,
            generation: 0,
            restarts: 0,
            last_failover_ms: None,
            session: None,
        };
        let saved = self.save_record(volume, &v);
        vols.insert(volume.to_string(), v);
        saved?;
        Ok(json!({"ok": true, "mounted": "now"}))
    }

    /// The handover for a worker taking `volume`, and a duplicate of its descriptor (made
    /// under the lock, sent after it).
    fn handover(&self, volume: &str) -> Result<(Value, OwnedFd)> {
        let vols = self.volumes();
        let v = vols
            .get(volume)
            .with_context(|| format!("no volume {volume}"))?;
        let h = Handover {
            version: HANDOVER_VERSION,
            volume: volume.to_string(),
            mountpoint: v.mountpoint.clone(),
            session: v.session.clone(),
        };
        let fd = v.master.try_clone().context("duplicate the descriptor")?;
        Ok((serde_json::to_value(&h)?, fd))
    }

    /// Starts the volume's worker with `req.args` (and `req.binary`, if given).
    fn serve(&self, volume: &str, req: &Value) -> Result<Value> {
        {
            let mut vols = self.volumes();
            let v = vols
                .get_mut(volume)
                .with_context(|| format!("no volume {volume}"))?;
            if v.worker.is_some() {
                bail!("volume {volume} already has a worker");
            }
            v.args = string_list(&req["args"])?;
            if let Some(b) = req["binary"].as_str() {
                v.binary = PathBuf::from(b);
            }
        }
        let pid = self.start_worker(volume)?;
        Ok(json!({"ok": true, "pid": pid}))
    }

    /// Replaces the volume's worker by one of `req.binary` (default: the same) with no
    /// request failing: the new one serves before the old one drains.
    fn upgrade(&self, volume: &str, req: &Value) -> Result<Value> {
        // Until it has drained, the old worker is ours to reap, not the supervisor's.
        let (mut old, old_dir) = {
            let mut vols = self.volumes();
            let v = vols
                .get_mut(volume)
                .with_context(|| format!("no volume {volume}"))?;
            if let Some(b) = req["binary"].as_str() {
                v.binary = PathBuf::from(b);
            }
            let old = v
                .worker
                .take()
                .with_context(|| format!("volume {volume} has no worker"))?;
            (old, self.worker_dir(volume, v.generation))
        };
        let started = self.start_worker(volume);
        let drained = drain(&mut old, &old_dir);
        let pid = started?;
        drained?;
        Ok(json!({"ok": true, "pid": pid, "previous": old.id()}))
    }

    fn unmount(&self, volume: &str) -> Result<Value> {
        let v = self.volumes().remove(volume);
        let Some(mut v) = v else {
            return Ok(json!({"ok": true, "mounted": false}));
        };
        if let Some(mut w) = v.worker.take() {
            drain(&mut w, &self.worker_dir(volume, v.generation))?;
        }
        if fusedev::unmount(&v.mountpoint, false).is_err() {
            fusedev::unmount(&v.mountpoint, true)
                .with_context(|| format!("unmount {}", v.mountpoint.display()))?;
        }
        let _ = std::fs::remove_dir_all(self.volume_dir(volume));
        Ok(json!({"ok": true, "mounted": false}))
    }

    fn list(&self) -> Value {
        let mut vols = self.volumes();
        let list: Vec<Value> = vols
            .iter_mut()
            .map(|(name, v)| {
                json!({
                    "volume": name,
                    "mountpoint": v.mountpoint,
                    "pid": v.worker.as_ref().map(Child::id),
                    "generation": v.generation,
                    "restarts": v.restarts,
                    "last_failover_ms": v.last_failover_ms,
                    "initialized": v.session.is_some(),
                })
            })
            .collect();
        json!({
            "ok": true,
            "pid": std::process::id(),
            "volumes": list,
            "recovered": *lock(&self.recovered),
        })
    }

    /// Persists what a later keeper needs to know of `volume`.
    fn save_record(&self, volume: &str, v: &Volume) -> Result<()> {
        VolumeRecord {
            volume: volume.to_string(),
            mountpoint: v.mountpoint.clone(),
            args: v.args.clone(),
            binary: v.binary.clone(),
            worker_pid: v.worker.as_ref().map(Child::id),
            pid_namespace: records::pid_namespace(),
            generation: v.generation,
        }
        .save(&self.volume_dir(volume))
    }

    /// Cleans up after a keeper that ended (crash, kill, its container gone) before this one
    /// started: a mount whose worker is gone too is dead (nobody holds its connection), so it
    /// is detached and its state removed; one whose worker still runs is left serving and
    /// reported. Directories without a record are stale and removed.
    fn recover(&self) -> Result<()> {
        let mut notes = Vec::new();
        for (dir, record) in VolumeRecord::load_all(&self.state_dir.join("volumes"))? {
            let Some(rec) = record else {
                let _ = std::fs::remove_dir_all(&dir);
                notes.push(json!({"state": dir, "action": "removed stale state"}));
                continue;
            };
            if let Some(pid) = rec.worker_pid_here().filter(|&p| is_worker_alive(p)) {
                tracing::warn!(
                    "worker {pid} of a previous keeper still serves {} at {}: left as it is",
                    rec.volume,
                    rec.mountpoint.display()
                );
                notes.push(json!({"volume": rec.volume, "action": "left serving", "pid": pid}));
                continue;
            }
            let mounted =
                fusedev::find_mount(&rec.mountpoint)?.is_some_and(|m| m.fstype.starts_with("fuse"));
            if mounted {
                fusedev::unmount(&rec.mountpoint, true)
                    .with_context(|| format!("detach {}", rec.mountpoint.display()))?;
            }
            std::fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
            let action = if mounted {
                "detached the dead mount"
            } else {
                "removed stale state"
            };
            tracing::info!("{}: {action} at {}", rec.volume, rec.mountpoint.display());
            notes.push(
                json!({"volume": rec.volume, "mountpoint": rec.mountpoint, "action": action}),
            );
        }
        *lock(&self.recovered) = notes;
        Ok(())
    }

    fn volume_dir(&self, volume: &str) -> PathBuf {
        self.state_dir.join("volumes").join(volume)
    }

    fn worker_dir(&self, volume: &str, generation: u32) -> PathBuf {
        self.volume_dir(volume).join(format!("worker-{generation}"))
    }

    /// Starts the next worker of `volume` and waits until it serves.
    fn start_worker(&self, volume: &str) -> Result<u32> {
        let (mut cmd, dir) = {
            let mut vols = self.volumes();
            let v = vols
                .get_mut(volume)
                .with_context(|| format!("no volume {volume}"))?;
            // The previous worker's record of INIT is the connection's.
            if v.session.is_none() {
                v.session = read_session(&self.worker_dir(volume, v.generation));
            }
            v.generation += 1;
            let dir = self.worker_dir(volume, v.generation);
            let mut cmd = Command::new(&v.binary);
            cmd.arg("worker")
                .args(&v.args)
                .arg("--keeper")
                .arg(Self::socket(&self.state_dir))
                .arg("--volume")
                .arg(volume)
                .arg("--state-dir")
                .arg(&dir)
                .stdin(Stdio::null());
            (cmd, dir)
        };
        let mut child = cmd.spawn().context("start the worker")?;
        let pid = child.id();
        if let Err(e) = wait_serving(&mut child, &dir) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        let mut vols = self.volumes();
        let v = vols
            .get_mut(volume)
            .with_context(|| format!("no volume {volume}"))?;
        v.worker = Some(child);
        if v.session.is_none() {
            v.session = read_session(&dir);
        }
        self.save_record(volume, v)?;
        Ok(pid)
    }

    /// Replaces workers that died (a crash, kill -9): the mount never notices more than the
    /// requests the dead worker had in flight.
    fn supervise(&self) {
        loop {
            std::thread::sleep(SUPERVISE_EVERY);
            let dead: Vec<(String, std::process::ExitStatus)> = {
                let mut vols = self.volumes();
                vols.iter_mut()
                    .filter_map(|(name, v)| {
                        let status = v.worker.as_mut()?.try_wait().ok().flatten()?;
                        v.worker = None;
                        Some((name.clone(), status))
                    })
                    .collect()
            };
            for (volume, status) in dead {
                let seen = Instant::now();
                tracing::warn!("worker of {volume} ended ({status}): starting another");
                match self.start_worker(&volume) {
                    Ok(pid) => {
                        let ms = seen.elapsed().as_secs_f64() * 1e3;
                        tracing::info!("worker {pid} serves {volume} after {ms:.1} ms");
                        if let Some(v) = self.volumes().get_mut(&volume) {
                            v.restarts += 1;
                            v.last_failover_ms = Some(ms);
                        }
                    }
                    Err(e) => tracing::error!("no worker for {volume}: {e:#}"),
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `pid` is a running volume worker (not a zombie, not a reused pid).
fn is_worker_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    state.is_some_and(|s| s != 'Z' && s != 'X')
        && cmdline.split(|b| *b == 0).any(|arg| arg == b"worker")
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

fn string_list(v: &Value) -> Result<Vec<String>> {
    v.as_array()
        .context("args: a list of strings")?
        .iter()
        .map(|a| {
            a.as_str()
                .map(str::to_string)
                .context("args: a list of strings")
        })
        .collect()
}

fn read_session(dir: &Path) -> Option<SessionRecord> {
    let text = std::fs::read_to_string(dir.join("session.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Waits until the worker whose state is in `dir` answers `health` with "serving".
fn wait_serving(child: &mut Child, dir: &Path) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let socket = dir.join("control.sock");
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("the worker exited ({status}) before serving");
        }
        if control::request(&socket, &json!({"op": "health"}))
            .is_ok_and(|h| h["state"] == "serving")
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the worker did not serve within {} s",
                READY_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Stops a worker serving a handed descriptor: it finishes the requests it holds and exits,
/// leaving the connection to the others.
fn drain(child: &mut Child, dir: &Path) -> Result<()> {
    let _ = control::request(&dir.join("control.sock"), &json!({"op": "stop"}));
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            let _ = std::fs::remove_dir_all(dir);
            if !status.success() {
                tracing::warn!("drained worker ended with {status}");
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            bail!(
                "the worker did not drain within {} s",
                READY_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One request to the keeper at `socket`; the descriptor of a handover comes with it.
pub fn request(socket: &Path, req: &Value) -> Result<(Value, Option<OwnedFd>)> {
    let conn = UnixStream::connect(socket)
        .with_context(|| format!("connect to the keeper at {}", socket.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    fdpass::send(&conn, &req.to_string(), None)?;
    let (line, fd) = fdpass::recv(&conn)?;
    let v: Value = serde_json::from_str(&line).context("keeper reply is not JSON")?;
    if v["ok"] == false {
        bail!("keeper: {}", v["error"].as_str().unwrap_or("refused"));
    }
    Ok((v, fd))
}

/// A worker's side of a handover: the descriptor of `volume` and what to know about it.
pub fn take_over(socket: &Path, volume: &str) -> Result<(Handover, OwnedFd)> {
    let (v, fd) = request(socket, &json!({"op": "handover", "volume": volume}))?;
    let h = Handover::decode(&v.to_string())?;
    let fd = fd.context("the keeper sent no descriptor")?;
    if !fusedev::is_fuse_device(std::os::fd::AsFd::as_fd(&fd))? {
        bail!("the keeper sent a descriptor that is not /dev/fuse");
    }
    Ok((h, fd))
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
