//! The stack's CSI driver: `dpufs-csi controller` and `dpufs-csi node` as children of `up`,
//! on unix sockets in the state directory, and `up` as their client — it provisions, stages
//! and publishes the default volume with the calls the CSI sidecars and kubelet make, so the
//! single-machine stack runs the same path as a cluster, and any CSI client (a conformance
//! suite, `csc`) can be pointed at the sockets.

use super::children::{Log, LogPart, spawn};
use super::state::{CONTROLLER_PID, CSI, NODE_PID, StateDir, terminate};
use anyhow::{Context, bail};
use dpufs_proto::csi::v1::controller_client::ControllerClient;
use dpufs_proto::csi::v1::node_client::NodeClient;
use dpufs_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use dpufs_proto::csi::v1::{self as csi, VolumeCapability};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};
use tonic::transport::{Channel, Endpoint};

/// The CSI name of the stack's volume (a PVC's `pvc-<uid>` in a cluster).
pub const VOLUME_NAME: &str = "dpufs-up-default";
/// The StorageClass parameters of the stack's volume: a container in the default pool.
const POOL_PARAMETER: (&str, &str) = ("pool", super::provision::DEFAULT_LABEL);
/// How long a plugin may take to accept on its socket.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Which of the driver's two services a plugin process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Controller,
    Node,
}

impl Service {
    fn subcommand(self) -> &'static str {
        match self {
            Service::Controller => "controller",
            Service::Node => "node",
        }
    }

    /// The file its pid is recorded in.
    pub fn pid_file(self) -> &'static str {
        match self {
            Service::Controller => CONTROLLER_PID,
            Service::Node => NODE_PID,
        }
    }

    /// Its socket, `<state>/csi/<controller|node>.sock`.
    pub fn socket(self, state: &StateDir) -> PathBuf {
        state.csi().join(format!("{}.sock", self.subcommand()))
    }
}

/// A `dpufs-csi controller|node` child of `up`.
#[derive(Debug)]
pub struct PluginProcess {
    pub service: Service,
    child: Child,
    pub pid: u32,
    pub log: Log,
    pub socket: PathBuf,
}

impl PluginProcess {
    /// Starts `binary <service> --endpoint unix://<socket> <args>` and waits until it
    /// accepts on its socket.
    pub async fn start(
        state: &StateDir,
        binary: &Path,
        service: Service,
        args: &[String],
    ) -> anyhow::Result<PluginProcess> {
        let socket = service.socket(state);
        std::fs::create_dir_all(state.csi())?;
        let name = format!("csi-{}", service.subcommand());
        let (log, log_file) = Log::create(state.path(&format!("{name}.log")))?;
        let mut cmd = Command::new(binary);
        cmd.arg(service.subcommand())
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(args)
            .env("RUST_LOG", "info");
        let child = spawn(&mut cmd, log_file.try_clone()?, Stdio::from(log_file))
            .with_context(|| format!("starting {} {}", binary.display(), service.subcommand()))?;
        let pid = child.id().context("the plugin exited at once")?;
        state.record(service.pid_file(), &pid.to_string())?;
        let mut plugin = PluginProcess {
            service,
            child,
            pid,
            log,
            socket,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        while std::os::unix::net::UnixStream::connect(&plugin.socket).is_err() {
            if let Some(status) = plugin.child.try_wait()? {
                bail!(
                    "the CSI {} plugin exited ({status}) before it served:\n{}",
                    service.subcommand(),
                    plugin.log.excerpt(LogPart::Start)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "the CSI {} plugin did not accept on {} within {} s:\n{}",
                    service.subcommand(),
                    plugin.socket.display(),
                    READY_TIMEOUT.as_secs(),
                    plugin.log.excerpt(LogPart::End)
                );
            }
            sleep(Duration::from_millis(20)).await;
        }
        Ok(plugin)
    }

    /// Waits for the plugin to end by itself.
    pub async fn ended(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    /// Stops the plugin (SIGTERM, SIGKILL after the grace period). The node plugin leaves
    /// what it staged mounted: `up` unstages first.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let child = &mut self.child;
        terminate(CSI, self.pid, || !matches!(child.try_wait(), Ok(None))).await
    }
}

/// A channel to a plugin's unix socket.
pub async fn connect(socket: &Path) -> anyhow::Result<Channel> {
    let socket = socket.to_path_buf();
    let shown = socket.display().to_string();
    Endpoint::from_static("http://csi.sock")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .with_context(|| format!("connecting to {shown}"))
}

/// The default volume as `up` staged and published it.
#[derive(Debug, Clone)]
pub struct Published {
    pub volume_id: String,
    pub staging: PathBuf,
    pub target: PathBuf,
}

/// The volume is `up`'s alone, mounted once at `./mnt`: a single writer (ReadWriteOncePod),
/// so its worker lets the kernel cache names and attributes hard (docs/worker.md).
fn capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeSingleWriter as i32,
        }),
    }
}

