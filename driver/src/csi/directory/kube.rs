//! [`KubeDirectory`]: a [`Directory`] answering from the dpufs CRDs. Four kube-rs
//! reflectors (DaosSystems, DaosPools, DaosTenants, Namespaces: list and watch, retried
//! with backoff) keep caches current, so a lookup is a cache read and an object's change
//! is seen without a restart; only a DaosSystem's TLS Secret is read with `get`, when a
//! client is built and then at most once per `secret_refresh`.
//!
//! The directory is [`Directory::ready`] once every cache has been filled by a complete
//! list. Lookups before that wait for it, up to `sync_wait` (so NodeGetInfo at plugin
//! start still names the system), then fail UNAVAILABLE. A watch that breaks later keeps
//! the last known objects and stays ready: Probe must not restart the plugins during an
//! API server outage.

use super::{Directory, DirectoryError, PoolRef, SystemClients, Tenant, from_crds};
use dpufs_api::{DaosPool, DaosSystem, DaosTenant};
use dpufs_kube::SystemClientCache;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The kinds the directory caches, in the order of [`Synced`].
const KINDS: [&str; 4] = ["DaosSystems", "DaosPools", "DaosTenants", "Namespaces"];

/// Which caches have been filled by a complete list, by index in [`KINDS`].
type Synced = [bool; KINDS.len()];

/// How a [`KubeDirectory`] behaves.
#[derive(Debug, Clone)]
pub struct KubeDirectoryConfig {
    /// The DaosTenant of requests that name no namespace; without one they are refused.
    pub default_tenant: Option<String>,
    /// Where DaosSystems' TLS Secrets are written out for the DAOS client, one directory
    /// per DaosSystem.
    pub tls_root: PathBuf,
    /// How long one DAOS call may take, retries included.
    pub request_timeout: Duration,
    /// How often an unchanged DaosSystem's TLS Secret is read again (a rotated
    /// certificate is used within this time).
    pub secret_refresh: Duration,
    /// How long a lookup waits for caches that are not synced yet.
    pub sync_wait: Duration,
    /// Where DAOS's client libraries are, for DaosSystems with `backend: daos`.
    pub daos_lib: Option<PathBuf>,
}

impl KubeDirectoryConfig {
    /// Defaults: no default tenant, 30 s DAOS calls, Secrets re-read every minute,
    /// lookups wait up to 10 s for the caches.
    pub fn new(tls_root: PathBuf) -> KubeDirectoryConfig {
        KubeDirectoryConfig {
            default_tenant: None,
            tls_root,
            request_timeout: Duration::from_secs(30),
            secret_refresh: Duration::from_secs(60),
            sync_wait: Duration::from_secs(10),
            daos_lib: None,
        }
    }
}

/// The watch tasks; dropping the directory stops them.
#[derive(Debug)]
struct Watches(Vec<JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A [`Directory`] backed by the Kubernetes API (see the module documentation).
pub struct KubeDirectory {
    kube: kube::Client,
    systems: Store<DaosSystem>,
    pools: Store<DaosPool>,
    tenants: Store<DaosTenant>,
    namespaces: Store<Namespace>,
    synced: watch::Receiver<Synced>,
    clients: SystemClientCache,
    default_tenant: Option<String>,
    sync_wait: Duration,
    _watches: Watches,
}

impl std::fmt::Debug for KubeDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDirectory")
            .field("synced", &*self.synced.borrow())
            .field("default_tenant", &self.default_tenant)
            .field("clients", &self.clients)
            .finish_non_exhaustive()
    }
}

impl KubeDirectory {
    /// Starts the watches on the current Tokio runtime and returns at once; the
    /// directory is ready when they have listed everything.
    pub fn start(kube: kube::Client, config: KubeDirectoryConfig) -> KubeDirectory {
        let (synced_tx, synced) = watch::channel(Synced::default());
        let synced_tx = Arc::new(synced_tx);
        let (systems, w0) = cache(Api::all(kube.clone()), 0, synced_tx.clone());
        let (pools, w1) = cache(Api::all(kube.clone()), 1, synced_tx.clone());
        let (tenants, w2) = cache(Api::all(kube.clone()), 2, synced_tx.clone());
        let (namespaces, w3) = cache(Api::all(kube.clone()), 3, synced_tx);
        KubeDirectory {
            kube,
            systems,
            pools,
            tenants,
            namespaces,
            synced,
            clients: SystemClientCache::new(config.tls_root)
                .with_request_timeout(config.request_timeout)
                .with_secret_refresh(config.secret_refresh)
                .with_daos_lib(config.daos_lib),
            default_tenant: config.default_tenant,
            sync_wait: config.sync_wait,
            _watches: Watches(vec![w0, w1, w2, w3]),
        }
    }

