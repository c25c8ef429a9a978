//! `dpufs-csi`: the CSI driver's processes: the volume worker, the node's mount keeper and
//! the launcher that adopts or starts them.

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use dpufs_csi::csi::directory::DirectoryArgs;
use dpufs_csi::csi::node::prepare::Stager;
use dpufs_csi::dpu::attach::AttachSpec;
use dpufs_csi::dpu::tls::TlsArgs;
use dpufs_csi::ipc::keeper as client;
use dpufs_csi::keeper::{Keeper, placement};
use dpufs_csi::launcher::{
    Attachment, KeeperFound, KeeperStart, VolumeState, WantedVolume, ensure_keeper, ensure_volume,
};
use dpufs_csi::worker::backend::{BackendOptions, BackendSpec, prepare_backend};
use dpufs_csi::worker::fs::{AccessMode, FsConfig};
use dpufs_csi::worker::privilege::Limits;
use dpufs_csi::worker::{Source, Worker, WorkerConfig};
use dpufs_daos::dfs::fabric::{DeviceOptions, Provider, ProviderKind};
use dpufs_node_api::transport::Transport;
use dpufs_node_api::wire;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "dpufs-csi", version, about = "dpufs CSI driver processes")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve one volume through FUSE (one worker per tenant volume and node).
    Worker(Box<WorkerArgs>),
    /// The node's mount keeper: mounts volumes, holds their connections, hands them to
    /// workers and replaces workers that die.
    Keeper(KeeperArgs),
    /// What the node plugin does at start: adopt the node's keeper (or start one that
    /// outlives this process) and make sure a volume is served; then wait for a stop signal
    /// and exit, leaving every volume mounted.
    Launcher(LauncherArgs),
    /// The CSI controller: the Identity and Controller services on a unix socket, until
    /// SIGINT or SIGTERM.
    Controller(ControllerArgs),
    /// The CSI node plugin (host mode): the Identity and Node services on a unix socket.
    /// Adopts the node's mount keeper (or starts one that outlives this process), signs and
    /// renews the workers' capabilities as the node agent; stops on SIGINT or SIGTERM,
    /// leaving every staged volume mounted and served.
    Node(Box<NodeArgs>),
    /// The dpufs agent on a DPU: stages volumes for the host the DPU is paired with (keeper,
    /// workers, fabric sessions, capabilities) and shows each to the host as a virtio-fs
    /// device, after checking the host's pod against the API server; serves the control
    /// channel (gRPC, mutual TLS) until SIGINT or SIGTERM, leaving every volume served.
    DpuAgent(Box<DpuAgentArgs>),
}

