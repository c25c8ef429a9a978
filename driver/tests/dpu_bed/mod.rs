//! The DPU-mode test bed: the CSI bed's engine and controller (to create volumes), the node's
//! mount keeper, `dpufs-csi dpu-agent` on TCP with certificates from `dpufs certs dpu`, and the
//! in-repo fake API server served over HTTP to the agent, holding the DPU's Node and the
//! pods, claims and PersistentVolumes the agent checks. With [`Clusters::Two`] the DPU's Node
//! is in a fake API server of its own (the DPU cluster, as under DPF), and the agent reaches
//! the other (the host cluster) through `--host-cluster-kubeconfig`.
#![allow(dead_code)]

use dpufs_csi::dpu::tls;
use dpufs_e2e::csi_bed::{Bed, BedOptions, wait_until};
use dpufs_kube::testing::FakeApiServer;
use dpufs_kube::testing::rbac::ApiCall;
use dpufs_node_api::keeper::VolumeStatus;
use dpufs_proto::dpu::v1::dpu_agent_client::DpuAgentClient;
use dpufs_proto::dpu::v1::{self as pb};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use tonic::transport::Channel;

/// The DPU's node, and the host it is paired with.
pub const DPU_NODE: &str = "dpu-1";
pub const HOST_NODE: &str = "host-1";
/// The users the agent's and the shim's API calls are recorded for.
pub const AGENT_USER: &str = "dpufs-dpu-agent";
pub const SHIM_USER: &str = "dpufs-host-shim";

/// The chart's RBAC components (tools/chart/api-calls.yaml): the agent's calls in the host
/// cluster, its call in the cluster it runs in, and the shim's.
pub const AGENT_COMPONENT: &str = "dpu-agent";
pub const AGENT_NODE_COMPONENT: &str = "dpu-agent-node";
pub const SHIM_COMPONENT: &str = "dpu-shim";

/// Where the DPU's Node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clusters {
    /// Hosts and DPUs are Nodes of one cluster.
    One,
    /// The DPU is a Node of a cluster of its own (DPF's DPU cluster); the pods, claims and
    /// PersistentVolumes are in the host cluster.
    Two,
}

