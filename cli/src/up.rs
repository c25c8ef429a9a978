//! `dpufs up`: the local stack in one command, and `dpufs down`.
//!
//! For now the stack is the embedded engine with a `default` pool and a
//! `default` POSIX container; the FUSE mount and the CSI driver join it as
//! they arrive. State lives in one directory (`./.dpufs`): the engine's data
//! and log, its pid (so `dpufs down` can stop an engine whose `dpufs up` was
//! killed), and the endpoint (so other `dpufs` commands run there find it).

use crate::output;
use crate::size::parse_size;
use anyhow::{Context, bail};
use clap::Args;
use dpufs_daos::{ContainerAdmin, ContainerSpec, EngineContainers, MgmtClient, PoolSize, PoolSpec};
use dpufs_proto::daos::props::{CONT_LAYOUT_TYPE, LAYOUT_POSIX, PropValue};
use rustix::process::{Pid, Signal, kill_process};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout};
use uuid::Uuid;

/// The stack's directory when none is given.
const DEFAULT_DIR: &str = ".dpufs";
const ENDPOINT_FILE: &str = "endpoint";
const PID_FILE: &str = "engine.pid";
const LOG_FILE: &str = "engine.log";
const ENGINE: &str = "dpufs-engine";
/// The prefix of the one line the engine prints when it serves.
const READY_PREFIX: &str = "dpufs-engine listening on ";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the engine may take to shut down after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The label of the pool and container `up` provides.
const DEFAULT_LABEL: &str = "default";
const DEFAULT_POOL_SIZE: u64 = 1 << 30;

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where the stack keeps its state: engine data, log, pid, endpoint.
    #[arg(long, default_value = DEFAULT_DIR)]
    data_dir: PathBuf,
    /// Storage each engine rank offers, e.g. 64G [default: the engine's].
    #[arg(long, value_parser = parse_size)]
    capacity: Option<u64>,
    /// Number of simulated engine ranks [default: the engine's].
    #[arg(long)]
    ranks: Option<u32>,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    /// The directory `dpufs up` used.
    #[arg(long, default_value = DEFAULT_DIR)]
    data_dir: PathBuf,
}

/// The endpoint a running `dpufs up` recorded in the default directory here.
pub fn recorded_endpoint() -> Option<String> {
    let text = std::fs::read_to_string(Path::new(DEFAULT_DIR).join(ENDPOINT_FILE)).ok()?;
    Some(text.trim().to_string()).filter(|e| !e.is_empty())
}

/// Runs the stack until Ctrl-C or SIGTERM, then stops it.
pub async fn up(args: UpArgs, system: &str) -> anyhow::Result<()> {
    // Installed first: the engine runs in its own process group (so the
    // terminal's Ctrl-C reaches only us and we stop things in order), which
    // also means a `dpufs up` killed by a default signal handler would orphan it.
    let mut stop = StopSignals::install()?;
    let dir = &args.data_dir;
    if let Some(pid) = running_engine(dir) {
        bail!(
            "a dpufs-engine from an earlier `dpufs up` is still running (pid {pid}, state in {}): \
             stop it with `dpufs down`",
            dir.display()
        );
    }
    let binary = engine_binary().await?;
    let started = tokio::select! {
        engine = EngineProcess::start(&binary, &args, system) => Some(engine),
        _ = stop.recv() => None,
    };
    let mut engine = match started {
        Some(Ok(engine)) => engine,
        // Dropping the child killed it.
        Some(Err(e)) => {
            remove_state(dir);
            return Err(e);
        }
        None => {
            remove_state(dir);
            println!("stopped");
            return Ok(());
        }
    };
    let provisioned = tokio::select! {
        p = provision(&engine.addr, system) => Some(p),
        _ = stop.recv() => None,
    };
    let outcome = match provisioned {
        Some(Ok(stack)) => serve(&mut engine, &stack, dir, &mut stop).await,
        Some(Err(e)) => Err(e),
        None => Ok(()),
    };
    let stopped = engine.stop().await;
    remove_state(dir);
    outcome?;
    stopped?;
    println!("stopped");
    Ok(())
}