#[derive(Args, Debug)]
struct NodeArgs {
    /// The CSI endpoint, unix:///path/to/csi.sock.
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: String,
    /// This node's id (the Kubernetes node name).
    #[arg(long, env = "NODE_ID")]
    node_id: String,
    /// `host`: this node stages its volumes itself (keeper, workers, fabric). `dpu-host`: the
    /// dpufs agent on this host's DPU stages them and shows them as virtio-fs devices; this
    /// plugin forwards to it and mounts the devices, and needs none of the staging flags.
    #[arg(long, value_enum, default_value = "host")]
    mode: NodeMode,
    /// Staging and target paths must be under this directory (kubelet's); the plugin
    /// refuses to mount or unmount anywhere else.
    #[arg(long, default_value = "/var/lib/kubelet")]
    mount_root: PathBuf,
    /// What stages volumes on this node (host mode).
    #[command(flatten)]
    staging: StagingArgs,
    /// Where the DPU's agent is (dpu-host mode).
    #[command(flatten)]
    dpu: DpuHostArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum NodeMode {
    Host,
    DpuHost,
}

/// What stages volumes, the same for the node plugin in host mode and the DPU agent: the
/// directory, the keeper and its state, the node agent key and the workers' fabric.
#[derive(Args, Debug)]
struct StagingArgs {
    /// Where the plugin finds DAOS systems (with their data endpoint), pools and tenants.
    #[command(flatten)]
    directory: DirectoryArgs,
    /// The node's state directory: the mount keeper's socket and workers, and the plugin's
    /// stage records (`csi/`). It must outlive the plugin's container.
    #[arg(long, default_value = "/var/lib/dpufs")]
    state_dir: PathBuf,
    /// The node agent's signing key (PEM, made on first use; the engines trust its public
    /// half). Default: `<state-dir>/agent.key`.
    #[arg(long)]
    agent_key: Option<PathBuf>,
    /// Lifetime of the capabilities signed for workers; renewed at a third of it. At most a
    /// day, the longest the engines accept.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(3..=86400))]
    capability_ttl_secs: u64,
    /// How often the QoS limits of staged volumes are re-read from DAOS (what
    /// ControllerModifyVolume changed reaches the workers within this and one second).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    qos_refresh_secs: u64,
    /// How to start the mount keeper when none answers.
    #[arg(long, value_enum, default_value = "auto")]
    keeper_start: KeeperStart,
    /// `max_volumes_per_node`: volumes (workers) this node stages at most.
    #[arg(long, default_value_t = 64)]
    max_volumes: i64,
    /// The uids this node gives tenants, FIRST-LAST, one per tenant: the workers of volumes
    /// of DAOS systems with `backend: daos` run as their tenant's uid, which the node's
    /// daos_agent must map to the tenant's DAOS user (the mapping is recorded in
    /// <state-dir>/csi/tenant-uids.json, with agent-user-map.yaml beside it;
    /// docs/real-daos.md). Not needed for the embedded engine's volumes.
    #[arg(long, value_name = "FIRST-LAST")]
    tenant_uids: Option<dpufs_csi::csi::node::uids::UidRange>,
    /// The workers' fabric.
    #[command(flatten)]
    fabric: FabricArgs,
}

/// The node plugin's flags in dpu-host mode.
#[derive(Args, Debug)]
struct DpuHostArgs {
    /// The DPU agent's address, HOST:PORT. Default: the InternalIP of the Node labelled
    /// provisioning.dpu.nvidia.com/host=<--node-id> (through the API server), port
    /// --dpu-agent-port.
    #[arg(long)]
    dpu_agent: Option<String>,
    /// The agent's port when its address comes from the API server.
    #[arg(long, default_value_t = 9640)]
    dpu_agent_port: u16,
    /// The name the agent's certificate must carry (a subject alternative name). Default: the
    /// host part of the agent's address.
    #[arg(long)]
    tls_server_name: Option<String>,
    /// The control channel's certificates: ca.crt, host.crt, host.key of `dpufs certs dpu`.
    #[command(flatten)]
    tls: TlsArgs,
}

/// What a node that stages volumes runs besides its services: the directory, the keeper (adopted
/// or started), the node agent renewing capabilities, QoS refreshes.
struct Staging {
    stager: Stager,
    /// Renewals and QoS refreshes; aborted when dropped.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Staging {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl StagingArgs {
    /// Opens the directory (a Kubernetes one in the cluster of `cluster` when given, else the
    /// in-cluster configuration's or $KUBECONFIG's), loads the agent key, adopts or starts the
    /// keeper, and starts the renewals and refreshes on the current runtime.
    async fn start(&self, cluster: Option<kube::Client>) -> Result<Staging> {
        use dpufs_csi::csi::node::agent::NodeAgent;
        let directory = self.directory.open_in(cluster).await?;
        let key = self
            .agent_key
            .clone()
            .unwrap_or_else(|| self.state_dir.join("agent.key"));
        let agent = NodeAgent::load(&key, Duration::from_secs(self.capability_ttl_secs))
            .map_err(anyhow::Error::msg)?;
        let binary = std::env::current_exe().context("this binary's path")?;
        let (state_dir, how) = (self.state_dir.clone(), self.keeper_start);
        let found =
            tokio::task::spawn_blocking(move || ensure_keeper(&state_dir, &binary, how)).await??;
        tracing::info!(?found, state_dir = %self.state_dir.display(), "mount keeper");
        let records = Stager::records_dir_in(&self.state_dir);
        let uids = dpufs_csi::csi::node::uids::TenantUids::open(&records, self.tenant_uids)?;
        let stager = Stager::new(
            self.state_dir.clone(),
            directory.clone(),
            agent.clone(),
            self.max_volumes,
            self.fabric.to_args(),
            std::sync::Arc::new(uids),
        );
        let tasks = vec![
            tokio::spawn(agent.renew_forever(records.clone())),
            tokio::spawn(dpufs_csi::csi::qos::refresh_forever(
                directory,
                records,
                Duration::from_secs(self.qos_refresh_secs),
            )),
        ];
        Ok(Staging { stager, tasks })
    }
}

fn node(a: NodeArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match a.mode {
            NodeMode::Host => node_host(a).await,
            NodeMode::DpuHost => node_dpu_host(a).await,
        }
    })
}

