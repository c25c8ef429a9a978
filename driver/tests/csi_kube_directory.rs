//! The Kubernetes directory: `dpufs-csi controller --directory kubernetes` (the real binary,
//! with a kubeconfig) and `KubeDirectory` itself, against the in-repo fake API server
//! (`dpufs_kube::testing`, served over HTTP for the binary) and a real kube-apiserver with
//! etcd (`dpufs_e2e::kube_api`; skipped loudly without its binaries, a failure with
//! `DPUFS_REQUIRE_KUBE=1`). Every scenario runs on both through [`on_both!`].
//!
//! On the real API server the plugin runs as the user `dpufs-csi`, which may do only what the
//! chart grants the driver (`tools/chart/api-calls.yaml`); on the fake, every call it makes is
//! recorded and must be in that list.

use dpufs_api::{DaosPool, DaosSystem, DaosTenant};
use dpufs_csi::csi::directory::{
    Directory, DirectoryError, KubeDirectory, KubeDirectoryConfig, PoolRef, VolumeAccess,
};
use dpufs_daos::{
    ClientConfig, ContainerAdmin, EngineContainers, MgmtClient, PoolSize, PoolSpec, TlsFiles,
};
use dpufs_e2e::kube_api::KubeApiServer;
use dpufs_e2e::{EngineOpts, EngineProcess};
use dpufs_kube::testing::FakeApiServer;
use dpufs_proto::csi::v1::controller_client::ControllerClient;
use dpufs_proto::csi::v1::identity_client::IdentityClient;
use dpufs_proto::csi::v1::node_client::NodeClient;
use dpufs_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use dpufs_proto::csi::v1::{self as csi, VolumeCapability};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// How long a scenario waits for something that should happen.
const WAIT: Duration = Duration::from_secs(60);

/// The user the plugin runs as on the real API server.
const PLUGIN_USER: &str = "dpufs-csi";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Fake,
    Real,
}

/// Runs an `async fn(Backend)` scenario as two tests, `fake` and `real_api_server`, in a
/// module named after it.
macro_rules! on_both {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fake() {
                super::$scenario(super::Backend::Fake).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn real_api_server() {
                super::$scenario(super::Backend::Real).await
            }
        }
    };
}

/// The API server of a scenario, an administrator's client, and what the plugin gets.
struct Cluster {
    server: Server,
    admin: kube::Client,
    dir: tempfile::TempDir,
}

enum Server {
    /// The fake, and the listener its HTTP face will serve on once the plugin may connect.
    Fake {
        fake: FakeApiServer,
        listener: Option<tokio::net::TcpListener>,
        url: String,
        serving: Option<tokio::task::JoinHandle<()>>,
    },
    Real(KubeApiServer),
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Server::Fake { fake, serving, .. } = &self.server {
            if let Some(task) = serving {
                task.abort();
            }
            if !std::thread::panicking() {
                // What the plugin asked is what the chart grants it.
                dpufs_kube::testing::rbac::assert_granted(&fake.api_calls(PLUGIN_USER), "driver");
            }
        }
    }
}

impl Cluster {
    /// Starts the API server (a real one with the dpufs CRDs installed) and creates the
    /// namespaces `names`; `None` when a real one cannot run here (said loudly).
    async fn start(backend: Backend, test: &str, names: &[(&str, Value)]) -> Option<Cluster> {
        let dir = tempfile::tempdir().unwrap();
        let (server, admin) = match backend {
            Backend::Fake => {
                let fake = FakeApiServer::new();
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let url = format!("http://{}", listener.local_addr().unwrap());
                let admin = fake.client();
                let server = Server::Fake {
                    fake,
                    listener: Some(listener),
                    url,
                    serving: None,
                };
                (server, admin)
            }
            Backend::Real => {
                let server = KubeApiServer::start(test)?;
                let admin = server.client().await;
                let warnings = server
                    .install_crds(&admin)
                    .await
                    .expect("installing the CRDs");
                assert!(warnings.is_empty(), "the CRDs warned: {warnings:?}");
                (Server::Real(server), admin)
            }
        };
        let cluster = Cluster { server, admin, dir };
        for (name, labels) in names {
            cluster.create_namespace(name, labels.clone()).await;
        }
        Some(cluster)
    }

