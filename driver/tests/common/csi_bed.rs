//! The CSI test bed: a real engine with its fabric data service, the node's mount keeper, and
//! `dpufs-csi controller` and `dpufs-csi node` processes on unix sockets, with clients — shared
//! by the Node service's tests and the stage-latency benchmark.

use super::{tempdir, wait_until};
use dpufs_csi::keeper::Keeper;
use dpufs_daos::{ContainerAdmin, EngineContainers};
use dpufs_e2e::volume::EngineVolume;
use dpufs_proto::csi::v1::controller_client::ControllerClient;
use dpufs_proto::csi::v1::identity_client::IdentityClient;
use dpufs_proto::csi::v1::node_client::NodeClient;
use dpufs_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use dpufs_proto::csi::v1::{self as csi, VolumeCapability};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use tonic::transport::{Channel, Endpoint};

pub const MIB: i64 = 1 << 20;

/// An engine volume (its pool is the directory's pool `fast`), the keeper, and the
/// controller and node plugins as processes, with clients on their sockets.
pub struct Bed {
    pub vol: EngineVolume,
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub keeper: Child,
    pub plugins: Vec<Child>,
    pub ctl: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
    pub ident: IdentityClient<Channel>,
    /// Extra flags of the node plugin.
    pub node_args: Vec<String>,
}

impl Drop for Bed {
    fn drop(&mut self) {
        for p in self.plugins.iter_mut().chain([&mut self.keeper]) {
            let _ = p.kill();
            let _ = p.wait();
        }
        // Whatever a failed test left mounted under the bed.
        let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        for line in text.lines() {
            if let Some(mp) = line.split(' ').nth(1)
                && Path::new(mp).starts_with(self.dir.path())
            {
                super::force_unmount(Path::new(mp));
            }
        }
    }
}

pub async fn connect(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    // Accepting, not only bound: the socket file exists a moment before the server listens
    // (and a killed plugin's file stays until its successor replaces it).
    wait_until("the plugin to accept on its socket", || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
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
        .expect("connect to the plugin")
}

pub fn plugin(args: &[&str], extra: &[PathBuf]) -> Child {
    Command::new(super::worker_bin())
        .args(args)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the plugin")
}

impl Bed {
    pub async fn new() -> Bed {
        Bed::with_node_args(&[]).await
    }

    /// A bed whose node plugin also gets `node_args`.
    pub async fn with_node_args(node_args: &[&str]) -> Bed {
        let vol = tokio::task::spawn_blocking(|| EngineVolume::start(1, 2 << 30))
            .await
            .unwrap();
        let dir = tempdir("dpufs-csi-node-");
        let config = serde_json::json!({
            "system": {"endpoints": [vol.engine.addr], "dataEndpoint": vol.fabric_addr()},
            "pools": {"fast": vol.pool},
            "tenants": [
                {"name": "team-a", "principal": "team-a@", "namespaces": ["ns-a"], "allowedPools": ["fast"]},
                {"name": "team-b", "principal": "team-b@", "namespaces": ["ns-b"], "allowedPools": ["fast"]}
            ],
            "defaultTenant": "team-a"
        });
        let directory = dir.path().join("directory.json");
        std::fs::write(&directory, config.to_string()).unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let key = dir.path().join("agent.key");
        std::fs::write(&key, vol.agent.to_pem().unwrap()).unwrap();
        let keeper = plugin(&["keeper", "--state-dir"], std::slice::from_ref(&state));
        wait_until("the keeper", || Keeper::socket(&state).exists());
        let (ctl_sock, node_sock) = (dir.path().join("ctl.sock"), dir.path().join("node.sock"));
        let controller = plugin(
            &["controller", "--endpoint"],
            &[unix(&ctl_sock), "--directory".into(), directory.clone()],
        );
        let ctl = ControllerClient::new(connect(&ctl_sock).await);
        let mut bed = Bed {
            vol,
            state,
            keeper,
            plugins: vec![controller],
            ctl,
            node: NodeClient::new(lazy_channel()),
            ident: IdentityClient::new(lazy_channel()),
            dir,
            node_args: node_args.iter().map(|a| a.to_string()).collect(),
        };
        bed.plugins.push(bed.node_plugin(&node_sock));
        let node_channel = connect(&node_sock).await;
        bed.node = NodeClient::new(node_channel.clone());
        bed.ident = IdentityClient::new(node_channel);
        bed
    }

    /// Starts a node plugin serving on `socket`, with the bed's directory, state and key.
    pub fn node_plugin(&self, socket: &Path) -> Child {
        let mut args = vec!["node", "--node-id", "node-1", "--keeper-start", "never"];
        args.extend(self.node_args.iter().map(String::as_str));
        plugin(
            &args,
            &[
                "--mount-root".into(),
                self.dir.path().to_path_buf(),
                "--endpoint".into(),
                unix(socket),
                "--directory".into(),
                self.path("directory.json"),
                "--state-dir".into(),
                self.state.clone(),
                "--agent-key".into(),
                self.path("agent.key"),
                "--fabric-dir".into(),
                self.vol.fabric_dir.clone(),
            ],
        )
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub async fn create(&self, name: &str, namespace: &str) -> csi::Volume {
        self.create_sized(name, namespace, 512 * MIB).await
    }

    pub async fn create_sized(&self, name: &str, namespace: &str, bytes: i64) -> csi::Volume {
        let params: HashMap<String, String> = [
            ("pool", "fast"),
            ("csi.storage.k8s.io/pvc/namespace", namespace),
            ("csi.storage.k8s.io/pvc/name", name),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        self.ctl
            .clone()
            .create_volume(csi::CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap(access_mode::Mode::MultiNodeMultiWriter)],
                parameters: params,
                ..Default::default()
            })
            .await
            .expect("CreateVolume")
            .into_inner()
            .volume
            .expect("a volume")
    }

    pub async fn stage(&self, id: &str, staging: &Path) -> Result<(), tonic::Status> {
        self.node
            .clone()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap(access_mode::Mode::MultiNodeMultiWriter)),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    pub async fn publish(
        &self,
        id: &str,
        staging: &Path,
        target: &Path,
        namespace: &str,
        readonly: bool,
    ) -> Result<(), tonic::Status> {
        let context = [(
            "csi.storage.k8s.io/pod.namespace".to_string(),
            namespace.to_string(),
        )];
        self.node
            .clone()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap(access_mode::Mode::MultiNodeMultiWriter)),
                readonly,
                volume_context: context.into_iter().collect(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    pub async fn unpublish(&self, id: &str, target: &Path) -> Result<(), tonic::Status> {
        self.node
            .clone()
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: target.display().to_string(),
            })
            .await
            .map(drop)
    }

    pub async fn unstage(&self, id: &str, staging: &Path) -> Result<(), tonic::Status> {
        self.node
            .clone()
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .map(drop)
    }

    /// The keeper's volumes: (name, worker pid).
    pub fn keeper_volumes(&self) -> Vec<(String, Option<u32>)> {
        let list = dpufs_csi::ipc::keeper::list(&Keeper::socket(&self.state)).unwrap();
        list.volumes
            .into_iter()
            .map(|v| (v.volume, v.pid))
            .collect()
    }

    pub fn records(&self) -> Vec<PathBuf> {
        match std::fs::read_dir(self.state.join("csi")) {
            Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
            Err(_) => vec![],
        }
    }
}