/// `dpufs certs dpu DIR --agent-host 127.0.0.1`: the real command.
pub fn certs(dir: &Path) {
    let dpufs = dpufs_e2e::binary("dpufs", "dpufs");
    let out = Command::new(&dpufs)
        .args(["certs", "dpu"])
        .arg(dir)
        .args(["--agent-host", "127.0.0.1"])
        .output()
        .expect("run dpufs certs dpu");
    assert!(
        out.status.success(),
        "dpufs certs dpu: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The host's (or any side's) TLS files in a `dpufs certs dpu` directory.
pub fn files(dir: &Path, side: &str) -> tls::TlsFiles {
    tls::TlsFiles {
        ca: dir.join("ca.crt"),
        cert: dir.join(format!("{side}.crt")),
        key: dir.join(format!("{side}.key")),
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Engine, controller, keeper, fake API server(s) and agent.
pub struct DpuBed {
    pub bed: Bed,
    /// The host cluster: pods, claims, PersistentVolumes (and with [`Clusters::One`] the
    /// DPU's Node).
    pub fake: FakeApiServer,
    /// With [`Clusters::Two`], the cluster the agent runs in, holding the DPU's Node.
    pub dpu_cluster: Option<FakeApiServer>,
    serving: Vec<tokio::task::JoinHandle<()>>,
    /// The agent's kubeconfig of the cluster it runs in ($KUBECONFIG).
    pub kubeconfig: PathBuf,
    /// With [`Clusters::Two`], its `--host-cluster-kubeconfig`.
    pub host_kubeconfig: Option<PathBuf>,
    pub certs: PathBuf,
    pub keeper: Child,
    pub agent: Option<Child>,
    pub port: u16,
    binary: PathBuf,
}

impl Drop for DpuBed {
    fn drop(&mut self) {
        for s in &self.serving {
            s.abort();
        }
        if let Some(a) = self.agent.as_mut() {
            let _ = a.kill();
            let _ = a.wait();
        }
        // The workers outlive the keeper (they are meant to): a failed test's are ended here.
        for v in self.keeper_list() {
            if let Some(pid) = v.pid {
                // SAFETY: plain kill(2) of a worker this bed's keeper started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        let _ = self.keeper.kill();
        let _ = self.keeper.wait();
    }
}

impl DpuBed {
    /// Starts everything, hosts and DPUs in one cluster; the agent runs with `--attach none`
    /// and the static directory of the CSI bed (tenants team-a: ns-a, team-b: ns-b).
    pub async fn start() -> DpuBed {
        DpuBed::start_in(Clusters::One).await
    }

    /// The same, the DPU's Node where `clusters` says.
    pub async fn start_in(clusters: Clusters) -> DpuBed {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_dpufs-csi"));
        let mut opts = BedOptions::new(&binary);
        opts.node = false;
        opts.log_to_files = true;
        let bed = Bed::start(opts).await;
        let cert_dir = bed.path("certs");
        certs(&cert_dir);
        let fake = FakeApiServer::new();
        let dpu_cluster = (clusters == Clusters::Two).then(FakeApiServer::new);
        let (kubeconfig, serving) = serve_as(
            dpu_cluster.as_ref().unwrap_or(&fake),
            AGENT_USER,
            &bed.path("agent.kubeconfig"),
        )
        .await;
        let mut servings = vec![serving];
        let host_kubeconfig = match clusters {
            Clusters::One => None,
            Clusters::Two => {
                let (path, serving) =
                    serve_as(&fake, AGENT_USER, &bed.path("host-cluster.kubeconfig")).await;
                servings.push(serving);
                Some(path)
            }
        };
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
        let mut dpu = DpuBed {
            bed,
            fake,
            dpu_cluster,
            serving: servings,
            kubeconfig,
            host_kubeconfig,
            certs: cert_dir,
            keeper,
            agent: None,
            port: free_port(),
            binary,
        };
        dpu.create(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": DPU_NODE, "labels": {"provisioning.dpu.nvidia.com/host": HOST_NODE}},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
        }))
        .await;
        dpu.start_agent();
        dpu
    }

    /// Starts (or starts again) the agent and waits until its port accepts.
    pub fn start_agent(&mut self) {
        let mut command = Command::new(&self.binary);
        command.arg("dpu-agent");
        if let Some(host_cluster) = &self.host_kubeconfig {
            command.arg("--host-cluster-kubeconfig").arg(host_cluster);
        }
        let agent = command
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--tls-ca")
            .arg(self.certs.join("ca.crt"))
            .arg("--tls-cert")
            .arg(self.certs.join("agent.crt"))
            .arg("--tls-key")
            .arg(self.certs.join("agent.key"))
            .args([
                "--node-id",
                DPU_NODE,
                "--attach",
                "none",
                "--keeper-start",
                "never",
            ])
            .arg("--directory")
            .arg(self.bed.path("directory.json"))
            .arg("--state-dir")
            .arg(&self.bed.state)
            .arg("--agent-key")
            .arg(self.bed.path("agent.key"))
            .arg("--fabric-dir")
            .arg(&self.bed.vol.fabric_dir)
            .arg("--dpf-socket")
            .arg(self.dpf_socket())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log(&self.bed, "agent"))
            .stderr(log(&self.bed, "agent"))
            .spawn()
            .expect("spawn the agent");
        self.agent = Some(agent);
        let addr = format!("127.0.0.1:{}", self.port);
        wait_until("the agent's port", || {
            std::net::TcpStream::connect(&addr).is_ok()
        });
    }

    /// The fake API server holding the DPU's Node.
    pub fn node_cluster(&self) -> &FakeApiServer {
        self.dpu_cluster.as_ref().unwrap_or(&self.fake)
    }

    /// A kubeconfig for the shim of the cluster holding the DPU's Node (its calls recorded for
    /// [`SHIM_USER`]).
    pub async fn shim_kubeconfig(&mut self) -> PathBuf {
        let (path, serving) = serve_as(
            self.node_cluster(),
            SHIM_USER,
            &self.bed.path("shim.kubeconfig"),
        )
        .await;
        self.serving.push(serving);
        path
    }

    /// The unix socket the agent serves DPF's storage plugin on (`--dpf-socket`).
    pub fn dpf_socket(&self) -> PathBuf {
        self.bed.path("dpf/dpu.sock")
    }

    /// The agent's address.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A client with the host's certificate.
    pub fn client(&self) -> DpuAgentClient<Channel> {
        client_with(&files(&self.certs, "host"), &self.addr())
    }

    /// Creates an object in the fake API server of its cluster (a Node in the DPU's).
    pub async fn create(&self, object: Value) {
        let kind = object["kind"].as_str().unwrap().to_string();
        let client = match kind.as_str() {
            "Node" => self.node_cluster().client(),
            _ => self.fake.client(),
        };
        let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
        let pp = PostParams::default();
        match kind.as_str() {
            "Node" => {
                let o: Node = serde_json::from_value(object).unwrap();
                Api::<Node>::all(client).create(&pp, &o).await.unwrap();
            }
            "Pod" => {
                let o: Pod = serde_json::from_value(object).unwrap();
                Api::<Pod>::namespaced(client, &ns.unwrap())
                    .create(&pp, &o)
                    .await
                    .unwrap();
            }
            "PersistentVolumeClaim" => {
                let o: PersistentVolumeClaim = serde_json::from_value(object).unwrap();
                Api::<PersistentVolumeClaim>::namespaced(client, &ns.unwrap())
                    .create(&pp, &o)
                    .await
                    .unwrap();
            }
            "PersistentVolume" => {
                let o: PersistentVolume = serde_json::from_value(object).unwrap();
                Api::<PersistentVolume>::all(client)
                    .create(&pp, &o)
                    .await
                    .unwrap();
            }
            other => panic!("the bed makes no {other}"),
        }
    }

    /// A pod `namespace/name` on `node` using claim `claim`, its claim bound to a
    /// PersistentVolume `pv-<namespace>-<name>` of the driver for `volume_id`. Returns its UID.
    pub async fn pod_with_volume(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        volume_id: &str,
    ) -> String {
        let claim = format!("{name}-data");
        let pv = format!("pv-{namespace}-{name}");
        self.create(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeName": pv,
                     "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound"}
        }))
        .await;
        let pvc_uid = Api::<PersistentVolumeClaim>::namespaced(self.fake.client(), namespace)
            .get(&claim)
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap();
        self.create(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                     "csi": {"driver": "dfs.dpufs.io", "volumeHandle": volume_id},
                     "claimRef": {"namespace": namespace, "name": claim, "uid": pvc_uid}}
        }))
        .await;
        self.create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
        }))
        .await;
        Api::<Pod>::namespaced(self.fake.client(), namespace)
            .get(name)
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap()
    }

    /// The keeper's volumes.
    pub fn keeper_list(&self) -> Vec<VolumeStatus> {
        let socket = self.bed.state.join("keeper.sock");
        match dpufs_csi::ipc::keeper::list(&socket) {
            Ok(list) => list.volumes,
            Err(_) => vec![],
        }
    }

    /// The agent's stage records.
    pub fn records(&self) -> Vec<PathBuf> {
        self.bed.records()
    }

    /// What the agent logged.
    pub fn agent_log(&self) -> String {
        self.bed.log("agent")
    }

    /// Fails unless the agent and the shim asked each API server only what the chart grants
    /// them there (tools/chart/api-calls.yaml): in one cluster the agent holds both of its
    /// roles; in two, the host cluster's role there and the node role in its own.
    pub fn assert_calls_granted(&self) {
        use dpufs_kube::testing::rbac::assert_granted;
        match &self.dpu_cluster {
            None => assert_granted_any(
                &self.fake.api_calls(AGENT_USER),
                &[AGENT_COMPONENT, AGENT_NODE_COMPONENT],
            ),
            Some(dpu_cluster) => {
                assert_granted(&self.fake.api_calls(AGENT_USER), AGENT_COMPONENT);
                assert_granted(&dpu_cluster.api_calls(AGENT_USER), AGENT_NODE_COMPONENT);
            }
        }
        assert_granted(&self.node_cluster().api_calls(SHIM_USER), SHIM_COMPONENT);
    }
}

