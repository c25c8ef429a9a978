//! The stack's child processes: finding their binaries, logs, and the engine's start-up.

use super::state::{ENGINE, ENGINE_PID, StateDir, terminate};
use anyhow::{Context, bail};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

/// The prefix of the one line the engine prints when it serves.
const READY_PREFIX: &str = "dpufs-engine listening on ";
/// The line before it when the engine serves DFS over the fabric.
const FABRIC_PREFIX: &str = "dpufs-engine data service on fabric ";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// `program` (of cargo package `package`) next to this executable. When it is missing and
/// this is a cargo workspace (`cargo run --bin dpufs -- up` builds only `dpufs`), it is built
/// with the profile of this executable so that it lands next to it.
pub async fn sibling_binary(program: &str, package: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the dpufs executable")?;
    let binary = exe.with_file_name(program);
    if binary.is_file() {
        return Ok(binary);
    }
    let is_workspace = std::fs::read_to_string("Cargo.toml")
        .is_ok_and(|toml| toml.lines().any(|l| l.trim() == "[workspace]"));
    if !is_workspace {
        bail!(
            "{program} is not next to {}: build every binary with `cargo build --release` \
             (in the dpufs source tree) and run target/release/dpufs",
            exe.display()
        );
    }
    let release = exe.parent().and_then(Path::file_name) == Some("release".as_ref());
    let profile_flag = release.then_some("--release");
    println!(
        "… {program} is not built yet: running cargo build {}-p {package}",
        profile_flag.map_or(String::new(), |f| format!("{f} "))
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", package, "--bin", program])
        .args(profile_flag)
        .status()
        .await
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo build -p {package} failed ({status})");
    }
    if !binary.is_file() {
        bail!(
            "cargo built {program}, but not next to {}: run `cargo build --release` and use target/release/dpufs",
            exe.display()
        );
    }
    Ok(binary)
}

/// A child's log file.
#[derive(Debug, Clone)]
pub struct Log(pub PathBuf);

impl Log {
    pub fn create(path: PathBuf) -> anyhow::Result<(Log, std::fs::File)> {
        let file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok((Log(path), file))
    }

    /// Its first lines (a failed start: the error comes first) or its last ones.
    pub fn excerpt(&self, part: LogPart) -> String {
        const LINES: usize = 20;
        let text = std::fs::read_to_string(&self.0).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let (which, shown) = match part {
            LogPart::Start => ("first", &lines[..lines.len().min(LINES)]),
            LogPart::End => ("last", &lines[lines.len().saturating_sub(LINES)..]),
        };
        format!(
            "--- {which} lines of {} ---\n{}",
            self.0.display(),
            shown.join("\n")
        )
    }
}

#[derive(Debug, Clone, Copy)]
pub enum LogPart {
    Start,
    End,
}

/// What the engine of the stack is started with.
#[derive(Debug)]
pub struct EngineLaunch<'a> {
    pub binary: &'a Path,
    pub system: &'a str,
    pub capacity: Option<u64>,
    pub ranks: Option<u32>,
    /// Public key of the agent whose capabilities the data service honours.
    pub agent_key: &'a Path,
    /// The software fabric's device directory.
    pub fabric_dir: &'a Path,
    /// The engine's device in it.
    pub fabric_device: &'a str,
}

/// The engine child process.
#[derive(Debug)]
pub struct EngineProcess {
    pub child: Child,
    pub pid: u32,
    pub addr: String,
    pub fabric_addr: Option<SocketAddr>,
    pub log: Log,
}

impl EngineProcess {
    /// Starts the engine on free loopback ports and waits for its ready line.
    pub async fn start(
        state: &StateDir,
        launch: &EngineLaunch<'_>,
    ) -> anyhow::Result<EngineProcess> {
        let (log, log_file) = Log::create(state.path("engine.log"))?;
        let mut cmd = Command::new(launch.binary);
        cmd.arg("--data-dir")
            .arg(state.path("engine"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--insecure",
                "--system",
                launch.system,
            ])
            .arg("--agent-key")
            .arg(launch.agent_key)
            .args(["--fabric-device", launch.fabric_device])
            .env("DPUFS_FABRIC_DIR", launch.fabric_dir);
        if let Some(capacity) = launch.capacity {
            cmd.args(["--capacity", &capacity.to_string()]);
        }
        if let Some(ranks) = launch.ranks {
            cmd.args(["--ranks", &ranks.to_string()]);
        }
        let mut child = spawn(&mut cmd, log_file, Stdio::piped())
            .with_context(|| format!("starting {}", launch.binary.display()))?;
        let pid = child.id().context("the engine exited at once")?;
        state.record(ENGINE_PID, &pid.to_string())?;
        let stdout = child.stdout.take().context("engine stdout")?;
        let mut engine = EngineProcess {
            child,
            pid,
            addr: String::new(),
            fabric_addr: None,
            log,
        };
        match timeout(READY_TIMEOUT, ready_lines(stdout)).await {
            Ok(Some((ready, fabric))) => {
                println!("✓ engine {}", ready.trim_start_matches("dpufs-engine "));
                engine.addr = address(&ready)
                    .context("reading the engine's address")?
                    .to_string();
                engine.fabric_addr = fabric;
                Ok(engine)
            }
            Ok(None) => {
                let status = engine.child.wait().await?;
                bail!(
                    "{ENGINE} exited ({status}) before it was ready:\n{}",
                    engine.log.excerpt(LogPart::Start)
                )
            }
            Err(_) => bail!(
                "{ENGINE} was not ready within {} s:\n{}",
                READY_TIMEOUT.as_secs(),
                engine.log.excerpt(LogPart::End)
            ),
        }
    }

    /// Stops the engine (SIGTERM, SIGKILL after the grace period).
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let child = &mut self.child;
        terminate(ENGINE, self.pid, || !matches!(child.try_wait(), Ok(None))).await
    }
}

/// Spawns a child of the stack: in its own process group (the terminal's Ctrl-C reaches only
/// `up`, which stops things in order), stderr to its log, killed should `up` fail half-way.
pub fn spawn(cmd: &mut Command, log: std::fs::File, stdout: Stdio) -> std::io::Result<Child> {
    cmd.stdin(Stdio::null())
        .stdout(stdout)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

/// Reads the engine's stdout up to its ready line (None if it ends first), noting the fabric
/// address announced before it, then keeps passing its later lines on, so the engine never
/// writes into a full or closed pipe.
async fn ready_lines(stdout: ChildStdout) -> Option<(String, Option<SocketAddr>)> {
    let mut lines = BufReader::new(stdout).lines();
    let mut fabric = None;
    while let Ok(Some(line)) = lines.next_line().await {
        if line.starts_with(READY_PREFIX) {
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    println!("engine: {line}");
                }
            });
            return Some((line, fabric));
        }
        if let Some(addr) = line.strip_prefix(FABRIC_PREFIX) {
            fabric = addr.trim().parse().ok();
            continue;
        }
        println!("engine: {line}");
    }
    None
}

/// The address in `dpufs-engine listening on ADDR (...)`.
fn address(ready: &str) -> Option<&str> {
    ready.strip_prefix(READY_PREFIX)?.split_whitespace().next()
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
}
