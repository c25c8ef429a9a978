//! What the operator's scenario tests share: the Kubernetes API they run
//! against — the in-crate fake, or a real kube-apiserver with etcd
//! (`dpufs_e2e::kube_api`) — and a real `dpufs-engine` process behind a
//! DaosSystem. Every scenario runs on both through [`on_both!`]; the real one
//! is skipped loudly where the Kubernetes binaries are not built.

#![allow(dead_code)] // each test binary uses its own part of the harness

use dpufs_api::DaosSystem;
use dpufs_e2e::kube_api::KubeApiServer;
use dpufs_e2e::{EngineOpts, EngineProcess};
use dpufs_kube::testing::FakeApiServer;
use dpufs_operator::{Backoff, Context};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a scenario waits for the operator to get somewhere.
pub const WAIT: Duration = Duration::from_secs(30);

/// Which API server a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Fake,
    Real,
}

/// Runs an `async fn(Backend)` scenario as two tests, `fake` and
/// `real_api_server`, in a module named after it.
#[macro_export]
macro_rules! on_both {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fake() {
                super::$scenario(super::support::Backend::Fake).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn real_api_server() {
                super::$scenario(super::support::Backend::Real).await
            }
        }
    };
}

/// Runs an `async fn(kube::Client)` scenario as two tests, `fake` and
/// `real_api_server`, in a module named after it; the scenario makes what it
/// needs (namespaces, systems) under names of its own.
#[macro_export]
macro_rules! on_both_with_client {
    ($scenario:ident) => {
        mod $scenario {
            use super::support::{Backend, Cluster};
            async fn run(backend: Backend) {
                let test = concat!(stringify!($scenario), "::", "real_api_server");
                let Some((_cluster, client)) = Cluster::start(backend, test).await else {
                    return;
                };
                super::$scenario(client).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fake() {
                run(Backend::Fake).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn real_api_server() {
                run(Backend::Real).await
            }
        }
    };
}

/// The API server of a scenario.
pub enum Cluster {
    Fake(FakeApiServer),
    Real(KubeApiServer),
}

impl Cluster {
    /// Starts the API server with the dpufs CRDs and the namespaces the
    /// scenarios use; `None` when a real one cannot run here (said loudly).
    pub async fn start(backend: Backend, test: &str) -> Option<(Cluster, kube::Client)> {
        Self::start_with(backend, test, false).await
    }

    /// As [`Cluster::start`]; a real API server also gets
    /// kube-controller-manager when `controllers` (the fake has none: its
    /// scenarios stand in for what those controllers would do).
    pub async fn start_with(
        backend: Backend,
        test: &str,
        controllers: bool,
    ) -> Option<(Cluster, kube::Client)> {
        let (cluster, client) = match backend {
            Backend::Fake => {
                let fake = FakeApiServer::new();
                let client = fake.client();
                (Cluster::Fake(fake), client)
            }
            Backend::Real => {
                let mut server = KubeApiServer::start(test)?;
                if controllers {
                    server
                        .start_controller_manager()
                        .expect("starting kube-controller-manager");
                }
                let client = server.client().await;
                let warnings = server
                    .install_crds(&client)
                    .await
                    .expect("installing the CRDs");
                assert!(warnings.is_empty(), "the CRDs warned: {warnings:?}");
                (Cluster::Real(server), client)
            }
        };
        if let Cluster::Real(_) = cluster {
            // The fake makes namespaces on first use; a real server wants them first.
            let namespaces: Api<Namespace> = Api::all(client.clone());
            for ns in ["dpufs-system", "team"] {
                let object = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
                namespaces
                    .create(&PostParams::default(), &object)
                    .await
                    .unwrap();
            }
        }
        Some((cluster, client))
    }

    pub fn fake(&self) -> Option<&FakeApiServer> {
        match self {
            Cluster::Fake(fake) => Some(fake),
            Cluster::Real(_) => None,
        }
    }
}

/// The number of Events with this reason (any object, any namespace).
pub async fn events(client: &kube::Client, reason: &str) -> usize {
    let events: Api<Event> = Api::all(client.clone());
    let list = events
        .list(&ListParams::default())
        .await
        .expect("listing Events");
    list.items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .count()
}

/// The resourceVersions of every object of kind `K`: unchanged means nothing
/// wrote to any of them.
pub async fn versions<K>(client: &kube::Client) -> Vec<(String, String)>
where
    K: Resource<Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await.expect("listing");
    list.items
        .iter()
        .map(|o| {
            let m = o.meta();
            (
                m.name.clone().unwrap_or_default(),
                m.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// An operator context with test timings.
pub fn context(client: &kube::Client, tls: &Path) -> Arc<Context> {
    let mut ctx = Context::new(client.clone(), tls.to_path_buf());
    ctx.systems = dpufs_operator::systems::SystemClients::new(client.clone(), tls.to_path_buf())
        .with_request_timeout(Duration::from_secs(2));
    ctx.resync = Duration::from_millis(500);
    ctx.system_probe = Duration::from_millis(500);
    ctx.blocked_retry = Duration::from_millis(300);
    ctx.backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
    Arc::new(ctx)
}

/// A real engine and the DaosSystem `daos` that points at it.
pub struct DaosBed {
    pub engine: EngineProcess,
    pub dir: tempfile::TempDir,
}

impl DaosBed {
    /// Starts an engine with `ranks` ranks (mutual TLS when `tls`, with the
    /// admin certificate in Secret dpufs-system/daos-admin-cert) and creates
    /// the DaosSystem `daos` for it.
    pub async fn start(client: &kube::Client, ranks: u32, tls: bool) -> DaosBed {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        if tls {
            dpufs_daos::certs::generate(&certs).unwrap();
        }
        let engine = EngineProcess::start(
            &dir.path().join("engine"),
            EngineOpts {
                ranks,
                tls_dir: tls.then(|| certs.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        let security = if tls {
            put_admin_secret(client, "dpufs-system", "daos-admin-cert", &certs).await;
            json!({"tls": {"secretRef": {"name": "daos-admin-cert", "namespace": "dpufs-system"}}})
        } else {
            json!({"insecure": true})
        };
        let mut spec = json!({"endpoints": [engine.addr], "version": "2.8.0"});
        dpufs_kube::testing::merge(&mut spec, &security);
        let sys: DaosSystem = serde_json::from_value(json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosSystem",
            "metadata": {"name": "daos"},
            "spec": spec
        }))
        .unwrap();
        Api::<DaosSystem>::all(client.clone())
            .create(&PostParams::default(), &sys)
            .await
            .unwrap();
        DaosBed { engine, dir }
    }
}

/// The Secret with an admin certificate from `certs`, as an administrator
/// creates it (replaced when it exists).
pub async fn put_admin_secret(client: &kube::Client, ns: &str, name: &str, certs: &Path) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = dpufs_kube::testing::admin_secret(ns, name, certs);
    match secrets.get_opt(name).await.unwrap() {
        Some(_) => {
            let patch = json!({"data": secret.data});
            secrets
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
        None => {
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .unwrap();
        }
    }
}

/// Polls `f` until it returns `Some`, for at most [`WAIT`].
pub async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