async fn node_host(a: NodeArgs) -> Result<()> {
    let staging = a.staging.start(None).await?;
    let directory = staging.stager.directory().clone();
    let config = dpufs_csi::csi::NodeConfig {
        node_id: a.node_id.clone(),
        mount_root: a.mount_root.clone(),
    };
    let service = dpufs_csi::csi::NodeService::new(config, staging.stager.clone());
    dpufs_csi::csi::server::serve_node_until(
        &a.endpoint,
        service,
        move || directory.ready(),
        dpufs_csi::csi::server::stop_signal(),
    )
    .await?;
    Ok(())
}

async fn node_dpu_host(a: NodeArgs) -> Result<()> {
    use dpufs_csi::dpu::shim::{AgentAddress, AgentLink, ShimConfig, ShimService};
    let connector = dpufs_csi::dpu::tls::connector(&a.dpu.tls.files()?)?;
    let address = match a.dpu.dpu_agent.clone() {
        Some(addr) => AgentAddress::Given(addr),
        None => AgentAddress::Paired {
            kube: kube::Client::try_default()
                .await
                .context("the Kubernetes API (to find this host's DPU; or pass --dpu-agent)")?,
            host: a.node_id.clone(),
            port: a.dpu.dpu_agent_port,
        },
    };
    let link = AgentLink::new(address, connector, a.dpu.tls_server_name.clone());
    tracing::info!(
        ?link,
        "dpu-host mode: volumes are staged by the DPU's agent"
    );
    let config = ShimConfig {
        node_id: a.node_id.clone(),
        state_dir: a.staging.state_dir.clone(),
        max_volumes: a.staging.max_volumes,
        mount_root: a.mount_root.clone(),
    };
    dpufs_csi::csi::server::serve_node_until(
        &a.endpoint,
        ShimService::new(config, link),
        || true,
        dpufs_csi::csi::server::stop_signal(),
    )
    .await?;
    Ok(())
}

#[derive(Args, Debug)]
struct DpuAgentArgs {
    /// The control channel's address.
    #[arg(long, default_value = "0.0.0.0:9640")]
    listen: std::net::SocketAddr,
    /// The control channel's certificates: ca.crt, agent.crt, agent.key of `dpufs certs dpu`.
    #[command(flatten)]
    tls: TlsArgs,
    /// The DPU's Kubernetes node name.
    #[arg(long, env = "NODE_ID")]
    node_id: String,
    /// The host node this DPU serves. Default: the DPU Node's label
    /// provisioning.dpu.nvidia.com/host (DPF's pairing), read from the cluster the agent runs
    /// in (in-cluster configuration or $KUBECONFIG).
    #[arg(long)]
    host_node: Option<String>,
    /// A kubeconfig of the cluster where the host's pods, claims and PersistentVolumes live
    /// (and, with --directory kubernetes, the dpufs resources), when it is not the cluster the
    /// agent runs in: under DPF the DPU is a Node of its own cluster. Default: the cluster the
    /// agent runs in.
    #[arg(long)]
    host_cluster_kubeconfig: Option<PathBuf>,
    /// How devices reach the host: none, qmp:/path/to/qmp.sock (QEMU's monitor: hot-plug), or
    /// snap (DOCA SNAP virtio-fs; needs the cargo feature snap and a BlueField).
    #[arg(long, default_value = "none")]
    attach: AttachSpec,
    /// Also serve NVIDIA DPF's storage plugin (`dfs.dpufs.io`) for SNAP's node driver on this
    /// unix socket; without a value, where SNAP looks for it:
    /// /var/lib/nvidia/storage/snap/plugins/dfs.dpufs.io/dpu.sock.
    #[arg(long, num_args = 0..=1, default_missing_value = dpufs_csi::dpf::DEFAULT_SOCKET)]
    dpf_socket: Option<PathBuf>,
    /// What stages volumes: as the node plugin's.
    #[command(flatten)]
    staging: StagingArgs,
}

