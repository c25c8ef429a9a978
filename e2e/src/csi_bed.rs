//! The CSI test bed: a real engine with its fabric data service, the node's mount keeper, and
//! `dpufs-csi controller` and `dpufs-csi node` processes on unix sockets, with tonic clients
//! over those sockets — shared by the driver's Node tests, its fuzz test, the stage-latency
//! benchmark and the CSI conformance suite (`tests/csi_conformance.rs`).
//!
//! The plugins run from a `dpufs-csi` binary the caller names: the driver's own tests pass
//! the one cargo built for them (`CARGO_BIN_EXE_dpufs-csi`), others [`crate::binary`]'s.

use crate::volume::EngineVolume;
use dpufs_daos::{ContainerAdmin, EngineContainers};
use dpufs_node_api::control::{self, Health, WorkerStats};
use dpufs_node_api::keeper::{List, Recovered, Reply, Request, VolumeStatus};
use dpufs_proto::csi::v1::controller_client::ControllerClient;
use dpufs_proto::csi::v1::identity_client::IdentityClient;
use dpufs_proto::csi::v1::node_client::NodeClient;
use dpufs_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use dpufs_proto::csi::v1::{self as csi, VolumeCapability};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

pub const MIB: i64 = 1 << 20;

/// Upper bound for anything the bed waits on (a safety net against hangs: everything
/// normally happens in milliseconds).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How a bed runs.
#[derive(Debug, Clone)]
pub struct BedOptions {
    /// The `dpufs-csi` binary the keeper and the plugins run from.
    pub binary: PathBuf,
    /// Extra flags of the node plugin.
    pub node_args: Vec<String>,
    /// Start the mount keeper and the node plugin (they need root and /dev/fuse to mount);
    /// without them only the controller serves.
    pub node: bool,
    /// Each process's stdout and stderr go to `<bed>/<name>.log` ([`Bed::log`]) instead of
    /// the test's terminal.
    pub log_to_files: bool,
    /// `RUST_LOG` of the processes.
    pub rust_log: String,
    /// Where the engine runs on the network (`None`: loopback).
    pub engine_network: Option<crate::EngineNetwork>,
    /// The node plugin's `--node-id`.
    pub node_id: String,
    /// The network namespace (its file, [`crate::netns::Netns::path`]) the keeper, the
    /// plugins and so the workers run in, as on a node of their own (`None`: the test's).
    pub netns: Option<PathBuf>,
}

impl BedOptions {
    /// Controller, keeper and node plugin of `binary`, logging at info level to the terminal.
    pub fn new(binary: impl Into<PathBuf>) -> BedOptions {
        BedOptions {
            binary: binary.into(),
            node_args: Vec::new(),
            node: true,
            log_to_files: false,
            rust_log: "info".into(),
            engine_network: None,
            node_id: "node-1".into(),
            netns: None,
        }
    }
}

/// An engine volume (its pool is the directory's pool `fast`) and the CSI plugins serving
/// it ([`CsiPlugins`], which the bed dereferences to).
#[derive(Debug)]
pub struct Bed {
    /// Declared first, so dropped first: the plugins and their mounts go before the engine.
    pub csi: CsiPlugins,
    pub vol: EngineVolume,
}

impl std::ops::Deref for Bed {
    type Target = CsiPlugins;
    fn deref(&self) -> &CsiPlugins {
        &self.csi
    }
}

impl std::ops::DerefMut for Bed {
    fn deref_mut(&mut self) -> &mut CsiPlugins {
        &mut self.csi
    }
}