/// Stops an engine a killed `dpufs up` left behind and forgets its endpoint.
pub async fn down(args: DownArgs) -> anyhow::Result<()> {
    let dir = &args.data_dir;
    match running_engine(dir) {
        Some(pid) => {
            terminate(pid, || !is_engine(pid)).await?;
            println!("stopped dpufs-engine (pid {pid})");
        }
        None => println!(
            "no dpufs-engine of `dpufs up` running (state in {})",
            dir.display()
        ),
    }
    remove_state(dir);
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

/// `dpufs-engine` next to this executable. When it is missing and this is a
/// cargo workspace (`cargo run --bin dpufs -- up` builds only `dpufs`), it is
/// built with the profile of this executable so that it lands next to it.
async fn engine_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the dpufs executable")?;
    let engine = exe.with_file_name(ENGINE);
    if engine.is_file() {
        return Ok(engine);
    }
    let is_workspace = std::fs::read_to_string("Cargo.toml")
        .is_ok_and(|toml| toml.lines().any(|l| l.trim() == "[workspace]"));
    if !is_workspace {
        bail!(
            "{ENGINE} is not next to {}: build every binary with `cargo build --release` \
             (in the dpufs source tree) and run target/release/dpufs",
            exe.display()
        );
    }
    let release = exe.parent().and_then(Path::file_name) == Some("release".as_ref());
    let profile_flag = release.then_some("--release");
    println!(
        "… {ENGINE} is not built yet: running cargo build {}-p dpufs-engine",
        profile_flag.map_or(String::new(), |f| format!("{f} "))
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "dpufs-engine"])
        .args(profile_flag)
        .status()
        .await
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo build -p dpufs-engine failed ({status})");
    }
    if !engine.is_file() {
        bail!(
            "cargo built {ENGINE}, but not next to {}: run `cargo build --release` and use target/release/dpufs",
            exe.display()
        );
    }
    Ok(engine)
}

/// The engine child process.
struct EngineProcess {
    child: Child,
    pid: u32,
    addr: String,
    log: PathBuf,
}

impl EngineProcess {
    /// Starts the engine on a free loopback port and waits for its ready line.
    async fn start(binary: &Path, args: &UpArgs, system: &str) -> anyhow::Result<EngineProcess> {
        let dir = &args.data_dir;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = dir.join(LOG_FILE);
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(binary);
        cmd.arg("--data-dir").arg(dir.join("engine")).args([
            "--listen",
            "127.0.0.1:0",
            "--insecure",
            "--system",
            system,
        ]);
        if let Some(capacity) = args.capacity {
            cmd.args(["--capacity", &capacity.to_string()]);
        }
        if let Some(ranks) = args.ranks {
            cmd.args(["--ranks", &ranks.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .process_group(0)
            // Should `up` fail half-way, the engine does not outlive it.
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().context("the engine exited at once")?;
        std::fs::write(dir.join(PID_FILE), pid.to_string())?;
        let stdout = child.stdout.take().context("engine stdout")?;
        let mut engine = EngineProcess {
            child,
            pid,
            addr: String::new(),
            log,
        };
        match timeout(READY_TIMEOUT, ready_line(stdout)).await {
            Ok(Some(line)) => {
                println!("✓ engine {}", line.trim_start_matches("dpufs-engine "));
                engine.addr = address(&line)
                    .context("reading the engine's address")?
                    .to_string();
                Ok(engine)
            }
            Ok(None) => {
                let status = engine.child.wait().await?;
                bail!(
                    "{ENGINE} exited ({status}) before it was ready:\n{}",
                    engine.log_excerpt(LogPart::Start)
                )
            }
            Err(_) => {
                bail!(
                    "{ENGINE} was not ready within {} s:\n{}",
                    READY_TIMEOUT.as_secs(),
                    engine.log_excerpt(LogPart::End)
                )
            }
        }
    }

    /// Stops the engine (SIGTERM, SIGKILL after the grace period).
    async fn stop(&mut self) -> anyhow::Result<()> {
        let child = &mut self.child;
        terminate(self.pid, || !matches!(child.try_wait(), Ok(None))).await
    }

    /// Part of the engine's log for an error message: its start when the
    /// engine failed to start (the error comes first, any backtrace after
    /// it), its end when it failed later.
    fn log_excerpt(&self, part: LogPart) -> String {
        const LINES: usize = 20;
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let (which, shown) = match part {
            LogPart::Start => ("first", &lines[..lines.len().min(LINES)]),
            LogPart::End => ("last", &lines[lines.len().saturating_sub(LINES)..]),
        };
        format!(
            "--- {which} lines of {} ---\n{}",
            self.log.display(),
            shown.join("\n")
        )
    }
}

#[derive(Debug, Clone, Copy)]
enum LogPart {
    Start,
    End,
}

/// Reads the engine's stdout up to its ready line (None if it ends first),
/// then keeps passing its later lines on, so the engine never writes into a
/// full or closed pipe.
async fn ready_line(stdout: ChildStdout) -> Option<String> {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.starts_with(READY_PREFIX) {
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    println!("engine: {line}");
                }
            });
            return Some(line);
        }
        println!("engine: {line}");
    }
    None
}

