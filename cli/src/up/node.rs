//! The node side of the stack as `up`, `down` and `status` see it: the node agent's key
//! (the engine trusts its public half; the node plugin signs the workers' capabilities with
//! it) and the mount keeper the node plugin started, queried on its socket.

use super::state::StateDir;
use anyhow::{Context, bail};
use dpufs_daos::capability::AgentKey;
use dpufs_node_api::keeper::{self, VolumeStatus};
use dpufs_node_api::{control, record::VolumeRecord};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::time::timeout;

/// The node agent's signing key in the state directory (made on first use; the node plugin
/// loads it with `--agent-key`), and its public half written next to it for the engine; the
/// public key's path.
pub fn agent_public_key(state: &StateDir) -> anyhow::Result<PathBuf> {
    let key =
        AgentKey::load_or_generate(&agent_key(state)).context("the node agent's signing key")?;
    let public_key = state.path("agent.pub");
    let pem = key.public_key().and_then(|k| k.to_pem())?;
    std::fs::write(&public_key, pem)
        .with_context(|| format!("writing {}", public_key.display()))?;
    Ok(public_key)
}

/// The node agent's private key.
pub fn agent_key(state: &StateDir) -> PathBuf {
    state.path("agent.key")
}

/// Asks the keeper at `socket` to drain and unmount every volume it serves (what `down`
/// does when the node plugin that staged them is gone); the volumes it unmounted.
pub async fn unmount_all(socket: &Path) -> anyhow::Result<Vec<String>> {
    let keeper::Reply::List(list) = ask_keeper(socket, &keeper::Request::List).await? else {
        bail!("the mount keeper did not list its volumes");
    };
    let mut unmounted = Vec::new();
    for v in list.volumes {
        let req = keeper::Request::Unmount {
            volume: v.volume.clone(),
        };
        if let keeper::Reply::Refused(e) = ask_keeper(socket, &req).await? {
            bail!("the mount keeper refused to unmount {}: {e}", v.volume);
        }
        unmounted.push(v.volume);
    }
    Ok(unmounted)
}

/// The pid of the keeper answering at `socket`.
pub async fn keeper_pid(socket: &Path) -> anyhow::Result<u32> {
    match ask_keeper(socket, &keeper::Request::List).await? {
        keeper::Reply::List(list) => Ok(list.pid),
        other => bail!("the mount keeper answered {other:?} to a list"),
    }
}

/// The keeper's socket in the stack's directory.
pub fn keeper_socket(state: &StateDir) -> PathBuf {
    state.keeper().join("keeper.sock")
}

/// The control socket of the worker serving the stack's volume now (the keeper names each
/// worker's state directory by its generation). `up` stages one volume, so the keeper's
/// first is it.
pub async fn worker_control(state: &StateDir) -> Option<(VolumeStatus, PathBuf)> {
    let keeper::Reply::List(list) = ask_keeper(&keeper_socket(state), &keeper::Request::List)
        .await
        .ok()?
    else {
        return None;
    };
    let volume = list.volumes.into_iter().next()?;
    let dir = state
        .keeper()
        .join("volumes")
        .join(&volume.volume)
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
