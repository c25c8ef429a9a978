//! The launcher: what the node plugin does at start (docs/architecture.md, "Worker lifetime";
//! docs/keeper.md, "Outliving the node plugin"). It finds the node's mount keeper — adopting
//! the one that already runs, with every volume and worker it serves — or starts one that
//! outlives the launcher, and makes sure its volumes are mounted and served. It never unmounts
//! on exit: the volumes belong to the node's pods, not to the plugin's process.

use crate::ipc::keeper as client;
use crate::keeper::{Keeper, placement};
use anyhow::{Context as _, Result, bail};
use dpufs_node_api::keeper::{Reply, Request};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started keeper may take to answer.
const KEEPER_READY: Duration = Duration::from_secs(10);

/// How to start a keeper when none answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeeperStart {
    /// systemd when the node runs it, else `detach` when this process shares the host's PID
    /// namespace; otherwise refuse (a keeper started from here would die with it).
    Auto,
    /// `systemd-run --unit dpufs-keeper`: systemd starts it, in its own unit and cgroup.
    Systemd,
    /// Double fork into a new session and the keeper's own cgroup in every hierarchy.
    Detach,
    /// A plain child of the launcher: it dies with the launcher's namespace or cgroup (for
    /// development, and to show what the escape is for).
    Child,
    /// Only adopt a running keeper.
    Never,
}

/// How the launcher came by its keeper.
#[derive(Debug)]
pub enum KeeperFound {
    /// One already answered.
    Adopted { pid: u32 },
    /// This launcher started it.
    Started {
        pid: u32,
        how: KeeperStart,
        /// Set for [`KeeperStart::Child`]: the launcher's own child.
        child: Option<Child>,
    },
}

/// The node's keeper at `state_dir`, adopted or started as `how` says.
pub fn ensure_keeper(state_dir: &Path, binary: &Path, how: KeeperStart) -> Result<KeeperFound> {
    let socket = Keeper::socket(state_dir);
    if let Ok(list) = client::list(&socket) {
        return Ok(KeeperFound::Adopted { pid: list.pid });
    }
    let how = resolve(how)?;
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("create {}", state_dir.display()))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state_dir.join("keeper.log"))
        .context("open keeper.log")?;
    let mut cmd = match how {
        KeeperStart::Systemd => {
            let mut c = Command::new("systemd-run");
            c.args(["--unit", "dpufs-keeper", "--collect", "--quiet"])
                .arg(binary);
            c
        }
        _ => Command::new(binary),
    };
    cmd.arg("keeper")
        .arg("--state-dir")
        .arg(state_dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if how == KeeperStart::Detach {
        cmd.args(["--cgroup", placement::KEEPER_CGROUP]);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe { cmd.pre_exec(detach) };
    }
    let mut child = cmd.spawn().context("start the keeper")?;
    let child = match how {
        // The intermediate process (Detach) or systemd-run has exited or will: reap it.
        KeeperStart::Detach | KeeperStart::Systemd => {
            let status = child.wait()?;
            if !status.success() {
                bail!("starting the keeper failed ({status}): see keeper.log");
            }
            None
        }
        _ => Some(child),
    };
    let pid = wait_ready(&socket)?;
    Ok(KeeperFound::Started { pid, how, child })
}

/// The concrete way `how` means here.
fn resolve(how: KeeperStart) -> Result<KeeperStart> {
    let nested = placement::in_nested_pid_namespace()?;
    match how {
        KeeperStart::Never => bail!(
            "no keeper answers in this state directory, and --keeper-start never forbids \
             starting one"
        ),
        KeeperStart::Auto if has_systemd() => Ok(KeeperStart::Systemd),
        KeeperStart::Auto | KeeperStart::Detach if nested => bail!(
            "this process runs in a PID namespace of its own (a pod without hostPID): a keeper \
             started from here would be killed with it, and its mounts with it. Run the node \
             plugin with hostPID: true, start the keeper as a node service, or pass \
             --keeper-start child to accept that"
        ),
        KeeperStart::Auto => Ok(KeeperStart::Detach),
        other => Ok(other),
    }
}

fn has_systemd() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// The second half of a double fork, run in the forked child before exec: a new session
/// (no controlling terminal, no process group of the launcher's), then a grandchild that
/// goes on to exec while the child exits, so the keeper is nobody's child.
fn detach() -> std::io::Result<()> {
    // SAFETY: setsid and fork are async-signal-safe; the parent side only calls _exit.
    unsafe {
        if libc::setsid() < 0 {
            return Err(std::io::Error::last_os_error());
        }
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error()),
            0 => Ok(()),
            _ => libc::_exit(0),
        }
    }
}

fn wait_ready(socket: &Path) -> Result<u32> {
    let deadline = Instant::now() + KEEPER_READY;
    loop {
        match client::list(socket) {
            Ok(list) => return Ok(list.pid),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!(
                    "the keeper did not answer within {} s (see keeper.log)",
                    KEEPER_READY.as_secs()
                )));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// How a wanted volume is attached: a FUSE mount, or a vhost-user-fs export (the keeper binds
/// the socket; the frontend, a VMM or DOCA SNAP, connects to it).
pub use dpufs_node_api::transport::Attachment;

/// A volume the launcher wants served.
#[derive(Debug, Clone)]
pub struct WantedVolume {
    pub name: String,
    pub attachment: Attachment,
    /// The worker's arguments (backend, caching); the keeper adds the rest.
    pub worker_args: Vec<String>,
}

/// What became of a wanted volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeState {
    /// The keeper already served it: the launcher adopted its worker.
    Adopted { pid: u32, generation: u64 },
    /// Mounted (if needed) and given a worker now.
    Started { pid: u32 },
}

/// Makes sure the keeper at `state_dir` serves `want`: attached as it asks (mounted or
/// exported, unless it is already) and given a worker (unless one serves it).
pub fn ensure_volume(state_dir: &Path, want: &WantedVolume) -> Result<VolumeState> {
    let socket = Keeper::socket(state_dir);
    let list = client::list(&socket)?;
    let current = list.volumes.iter().find(|v| v.volume == want.name);
    if let Some(v) = current {
        if v.attachment != want.attachment {
            bail!(
                "volume {} is {}, not {}",
                want.name,
                v.attachment,
                want.attachment
            );
        }
        if let Some(pid) = v.pid {
            return Ok(VolumeState::Adopted {
                pid,
                generation: u64::from(v.generation),
            });
        }
    } else {
        client::request(&socket, &attach_request(want))?;
    }
    let serve = Request::Serve {
        volume: want.name.clone(),
        args: want.worker_args.clone(),
        binary: None,
    };
    match client::request(&socket, &serve)?.0 {
        Reply::Served { pid } => Ok(VolumeState::Started { pid }),
        other => bail!("serve answered {other:?}"),
    }
}

/// The request that attaches `want` on the keeper.
fn attach_request(want: &WantedVolume) -> Request {
    match &want.attachment {
        Attachment::Mount(mountpoint) => Request::Mount {
            volume: want.name.clone(),
            mountpoint: mountpoint.clone(),
            fsname: None,
            read_only: None,
            allow_other: None,
        },
        Attachment::VhostUser { socket } => Request::Export {
            volume: want.name.clone(),
            socket: socket.clone(),
        },
    }
}