fn dpu_agent(a: DpuAgentArgs) -> Result<()> {
    use dpufs_csi::dpf::AgentDevices;
    use dpufs_csi::dpu::agent::{Agent, Pairing, service};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let acceptor = dpufs_csi::dpu::tls::acceptor(&a.tls.files()?)?;
        let attach = a.attach.open()?;
        let own_cluster = || async {
            kube::Client::try_default()
                .await
                .context("the Kubernetes API of the cluster the agent runs in")
        };
        let host_cluster = match &a.host_cluster_kubeconfig {
            Some(path) => client_of(path)
                .await
                .with_context(|| format!("--host-cluster-kubeconfig {}", path.display()))?,
            None => own_cluster().await?,
        };
        let pairing = match &a.host_node {
            Some(host) => Pairing::Given(host.clone()),
            None => Pairing::Label(own_cluster().await.context(
                "reading this DPU's pairing label from its own Node (or pass --host-node)",
            )?),
        };
        let staging = a.staging.start(Some(host_cluster.clone())).await?;
        let agent = std::sync::Arc::new(Agent::new(
            staging.stager.clone(),
            host_cluster,
            pairing,
            attach.into(),
            a.node_id.clone(),
        ));
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        let control = async {
            service::serve(
                agent.clone(),
                listener,
                acceptor,
                dpufs_csi::csi::server::stop_signal(),
            )
            .await?;
            anyhow::Ok(())
        };
        // Beside the control channel, over the same agent; a socket it cannot serve on stops
        // the agent at start rather than leave SNAP without its plugin.
        let plugin = async {
            if let Some(socket) = &a.dpf_socket {
                let devices = AgentDevices::new(agent.clone(), &a.staging.state_dir);
                let stop = dpufs_csi::csi::server::stop_signal();
                dpufs_csi::dpf::serve_until(socket, std::sync::Arc::new(devices), stop)
                    .await
                    .with_context(|| format!("the DPF storage plugin on {}", socket.display()))?;
            }
            anyhow::Ok(())
        };
        tokio::try_join!(control, plugin)?;
        drop(staging);
        Ok(())
    })
}

/// An API client of the cluster the kubeconfig at `path` names (its current context).
async fn client_of(path: &std::path::Path) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// How a worker reaches the engine's data service (a worker's own flags; the node plugin
/// passes its values on to every worker it starts).
#[derive(Args, Debug, Clone)]
struct FabricArgs {
    /// The fabric provider: `soft` (the node's software RDMA device) or `verbs` (the RDMA
    /// device $DPUFS_RDMA_DEVICE names, else the first; needs a build with the `rdma`
    /// feature).
    #[arg(long, default_value = "soft")]
    fabric_provider: ProviderKind,
    /// The node's software device (soft provider).
    #[arg(long, default_value = "dpufs-node")]
    fabric_device: String,
    /// The software device directory (default: $DPUFS_FABRIC_DIR, else /dev/shm/dpufs-fabric).
    #[arg(long)]
    fabric_dir: Option<PathBuf>,
}

impl FabricArgs {
    /// The provider these flags name.
    fn provider(&self) -> Provider {
        let mut device = DeviceOptions::new(self.fabric_device.clone());
        if let Some(dir) = &self.fabric_dir {
            device = device.in_dir(dir);
        }
        Provider::new(self.fabric_provider, device)
    }

    /// The same flags on a worker's command line.
    fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--fabric-provider".to_string(),
            self.fabric_provider.to_string(),
            "--fabric-device".to_string(),
            self.fabric_device.clone(),
        ];
        if let Some(dir) = &self.fabric_dir {
            args.extend(["--fabric-dir".to_string(), dir.display().to_string()]);
        }
        args
    }
}