/// The keeper, and the controller and node plugins as processes with clients on their
/// sockets, over any DAOS system a static directory describes (its pool `fast`, and the
/// tenants of [`two_tenants`] or others).
#[derive(Debug)]
pub struct CsiPlugins {
    /// Everything of the bed; also the node plugin's `--mount-root`.
    pub dir: tempfile::TempDir,
    /// The keeper's and the node plugin's state directory.
    pub state: PathBuf,
    /// The mount keeper (none when the bed runs without its node part).
    pub keeper: Option<Child>,
    /// The controller, then the node plugin.
    pub plugins: Vec<Child>,
    pub ctl: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
    /// Identity of the node plugin.
    pub ident: IdentityClient<Channel>,
    pub opts: BedOptions,
    /// What the node plugin is told about the system besides the directory (the engine's
    /// fabric and the agent key; DAOS's libraries and the tenant uids).
    system_node_args: Vec<PathBuf>,
    /// The environment of every process (a DAOS agent's socket directory).
    env: Vec<(String, String)>,
}

impl Drop for CsiPlugins {
    fn drop(&mut self) {
        for p in self.plugins.iter_mut().chain(self.keeper.as_mut()) {
            let _ = p.kill();
            let _ = p.wait();
        }
        // Whatever a failed test left mounted under the bed, the topmost first.
        let mounts = dpufs_node_api::mountinfo::read().unwrap_or_default();
        for m in mounts.iter().rev() {
            if m.mountpoint.starts_with(self.dir.path()) {
                force_unmount(&m.mountpoint);
            }
        }
    }
}

impl Bed {
    /// A bed of `binary` with every process.
    pub async fn new(binary: impl Into<PathBuf>) -> Bed {
        Bed::start(BedOptions::new(binary)).await
    }

    pub async fn start(opts: BedOptions) -> Bed {
        let network = opts.engine_network.clone();
        let vol = tokio::task::spawn_blocking(|| EngineVolume::start_on(1, 2 << 30, network))
            .await
            .expect("engine volume");
        let dir = tempdir("dpufs-csi-node-");
        let system = serde_json::json!({
            "endpoints": [vol.engine.addr],
            "dataEndpoint": vol.fabric_addr(),
        });
        let key = write_agent_key(dir.path(), &vol.agent);
        let node_args = vec![
            "--agent-key".into(),
            key,
            "--fabric-dir".into(),
            vol.fabric_dir.clone(),
        ];
        let csi = CsiPlugins::start(
            opts,
            dir,
            system,
            &vol.pool,
            two_tenants(),
            node_args,
            Vec::new(),
        )
        .await;
        Bed { csi, vol }
    }

    /// The uuids of the containers in the bed's pool.
    pub async fn containers(&self) -> Vec<String> {
        let admin = EngineContainers::new(&self.vol.engine.client());
        let list = admin.list(&self.vol.pool).await.expect("list containers");
        list.into_iter().map(|c| c.uuid).collect()
    }
}

/// Writes `agent`'s signing key to `<dir>/agent.key`, private (0600) as the node plugin
/// requires of a signing key; returns the path.
pub fn write_agent_key(dir: &Path, agent: &dpufs_fabric::session::AgentKey) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    let key = dir.join("agent.key");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key)
        .and_then(|mut f| f.write_all(&agent.to_pem().expect("PEM")))
        .expect("write the agent key");
    key
}