/// The address in `dpufs-engine listening on ADDR (...)`.
fn address(ready: &str) -> Option<&str> {
    ready.strip_prefix(READY_PREFIX)?.split_whitespace().next()
}

/// What `up` provides besides the engine.
struct Stack {
    pool: String,
    container: String,
}

/// The `default` pool and container, made if missing, reused otherwise.
async fn provision(addr: &str, system: &str) -> anyhow::Result<Stack> {
    // `up` started this engine in insecure mode itself.
    let mgmt = crate::connect(None, addr, system)?;
    let (pool, made) = default_pool(&mgmt, system).await?;
    let info = mgmt.pool_query(&pool).await?;
    let size: u64 = info.tiers.iter().map(|t| t.total).sum();
    println!(
        "✓ pool {DEFAULT_LABEL} ({pool}) {}, {}",
        output::bytes(size),
        if made { "created" } else { "reused" }
    );
    let (cont, made) = default_container(&mgmt, &pool).await?;
    println!(
        "✓ container {DEFAULT_LABEL} ({cont}) POSIX, {}",
        if made { "created" } else { "reused" }
    );
    Ok(Stack {
        pool: format!("{DEFAULT_LABEL} ({pool})"),
        container: format!("{DEFAULT_LABEL} ({cont}), POSIX"),
    })
}

/// The pool labelled `default`; made with a UUID derived from the system
/// name, so that a create interrupted and repeated finds its own pool.
async fn default_pool(mgmt: &MgmtClient, system: &str) -> anyhow::Result<(String, bool)> {
    if let Some(p) = mgmt
        .list_pools()
        .await?
        .into_iter()
        .find(|p| p.label == DEFAULT_LABEL)
    {
        return Ok((p.uuid, false));
    }
    let mut spec = PoolSpec::new(DEFAULT_LABEL, PoolSize::total(DEFAULT_POOL_SIZE));
    spec.uuid = stable_uuid(&format!("{system}/pool/{DEFAULT_LABEL}"));
    Ok((mgmt.pool_create(&spec).await?.uuid, true))
}

/// The POSIX container labelled `default` in `pool`, made like the pool.
async fn default_container(mgmt: &MgmtClient, pool: &str) -> anyhow::Result<(String, bool)> {
    let admin = EngineContainers::new(mgmt);
    if let Some(c) = admin
        .list(pool)
        .await?
        .into_iter()
        .find(|c| c.label == DEFAULT_LABEL)
    {
        return Ok((c.uuid, false));
    }
    let spec = ContainerSpec {
        pool: pool.to_string(),
        uuid: Some(stable_uuid(&format!("{pool}/container/{DEFAULT_LABEL}"))),
        label: DEFAULT_LABEL.into(),
        properties: vec![(CONT_LAYOUT_TYPE, PropValue::Num(LAYOUT_POSIX))],
        ..ContainerSpec::default()
    };
    Ok((admin.create(&spec).await?.uuid, true))
}

