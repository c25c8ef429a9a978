//! The DPU-mode bed: three machines on one, as network namespaces (docs/dpu.md, "What was
//! tested here").
//!
//! - `storage`: the engine (management and fabric data service), on the storage link only.
//! - the DPU: the test's own namespace, the one with a link to each side, as a BlueField has
//!   ports on both networks: the CSI controller, the mount keeper, the workers, the
//!   `dpufs-csi dpu-agent`, the fake API server, and the other worker that reads volumes back.
//! - `host`: QEMU, whose guest is the host (`host::HostGuest`); it has a link to the DPU only.
//!
//! The agent's and the workers' software fabric device is not the engine's (another device
//! directory, as another node has another NIC), so every fabric connection crosses the
//! storage link.

pub mod host;

use dpufs_e2e::EngineNetwork;
use dpufs_e2e::csi_bed::{Bed, BedOptions, wait_until};
use dpufs_e2e::netns::{End, Netns, veth};
use dpufs_fabric::session::{Capability, Rights};
use dpufs_kube::testing::FakeApiServer;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The DPU's Kubernetes node and the host it is paired with (DPF's label).
pub const DPU_NODE: &str = "dpu-1";
pub const HOST_NODE: &str = "host-1";

/// The namespaces and addresses of one bed.
#[derive(Debug)]
pub struct Topology {
    pub storage: Netns,
    pub host: Netns,
    /// The engine's address on the storage link.
    pub engine_ip: Ipv4Addr,
    /// The DPU's address on the storage link.
    pub dpu_storage_ip: Ipv4Addr,
    /// The DPU's address on the host link: the agent's control channel, the API server.
    pub dpu_host_ip: Ipv4Addr,
    /// The host's address on the host link.
    pub host_ip: Ipv4Addr,
}

impl Topology {
    /// Two namespaces and two links; subnets and names of their own per process and bed.
    pub fn create() -> Topology {
        static BEDS: AtomicU32 = AtomicU32::new(0);
        let n = BEDS.fetch_add(1, Ordering::Relaxed) % 4;
        let pid = std::process::id();
        let third = u8::try_from((pid % 60) * 4 + n).expect("below 240");
        let tag = format!("{}{n}", pid % 10_000);
        let storage = Netns::create(&format!("dpufs-storage-{tag}")).expect("storage namespace");
        let host = Netns::create(&format!("dpufs-host-{tag}")).expect("host namespace");
        let net = |second: u8, last: u8| Ipv4Addr::new(10, second, third, last);
        let topology = Topology {
            engine_ip: net(218, 1),
            dpu_storage_ip: net(218, 2),
            dpu_host_ip: net(219, 1),
            host_ip: net(219, 2),
            storage,
            host,
        };
        let cidr = |ip: Ipv4Addr| format!("{ip}/24");
        veth(
            End {
                ifname: &format!("dps{tag}"),
                netns: Some(&topology.storage),
                cidr: &cidr(topology.engine_ip),
            },
            End {
                ifname: &format!("dpd{tag}"),
                netns: None,
                cidr: &cidr(topology.dpu_storage_ip),
            },
        )
        .expect("the storage link");
        veth(
            End {
                ifname: &format!("dph{tag}"),
                netns: Some(&topology.host),
                cidr: &cidr(topology.host_ip),
            },
            End {
                ifname: &format!("dpe{tag}"),
                netns: None,
                cidr: &cidr(topology.dpu_host_ip),
            },
        )
        .expect("the host link");
        topology
    }

    /// Where the engine runs.
    pub fn engine_network(&self) -> EngineNetwork {
        EngineNetwork {
            netns: self.storage.path(),
            ip: self.engine_ip.into(),
        }
    }
}

/// Everything on the DPU's side and the engine; the guest comes on top (`host::HostGuest`).
pub struct DpuBed {
    /// The engine (in `storage`), the controller, the directory, the node agent key and the
    /// state directory the keeper and the agent share.
    pub bed: Bed,
    pub fake: FakeApiServer,
    serving: tokio::task::JoinHandle<()>,
    /// `http://<dpu_host_ip>:<port>`: the agent and the host's shim ask it.
    pub api_url: String,
    pub certs: PathBuf,
    keeper: Child,
    agent: Option<Child>,
    /// The agent's control channel, on the host link.
    pub agent_addr: SocketAddr,
    /// The DPU's software fabric device directory (not the engine's).
    pub fabric_dir: PathBuf,
    binary: PathBuf,
    // Last: the namespaces go after every process in them.
    pub net: Topology,
}