impl CsiPlugins {
    /// The plugins of `opts` in `dir`, with a static directory of `system` (its `system`
    /// entry) whose pool `fast` is `pool` and whose `tenants` may use it, `team-a` the
    /// default; `node_args` tell the node plugin the rest of what it needs for that system,
    /// `env` is every process's environment.
    pub async fn start(
        opts: BedOptions,
        dir: tempfile::TempDir,
        system: serde_json::Value,
        pool: impl std::fmt::Display,
        tenants: serde_json::Value,
        node_args: Vec<PathBuf>,
        env: Vec<(String, String)>,
    ) -> CsiPlugins {
        let config = serde_json::json!({
            "system": system,
            "pools": {"fast": pool.to_string()},
            "tenants": tenants,
            "defaultTenant": "team-a"
        });
        std::fs::write(dir.path().join("directory.json"), config.to_string())
            .expect("write the directory");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).expect("state dir");
        let mut bed = CsiPlugins {
            state,
            keeper: None,
            plugins: Vec::new(),
            ctl: ControllerClient::new(lazy_channel()),
            node: NodeClient::new(lazy_channel()),
            ident: IdentityClient::new(lazy_channel()),
            dir,
            opts,
            system_node_args: node_args,
            env,
        };
        let controller = bed.spawn(
            "controller",
            &[
                "controller".into(),
                "--endpoint".into(),
                unix(&bed.controller_socket()),
                "--directory".into(),
                bed.path("directory.json"),
            ],
        );
        bed.plugins.push(controller);
        bed.ctl = ControllerClient::new(connect(&bed.controller_socket()).await);
        if bed.opts.node {
            bed.start_keeper();
            bed.start_node_plugin().await;
        }
        bed
    }

    /// Starts the mount keeper and waits for its socket.
    fn start_keeper(&mut self) {
        let socket = keeper_socket(&self.state);
        // A killed keeper's socket file stays until its successor replaces it.
        let _ = std::fs::remove_file(&socket);
        let keeper = self.spawn(
            "keeper",
            &["keeper".into(), "--state-dir".into(), self.state.clone()],
        );
        self.keeper = Some(keeper);
        wait_until("the keeper", || socket.exists());
    }

    /// Starts the node plugin on [`Self::node_socket`] and connects the node clients to it.
    async fn start_node_plugin(&mut self) {
        let node = self.node_plugin(&self.node_socket());
        self.plugins.push(node);
        let channel = connect(&self.node_socket()).await;
        self.node = NodeClient::new(channel.clone());
        self.ident = IdentityClient::new(channel);
    }

    /// `kill -9` of the mount keeper, then a new one on the same state directory (what the
    /// launcher does when it finds none).
    pub fn kill9_and_restart_keeper(&mut self) {
        let mut keeper = self.keeper.take().expect("a keeper");
        crate::kill9(keeper.id());
        keeper.wait().expect("reaped");
        self.start_keeper();
    }

    /// `kill -9` of the node plugin, then a new one on the same socket and state directory
    /// (what kubelet's restart of the container does).
    pub async fn kill9_and_restart_node_plugin(&mut self) {
        let mut node = self.plugins.pop().expect("the node plugin");
        crate::kill9(node.id());
        node.wait().expect("reaped");
        self.start_node_plugin().await;
    }

    /// The controller's socket.
    pub fn controller_socket(&self) -> PathBuf {
        self.path("ctl.sock")
    }

    /// The node plugin's socket.
    pub fn node_socket(&self) -> PathBuf {
        self.path("node.sock")
    }

    /// Starts a node plugin serving on `socket`, with the bed's directory, state and key.
    fn node_plugin(&self, socket: &Path) -> Child {
        let mut args: Vec<PathBuf> = ["node", "--node-id", &self.opts.node_id]
            .into_iter()
            .chain(["--keeper-start", "never"])
            .map(PathBuf::from)
            .collect();
        args.extend(self.opts.node_args.iter().map(PathBuf::from));
        args.extend([
            "--mount-root".into(),
            self.dir.path().to_path_buf(),
            "--endpoint".into(),
            unix(socket),
            "--directory".into(),
            self.path("directory.json"),
            "--state-dir".into(),
            self.state.clone(),
        ]);
        args.extend(self.system_node_args.iter().cloned());
        self.spawn("node", &args)
    }

    fn spawn(&self, name: &str, args: &[PathBuf]) -> Child {
        let mut cmd = Command::new(&self.opts.binary);
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", &self.opts.rust_log)
            .stdin(Stdio::null());
        if let Some(netns) = &self.opts.netns {
            crate::netns::enter_on_exec(netns, &mut cmd).expect("enter the node's namespace");
        }
        if self.opts.log_to_files {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.path(&format!("{name}.log")))
                .expect("open the log");
            cmd.stdout(log.try_clone().expect("dup the log"))
                .stderr(log);
        }
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.opts.binary.display()))
    }

    /// What the process `name` (`controller`, `keeper`, `node`) logged, with
    /// [`BedOptions::log_to_files`].
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
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

    /// DeleteVolume, which must succeed.
    pub async fn delete(&self, id: &str) {
        self.ctl
            .clone()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .expect("DeleteVolume");
    }

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

    pub async fn stage(&self, id: &str, staging: &Path) -> Result<(), tonic::Status> {
        self.stage_as(id, staging, access_mode::Mode::MultiNodeMultiWriter)
            .await
    }

    /// NodeStageVolume with the access mode `mode`.
    pub async fn stage_as(
        &self,
        id: &str,
        staging: &Path,
        mode: access_mode::Mode,
    ) -> Result<(), tonic::Status> {
        self.node
            .clone()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap(mode)),
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
        let capability = cap(access_mode::Mode::MultiNodeMultiWriter);
        self.publish_as(id, (staging, target), namespace, readonly, capability)
            .await
    }

    /// NodePublishVolume with the volume capability `capability`.
    pub async fn publish_as(
        &self,
        id: &str,
        (staging, target): (&Path, &Path),
        namespace: &str,
        readonly: bool,
        capability: VolumeCapability,
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
                volume_capability: Some(capability),
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

    /// Stages and publishes `id` for a pod of `ns-a` at `<name>/mount`; returns the staging
    /// path and the target.
    pub async fn mount(&self, id: &str, name: &str) -> (PathBuf, PathBuf) {
        let staging = self.path(&format!("{name}-globalmount"));
        std::fs::create_dir_all(&staging).expect("staging dir");
        self.stage(id, &staging).await.expect("NodeStage");
        let target = self.path(&format!("{name}/mount"));
        std::fs::create_dir_all(target.parent().expect("a parent")).expect("target's parent");
        self.publish(id, &staging, &target, "ns-a", false)
            .await
            .expect("publish");
        (staging, target)
    }

    pub async fn unmount(&self, id: &str, (staging, target): (PathBuf, PathBuf)) {
        self.unpublish(id, &target).await.expect("unpublish");
        self.unstage(id, &staging).await.expect("unstage");
    }

    /// The keeper's volumes: (name, worker pid).
    pub fn keeper_volumes(&self) -> Vec<(String, Option<u32>)> {
        self.keeper_list()
            .into_iter()
            .map(|v| (v.volume, v.pid))
            .collect()
    }

    fn keeper_list(&self) -> Vec<VolumeStatus> {
        self.keeper_list_all().volumes
    }

    /// What the keeper did at its start with what an earlier keeper left.
    pub fn keeper_recovered(&self) -> Vec<Recovered> {
        self.keeper_list_all().recovered
    }

    fn keeper_list_all(&self) -> List {
        let req = Request::List;
        let line = ask(&keeper_socket(&self.state), &req.encode());
        match req.decode_reply(&line) {
            Ok(Reply::List(list)) => list,
            other => panic!("the keeper answered list with {other:?}"),
        }
    }

    /// The `health` of the worker serving the keeper's volume `volume` now.
    pub fn worker_health(&self, volume: &str) -> Health {
        match self.ask_worker(volume, control::Request::Health) {
            control::Reply::Health(h) => h,
            other => panic!("the worker answered health with {other:?}"),
        }
    }

    /// The `stats` of the worker serving the keeper's volume `volume` now.
    pub fn worker_stats(&self, volume: &str) -> WorkerStats {
        match self.ask_worker(volume, control::Request::Stats) {
            control::Reply::Stats(s) => s,
            other => panic!("the worker answered stats with {other:?}"),
        }
    }

    fn ask_worker(&self, volume: &str, req: control::Request) -> control::Reply {
        let generation = self
            .keeper_list()
            .into_iter()
            .find(|v| v.volume == volume)
            .unwrap_or_else(|| panic!("the keeper has no volume {volume}"))
            .generation;
        let socket = self
            .state
            .join("volumes")
            .join(volume)
            .join(format!("worker-{generation}"))
            .join("control.sock");
        req.decode_reply(&ask(&socket, &req.encode()))
            .unwrap_or_else(|e| panic!("the worker's answer to {req:?}: {e}"))
    }

    /// The node plugin's stage records.
    pub fn records(&self) -> Vec<PathBuf> {
        match std::fs::read_dir(self.state.join("csi")) {
            Ok(entries) => entries
                .map(|e| e.expect("directory entry").path())
                .collect(),
            Err(_) => vec![],
        }
    }
}