    /// Waits until every cache is synced, for at most `timeout`; whether they are.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let mut synced = self.synced.clone();
        tokio::time::timeout(timeout, synced.wait_for(|s| s.iter().all(|&k| k)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Lookups read the caches only once they are synced: before that an empty cache
    /// would answer "no such DaosTenant" for a tenant that exists.
    async fn synced(&self) -> Result<(), DirectoryError> {
        if self.ready() || self.wait_ready(self.sync_wait).await {
            return Ok(());
        }
        let missing: Vec<&str> = KINDS
            .iter()
            .zip(*self.synced.borrow())
            .filter(|(_, synced)| !synced)
            .map(|(kind, _)| *kind)
            .collect();
        Err(DirectoryError::Unavailable(format!(
            "the Kubernetes caches of {} are not synced yet (the plugin's log has the watch errors; check its RBAC)",
            missing.join(", ")
        )))
    }
}

/// A cache of every object of `api`'s kind, kept by a watch task that marks
/// `synced[index]` after its first complete list.
fn cache<K>(
    api: Api<K>,
    index: usize,
    synced: Arc<watch::Sender<Synced>>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let kind = KINDS[index];
    let (store, writer) = reflector::store();
    let events = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    );
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                // The reflector has swapped the complete list into the store.
                Ok(watcher::Event::InitDone) if !synced.borrow()[index] => {
                    synced.send_modify(|s| s[index] = true);
                    tracing::info!(kind, "Kubernetes cache synced");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(kind, "watch failed; retrying with backoff: {e}"),
            }
        }
    });
    (store, task)
}

#[tonic::async_trait]
impl Directory for KubeDirectory {
    fn ready(&self) -> bool {
        self.synced.borrow().iter().all(|&k| k)
    }

    async fn default_system(&self) -> Result<String, DirectoryError> {
        self.synced().await?;
        from_crds::default_system(&self.systems.state())
    }

    async fn system(&self, name: &str) -> Result<SystemClients, DirectoryError> {
        self.synced().await?;
        let systems = self.systems.state();
        let sys = from_crds::system(&systems, name)?;
        let client = self
            .clients
            .client(&self.kube, sys)
            .await
            .map_err(|e| DirectoryError::Unavailable(e.to_string()))?;
        Ok(SystemClients {
            name: name.to_string(),
            mgmt: client.mgmt,
            containers: client.containers,
            volumes: from_crds::volume_access(sys, self.clients.daos_lib())?,
        })
    }

    async fn pool(&self, system: &str, pool: &str) -> Result<PoolRef, DirectoryError> {
        self.synced().await?;
        from_crds::system(&self.systems.state(), system)?;
        from_crds::pool(&self.pools.state(), system, pool)
    }

    async fn pools(&self, system: &str) -> Result<Vec<PoolRef>, DirectoryError> {
        self.synced().await?;
        from_crds::system(&self.systems.state(), system)?;
        Ok(from_crds::pools(&self.pools.state(), system))
    }

    async fn tenant(&self, namespace: Option<&str>) -> Result<Tenant, DirectoryError> {
        self.synced().await?;
        let tenants = self.tenants.state();
        match namespace {
            Some(name) => {
                let cached = self.namespaces.get(&ObjectRef::new(name));
                let ns = from_crds::namespace_view(cached.as_deref(), name);
                from_crds::tenant_of(&tenants, &ns)
            }
            None => from_crds::default_tenant(&tenants, self.default_tenant.as_deref()),
        }
    }

    async fn tenant_named(&self, name: &str) -> Result<Option<Tenant>, DirectoryError> {
        self.synced().await?;
        from_crds::tenant_named(&self.tenants.state(), name)
    }
}