impl std::fmt::Debug for DpuBed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DpuBed")
            .field("net", &self.net)
            .field("agent_addr", &self.agent_addr)
            .finish_non_exhaustive()
    }
}

impl Drop for DpuBed {
    fn drop(&mut self) {
        self.serving.abort();
        self.stop_agent();
        // The workers outlive the keeper (they are meant to): a failed test's are ended here.
        for (_, pid) in self.bed.keeper_volumes() {
            if let Some(pid) = pid {
                // SAFETY: plain kill(2) of a worker this bed's keeper started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        let _ = self.keeper.kill();
        let _ = self.keeper.wait();
        let _ = std::fs::remove_dir_all(&self.fabric_dir);
    }
}

impl DpuBed {
    /// The namespaces, the engine in `storage`, the controller, the keeper, the fake API server
    /// with the DPU's Node; the agent starts with [`DpuBed::start_agent`] once the host's QEMU
    /// (its QMP socket) exists.
    pub async fn start() -> DpuBed {
        let net = Topology::create();
        let binary = dpufs_e2e::binary("dpufs-csi", "dpufs-csi");
        let mut opts = BedOptions::new(&binary);
        opts.node = false;
        opts.log_to_files = true;
        opts.engine_network = Some(net.engine_network());
        let bed = Bed::start(opts).await;
        let certs = bed.path("certs");
        dpu_certs(&certs, net.dpu_host_ip);
        let fake = FakeApiServer::new();
        let listener = tokio::net::TcpListener::bind((net.dpu_host_ip, 0))
            .await
            .expect("the API server's port");
        let api_url = format!("http://{}", listener.local_addr().unwrap());
        let serving = fake.serve_http(listener);
        std::fs::write(bed.path("kubeconfig"), kubeconfig(&api_url)).unwrap();
        let keeper = Command::new(&binary)
            .args(["keeper", "--state-dir"])
            .arg(&bed.state)
            .stdin(Stdio::null())
            .stdout(log(&bed, "keeper"))
            .stderr(log(&bed, "keeper"))
            .spawn()
            .expect("spawn the keeper");
        let socket = bed.state.join("keeper.sock");
        wait_until("the keeper", || socket.exists());
        let agent_addr = SocketAddr::from((net.dpu_host_ip, free_port(net.dpu_host_ip)));
        let fabric_dir = tempfile::Builder::new()
            .prefix("dpufs-e2e-dpu-fabric")
            .tempdir_in("/dev/shm")
            .expect("the DPU's fabric directory")
            .keep();
        let dpu = DpuBed {
            bed,
            fake,
            serving,
            api_url,
            certs,
            keeper,
            agent: None,
            agent_addr,
            fabric_dir,
            binary,
            net,
        };
        dpu.create::<Node>(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": DPU_NODE,
                         "labels": {"provisioning.dpu.nvidia.com/host": HOST_NODE}},
            "status": {"addresses": [{"type": "InternalIP",
                                      "address": dpu.net.dpu_host_ip.to_string()}]}
        }))
        .await;
        dpu
    }

    /// Where the agent finds QEMU's monitor: a link to the running host's QMP socket, as a
    /// VM's monitor socket has one path across the VM's restarts.
    fn qmp_link(&self) -> PathBuf {
        self.bed.path("qmp.sock")
    }

    /// Points the agent at the QMP socket of the host that runs now.
    pub fn host_started(&self, qmp: &Path) {
        let link = self.qmp_link();
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{}: {e}", link.display()),
            _ => {}
        }
        std::os::unix::fs::symlink(qmp, &link).expect("the QMP link");
    }

    /// Starts (or starts again) the agent, hot-plugging through QEMU's monitor
    /// ([`DpuBed::host_started`]), and waits until its port accepts.
    pub fn start_agent(&mut self) {
        let agent = Command::new(&self.binary)
            .arg("dpu-agent")
            .args(["--listen", &self.agent_addr.to_string()])
            .arg("--tls-ca")
            .arg(self.certs.join("ca.crt"))
            .arg("--tls-cert")
            .arg(self.certs.join("agent.crt"))
            .arg("--tls-key")
            .arg(self.certs.join("agent.key"))
            .args(["--node-id", DPU_NODE, "--keeper-start", "never"])
            .arg(format!("--attach=qmp:{}", self.qmp_link().display()))
            .arg("--directory")
            .arg(self.bed.path("directory.json"))
            .arg("--state-dir")
            .arg(&self.bed.state)
            .arg("--agent-key")
            .arg(self.bed.path("agent.key"))
            .arg("--fabric-dir")
            .arg(&self.fabric_dir)
            .env("KUBECONFIG", self.bed.path("kubeconfig"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log(&self.bed, "agent"))
            .stderr(log(&self.bed, "agent"))
            .spawn()
            .expect("spawn the agent");
        self.agent = Some(agent);
        let addr = self.agent_addr;
        wait_until("the agent's port", || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
        });
    }

    /// The agent's pid.
    pub fn agent_pid(&self) -> u32 {
        self.agent.as_ref().expect("the agent runs").id()
    }

    /// kill -9 of the agent.
    pub fn kill_agent(&mut self) {
        let mut agent = self.agent.take().expect("the agent runs");
        dpufs_e2e::kill9(agent.id());
        let _ = agent.wait();
    }

    fn stop_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }

    /// What the agent logged.
    pub fn agent_log(&self) -> String {
        self.bed.log("agent")
    }

    /// The keeper's volumes and their workers' pids, sorted.
    pub fn workers(&self) -> Vec<(String, Option<u32>)> {
        let mut v = self.bed.keeper_volumes();
        v.sort();
        v
    }

    /// The pid of the worker serving volume `id` now, if one does.
    pub fn worker_of_opt(&self, id: &str) -> Option<u32> {
        let name = format!("csi-{}", key(id));
        self.workers()
            .into_iter()
            .find_map(|(v, pid)| (v == name).then_some(pid).flatten())
    }

    /// The pid of the worker serving volume `id`.
    pub fn worker_of(&self, id: &str) -> u32 {
        self.worker_of_opt(id)
            .unwrap_or_else(|| panic!("no worker serves {id}: {:?}", self.workers()))
    }

    /// The agent's stage records (volume ids).
    pub fn records(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .bed
            .records()
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter_map(|p| std::fs::read(p).ok())
            .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
            .filter_map(|v| v["volumeId"].as_str().map(str::to_string))
            .collect();
        ids.sort();
        ids
    }

    /// Creates an object in the fake API server and returns it as the server has it.
    pub async fn create<K>(&self, object: Value) -> K
    where
        K: kube::Resource + DeserializeOwned,
        K::DynamicType: Default,
    {
        let resource = ApiResource::erase::<K>(&Default::default());
        let o: DynamicObject = serde_json::from_value(object).expect("a valid object");
        let api: Api<DynamicObject> = match o.metadata.namespace.as_deref() {
            Some(ns) => Api::namespaced_with(self.fake.client(), ns, &resource),
            None => Api::all_with(self.fake.client(), &resource),
        };
        let created = api
            .create(&PostParams::default(), &o)
            .await
            .expect("create");
        serde_json::from_value(serde_json::to_value(created).unwrap()).expect("the object back")
    }

    /// A pod `namespace/name` on the host using volume `volume_id` through a claim bound to
    /// a PersistentVolume of the driver; returns the pod's UID.
    pub async fn pod_with_volume(&self, namespace: &str, name: &str, volume_id: &str) -> String {
        let claim = format!("{name}-data");
        let pv = format!("pv-{namespace}-{name}");
        let pvc: PersistentVolumeClaim = self
            .create(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {"accessModes": ["ReadWriteMany"], "volumeName": pv,
                         "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Bound"}
            }))
            .await;
        let _: PersistentVolume = self
            .create(json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": pv},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                         "csi": {"driver": "dfs.dpufs.io", "volumeHandle": volume_id},
                         "claimRef": {"namespace": namespace, "name": claim,
                                      "uid": pvc.metadata.uid}}
            }))
            .await;
        let pod: Pod = self
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"nodeName": HOST_NODE,
                         "containers": [{"name": "c", "image": "busybox"}],
                         "volumes": [{"name": "data",
                                      "persistentVolumeClaim": {"claimName": claim}}]}
            }))
            .await;
        pod.metadata.uid.expect("a UID")
    }

    /// Mounts volume `id`'s container on the DPU through another worker of its own (its own
    /// tenant session over the storage link, a read-only capability the node agent key signs),
    /// at `<bed>/<name>`. The mount goes when the reader is dropped.
    pub fn reader(&self, id: &str, principal: &str, name: &str) -> Reader {
        let (pool, container) = pool_and_container(id);
        let claims = Capability::new(
            principal,
            id,
            pool,
            container,
            Rights::READ_ONLY,
            Duration::from_secs(600),
        );
        let cap = self.bed.vol.agent.sign(&claims).expect("sign");
        let cap_file = self.bed.path(&format!("{name}.cap"));
        dpufs_e2e::write_file_atomic(&cap_file, cap.to_hex().as_bytes());
        let mountpoint = self.bed.path(name);
        std::fs::create_dir_all(&mountpoint).unwrap();
        let child = Command::new(&self.binary)
            .arg("worker")
            .arg("--backend")
            .arg(format!("engine:{}", self.bed.vol.fabric_addr()))
            .arg("--capability")
            .arg(&cap_file)
            .arg("--fabric-dir")
            .arg(&self.fabric_dir)
            .args(["--access", "read-only", "--mountpoint"])
            .arg(&mountpoint)
            .arg("--state-dir")
            .arg(self.bed.path(&format!("{name}.state")))
            .stdin(Stdio::null())
            .stdout(log(&self.bed, name))
            .stderr(log(&self.bed, name))
            .spawn()
            .expect("spawn the reader");
        wait_until("the reader's mount", || {
            dpufs_e2e::csi_bed::mounted(&mountpoint)
        });
        Reader { child, mountpoint }
    }
}