    async fn create_namespace(&self, name: &str, labels: Value) {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        Api::<Namespace>::all(self.admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }

    /// Lets the plugin in: on the real server, binds the chart's driver rules to its user; on the
    /// fake, starts answering on the HTTP port it has been connecting to.
    async fn admit_plugin(&mut self) {
        match &mut self.server {
            Server::Fake {
                fake,
                listener,
                serving,
                ..
            } => {
                let listener = listener.take().expect("admitted once");
                *serving = Some(fake.as_user(PLUGIN_USER).serve_http(listener));
            }
            Server::Real(_) => {
                // Exactly what the chart grants the driver (tools/chart/api-calls.yaml, which
                // tools/chart/check.py holds the chart's roles to): a real API server refuses
                // the plugin anything else.
                let rules: Vec<Value> = dpufs_kube::testing::rbac::granted("driver")
                    .into_iter()
                    .map(|(group, resource, verb)| {
                        json!({"apiGroups": [group], "resources": [resource], "verbs": [verb]})
                    })
                    .collect();
                let role: ClusterRole = serde_json::from_value(json!({
                    "metadata": {"name": "dpufs-csi-directory"}, "rules": rules
                }))
                .unwrap();
                Api::<ClusterRole>::all(self.admin.clone())
                    .create(&PostParams::default(), &role)
                    .await
                    .unwrap();
                let binding: ClusterRoleBinding = serde_json::from_value(json!({
                    "metadata": {"name": "dpufs-csi-directory"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "dpufs-csi-directory"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": PLUGIN_USER}]
                }))
                .unwrap();
                Api::<ClusterRoleBinding>::all(self.admin.clone())
                    .create(&PostParams::default(), &binding)
                    .await
                    .unwrap();
            }
        }
    }

    /// The plugin's kubeconfig: the fake's HTTP address, or the real server as
    /// [`PLUGIN_USER`] (the fixture's administrator impersonating it, so the API server
    /// authorizes every request as that user).
    fn plugin_kubeconfig(&self) -> kube::config::Kubeconfig {
        match &self.server {
            Server::Fake { url, .. } => serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "plugin", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "plugin"}}],
                "current-context": "fake"
            }))
            .unwrap(),
            Server::Real(server) => {
                let mut config = kube::config::Kubeconfig::read_from(&server.kubeconfig).unwrap();
                for user in &mut config.auth_infos {
                    if let Some(auth) = user.auth_info.as_mut() {
                        auth.impersonate = Some(PLUGIN_USER.to_string());
                    }
                }
                config
            }
        }
    }

    /// [`Cluster::plugin_kubeconfig`] written to a file, for `KUBECONFIG`.
    fn plugin_kubeconfig_file(&self) -> PathBuf {
        let path = self.dir.path().join("plugin.kubeconfig");
        // JSON is YAML: kubeconfig readers take it.
        let text = serde_json::to_string(&self.plugin_kubeconfig()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A client with the plugin's identity, for a directory in this process.
    async fn plugin_client(&self) -> kube::Client {
        let config =
            kube::Config::from_custom_kubeconfig(self.plugin_kubeconfig(), &Default::default())
                .await
                .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    async fn create<K>(&self, object: Value) -> K
    where
        K: kube::Resource<Scope = kube::core::ClusterResourceScope>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let object: K = serde_json::from_value(object).unwrap();
        Api::<K>::all(self.admin.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap()
    }

    async fn system(&self, name: &str, spec: Value) {
        self.create::<DaosSystem>(json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosSystem",
            "metadata": {"name": name}, "spec": spec
        }))
        .await;
    }

    /// A DaosPool of system `daos`, with the UUID the operator would write into its
    /// status once it created the pool (`None`: not created yet).
    async fn pool(&self, name: &str, uuid: Option<&str>) {
        self.create::<DaosPool>(json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosPool",
            "metadata": {"name": name},
            "spec": {"systemRef": "daos", "size": {"totalBytes": "1Gi"}}
        }))
        .await;
        if let Some(uuid) = uuid {
            self.set_pool_uuid(name, uuid).await;
        }
    }

    /// What the operator does once it created the pool.
    async fn set_pool_uuid(&self, name: &str, uuid: &str) {
        let status = json!({"status": {"uuid": uuid, "state": "Ready"}});
        Api::<DaosPool>::all(self.admin.clone())
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }

    async fn tenant(&self, name: &str, spec: Value) {
        self.create::<DaosTenant>(json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosTenant",
            "metadata": {"name": name}, "spec": spec
        }))
        .await;
    }

    async fn merge<K>(&self, name: &str, patch: Value)
    where
        K: kube::Resource<Scope = kube::core::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Api::<K>::all(self.admin.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

/// A `dpufs-csi` process (a plugin with `--directory kubernetes`, or the node's keeper);
/// killed on drop.
struct Plugin {
    child: Child,
    socket: PathBuf,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Plugin {
    fn spawn(cluster: &Cluster, socket: PathBuf, args: &[&str]) -> Plugin {
        let child = Command::new(env!("CARGO_BIN_EXE_dpufs-csi"))
            .args(args)
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(["--directory", "kubernetes"])
            .arg("--tls-dir")
            .arg(cluster.dir.path().join("tls"))
            .env("KUBECONFIG", cluster.plugin_kubeconfig_file())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawning dpufs-csi");
        Plugin { child, socket }
    }

    /// `dpufs-csi controller --directory kubernetes`.
    fn controller(cluster: &Cluster) -> Plugin {
        let socket = cluster.dir.path().join("controller.sock");
        Plugin::spawn(cluster, socket, &["controller"])
    }

    /// The node's mount keeper and `dpufs-csi node --directory kubernetes`, which adopts it.
    fn node(cluster: &Cluster) -> (Plugin, Plugin) {
        let state = cluster.dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let keeper = Command::new(env!("CARGO_BIN_EXE_dpufs-csi"))
            .arg("keeper")
            .arg("--state-dir")
            .arg(&state)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawning the keeper");
        let keeper = Plugin {
            child: keeper,
            socket: dpufs_csi::keeper::Keeper::socket(&state),
        };
        let deadline = Instant::now() + WAIT;
        while std::os::unix::net::UnixStream::connect(&keeper.socket).is_err() {
            assert!(Instant::now() < deadline, "the keeper never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        let root = cluster.dir.path().display().to_string();
        let state = state.display().to_string();
        let socket = cluster.dir.path().join("node.sock");
        let node = Plugin::spawn(
            cluster,
            socket,
            &[
                "node",
                "--node-id",
                "node-1",
                "--keeper-start",
                "never",
                "--state-dir",
                &state,
                "--mount-root",
                &root,
            ],
        );
        (keeper, node)
    }

    /// A channel to the plugin once it accepts on its socket.
    async fn channel(&mut self) -> Channel {
        let deadline = Instant::now() + WAIT;
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the plugin exited"
            );
            assert!(Instant::now() < deadline, "the plugin never listened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let socket = self.socket.clone();
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
            .unwrap()
    }
}

async fn probe(identity: &mut IdentityClient<Channel>) -> Option<bool> {
    identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner()
        .ready
}

/// A CreateVolume of 64 MiB from a PVC in `namespace`, with `pool` when given.
async fn create_volume(
    ctl: &mut ControllerClient<Channel>,
    name: &str,
    namespace: &str,
    pool: Option<&str>,
) -> Result<csi::Volume, tonic::Status> {
    let mut parameters = HashMap::from([
        (
            "csi.storage.k8s.io/pvc/namespace".to_string(),
            namespace.to_string(),
        ),
        ("csi.storage.k8s.io/pvc/name".to_string(), name.to_string()),
    ]);
    if let Some(pool) = pool {
        parameters.insert("pool".into(), pool.into());
    }
    let capability = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::MultiNodeMultiWriter as i32,
        }),
    };
    ctl.create_volume(csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability],
        parameters,
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().volume.expect("a volume"))
}