#[derive(Args, Debug)]
struct ControllerArgs {
    /// The CSI endpoint, unix:///path/to/csi.sock.
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: String,
    /// Where the controller finds DAOS systems, pools and tenants.
    #[command(flatten)]
    directory: DirectoryArgs,
}

fn controller(a: ControllerArgs) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let directory = a.directory.open().await?;
            dpufs_csi::csi::serve_controller(&a.endpoint, directory).await?;
            Ok(())
        })
}

#[derive(Args, Debug)]
struct LauncherArgs {
    /// The keeper's state directory.
    #[arg(long)]
    state_dir: PathBuf,
    /// How to start a keeper when none answers.
    #[arg(long, value_enum, default_value = "auto")]
    keeper_start: KeeperStart,
    /// A volume to serve, NAME=MOUNTPOINT; the worker's arguments follow `--`.
    #[arg(long, value_parser = parse_volume, requires = "worker_args")]
    volume: Option<(String, PathBuf)>,
    /// The worker's arguments (backend, caching) for --volume.
    #[arg(last = true)]
    worker_args: Vec<String>,
}

fn parse_volume(s: &str) -> Result<(String, PathBuf), String> {
    let (name, mp) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: use NAME=MOUNTPOINT"))?;
    Ok((name.to_string(), PathBuf::from(mp)))
}

#[derive(Args, Debug)]
struct KeeperArgs {
    /// The keeper's socket (keeper.sock) and the workers' state directories.
    #[arg(long)]
    state_dir: PathBuf,
    /// The worker binary (default: this one).
    #[arg(long)]
    worker_binary: Option<PathBuf>,
    /// Move into this cgroup (under the root of every hierarchy) before serving, out of
    /// the launcher's (what `dpufs-csi launcher --keeper-start detach` passes).
    #[arg(long)]
    cgroup: Option<String>,
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("source").required(true).multiple(true).args(["mountpoint", "fuse_fd", "vhost_user_socket", "keeper"]))]
struct WorkerArgs {
    /// The DFS to serve: `local:<dir>` (a local directory), `engine:<ip>:<port>` (the
    /// container named by --capability, on the engine data service at that fabric address)
    /// or `daos:<pool>/<container>` (a POSIX container of a real DAOS system, through libdfs
    /// from --daos-lib and the node's daos_agent at $DAOS_AGENT_DRPC_DIR).
    #[arg(long)]
    backend: BackendSpec,
    /// With a daos: backend: the directory holding DAOS's client libraries (libdfs.so).
    #[arg(long, env = "DPUFS_DAOS_LIB")]
    daos_lib: Option<PathBuf>,
    /// With an engine: backend: the file holding the node agent's signed capability (hex).
    /// Re-read when it changes, so the agent can renew it.
    #[arg(long)]
    capability: Option<PathBuf>,
    /// With an engine: backend: its fabric.
    #[command(flatten)]
    fabric: FabricArgs,
    /// Mount here (as root). With --fuse-fd: where that connection is mounted (for the
    /// readahead setting and reports only; never accessed).
    #[arg(long)]
    mountpoint: Option<PathBuf>,
    /// Serve this inherited, already mounted /dev/fuse descriptor instead of mounting.
    #[arg(long, conflicts_with = "keeper")]
    fuse_fd: Option<i32>,
    /// How the volume is served: `fuse` (/dev/fuse on this kernel) or `vhost-user-fs`
    /// (virtio-fs to the frontend, a VMM or DOCA SNAP, that connects to
    /// --vhost-user-socket or to the keeper's export).
    #[arg(long, default_value = "fuse")]
    transport: Transport,
    /// Listen for vhost-user-fs frontends here (a stale socket file is replaced), serving one
    /// at a time.
    #[arg(long, conflicts_with_all = ["mountpoint", "fuse_fd", "keeper"])]
    vhost_user_socket: Option<PathBuf>,
    /// Take the volume from the mount keeper at this socket: its FUSE connection, or its
    /// export's vhost-user socket.
    #[arg(long, requires = "volume", conflicts_with = "mountpoint")]
    keeper: Option<PathBuf>,
    /// The volume to take from the keeper.
    #[arg(long, requires = "keeper")]
    volume: Option<String>,
    /// Control socket (control.sock) and state files.
    #[arg(long)]
    state_dir: PathBuf,
    /// Request threads: FUSE readers (each on its own cloned /dev/fuse descriptor), or the
    /// threads answering a vhost-user-fs frontend's requests.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Drop to this uid after setup (needs --fuse-fd).
    #[arg(long, requires = "gid")]
    uid: Option<u32>,
    /// Drop to this gid after setup (needs --fuse-fd).
    #[arg(long, requires = "uid")]
    gid: Option<u32>,
    /// RLIMIT_NOFILE to run with (default: the hard limit).
    #[arg(long)]
    max_open_files: Option<u64>,
    /// RLIMIT_NPROC to run with (per uid: use with a per-tenant --uid).
    #[arg(long)]
    max_procs: Option<u64>,
    /// Who writes the volume: multi-writer (RWX), single-writer (RWO) or read-only (ROX).
    #[arg(long, default_value = "multi-writer")]
    access: AccessMode,
    /// Seconds the kernel may cache attributes (default: 1, or 60 with --access single-writer).
    #[arg(long)]
    attr_ttl: Option<f64>,
    /// Seconds the kernel may cache name lookups (default: 1, or 60 with --access
    /// single-writer).
    #[arg(long)]
    entry_ttl: Option<f64>,
    /// Seconds the kernel may cache "no such file" (0: never; default: 0, or 60 with --access
    /// single-writer).
    #[arg(long)]
    negative_ttl: Option<f64>,
    /// Page cache for file data: on, or off (every read and write reaches the worker).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    data_cache: String,
    /// Kernel writeback cache (needs --access single-writer); write errors then surface at
    /// fsync/close.
    #[arg(long)]
    writeback_cache: bool,
    /// Readahead of the mount in KiB (0: kernel default, 128).
    #[arg(long, default_value_t = 1024)]
    read_ahead_kb: u32,
    /// Mount source name (in /proc/mounts).
    #[arg(long, default_value = "dpufs")]
    fsname: String,
    /// Do not let other users into the mount (when mounting).
    #[arg(long)]
    no_allow_other: bool,
    /// The volume's QoS file (`{"maxThroughputMiBps":…,"maxIops":…}`, written by the node
    /// plugin): caps on reads and writes, re-read every second. Without it: no caps.
    #[arg(long)]
    qos: Option<PathBuf>,
}