/// A worker on the DPU that mounted a container by itself.
#[derive(Debug)]
pub struct Reader {
    child: Child,
    pub mountpoint: PathBuf,
}

impl Drop for Reader {
    fn drop(&mut self) {
        // SIGTERM: the worker stops and its mount goes with it.
        // SAFETY: plain kill(2) of our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        dpufs_e2e::csi_bed::force_unmount(&self.mountpoint);
    }
}

/// The 24 hex digits that name volume `id`'s files, keeper volume (`csi-<key>`) and virtio-fs
/// tag (`dpufs-` and the first 13) on the DPU (docs/dpu.md, "Devices").
pub fn key(id: &str) -> String {
    openssl::sha::sha256(id.as_bytes())[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The virtio-fs tag of volume `id`.
pub fn tag(id: &str) -> String {
    format!("dpufs-{}", &key(id)[..13])
}

/// `v1/<system>/<pool>/<container>`.
fn pool_and_container(id: &str) -> (String, String) {
    let parts: Vec<&str> = id.split('/').collect();
    assert_eq!(parts.len(), 4, "a volume id: {id}");
    (parts[2].to_string(), parts[3].to_string())
}

/// `M <label> d <path>` and `M <label> f <path> <size> <sha256>` for every entry under `root`,
/// paths as `find .` prints them, in byte order: what the guest's `manifest` prints.
pub fn manifest(label: &str, root: &Path) -> Vec<String> {
    let mut paths = vec![PathBuf::from(".")];
    let mut i = 0;
    while i < paths.len() {
        let path = root.join(&paths[i]);
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read_dir") {
                paths.push(paths[i].join(entry.expect("entry").file_name()));
            }
        }
        i += 1;
    }
    paths.sort_by(|a, b| {
        a.as_os_str()
            .as_encoded_bytes()
            .cmp(b.as_os_str().as_encoded_bytes())
    });
    paths
        .into_iter()
        .map(|rel| {
            let path = root.join(&rel);
            if path.is_dir() {
                format!("M {label} d {}", rel.display())
            } else {
                let bytes = std::fs::read(&path).expect("read");
                format!(
                    "M {label} f {} {} {}",
                    rel.display(),
                    bytes.len(),
                    sha(&bytes)
                )
            }
        })
        .collect()
}

pub fn sha(bytes: &[u8]) -> String {
    openssl::sha::sha256(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// User and system CPU time of process `pid` so far, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    // After the command name's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ").expect("a stat line").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf cannot fail for _SC_CLK_TCK.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// `dpufs certs dpu DIR --agent-host IP`: the real command.
fn dpu_certs(dir: &Path, agent_ip: Ipv4Addr) {
    let out = Command::new(dpufs_e2e::binary("dpufs", "dpufs"))
        .args(["certs", "dpu"])
        .arg(dir)
        .args(["--agent-host", &agent_ip.to_string()])
        .output()
        .expect("run dpufs certs dpu");
    assert!(
        out.status.success(),
        "dpufs certs dpu: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A kubeconfig for the fake API server at `url` (no authentication).
pub fn kubeconfig(url: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        "current-context": "fake"
    })
    .to_string()
}

fn free_port(ip: Ipv4Addr) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn log(bed: &Bed, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(bed.path(&format!("{name}.log")))
        .expect("open the log")
}
