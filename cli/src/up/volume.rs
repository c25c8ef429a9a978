//! The stack's volume: `up` plays the node agent (it holds the signing key the engine trusts
//! and issues the worker short-lived capabilities, renewing them in place) and runs one
//! volume worker that mounts the default container.

use super::children::{Log, LogPart, spawn};
use super::state::{StateDir, WORKER, WORKER_PID, terminate};
use anyhow::{Context, bail};
use dpufs_fabric::session::{AgentKey, Capability, Rights};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};

/// Lifetime of a capability; `up` renews it well before it ends.
const CAPABILITY_TTL: Duration = Duration::from_secs(3600);
pub const RENEW_EVERY: Duration = Duration::from_secs(1200);
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The tenant and volume names of the stack's one volume.
const TENANT: &str = "default";
const VOLUME: &str = "default";

/// The node agent of the local stack.
#[derive(Debug)]
pub struct Agent {
    key: AgentKey,
    /// The public key file the engine is started with.
    pub public_key: PathBuf,
}

impl Agent {
    /// The key kept in the state directory (made on first use), and its public half.
    pub fn load(state: &StateDir) -> anyhow::Result<Agent> {
        let key = AgentKey::load_or_generate(&state.path("agent.key"))
            .context("the node agent's signing key")?;
        let public_key = state.path("agent.pub");
        let pem = key.public_key().and_then(|k| k.to_pem())?;
        std::fs::write(&public_key, pem)
            .with_context(|| format!("writing {}", public_key.display()))?;
        Ok(Agent { key, public_key })
    }

    /// Writes a fresh read-write capability for `pool`/`container` to `path` (mode 0600,
    /// replaced atomically so the worker never reads half a token).
    pub fn issue(&self, pool: &str, container: &str, path: &Path) -> anyhow::Result<()> {
        let claims = Capability::new(
            TENANT,
            VOLUME,
            pool,
            container,
            Rights::READ_WRITE,
            CAPABILITY_TTL,
        );
        let token = self.key.sign(&claims)?.to_hex();
        let tmp = path.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        std::io::Write::write_all(&mut f, token.as_bytes())?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }
}

/// What the worker is started with.
#[derive(Debug)]
pub struct WorkerLaunch<'a> {
    pub binary: &'a Path,
    pub fabric_addr: SocketAddr,
    pub fabric_dir: &'a Path,
    pub capability: &'a Path,
    pub mountpoint: &'a Path,
}

/// The volume worker child process.
#[derive(Debug)]
pub struct WorkerProcess {
    child: Child,
    pub pid: u32,
    pub log: Log,
    pub control: PathBuf,
}

impl WorkerProcess {
    /// Starts the worker and waits until it serves the mount.
    pub async fn start(
        state: &StateDir,
        launch: &WorkerLaunch<'_>,
    ) -> anyhow::Result<WorkerProcess> {
        let volume = state.volume();
        let (log, log_file) = Log::create(state.path("worker.log"))?;
        let mut cmd = Command::new(launch.binary);
        cmd.arg("worker")
            .arg("--backend")
            .arg(format!("engine:{}", launch.fabric_addr))
            .arg("--capability")
            .arg(launch.capability)
            .arg("--fabric-dir")
            .arg(launch.fabric_dir)
            .arg("--mountpoint")
            .arg(launch.mountpoint)
            .arg("--state-dir")
            .arg(&volume)
            .args(["--fsname", "dpufs:default"]);
        let child = spawn(&mut cmd, log_file, Stdio::null())
            .with_context(|| format!("starting {}", launch.binary.display()))?;
        let pid = child.id().context("the worker exited at once")?;
        state.record(WORKER_PID, &pid.to_string())?;
        let mut worker = WorkerProcess {
            child,
            pid,
            log,
            control: volume.join("control.sock"),
        };
        worker.wait_serving().await?;
        Ok(worker)
    }

    async fn wait_serving(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{WORKER} worker exited ({status}) before it served the mount:\n{}",
                    self.log.excerpt(LogPart::Start)
                );
            }
            if let Ok(h) = control(&self.control, "health").await
                && h["state"] == "serving"
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{WORKER} worker did not serve within {} s:\n{}",
                    READY_TIMEOUT.as_secs(),
                    self.log.excerpt(LogPart::End)
                );
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the worker to end by itself.
    pub async fn ended(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    /// Stops the worker: SIGTERM makes it unmount (detaching a busy mount) and exit.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let child = &mut self.child;
        terminate(WORKER, self.pid, || !matches!(child.try_wait(), Ok(None))).await
    }
}

/// One request on a worker's control socket (line-delimited JSON).
pub async fn control(socket: &Path, op: &str) -> anyhow::Result<Value> {
    let exchange = async {
        let mut stream = UnixStream::connect(socket).await?;
        let mut line = json!({ "op": op }).to_string();
        line.push('\n');
        stream.write_all(line.as_bytes()).await?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).await?;
        anyhow::Ok(serde_json::from_str::<Value>(&answer)?)
    };
    timeout(Duration::from_secs(5), exchange)
        .await
        .with_context(|| format!("{} did not answer", socket.display()))?
        .with_context(|| format!("control socket {}", socket.display()))
}