/// Two reader threads per CPU, 4..16: a reader blocks for a whole engine round trip, so with
/// one per CPU the engine would see no more requests in flight than there are CPUs, however
/// many application threads wait in the kernel's queue.
fn default_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cpus * 2).clamp(4, 16)
}

fn secs(v: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("--{what} {v}"))
}

/// Blocks the stop signals in this thread (and every thread it starts), so one thread can
/// take them with sigwait.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain signal-mask calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        // The control socket's clients may hang up early.
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        set
    }
}

fn worker(a: WorkerArgs) -> Result<()> {
    let defaults = FsConfig::for_access(a.access);
    let ttl = |flag: Option<f64>, name: &str, default: Duration| match flag {
        Some(v) => secs(v, name),
        None => Ok(default),
    };
    let fs = FsConfig {
        attr_ttl: ttl(a.attr_ttl, "attr-ttl", defaults.attr_ttl)?,
        entry_ttl: ttl(a.entry_ttl, "entry-ttl", defaults.entry_ttl)?,
        negative_ttl: ttl(a.negative_ttl, "negative-ttl", defaults.negative_ttl)?,
        data_cache: a.data_cache == "on",
        writeback_cache: a.writeback_cache,
        ..defaults
    };
    let source = match (a.fuse_fd, a.mountpoint, a.vhost_user_socket) {
        _ if a.keeper.is_some() => Source::Keeper {
            socket: a.keeper.clone().unwrap_or_default(),
            volume: a.volume.clone().unwrap_or_default(),
        },
        (_, _, Some(socket)) => Source::Listen(socket),
        (Some(fd), mountpoint, None) => Source::Fd { fd, mountpoint },
        (None, Some(mp), None) => Source::Mount(mp),
        (None, None, None) => unreachable!("clap requires one"),
    };
    let cfg = WorkerConfig {
        backend: a.backend.clone(),
        transport: a.transport,
        source,
        state_dir: a.state_dir,
        threads: a.threads,
        fs,
        fsname: a.fsname,
        allow_other: !a.no_allow_other,
        read_ahead_kb: a.read_ahead_kb,
        run_as: a.uid.zip(a.gid),
        limits: Some(Limits {
            nofile: a.max_open_files,
            nproc: a.max_procs,
        }),
        qos: a.qos,
    };
    let signals = block_stop_signals();
    let opts = BackendOptions {
        capability: a.capability,
        provider: a.fabric.provider(),
        daos_lib: a.daos_lib,
        read_only: a.access == AccessMode::ReadOnly,
    };
    let backend = prepare_backend(&a.backend, &opts, a.uid.zip(a.gid))?;
    let w = Worker::start(cfg, backend)?;
    let stop = w.stopper();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            loop {
                let mut sig = 0;
                // SAFETY: waits for one of the signals blocked above.
                if unsafe { libc::sigwait(&signals, &mut sig) } == 0 {
                    tracing::info!("signal {sig}: stopping");
                    stop();
                }
            }
        })?;
    w.wait()
}

