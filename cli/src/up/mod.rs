//! `dpufs up`: the local stack in one command, with `dpufs down` and `dpufs status`.
//!
//! The stack: the embedded engine serving the management API and DFS over the software
//! fabric, a `default` pool and POSIX container, and a volume worker mounting the container
//! at `./mnt` through its own tenant session, with capabilities `up` signs as the node agent.
//! State lives in one directory (`./.dpufs`, see [`state`]) so `dpufs down` can stop what a
//! killed `up` left and other `dpufs` commands find the engine.

mod children;
mod provision;
mod state;
mod status;
mod volume;

use anyhow::{Context, bail};
use children::{EngineLaunch, EngineProcess, sibling_binary};
use clap::Args;
use provision::{DEFAULT_LABEL, Stack};
use state::{
    ENDPOINT, ENGINE, ENGINE_PID, FABRIC_DIR, KEEPER, KEEPER_PID, MOUNT, StateDir, detach,
    mounted_fstype, runs, terminate,
};
use std::future::Future;
use std::path::{Path, PathBuf};
use tokio::signal::unix::{SignalKind, signal};
use volume::{Agent, KeeperProcess, WorkerLaunch, recorded_workers};

pub use status::{StatusArgs, status};

/// The stack's directory when none is given.
const DEFAULT_DIR: &str = ".dpufs";

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where the stack keeps its state: engine data, logs, pids, endpoint, keys.
    #[arg(long, default_value = DEFAULT_DIR)]
    data_dir: PathBuf,
    /// Where the default container is mounted.
    #[arg(long, default_value = "mnt")]
    mountpoint: PathBuf,
    /// Run without the FUSE mount (engine, pool and container only).
    #[arg(long)]
    no_mount: bool,
    /// Storage each engine rank offers, e.g. 64G [default: the engine's].
    #[arg(long, value_parser = crate::size::parse_size)]
    capacity: Option<u64>,
    /// Number of simulated engine ranks [default: the engine's].
    #[arg(long)]
    ranks: Option<u32>,
    /// Size of the default pool when it is created, e.g. 16G [default: 1G].
    #[arg(long, value_parser = crate::size::parse_size)]
    pool_size: Option<u64>,
    /// The engine's software fabric device. By default the worker's (`dpufs-node`): one
    /// machine has one NIC, so payloads move by one copy between the two processes' buffers.
    /// Another name puts the engine on a device of its own, as on another node: payloads
    /// then cross TCP, as they would cross the network.
    #[arg(long, default_value = "dpufs-node")]
    engine_device: String,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    /// The directory `dpufs up` used.
    #[arg(long, default_value = DEFAULT_DIR)]
    data_dir: PathBuf,
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
    let state = StateDir::new(&args.data_dir);
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
    for (file, program) in [(ENGINE_PID, ENGINE), (KEEPER_PID, KEEPER)] {
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
    keeper: Option<KeeperProcess>,
    worker_pid: Option<u32>,
    mountpoint: Option<PathBuf>,
    fabric_dir: Option<PathBuf>,
}

