//! The stack's volume: `up` plays the node agent (it holds the signing key the engine trusts
//! and issues the worker short-lived capabilities, renewing them in place) and runs one
//! volume worker that mounts the default container.

use super::children::{Log, LogPart, spawn};
use super::state::{KEEPER, KEEPER_PID, StateDir, terminate};
use anyhow::{Context, bail};
use dpufs_daos::capability::{AgentKey, Capability, Rights};
use dpufs_node_api::keeper::{self, VolumeStatus};
use dpufs_node_api::{control, record::VolumeRecord};
use std::net::SocketAddr;
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
        Ok(dpufs_node_api::file::write_atomic(
            path,
            token.as_bytes(),
            0o600,
        )?)
    }
}

/// What the volume's worker is started with.
#[derive(Debug)]
pub struct WorkerLaunch<'a> {
    pub fabric_addr: SocketAddr,
    pub fabric_dir: &'a Path,
    pub capability: &'a Path,
    pub mountpoint: &'a Path,
}

/// The node's mount keeper as a child of `up`: it mounts the volume, holds its connection
/// and runs its worker, replacing a worker that dies (docs/keeper.md). The mount therefore
/// survives a crashed worker; `up` stops both at the end.
#[derive(Debug)]
pub struct KeeperProcess {
    child: Child,
    pub pid: u32,
    pub log: Log,
    pub socket: PathBuf,
}

impl KeeperProcess {
    /// Starts `binary keeper` with its state in the stack's directory and waits until it
    /// answers.
    pub async fn start(state: &StateDir, binary: &Path) -> anyhow::Result<KeeperProcess> {
        let dir = state.keeper();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (log, log_file) = Log::create(state.path("keeper.log"))?;
        let mut cmd = Command::new(binary);
        cmd.arg("keeper").arg("--state-dir").arg(&dir);
        let child = spawn(&mut cmd, log_file, Stdio::null())
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().context("the keeper exited at once")?;
        state.record(KEEPER_PID, &pid.to_string())?;
        let mut keeper = KeeperProcess {
            child,
            pid,
            log,
            socket: keeper_socket(state),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        while ask_keeper(&keeper.socket, &keeper::Request::List)
            .await
            .is_err()
        {
            if let Some(status) = keeper.child.try_wait()? {
                bail!(
                    "the mount keeper exited ({status}) before it answered:\n{}",
                    keeper.log.excerpt(LogPart::Start)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "the mount keeper did not answer within {} s",
                    READY_TIMEOUT.as_secs()
                );
            }
            sleep(Duration::from_millis(20)).await;
        }
        Ok(keeper)
    }

    /// Mounts the default container and has the keeper start its worker; the worker's pid.
    pub async fn serve_volume(&self, launch: &WorkerLaunch<'_>) -> anyhow::Result<u32> {
        let mount = keeper::Request::Mount {
            volume: VOLUME.into(),
            mountpoint: launch.mountpoint.to_path_buf(),
            fsname: Some(format!("dpufs:{VOLUME}")),
            read_only: None,
            allow_other: None,
        };
        let args = vec![
            "--backend".to_string(),
            format!("engine:{}", launch.fabric_addr),
            "--capability".into(),
            launch.capability.display().to_string(),
            "--fabric-dir".into(),
            launch.fabric_dir.display().to_string(),
        ];
        let serve = keeper::Request::Serve {
            volume: VOLUME.into(),
            args,
            binary: None,
        };
        for req in [mount, serve] {
            match ask_keeper(&self.socket, &req).await? {
                keeper::Reply::Refused(error) => bail!(
                    "the mount keeper refused to {:?}: {error}\n{}",
                    req.op(),
                    self.log.excerpt(LogPart::End)
                ),
                keeper::Reply::Served { pid } => return Ok(pid),
                _ => {}
            }
        }
        bail!("the mount keeper started no worker")
    }

    /// Waits for the keeper to end by itself.
    pub async fn ended(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    /// Has the keeper drain the worker and unmount, then stops the keeper.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let unmounted = unmount(&self.socket).await;
        let child = &mut self.child;
        let stopped = terminate(KEEPER, self.pid, || !matches!(child.try_wait(), Ok(None))).await;
        match unmounted {
            Ok(keeper::Reply::Refused(e)) => bail!("unmount: {e}"),
            other => other.map(drop).and(stopped),
        }
    }
}

/// Asks the keeper at `socket` to drain the default volume's worker and unmount it.
pub async fn unmount(socket: &Path) -> anyhow::Result<keeper::Reply> {
    let req = keeper::Request::Unmount {
        volume: VOLUME.into(),
    };
    ask_keeper(socket, &req).await
}

/// The keeper's socket in the stack's directory.
pub fn keeper_socket(state: &StateDir) -> PathBuf {
    state.keeper().join("keeper.sock")
}

/// The control socket of the worker serving the default volume now (the keeper names each
/// worker's state directory by its generation).
pub async fn worker_control(state: &StateDir) -> Option<(VolumeStatus, PathBuf)> {
    let keeper::Reply::List(list) = ask_keeper(&keeper_socket(state), &keeper::Request::List)
        .await
        .ok()?
    else {
        return None;
    };
    let volume = list.volumes.into_iter().find(|v| v.volume == VOLUME)?;
    let dir = state
        .keeper()
        .join("volumes")
        .join(VOLUME)
        .join(format!("worker-{}", volume.generation));
    Some((volume, dir.join("control.sock")))
}

/// Workers the keeper recorded (a keeper killed with -9 leaves its workers serving).
pub fn recorded_workers(state: &StateDir) -> Vec<u32> {
    VolumeRecord::load_all(&state.keeper().join("volumes"))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(_, record)| record?.worker_pid)
        .collect()
}

/// One request on a worker's control socket.
pub async fn control(socket: &Path, req: control::Request) -> anyhow::Result<control::Reply> {
    let answer = exchange(socket, &req.encode()).await?;
    Ok(req.decode_reply(&answer)?)
}

/// One request on the keeper's socket (`dpufs up` never asks for a descriptor).
pub async fn ask_keeper(socket: &Path, req: &keeper::Request) -> anyhow::Result<keeper::Reply> {
    let answer = exchange(socket, &req.encode()).await?;
    Ok(req.decode_reply(&answer)?)
}

/// One request line on a unix socket (a worker's control socket or the keeper's) and its
/// one-line answer.
async fn exchange(socket: &Path, line: &str) -> anyhow::Result<String> {
    let exchange = async {
        let mut stream = UnixStream::connect(socket).await?;
        let mut line = line.to_string();
        line.push('\n');
        stream.write_all(line.as_bytes()).await?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).await?;
        anyhow::Ok(answer)
    };
    // Serving waits for the worker to start (the keeper allows it 30 s).
    timeout(Duration::from_secs(60), exchange)
        .await
        .with_context(|| format!("{} did not answer", socket.display()))?
        .with_context(|| format!("socket {}", socket.display()))
}