/// Polls `f` until it returns `Some`, for at most [`WAIT`].
async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Until the directory's caches have listed everything, Probe says not ready and lookups
/// answer UNAVAILABLE (an empty cache would otherwise call a tenant's namespace tenantless),
/// on the controller and on the node plugin. The plugins cannot list yet: the real API
/// server refuses their user until the RBAC of docs/csi.md is bound; the fake does not
/// answer yet. Once they can, they become ready without a restart, and the node names its
/// DAOS system in NodeGetInfo's topology.
async fn probe_is_not_ready_until_the_caches_sync(backend: Backend) {
    let test = "probe_is_not_ready_until_the_caches_sync::real_api_server";
    let Some(mut cluster) = Cluster::start(backend, test, &[("ns-a", json!({}))]).await else {
        return;
    };
    cluster
        .system(
            "daos",
            json!({"endpoints": ["127.0.0.1:1"], "version": "2.8.0", "insecure": true}),
        )
        .await;
    let mut controller = Plugin::controller(&cluster);
    let (_keeper, mut node) = Plugin::node(&cluster);
    let channel = controller.channel().await;
    let mut identity = IdentityClient::new(channel.clone());
    let mut ctl = ControllerClient::new(channel);
    let node_channel = node.channel().await;
    let mut node_identity = IdentityClient::new(node_channel.clone());
    let mut node_service = NodeClient::new(node_channel);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(probe(&mut identity).await, Some(false), "ready too early");
        assert_eq!(
            probe(&mut node_identity).await,
            Some(false),
            "node ready too early"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let err = create_volume(&mut ctl, "early", "ns-a", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    assert!(
        err.message().contains("not synced yet"),
        "{}",
        err.message()
    );
    assert_eq!(probe(&mut identity).await, Some(false));

    cluster.admit_plugin().await;
    eventually("Probe ready", async || {
        (probe(&mut identity).await == Some(true)).then_some(())
    })
    .await;
    eventually("the node's Probe ready", async || {
        (probe(&mut node_identity).await == Some(true)).then_some(())
    })
    .await;
    // Synced, the caches answer: the system is there, the namespace has no tenant.
    let err = create_volume(&mut ctl, "late", "ns-a", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("\"ns-a\""), "{}", err.message());
    let info = node_service
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let segments = info.accessible_topology.unwrap().segments;
    assert_eq!(segments["dpufs.io/daos-system"], "daos");
}
on_both!(probe_is_not_ready_until_the_caches_sync);

/// A real engine with mutual TLS (the admin certificate in Secret dpufs-system/daos-admin),
/// two pools in it (`fast`, `bulk`), and the DaosSystem `daos` pointing at it.
struct TlsEngine {
    engine: EngineProcess,
    mgmt: MgmtClient,
    fast: String,
    bulk: String,
    _dir: tempfile::TempDir,
}

impl TlsEngine {
    async fn start(cluster: &Cluster) -> TlsEngine {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        dpufs_daos::certs::generate(&certs).unwrap();
        let engine = EngineProcess::start(
            &dir.path().join("engine"),
            EngineOpts {
                tls_dir: Some(certs.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        let mut cfg = ClientConfig::new(vec![engine.addr.clone()]);
        cfg.request_timeout = Duration::from_secs(20);
        let mgmt = MgmtClient::new(cfg.with_tls(TlsFiles::in_dir(&certs, "admin"))).unwrap();
        let mut pools = Vec::new();
        for label in ["fast", "bulk"] {
            let created = mgmt
                .pool_create(&PoolSpec::new(label, PoolSize::total(1 << 30)))
                .await
                .unwrap();
            pools.push(created.uuid);
        }
        cluster.create_namespace("dpufs-system", json!({})).await;
        put_admin_secret(&cluster.admin, &certs).await;
        cluster
            .system(
                "daos",
                json!({"endpoints": [engine.addr], "version": "2.8.0",
                       "tls": {"secretRef": {"name": "daos-admin", "namespace": "dpufs-system"}}}),
            )
            .await;
        let [fast, bulk] = <[String; 2]>::try_from(pools).unwrap();
        TlsEngine {
            engine,
            mgmt,
            fast,
            bulk,
            _dir: dir,
        }
    }

    /// The ACL entries of a volume's container, read from DAOS.
    async fn acl(&self, volume_id: &str) -> Vec<String> {
        let parts: Vec<&str> = volume_id.split('/').collect();
        EngineContainers::new(&self.mgmt)
            .get_acl(parts[2], parts[3])
            .await
            .unwrap()
            .entries
    }
}

/// The Secret with the admin certificate, as an administrator creates it.
async fn put_admin_secret(admin: &kube::Client, certs: &Path) {
    let secret = dpufs_kube::testing::admin_secret("dpufs-system", "daos-admin", certs);
    Api::<Secret>::namespaced(admin.clone(), "dpufs-system")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// CreateVolume through the controller binary: a PVC of tenant A's namespace lands in A's
/// allowed pool with A's principal (in DAOS, through the TLS Secret); a namespace of no
/// tenant is FAILED_PRECONDITION naming it; a pool the operator has not created (no
/// status.uuid) is FAILED_PRECONDITION until its UUID appears; a namespace added to a
/// DaosTenant, and a namespace labelled for a selector tenant, are seen without a restart.
async fn create_volume_follows_the_tenants_pools_and_namespaces(backend: Backend) {
    let test = "create_volume_follows_the_tenants_pools_and_namespaces::real_api_server";
    let namespaces = [
        ("ns-a", json!({})),
        ("ns-b", json!({})),
        ("ns-x", json!({})),
        ("ns-ml", json!({"dpufs.io/tenant": "other"})),
    ];
    let Some(mut cluster) = Cluster::start(backend, test, &namespaces).await else {
        return;
    };
    let daos = TlsEngine::start(&cluster).await;
    cluster.pool("fast", Some(&daos.fast)).await;
    cluster.pool("bulk", Some(&daos.bulk)).await;
    cluster.pool("pending", None).await;
    cluster
        .tenant(
            "team-a",
            json!({"namespaces": ["ns-a"], "principal": "team-a@", "allowedPools": ["fast"]}),
        )
        .await;
    cluster
        .tenant(
            "team-b",
            json!({"namespaces": ["ns-b"], "principal": "team-b@", "allowedPools": ["bulk", "pending"]}),
        )
        .await;
    cluster
        .tenant(
            "team-ml",
            json!({"namespaceSelector": {"matchLabels": {"dpufs.io/tenant": "ml"}},
                   "principal": "team-ml@", "allowedPools": ["bulk"]}),
        )
        .await;
    cluster.admit_plugin().await;
    let mut controller = Plugin::controller(&cluster);
    let channel = controller.channel().await;
    let mut identity = IdentityClient::new(channel.clone());
    let mut ctl = ControllerClient::new(channel);
    eventually("Probe ready", async || {
        (probe(&mut identity).await == Some(true)).then_some(())
    })
    .await;

    // Tenant A's namespace: A's only allowed pool, A's principal, in DAOS too.
    let v = create_volume(&mut ctl, "pvc-a", "ns-a", None)
        .await
        .unwrap();
    let ctx = &v.volume_context;
    assert_eq!(ctx["pool"], daos.fast);
    assert_eq!(ctx["poolName"], "fast");
    assert_eq!(ctx["tenant"], "team-a");
    assert_eq!(ctx["principal"], "team-a@");
    assert!(v.volume_id.starts_with(&format!("v1/daos/{}/", daos.fast)));
    let acl = daos.acl(&v.volume_id).await;
    assert!(acl.contains(&"A::team-a@:rwt".to_string()), "{acl:?}");
    assert!(!acl.iter().any(|e| e.contains("team-b@")), "{acl:?}");

    // A namespace of no tenant.
    let err = create_volume(&mut ctl, "pvc-x", "ns-x", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("\"ns-x\""), "{}", err.message());

    // A pool whose DaosPool has no UUID yet; then the operator creates it.
    let err = create_volume(&mut ctl, "pvc-b", "ns-b", Some("pending"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("\"pending\""), "{}", err.message());
    let pending = daos
        .mgmt
        .pool_create(&PoolSpec::new("pending", PoolSize::total(1 << 30)))
        .await
        .unwrap()
        .uuid;
    cluster.set_pool_uuid("pending", &pending).await;
    let v = eventually("the pending pool's UUID", async || {
        create_volume(&mut ctl, "pvc-b", "ns-b", Some("pending"))
            .await
            .ok()
    })
    .await;
    assert_eq!(v.volume_context["pool"], pending);
    assert_eq!(v.volume_context["principal"], "team-b@");

    // ns-x joins tenant A: seen without a restart.
    cluster
        .merge::<DaosTenant>("team-a", json!({"spec": {"namespaces": ["ns-a", "ns-x"]}}))
        .await;
    let v = eventually("ns-x in team-a", async || {
        create_volume(&mut ctl, "pvc-x", "ns-x", None).await.ok()
    })
    .await;
    assert_eq!(v.volume_context["pool"], daos.fast);
    assert_eq!(v.volume_context["principal"], "team-a@");

    // A namespace relabelled for the selector tenant.
    let err = create_volume(&mut ctl, "pvc-ml", "ns-ml", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    cluster
        .merge::<Namespace>(
            "ns-ml",
            json!({"metadata": {"labels": {"dpufs.io/tenant": "ml"}}}),
        )
        .await;
    let v = eventually("ns-ml selected by team-ml", async || {
        create_volume(&mut ctl, "pvc-ml", "ns-ml", None).await.ok()
    })
    .await;
    assert_eq!(v.volume_context["pool"], daos.bulk);
    assert_eq!(v.volume_context["principal"], "team-ml@");
    let acl = daos.acl(&v.volume_id).await;
    assert!(acl.contains(&"A::team-ml@:rwt".to_string()), "{acl:?}");
    drop(daos.engine);
}
on_both!(create_volume_follows_the_tenants_pools_and_namespaces);

/// `KubeDirectory` in this process, with the plugin's identity: what the node plugin and
/// the controller ask besides CreateVolume — the data endpoint, the default tenant, pools
/// of a system — and every answer following the objects as they change.
async fn the_directory_follows_the_crds(backend: Backend) {
    let test = "the_directory_follows_the_crds::real_api_server";
    let namespaces = [
        ("ns-a", json!({})),
        ("ns-r", json!({"dpufs.io/tenant": "r"})),
        ("ns-x", json!({})),
    ];
    let Some(mut cluster) = Cluster::start(backend, test, &namespaces).await else {
        return;
    };
    const P1: &str = "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f";
    cluster
        .system(
            "daos",
            json!({"endpoints": ["127.0.0.1:1"], "version": "2.8.0", "insecure": true,
                   "dataEndpoint": "127.0.0.1:7000"}),
        )
        .await;
    cluster.pool("fast", Some(P1)).await;
    cluster.pool("pending", None).await;
    cluster
        .tenant(
            "team-a",
            json!({"namespaces": ["ns-a"], "principal": "team-a@", "allowedPools": ["fast"]}),
        )
        .await;
    cluster
        .tenant(
            "team-r",
            json!({"namespaceSelector": {"matchLabels": {"dpufs.io/tenant": "r"}},
                   "principal": "team-r@", "allowedPools": ["fast"]}),
        )
        .await;
    cluster.admit_plugin().await;
    let client = match &cluster.server {
        // The fake's in-process client: the HTTP face is the binary's.
        Server::Fake { fake, .. } => fake.client_as(PLUGIN_USER),
        Server::Real(_) => cluster.plugin_client().await,
    };
    let mut config = KubeDirectoryConfig::new(cluster.dir.path().join("tls"));
    config.default_tenant = Some("team-a".into());
    let dir = KubeDirectory::start(client, config);
    assert!(dir.wait_ready(WAIT).await, "caches never synced");
    assert!(dir.ready());

    assert_eq!(dir.default_system().await.unwrap(), "daos");
    let sys = dir.system("daos").await.unwrap();
    assert_eq!(sys.name, "daos");
    assert_eq!(
        sys.volumes,
        VolumeAccess::Engine {
            data_endpoint: Some("127.0.0.1:7000".parse().unwrap())
        }
    );
    assert_eq!(
        dir.system("other").await.unwrap_err(),
        DirectoryError::UnknownSystem("other".into())
    );
    assert_eq!(
        dir.pools("daos").await.unwrap(),
        vec![PoolRef {
            name: "fast".into(),
            uuid: P1.parse().unwrap()
        }]
    );
    assert!(matches!(
        dir.pool("daos", "pending").await,
        Err(DirectoryError::UnknownPool { .. })
    ));
    assert_eq!(dir.tenant(Some("ns-a")).await.unwrap().name, "team-a");
    assert_eq!(dir.tenant(Some("ns-r")).await.unwrap().principal, "team-r@");
    assert_eq!(
        dir.tenant(None).await.unwrap().name,
        "team-a",
        "the default"
    );
    assert_eq!(
        dir.tenant(Some("ns-x")).await.unwrap_err(),
        DirectoryError::NoTenant("ns-x".into())
    );

    // Changes, each seen through the watches.
    cluster
        .merge::<Namespace>(
            "ns-x",
            json!({"metadata": {"labels": {"dpufs.io/tenant": "r"}}}),
        )
        .await;
    eventually("ns-x labelled into team-r", async || {
        dir.tenant(Some("ns-x"))
            .await
            .ok()
            .filter(|t| t.name == "team-r")
    })
    .await;
    cluster
        .merge::<DaosSystem>("daos", json!({"spec": {"dataEndpoint": "127.0.0.1:7001"}}))
        .await;
    eventually("the new data endpoint", async || {
        let sys = dir.system("daos").await.ok()?;
        let moved = VolumeAccess::Engine {
            data_endpoint: Some("127.0.0.1:7001".parse().unwrap()),
        };
        (sys.volumes == moved).then_some(())
    })
    .await;
    Api::<DaosTenant>::all(cluster.admin.clone())
        .delete("team-r", &DeleteParams::default())
        .await
        .unwrap();
    eventually("team-r gone", async || {
        (dir.tenant(Some("ns-r")).await == Err(DirectoryError::NoTenant("ns-r".into())))
            .then_some(())
    })
    .await;
    cluster
        .system(
            "daos-b",
            json!({"endpoints": ["127.0.0.1:2"], "version": "2.8.0", "insecure": true}),
        )
        .await;
    eventually("a second system", async || {
        (dir.default_system().await
            == Err(DirectoryError::SeveralSystems(vec![
                "daos".into(),
                "daos-b".into(),
            ])))
        .then_some(())
    })
    .await;
    assert!(
        dir.pools("daos-b").await.unwrap().is_empty(),
        "the pools are daos's"
    );
}
on_both!(the_directory_follows_the_crds);
