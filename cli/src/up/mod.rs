//! `dpufs up`: the local stack in one command, with `dpufs down` and `dpufs status`.
//!
//! The stack: the embedded engine serving the management API and DFS over the software
//! fabric, a `default` pool, and the CSI driver — `dpufs-csi controller` and `dpufs-csi node`
//! on unix sockets in the state directory. `up` is their first client, as the CSI sidecars
//! and kubelet are in a cluster: CreateVolume makes the default volume (a POSIX container in
//! the pool), NodeStageVolume has the node's mount keeper mount it with a volume worker over
//! the fabric (capabilities signed and renewed by the node plugin as the node agent), and
//! NodePublishVolume binds it to `./mnt`. State lives in one directory (`./.dpufs`, see
//! [`state`]) so `dpufs down` can stop what a killed `up` left and other `dpufs` commands find
//! the engine.

mod children;
mod csi;
mod directory;
mod down;
mod node;
mod provision;
mod state;
mod status;
mod summary;

use anyhow::{Context, bail};
use children::{EngineLaunch, EngineProcess, LogPart, sibling_binary};
use clap::Args;
use csi::{PluginProcess, Published, Service};
use provision::{DEFAULT_LABEL, Stack};
use state::{
    CSI, ENDPOINT, ENGINE, ENGINE_PID, FABRIC_DIR, KEEPER_PID, MOUNT, NODE_PID, StateDir, detach,
    mounted_fstype,
};
use std::future::Future;
use std::path::{Path, PathBuf};
use tokio::signal::unix::{SignalKind, signal};

pub use down::{DownArgs, down};
pub use status::{StatusArgs, status};

/// The stack's directory when none is given.
const DEFAULT_DIR: &str = ".dpufs";

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where the stack keeps its state: engine data, logs, pids, endpoint, keys, sockets.
    #[arg(long, default_value = DEFAULT_DIR)]
    data_dir: PathBuf,
    /// Where the default volume is mounted (its CSI target path).
    #[arg(long, default_value = "mnt")]
    mountpoint: PathBuf,
    /// Run without the FUSE mount (engine, pool, CSI driver and volume only).
    #[arg(long)]
    no_mount: bool,
    /// Storage each engine rank offers, e.g. 64G [default: the engine's].
    #[arg(long, value_parser = crate::size::parse_size)]
    capacity: Option<u64>,
    /// Number of simulated engine ranks [default: the engine's].
    #[arg(long)]
    ranks: Option<u32>,
    /// Size of the default pool when it is created, e.g. 16G [default: 1G]. The default
    /// volume's capacity (its quota) is the pool's size.
    #[arg(long, value_parser = crate::size::parse_size)]
    pool_size: Option<u64>,
    /// The engine's software fabric device. By default the worker's (`dpufs-node`): one
    /// machine has one NIC, so payloads move by one copy between the two processes' buffers.
    /// Another name puts the engine on a device of its own, as on another node: payloads
    /// then cross TCP, as they would cross the network.
    #[arg(long, default_value = "dpufs-node")]
    engine_device: String,
    /// The node plugin's `--mount-root`: staging and target paths CSI clients send must be
    /// under it. `/` lets any client of the stack's node socket (a conformance suite with
    /// its own directories) mount anywhere but `/` itself.
    #[arg(long, default_value = "/")]
    csi_mount_root: PathBuf,
}

/// The endpoint a running `dpufs up` recorded in the default directory here.
pub fn recorded_endpoint() -> Option<String> {
    StateDir::new(Path::new(DEFAULT_DIR)).recorded(ENDPOINT)
}

/// Runs the stack until Ctrl-C or SIGTERM, then stops it.
pub async fn up(args: UpArgs, system: &str) -> anyhow::Result<()> {
    // Installed first: the children run in their own process groups (so the terminal's
    // Ctrl-C reaches only us and we stop things in order), which also means a `dpufs up`
    // killed by a default signal handler would orphan them.
    let mut stop = StopSignals::install()?;
    // Absolute: the plugins get these paths, and CSI paths must be absolute.
    let state = StateDir::new(&std::env::current_dir()?.join(&args.data_dir));
    refuse_a_running_stack(&state)?;
    std::fs::create_dir_all(&state.dir)
        .with_context(|| format!("creating {}", state.dir.display()))?;
    let mut running = Running::default();
    let outcome = bring_up(&args, system, &state, &mut running, &mut stop).await;
    let stopped = running.stop(&state).await;
    outcome?;
    stopped?;
    println!("stopped");
    Ok(())
}

fn refuse_a_running_stack(state: &StateDir) -> anyhow::Result<()> {
    for (file, program) in [(ENGINE_PID, ENGINE), (NODE_PID, CSI), (KEEPER_PID, CSI)] {
        if let Some(pid) = state.running(file, program) {
            bail!(
                "a {program} from an earlier `dpufs up` is still running (pid {pid}, state in {}): \
                 stop it with `dpufs down`",
                state.dir.display()
            );
        }
    }
    Ok(())
}