/// A channel that connects on first use: a placeholder until the plugin's socket exists.
pub fn lazy_channel() -> Channel {
    Endpoint::from_static("http://unused.invalid").connect_lazy()
}

pub fn unix(socket: &Path) -> PathBuf {
    PathBuf::from(format!("unix://{}", socket.display()))
}

pub fn cap(mode: access_mode::Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn mounted(path: &Path) -> bool {
    dpufs_node_api::mountinfo::find(path).unwrap().is_some()
}

impl Bed {
    pub async fn snapshot(&self, name: &str, source: &str) -> csi::Snapshot {
        self.ctl
            .clone()
            .create_snapshot(csi::CreateSnapshotRequest {
                name: name.into(),
                source_volume_id: source.into(),
                ..Default::default()
            })
            .await
            .expect("CreateSnapshot")
            .into_inner()
            .snapshot
            .expect("a snapshot")
    }

    /// Stages and publishes `id` for a pod of `ns-a` at `<name>/mount`; returns the target.
    pub async fn mount(&self, id: &str, name: &str) -> (PathBuf, PathBuf) {
        let staging = self.path(&format!("{name}-globalmount"));
        std::fs::create_dir_all(&staging).unwrap();
        self.stage(id, &staging).await.expect("NodeStage");
        let target = self.path(&format!("{name}/mount"));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        self.publish(id, &staging, &target, "ns-a", false)
            .await
            .expect("publish");
        (staging, target)
    }

    pub async fn unmount(&self, id: &str, (staging, target): (PathBuf, PathBuf)) {
        self.unpublish(id, &target).await.expect("unpublish");
        self.unstage(id, &staging).await.expect("unstage");
    }

    pub async fn containers(&self) -> Vec<String> {
        let admin = EngineContainers::new(&self.vol.engine.client());
        let list = admin.list(&self.vol.pool).await.unwrap();
        list.into_iter().map(|c| c.uuid).collect()
    }
}