/// The bed's tenants: `team-a` of namespace `ns-a` and `team-b` of `ns-b`, both on the
/// pool `fast`.
pub fn two_tenants() -> serde_json::Value {
    serde_json::json!([
        {"name": "team-a", "principal": "team-a@", "namespaces": ["ns-a"], "allowedPools": ["fast"]},
        {"name": "team-b", "principal": "team-b@", "namespaces": ["ns-b"], "allowedPools": ["fast"]}
    ])
}

/// Sends one request line to a node socket and returns the answer line.
fn ask(socket: &Path, line: &str) -> String {
    let mut conn = UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
    conn.set_read_timeout(Some(DEADLINE)).expect("timeout");
    writeln!(conn, "{line}").expect("send");
    let mut answer = String::new();
    BufReader::new(&conn)
        .read_line(&mut answer)
        .expect("the answer");
    answer.trim_end().to_string()
}

/// The keeper's socket in its state directory.
pub fn keeper_socket(state: &Path) -> PathBuf {
    state.join("keeper.sock")
}

/// A temporary directory under /tmp (a local file system, not tmpfs).
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// Waits for `cond`, up to [`DEADLINE`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A channel to the gRPC server on the unix socket `socket`, once it accepts (up to
/// [`DEADLINE`]); panics otherwise.
pub async fn connect(socket: &Path) -> Channel {
    try_connect(socket, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A channel to the gRPC server on the unix socket `socket`: waits until it accepts, not
/// only until the file exists (the file is there a moment before the server listens, and a
/// killed server's file stays until its successor replaces it).
pub async fn try_connect(socket: &Path, wait: Duration) -> Result<Channel, String> {
    let start = Instant::now();
    loop {
        match tokio::net::UnixStream::connect(socket).await {
            Ok(_) => break,
            Err(e) if start.elapsed() >= wait => {
                return Err(format!(
                    "nothing accepts on {} after {wait:?}: {e}",
                    socket.display()
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let socket = socket.to_path_buf();
    let path = socket.clone();
    Endpoint::from_static("http://csi.sock")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .map_err(|e| format!("connect to {}: {e}", socket.display()))
}

/// A channel that connects on first use: a placeholder until a plugin's socket exists.
pub fn lazy_channel() -> Channel {
    Endpoint::from_static("http://unused.invalid").connect_lazy()
}

/// `unix://<socket>`, a CSI endpoint.
pub fn unix(socket: &Path) -> PathBuf {
    PathBuf::from(format!("unix://{}", socket.display()))
}

/// A mount capability (no fs type) with `mode`.
pub fn cap(mode: access_mode::Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// Whether something is mounted at `path`.
pub fn mounted(path: &Path) -> bool {
    dpufs_node_api::mountinfo::find(path)
        .expect("read the mount table")
        .is_some()
}

/// Removes whatever is mounted at `mountpoint`: a FUSE mount's connection is aborted first
/// (so nothing blocks on a dead server), then the mount is detached.
pub fn force_unmount(mountpoint: &Path) {
    use std::os::unix::ffi::OsStrExt;
    for _ in 0..8 {
        let Some(m) = dpufs_node_api::mountinfo::find(mountpoint).ok().flatten() else {
            return;
        };
        if m.is_fuse() {
            let abort = format!("/sys/fs/fuse/connections/{}/abort", m.connection());
            let _ = std::fs::write(abort, "1");
        }
        let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else {
            return;
        };
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}