/// What runs, for an orderly stop whatever step we reached.
#[derive(Debug, Default)]
struct Running {
    engine: Option<EngineProcess>,
    controller: Option<PluginProcess>,
    node: Option<PluginProcess>,
    /// The keeper the node plugin started or adopted.
    keeper_pid: Option<u32>,
    published: Option<Published>,
    mountpoint: Option<PathBuf>,
    fabric_dir: Option<PathBuf>,
}

impl Running {
    /// As a cluster would: unpublish and unstage through the node plugin (the keeper drains
    /// the worker and unmounts), then the plugins, the keeper, the engine; then the records.
    async fn stop(&mut self, state: &StateDir) -> anyhow::Result<()> {
        let mut result = Ok(());
        if let (Some(node), Some(published)) = (&self.node, &self.published) {
            result = csi::unpublish_and_unstage(&node.socket, published).await;
        }
        for plugin in [&mut self.node, &mut self.controller].into_iter().flatten() {
            result = result.and(plugin.stop().await);
        }
        if let Some(pid) = self.keeper_pid {
            result = result.and(down::stop_keeper(state, pid).await);
        }
        if let Some(mp) = &self.mountpoint
            && mounted_fstype(mp).is_some()
        {
            // Something failed on the way: detach what is left.
            let _ = detach(mp);
        }
        if let Some(engine) = &mut self.engine {
            result = result.and(engine.stop().await);
        }
        if let Some(dir) = &self.fabric_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        state.forget();
        result
    }
}

/// `fut`, or None when a stop signal comes first.
async fn or_stop<T>(stop: &mut StopSignals, fut: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        v = fut => Some(v),
        _ = stop.recv() => None,
    }
}

/// Starts each part in turn (returning early, with what runs in `running`, on an error or a
/// stop signal), then serves until stopped.
async fn bring_up(
    args: &UpArgs,
    system: &str,
    state: &StateDir,
    running: &mut Running,
    stop: &mut StopSignals,
) -> anyhow::Result<()> {
    let mountpoint = match can_mount(args) {
        Ok(()) => Some(prepare_mountpoint(&args.mountpoint)?),
        Err(why) => {
            println!("… no FUSE mount: {why}");
            None
        }
    };
    let agent_public_key = node::agent_public_key(state)?;
    let fabric_dir = fabric_dir(state)?;
    running.fabric_dir = Some(fabric_dir.clone());
    let Some(binary) = or_stop(stop, sibling_binary(ENGINE, "dpufs-engine")).await else {
        return Ok(());
    };
    let launch = EngineLaunch {
        binary: &binary?,
        system,
        capacity: args.capacity,
        ranks: args.ranks,
        agent_key: &agent_public_key,
        fabric_dir: &fabric_dir,
        fabric_device: &args.engine_device,
    };
    let Some(engine) = or_stop(stop, EngineProcess::start(state, &launch)).await else {
        return Ok(());
    };
    let engine = running.engine.insert(engine?);
    let addr = engine.addr.clone();
    let fabric_addr = engine.fabric_addr;
    let Some(stack) = or_stop(stop, provision::provision(&addr, system, args.pool_size)).await
    else {
        return Ok(());
    };
    let stack = stack?;
    let layout = directory::Layout {
        system,
        endpoint: &addr,
        data_endpoint: fabric_addr,
        pool: &stack.pool,
    };
    let directory = directory::write(state, &layout)?;
    let Some(started) = or_stop(
        stop,
        start_plugins(args, state, running, &directory, &fabric_dir),
    )
    .await
    else {
        return Ok(());
    };
    started?;
    let Some(volume) = or_stop(stop, provide_volume(state, running, &stack, mountpoint)).await
    else {
        return Ok(());
    };
    volume?;
    serve(state, running, &stack, stop).await
}

/// Why no mount can be made here, if so.
fn can_mount(args: &UpArgs) -> Result<(), String> {
    if args.no_mount {
        return Err("--no-mount".into());
    }
    if !rustix::process::geteuid().is_root() {
        return Err("mounting needs root (run `dpufs up` as root, or pass --no-mount)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing (modprobe fuse)".into());
    }
    Ok(())
}

/// The absolute mountpoint, made if missing; refused when something is mounted there.
fn prepare_mountpoint(path: &Path) -> anyhow::Result<PathBuf> {
    let abs = std::env::current_dir()?.join(path);
    if let Some(fstype) = mounted_fstype(&abs) {
        bail!(
            "{} is already a mount point ({fstype}); if it is left from an earlier `dpufs up`, \
             `dpufs down` removes it",
            abs.display()
        );
    }
    std::fs::create_dir_all(&abs).with_context(|| format!("creating {}", abs.display()))?;
    Ok(abs)
}