/// What a failed CSI call says: its code and message.
fn refused(what: &str) -> impl FnOnce(tonic::Status) -> anyhow::Error + '_ {
    move |s| anyhow::anyhow!("{what}: {:?}: {}", s.code(), s.message())
}

/// CreateVolume of the stack's volume: a container of `bytes` in the default pool (the
/// same request each time, so a later `up` finds the volume it made before).
pub async fn create_volume(controller: &Path, bytes: u64) -> anyhow::Result<csi::Volume> {
    let mut client = ControllerClient::new(connect(controller).await?);
    let req = csi::CreateVolumeRequest {
        name: VOLUME_NAME.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: i64::try_from(bytes).context("volume size")?,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        parameters: HashMap::from([(POOL_PARAMETER.0.into(), POOL_PARAMETER.1.into())]),
        ..Default::default()
    };
    client
        .create_volume(req)
        .await
        .map_err(refused("CreateVolume"))?
        .into_inner()
        .volume
        .context("CreateVolume answered no volume")
}

/// NodeStageVolume then NodePublishVolume, as kubelet does for a pod.
pub async fn stage_and_publish(
    node: &Path,
    volume: &csi::Volume,
    staging: &Path,
    target: &Path,
) -> anyhow::Result<Published> {
    let mut client = NodeClient::new(connect(node).await?);
    std::fs::create_dir_all(staging).with_context(|| format!("creating {}", staging.display()))?;
    let stage = csi::NodeStageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability()),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    match client.node_stage_volume(stage.clone()).await {
        // Staged with another access by an earlier `up` that was killed (before `up` staged
        // its volume single-writer): nobody else uses the stack's volume, so it is staged anew.
        Err(s) if s.code() == tonic::Code::AlreadyExists => {
            let unstage = csi::NodeUnstageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: staging.display().to_string(),
            };
            client
                .node_unstage_volume(unstage)
                .await
                .map_err(refused("NodeUnstageVolume of an earlier stage"))?;
            client
                .node_stage_volume(stage)
                .await
                .map_err(refused("NodeStageVolume"))?;
        }
        other => drop(other.map_err(refused("NodeStageVolume"))?),
    }
    let publish = csi::NodePublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability()),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    client
        .node_publish_volume(publish)
        .await
        .map_err(refused("NodePublishVolume"))?;
    Ok(Published {
        volume_id: volume.volume_id.clone(),
        staging: staging.to_path_buf(),
        target: target.to_path_buf(),
    })
}

/// NodeUnpublishVolume then NodeUnstageVolume: the bind mount goes, then the keeper drains
/// the worker and unmounts.
pub async fn unpublish_and_unstage(node: &Path, published: &Published) -> anyhow::Result<()> {
    let mut client = NodeClient::new(connect(node).await?);
    let unpublish = csi::NodeUnpublishVolumeRequest {
        volume_id: published.volume_id.clone(),
        target_path: published.target.display().to_string(),
    };
    client
        .node_unpublish_volume(unpublish)
        .await
        .map_err(refused("NodeUnpublishVolume"))?;
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: published.volume_id.clone(),
        staging_target_path: published.staging.display().to_string(),
    };
    client
        .node_unstage_volume(unstage)
        .await
        .map_err(refused("NodeUnstageVolume"))?;
    Ok(())
}