fn keeper(a: KeeperArgs) -> Result<()> {
    // SAFETY: ignoring SIGPIPE: clients may hang up before their answer.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let binary = match a.worker_binary {
        Some(b) => b,
        None => std::env::current_exe().context("locating this executable")?,
    };
    if let Some(name) = &a.cgroup {
        let joined = placement::move_to_own_cgroups(name)?;
        tracing::info!("keeper in its own cgroups: {joined:?}");
    }
    Keeper::new(&a.state_dir, binary)?.run()
}

fn launcher(a: LauncherArgs) -> Result<()> {
    let signals = block_stop_signals();
    let pids = placement::ns_pids("self")?;
    println!(
        "launcher pid {} ({} in its PID namespace)",
        pids[0],
        pids[pids.len() - 1]
    );
    let binary = std::env::current_exe().context("locating this executable")?;
    // Kept (not waited for) so a child keeper is not reaped away from under us.
    let _child = match ensure_keeper(&a.state_dir, &binary, a.keeper_start)? {
        KeeperFound::Adopted { pid } => {
            println!("keeper pid {pid} adopted");
            None
        }
        KeeperFound::Started { pid, how, child } => {
            println!("keeper pid {pid} started ({how:?})");
            child
        }
    };
    let list = client::list(&Keeper::socket(&a.state_dir))?;
    for note in &list.recovered {
        println!("keeper recovered: {}", wire::encode(note));
    }
    if let Some((name, mountpoint)) = a.volume {
        let want = WantedVolume {
            name: name.clone(),
            attachment: Attachment::Mount(mountpoint.clone()),
            worker_args: a.worker_args,
        };
        match ensure_volume(&a.state_dir, &want)? {
            VolumeState::Adopted { pid, generation } => println!(
                "volume {name} at {}: worker pid {pid} adopted (generation {generation})",
                mountpoint.display()
            ),
            VolumeState::Started { pid } => println!(
                "volume {name} at {}: worker pid {pid} started",
                mountpoint.display()
            ),
        }
    }
    println!("launcher ready");
    let mut sig = 0;
    // SAFETY: waits for one of the signals blocked above.
    unsafe { libc::sigwait(&signals, &mut sig) };
    println!("launcher stopping (signal {sig}); the volumes stay mounted");
    Ok(())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // The node plugin in dpu-host mode reads no directory: --directory is required for the
    // other commands and for host mode (checked when it opens the directory).
    let command =
        Cli::command().mut_subcommand("node", |c| c.mut_arg("directory", |a| a.required(false)));
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    let r = match cli.cmd {
        Cmd::Worker(a) => worker(*a),
        Cmd::Keeper(a) => keeper(a),
        Cmd::Launcher(a) => launcher(a),
        Cmd::Controller(a) => controller(a),
        Cmd::Node(a) => node(*a),
        Cmd::DpuAgent(a) => dpu_agent(*a),
    };
    if let Err(e) = r {
        eprintln!("dpufs-csi: {e:#}");
        std::process::exit(1);
    }
}