/// The software fabric's device directory: in shared memory, one per state directory.
fn fabric_dir(state: &StateDir) -> anyhow::Result<PathBuf> {
    let tag = state
        .dir
        .to_string_lossy()
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        });
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.join(format!("dpufs-up-{tag:016x}"))
    } else {
        state.path("fabric")
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    state.record(FABRIC_DIR, &dir.to_string_lossy())?;
    Ok(dir)
}

/// Starts the CSI controller and node plugins; the node plugin starts the mount keeper.
async fn start_plugins(
    args: &UpArgs,
    state: &StateDir,
    running: &mut Running,
    directory: &Path,
    fabric_dir: &Path,
) -> anyhow::Result<()> {
    let binary = sibling_binary(CSI, "dpufs-csi").await?;
    let directory = directory.display().to_string();
    let controller = running.controller.insert(
        PluginProcess::start(
            state,
            &binary,
            Service::Controller,
            &["--directory".into(), directory.clone()],
        )
        .await?,
    );
    println!(
        "✓ CSI controller (pid {}) on {}",
        controller.pid,
        controller.socket.display()
    );
    let node_args = [
        ("--directory", directory),
        ("--node-id", node_id()),
        ("--state-dir", state.keeper().display().to_string()),
        ("--agent-key", node::agent_key(state).display().to_string()),
        // The keeper is the node plugin's child, in the plugin's process group: `up` stops
        // it last, and a plugin killed alone leaves it serving.
        ("--keeper-start", "child".into()),
        ("--mount-root", args.csi_mount_root.display().to_string()),
        ("--fabric-dir", fabric_dir.display().to_string()),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_string(), value])
    .collect::<Vec<_>>();
    let node = running
        .node
        .insert(PluginProcess::start(state, &binary, Service::Node, &node_args).await?);
    println!(
        "✓ CSI node plugin (pid {}) on {}",
        node.pid,
        node.socket.display()
    );
    let keeper = node::keeper_pid(&node::keeper_socket(state)).await?;
    running.keeper_pid = Some(keeper);
    state.record(KEEPER_PID, &keeper.to_string())?;
    println!("✓ mount keeper (pid {keeper})");
    Ok(())
}

/// This machine's name: the node id (a Kubernetes node name in a cluster).
fn node_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// CreateVolume, then (with a mountpoint) NodeStageVolume and NodePublishVolume.
async fn provide_volume(
    state: &StateDir,
    running: &mut Running,
    stack: &Stack,
    mountpoint: Option<PathBuf>,
) -> anyhow::Result<()> {
    let controller = running.controller.as_ref().context("controller")?;
    let volume = csi::create_volume(&controller.socket, stack.bytes).await?;
    println!(
        "✓ volume {} (CreateVolume {}: a POSIX container in pool {DEFAULT_LABEL})",
        volume.volume_id,
        csi::VOLUME_NAME
    );
    let Some(target) = mountpoint else {
        return Ok(());
    };
    let node = running.node.as_ref().context("node plugin")?;
    let staging = state.staging();
    running.mountpoint = Some(target.clone());
    let published = csi::stage_and_publish(&node.socket, &volume, &staging, &target).await?;
    println!(
        "✓ staged at {} (a volume worker over the fabric) and published at {}",
        staging.display(),
        target.display()
    );
    running.published = Some(published);
    Ok(())
}

/// Records the endpoint, says what runs where, and waits for a stop signal or the end of a
/// child.
async fn serve(
    state: &StateDir,
    running: &mut Running,
    stack: &Stack,
    stop: &mut StopSignals,
) -> anyhow::Result<()> {
    let engine = running.engine.as_ref().context("engine")?;
    state.record(ENDPOINT, &engine.addr)?;
    if let Some(p) = &running.published {
        state.record(MOUNT, &p.target.to_string_lossy())?;
    }
    summary::print(state, running, stack);
    let (Some(engine), Some(controller), Some(node)) = (
        running.engine.as_mut(),
        running.controller.as_mut(),
        running.node.as_mut(),
    ) else {
        bail!("the stack is incomplete");
    };
    tokio::select! {
        _ = stop.recv() => Ok(()),
        // A clean exit is someone's stop (`dpufs down`, the control socket's stop).
        status = engine.child.wait() => {
            let status = status?;
            if status.success() {
                println!("{ENGINE} stopped");
                return Ok(());
            }
            bail!("{ENGINE} exited ({status}):\n{}", engine.log.excerpt(LogPart::End))
        }
        status = controller.ended() => plugin_ended(controller, status),
        status = node.ended() => plugin_ended(node, status),
    }
}

fn plugin_ended(
    plugin: &PluginProcess,
    status: std::io::Result<std::process::ExitStatus>,
) -> anyhow::Result<()> {
    bail!(
        "the CSI {:?} plugin exited ({}):\n{}",
        plugin.service,
        status?,
        plugin.log.excerpt(LogPart::End)
    )
}

/// Ctrl-C and SIGTERM.
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> anyhow::Result<StopSignals> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