impl Running {
    /// The keeper first (it drains the worker and unmounts), then the engine; then the
    /// records.
    async fn stop(&mut self, state: &StateDir) -> anyhow::Result<()> {
        let mut result = Ok(());
        if let Some(keeper) = &mut self.keeper {
            result = keeper.stop().await;
        }
        if let Some(mp) = &self.mountpoint
            && is_fuse(mp)
        {
            // The keeper could not unmount (it was killed): detach the dead mount.
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

fn is_fuse(path: &Path) -> bool {
    mounted_fstype(path).is_some_and(|t| t.starts_with("fuse"))
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
    let agent = Agent::load(state)?;
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
        agent_key: &agent.public_key,
        fabric_dir: &fabric_dir,
        fabric_device: &args.engine_device,
    };
    let Some(engine) = or_stop(stop, EngineProcess::start(state, &launch)).await else {
        return Ok(());
    };
    let engine = running.engine.insert(engine?);
    let addr = engine.addr.clone();
    let Some(stack) = or_stop(stop, provision::provision(&addr, system, args.pool_size)).await
    else {
        return Ok(());
    };
    let stack = stack?;
    if let Some(mountpoint) = mountpoint {
        running.mountpoint = Some(mountpoint.clone());
        let Some(served) = or_stop(
            stop,
            start_volume(state, running, &agent, &stack, &mountpoint),
        )
        .await
        else {
            return Ok(());
        };
        served?;
    }
    serve(state, running, &agent, &stack, stop).await
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
    let abs = std::env::current_dir()?.join(&state.dir);
    let tag = abs
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

/// Starts the mount keeper, which mounts the default container and runs its worker.
async fn start_volume(
    state: &StateDir,
    running: &mut Running,
    agent: &Agent,
    stack: &Stack,
    mountpoint: &Path,
) -> anyhow::Result<()> {
    let engine = running.engine.as_ref().context("engine")?;
    let fabric_addr = engine
        .fabric_addr
        .context("the engine did not announce its fabric data service")?;
    let binary = sibling_binary(KEEPER, "dpufs-csi").await?;
    std::fs::create_dir_all(state.volume())?;
    let capability = state.volume().join("capability");
    agent.issue(&stack.pool, &stack.container, &capability)?;
    let keeper = running
        .keeper
        .insert(KeeperProcess::start(state, &binary).await?);
    println!("✓ mount keeper (pid {})", keeper.pid);
    state.record(MOUNT, &mountpoint.to_string_lossy())?;
    let launch = WorkerLaunch {
        fabric_addr,
        fabric_dir: running.fabric_dir.as_deref().context("fabric dir")?,
        capability: &capability,
        mountpoint,
    };
    let pid = keeper.serve_volume(&launch).await?;
    running.worker_pid = Some(pid);
    println!(
        "✓ volume worker (pid {pid}) serving {DEFAULT_LABEL} at {} over the fabric ({fabric_addr})",
        mountpoint.display()
    );
    Ok(())
}

/// Records the endpoint, says what runs where, renews the capability, and waits for a stop
/// signal or the end of a child.
async fn serve(
    state: &StateDir,
    running: &mut Running,
    agent: &Agent,
    stack: &Stack,
    stop: &mut StopSignals,
) -> anyhow::Result<()> {
    let engine = running.engine.as_ref().context("engine")?;
    state.record(ENDPOINT, &engine.addr)?;
    summary(state, engine, running, stack);
    let engine = running.engine.as_mut().context("engine")?;
    let mut renew = tokio::time::interval(volume::RENEW_EVERY);
    renew.tick().await;
    let capability = state.volume().join("capability");
    loop {
        tokio::select! {
            _ = stop.recv() => return Ok(()),
            // A clean exit is someone's stop (`dpufs down`, the control socket's stop).
            status = engine.child.wait() => {
                let status = status?;
                if status.success() {
                    println!("{ENGINE} stopped");
                    return Ok(());
                }
                bail!("{ENGINE} exited ({status}):\n{}", engine.log.excerpt(children::LogPart::End))
            }
            status = ended(running.keeper.as_mut()) => {
                let status = status?;
                let keeper = running.keeper.as_ref().context("keeper")?;
                bail!("the mount keeper exited ({status}):\n{}", keeper.log.excerpt(children::LogPart::End))
            }
            _ = renew.tick(), if running.keeper.is_some() => {
                agent.issue(&stack.pool, &stack.container, &capability)?;
            }
        }
    }
}

/// The keeper's end; never, when there is none.
async fn ended(keeper: Option<&mut KeeperProcess>) -> std::io::Result<std::process::ExitStatus> {
    match keeper {
        Some(k) => k.ended().await,
        None => std::future::pending().await,
    }
}

fn summary(state: &StateDir, engine: &EngineProcess, running: &Running, stack: &Stack) {
    println!("\ndpufs is up:");
    let mount = match (&running.keeper, running.worker_pid, &running.mountpoint) {
        (Some(k), Some(worker), Some(mp)) => format!(
            "{} (mount keeper pid {k}, volume worker pid {worker}; log {})",
            mp.display(),
            k.log.0.display(),
            k = k.pid,
        ),
        _ => "none".into(),
    };
    crate::output::Table::fields([
        (
            "engine",
            format!(
                "{} (pid {}, log {})",
                engine.addr,
                engine.pid,
                engine.log.0.display()
            ),
        ),
        (
            "fabric",
            engine.fabric_addr.map_or("not serving".into(), |a| {
                format!("{a} (software RDMA device)")
            }),
        ),
        ("pool", format!("{DEFAULT_LABEL} ({})", stack.pool)),
        (
            "container",
            format!("{DEFAULT_LABEL} ({}), POSIX", stack.container),
        ),
        ("mount", mount),
        ("CSI driver", "not available yet".into()),
    ])
    .print();
    // Only the default directory's endpoint file is looked for by other commands.
    let (reach, flags) = if state.dir == Path::new(DEFAULT_DIR) {
        ("run in this directory find it", String::new())
    } else {
        (
            "reach it with",
            format!("--insecure --endpoint {} ", engine.addr),
        )
    };
    println!(
        "Other dpufs commands {reach}, e.g.\n  dpufs {flags}status\n  dpufs {flags}pool query {DEFAULT_LABEL}\n\
         Ctrl-C stops the stack."
    );
}

/// Stops what a killed `dpufs up` left behind and forgets it.
pub async fn down(args: DownArgs) -> anyhow::Result<()> {
    let state = StateDir::new(&args.data_dir);
    let mut did = false;
    if let Some(pid) = state.running(KEEPER_PID, KEEPER) {
        // It drains its worker and unmounts, if it still can.
        let _ = volume::unmount(&volume::keeper_socket(&state)).await;
        terminate(KEEPER, pid, || !runs(pid, KEEPER)).await?;
        println!("stopped the mount keeper (pid {pid})");
        did = true;
    }
    // A keeper killed with -9 leaves its workers serving.
    for pid in recorded_workers(&state)
        .into_iter()
        .filter(|&p| runs(p, KEEPER))
    {
        terminate(KEEPER, pid, || !runs(pid, KEEPER)).await?;
        println!("stopped the volume worker (pid {pid})");
        did = true;
    }
    if let Some(mp) = state.recorded(MOUNT).map(PathBuf::from)
        && is_fuse(&mp)
    {
        detach(&mp).with_context(|| format!("detaching {}", mp.display()))?;
        println!("detached the mount at {}", mp.display());
        did = true;
    }
    if let Some(pid) = state.running(ENGINE_PID, ENGINE) {
        terminate(ENGINE, pid, || !runs(pid, ENGINE)).await?;
        println!("stopped {ENGINE} (pid {pid})");
        did = true;
    }
    if let Some(dir) = state.recorded(FABRIC_DIR) {
        let _ = std::fs::remove_dir_all(dir);
    }
    if !did {
        println!(
            "nothing of `dpufs up` running (state in {})",
            state.dir.display()
        );
    }
    state.forget();
    Ok(())
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