/// Panics, naming each, when `calls` holds a call none of `components` is granted.
fn assert_granted_any(calls: &BTreeSet<ApiCall>, components: &[&str]) {
    let granted: BTreeSet<(String, String, String)> = components
        .iter()
        .flat_map(|c| dpufs_kube::testing::rbac::granted(c))
        .collect();
    let missing: Vec<&ApiCall> = calls
        .iter()
        .filter(|c| !granted.contains(&(c.group.clone(), c.resource.clone(), c.verb.clone())))
        .collect();
    assert!(
        missing.is_empty(),
        "calls tools/chart/api-calls.yaml grants none of {components:?}: {missing:?}"
    );
}

/// Serves `fake` over HTTP, recording calls for `user`; writes a kubeconfig for it to `path`.
async fn serve_as(
    fake: &FakeApiServer,
    user: &str,
    path: &Path,
) -> (PathBuf, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let serving = fake.as_user(user).serve_http(listener);
    std::fs::write(
        path,
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": user, "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": user}}],
            "current-context": "fake"
        })
        .to_string(),
    )
    .unwrap();
    (path.to_path_buf(), serving)
}

pub fn log(bed: &Bed, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(bed.path(&format!("{name}.log")))
        .expect("open the log")
}

/// A client of the agent at `addr` with `files`.
pub fn client_with(files: &tls::TlsFiles, addr: &str) -> DpuAgentClient<Channel> {
    let connector = tls::connector(files).expect("the host's TLS files");
    DpuAgentClient::new(tls::channel(connector, addr, None).expect("a channel"))
}

/// A client that presents no certificate (it trusts the CA at `ca`).
pub fn client_without_certificate(ca: &Path, addr: &str) -> DpuAgentClient<Channel> {
    use openssl::ssl::{SslConnector, SslMethod};
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_ca_file(ca).unwrap();
    b.set_alpn_protos(b"\x02h2").unwrap();
    DpuAgentClient::new(tls::channel(b.build(), addr, None).unwrap())
}

/// A StageVolume request of `host` for the pod `namespace/name/uid`.
pub fn stage_request(
    volume_id: &str,
    host: &str,
    pod: (&str, &str, &str),
) -> pb::StageVolumeRequest {
    pb::StageVolumeRequest {
        volume_id: volume_id.into(),
        access: Some(pb::VolumeAccess {
            mode: pb::AccessMode::MultiNodeMultiWriter as i32,
            read_only: false,
        }),
        volume_context: Default::default(),
        pod: Some(pb::PodRef {
            namespace: pod.0.into(),
            name: pod.1.into(),
            uid: pod.2.into(),
        }),
        host_node: host.into(),
    }
}