fn stable_uuid(name: &str) -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("dpufs-up/{name}").as_bytes())
}

/// Records the endpoint, says what runs where, and waits for a stop signal
/// or the engine's end.
async fn serve(
    engine: &mut EngineProcess,
    stack: &Stack,
    dir: &Path,
    stop: &mut StopSignals,
) -> anyhow::Result<()> {
    std::fs::write(dir.join(ENDPOINT_FILE), &engine.addr)?;
    println!("\ndpufs is up:");
    output::Table::fields([
        (
            "engine",
            format!(
                "{} (pid {}, log {})",
                engine.addr,
                engine.pid,
                engine.log.display()
            ),
        ),
        ("pool", stack.pool.clone()),
        ("container", stack.container.clone()),
        (
            "FUSE mount",
            "not available yet (arrives with the volume worker)".into(),
        ),
        ("CSI driver", "not available yet".into()),
    ])
    .print();
    // Only the default directory's endpoint file is looked for by other commands.
    let (reach, flags) = if dir == Path::new(DEFAULT_DIR) {
        ("run in this directory find it", String::new())
    } else {
        (
            "reach it with",
            format!("--insecure --endpoint {} ", engine.addr),
        )
    };
    println!(
        "Other dpufs commands {reach}, e.g.\n  dpufs {flags}pool query {DEFAULT_LABEL}\n\
         Ctrl-C stops the stack."
    );
    tokio::select! {
        _ = stop.recv() => Ok(()),
        status = engine.child.wait() => engine_ended(status?, engine),
    }
}

/// The engine ended by itself: fine after SIGTERM from `dpufs down`,
/// otherwise an error with the end of its log.
fn engine_ended(status: ExitStatus, engine: &EngineProcess) -> anyhow::Result<()> {
    if status.success() {
        println!("{ENGINE} stopped");
        Ok(())
    } else {
        bail!(
            "{ENGINE} exited unexpectedly ({status}):\n{}",
            engine.log_excerpt(LogPart::End)
        )
    }
}

/// The pid in the pid file, if that process still is a dpufs-engine.
fn running_engine(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join(PID_FILE)).ok()?;
    text.trim().parse().ok().filter(|pid| is_engine(*pid))
}

/// Whether `pid` runs dpufs-engine (a reused pid or a zombie does not).
fn is_engine(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    Path::new(std::str::from_utf8(program).unwrap_or_default()).file_name() == Some(ENGINE.as_ref())
}

/// Sends SIGTERM, waits for `gone` up to the grace period, then SIGKILL.
async fn terminate(pid: u32, mut gone: impl FnMut() -> bool) -> anyhow::Result<()> {
    let target = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .context("invalid pid")?;
    if gone() {
        return Ok(());
    }
    // An error means the process is gone already.
    let _ = kill_process(target, Signal::TERM);
    if wait_until(&mut gone, STOP_GRACE).await {
        return Ok(());
    }
    eprintln!(
        "{ENGINE} (pid {pid}) did not stop within {} s: killing it",
        STOP_GRACE.as_secs()
    );
    let _ = kill_process(target, Signal::KILL);
    if wait_until(&mut gone, STOP_GRACE).await {
        Ok(())
    } else {
        bail!("{ENGINE} (pid {pid}) survived SIGKILL")
    }
}

async fn wait_until(gone: &mut impl FnMut() -> bool, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !gone() {
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Forgets the engine: its pid and endpoint files.
fn remove_state(dir: &Path) {
    for file in [ENDPOINT_FILE, PID_FILE] {
        let _ = std::fs::remove_file(dir.join(file));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_gives_the_address() {
        let line =
            "dpufs-engine listening on 127.0.0.1:4242 (system daos_server, 1 rank(s), data in x)";
        assert_eq!(address(line), Some("127.0.0.1:4242"));
        assert_eq!(address("something else"), None);
    }

    #[test]
    fn stable_uuids_are_stable() {
        assert_eq!(stable_uuid("a"), stable_uuid("a"));
        assert_ne!(stable_uuid("a"), stable_uuid("b"));
    }
}
