//! The DFS service's volumes: where containers' namespaces live, and the open ones.
//!
//! Layout, on every rank of the pool (`ranks/<r>/pools/<pool>/`):
//! - `conts/<container>/`: the container's chunk files; rank 0 of the pool also holds its
//!   metadata store `meta.redb` there;
//! - `snaps/<container>/<epoch>/`: the same for each snapshot.
//!
//! A namespace is opened once and kept (two open instances of one store would corrupt it);
//! destroy is the only thing that closes one. Each pool has one [`PoolBudget`], built the
//! first time any of its namespaces is needed by counting every container found on disk.
//! What management calls do to namespaces (destroy, snapshot, clone) is in `lifecycle.rs`.

use super::budget::PoolBudget;
use crate::layout::Layout;
use crate::namespace::SpaceBudget;
use crate::namespace::{DfsError, DfsResult, Errno, Namespace, NamespaceConfig, RealDisk};
use crate::records::{ContRecord, PoolRecord, Stored};
use crate::store::{Reader, Store};
use dpufs_proto::daos::props::{CONT_DPUFS_CHUNK_SIZE, CONT_DPUFS_QUOTA};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// DFS's default chunk size.
pub const DEFAULT_CHUNK_SIZE: u64 = 1 << 20;

/// Names one namespace: a container, or one of its snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VolumeKey {
    pub pool: String,
    pub container: String,
    /// The snapshot's epoch; None for the container itself.
    pub snapshot: Option<u64>,
}

/// The open namespaces and pool budgets of an engine.
#[derive(Debug)]
pub struct Volumes {
    layout: Layout,
    /// Read for the pools and containers the namespaces belong to.
    store: Arc<Store>,
    inner: Mutex<Open>,
    /// Serializes snapshot, clone and destroy of namespaces (they pick epochs and paths).
    lifecycle: Mutex<()>,
    /// The write verifier of every reply (`DfsReply.verifier`): these open namespaces hold
    /// the changes no fsync has made durable yet, and a crash loses them with this value.
    verifier: u64,
}

#[derive(Debug, Default)]
struct Open {
    namespaces: HashMap<VolumeKey, Arc<Namespace>>,
    budgets: HashMap<String, Arc<PoolBudget>>,
}

fn prop(cont: &ContRecord, number: u32) -> Option<u64> {
    match cont.props.get(&number) {
        Some(Stored::Num(n)) => Some(*n),
        _ => None,
    }
}

/// The chunk size a container's namespace is created with.
pub fn chunk_size_of(cont: &ContRecord) -> u64 {
    prop(cont, CONT_DPUFS_CHUNK_SIZE).unwrap_or(DEFAULT_CHUNK_SIZE)
}

/// The container's quota, if any.
pub fn quota_of(cont: &ContRecord) -> Option<u64> {
    prop(cont, CONT_DPUFS_QUOTA).filter(|&q| q > 0)
}

impl Volumes {
    /// No volume open yet, over the data directory of `layout` and the pools and containers
    /// of `store`.
    pub(crate) fn new(layout: Layout, store: Arc<Store>) -> Volumes {
        Volumes {
            verifier: super::verifier::take(&layout),
            layout,
            store,
            inner: Mutex::default(),
            lifecycle: Mutex::default(),
        }
    }

    /// An orderly stop, once no request is served any more: every open namespace's changes
    /// made durable, then the verifier left for the next start, which keeps it (nothing its
    /// replies acknowledged is lost; `verifier.rs`).
    ///
    /// A write that failed and waits to be reported to its object's next fsync lives only
    /// in this process: then the verifier is not kept, so the next start's new one makes
    /// that fsync fail.
    pub fn stop(&self) -> DfsResult<()> {
        if !self.sync_open()? {
            return Err(DfsError::new(
                Errno::IO,
                "failed writes wait to be reported to their fsync",
            ));
        }
        super::verifier::leave(&self.layout, self.verifier)
            .map_err(|e| DfsError::new(Errno::IO, format!("leaving the write verifier: {e}")))
    }

    /// Makes every open, writable namespace durable; true when no failed write waits to be
    /// reported to its object's next fsync.
    pub fn sync_open(&self) -> DfsResult<bool> {
        let open: Vec<Arc<Namespace>> = self.lock().namespaces.values().cloned().collect();
        let mut clean = true;
        for ns in open.iter().filter(|ns| !ns.read_only()) {
            clean &= ns.sync_all()?;
        }
        Ok(clean)
    }

    /// What every reply of this engine says its changes die with (see [`Volumes::verifier`]).
    pub fn verifier(&self) -> u64 {
        self.verifier
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Held while a namespace is snapshotted, cloned or destroyed (one at a time).
    pub(crate) fn lifecycle(&self) -> MutexGuard<'_, ()> {
        self.lifecycle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directories of a namespace: one per rank of the pool, the first holding the store.
    pub fn dirs(&self, pool: &PoolRecord, cont: &str, snapshot: Option<u64>) -> Vec<PathBuf> {
        pool.ranks
            .iter()
            .map(|&rank| {
                let base = self.layout.pool_dir(rank, &pool.uuid);
                match snapshot {
                    None => base.join("conts").join(cont),
                    Some(epoch) => base.join("snaps").join(cont).join(epoch.to_string()),
                }
            })
            .collect()
    }

    /// How the namespace of `cont` (or of its snapshot) is laid out and limited.
    pub(crate) fn config(
        &self,
        pool: &PoolRecord,
        cont: &ContRecord,
        snapshot: Option<u64>,
        budget: Option<Arc<dyn SpaceBudget>>,
    ) -> NamespaceConfig {
        let chunk_dirs = self.dirs(pool, &cont.uuid, snapshot);
        NamespaceConfig {
            meta_path: chunk_dirs[0].join("meta.redb"),
            chunk_dirs,
            chunk_size: chunk_size_of(cont),
            quota: quota_of(cont),
            read_only: snapshot.is_some(),
            budget: if snapshot.is_some() { None } else { budget },
        }
    }

    /// The namespace of a container or snapshot named by the data service, opening it if
    /// needed. A container or snapshot that does not exist (any more) is ESTALE.
    pub fn volume(&self, key: &VolumeKey) -> DfsResult<Arc<Namespace>> {
        if let Some(ns) = self.lock().namespaces.get(key) {
            return Ok(ns.clone());
        }
        let found = self.store.read(|v| {
            let pool = v.pool(&key.pool)?;
            let cont = match &pool {
                Some(p) => v.find_container(&p.uuid, &key.container)?,
                None => None,
            };
            Ok(pool.zip(cont))
        });
        let gone = |what: &str| DfsError {
            errno: Errno::STALE,
            detail: format!("{what} of this connection no longer exists"),
        };
        let (pool, cont) = found
            .map_err(DfsError::from)?
            .ok_or_else(|| gone("the container"))?;
        if let Some(epoch) = key.snapshot
            && !cont.snapshots.iter().any(|s| s.epoch == epoch)
        {
            return Err(gone("the snapshot"));
        }
        self.namespace(&pool, &cont, key.snapshot)
    }

    /// The namespace of `cont` (or of its snapshot), opened once and kept.
    pub fn namespace(
        &self,
        pool: &PoolRecord,
        cont: &ContRecord,
        snapshot: Option<u64>,
    ) -> DfsResult<Arc<Namespace>> {
        let mut open = self.lock();
        let budget = self.budget_locked(&mut open, pool)?;
        self.open_locked(&mut open, pool, cont, snapshot, budget)
    }

    fn open_locked(
        &self,
        open: &mut Open,
        pool: &PoolRecord,
        cont: &ContRecord,
        snapshot: Option<u64>,
        budget: Arc<PoolBudget>,
    ) -> DfsResult<Arc<Namespace>> {
        let key = VolumeKey {
            pool: pool.uuid.clone(),
            container: cont.uuid.clone(),
            snapshot,
        };
        if let Some(ns) = open.namespaces.get(&key) {
            return Ok(ns.clone());
        }
        let cfg = self.config(pool, cont, snapshot, Some(budget));
        if snapshot.is_some() && !cfg.meta_path.exists() {
            // Never create an empty namespace in a snapshot's place.
            return Err(DfsError {
                errno: Errno::STALE,
                detail: format!("snapshot {snapshot:?} of {} has no namespace", cont.uuid),
            });
        }
        let ns = Arc::new(Namespace::open(Arc::new(RealDisk), cfg)?);
        open.namespaces.insert(key, ns.clone());
        Ok(ns)
    }

    /// The pool's budget, counting every container already on disk the first time.
    fn budget_locked(&self, open: &mut Open, pool: &PoolRecord) -> DfsResult<Arc<PoolBudget>> {
        if let Some(b) = open.budgets.get(&pool.uuid) {
            return Ok(b.clone());
        }
        let budget = Arc::new(PoolBudget::new(pool));
        let conts = self
            .store
            .read(|v| v.containers(&pool.uuid))
            .map_err(DfsError::from)?;
        for cont in &conts {
            let meta = self.dirs(pool, &cont.uuid, None)[0].join("meta.redb");
            if meta.exists() {
                let ns = self.open_locked(open, pool, cont, None, budget.clone())?;
                budget.add_existing(ns.used()?);
            }
        }
        open.budgets.insert(pool.uuid.clone(), budget.clone());
        Ok(budget)
    }

    /// The budget of a pool whose namespaces are in use.
    pub fn budget_of(&self, pool: &str) -> Option<Arc<PoolBudget>> {
        self.lock().budgets.get(pool).cloned()
    }

    /// The pool's budget (capacity and data bytes used).
    pub fn pool_budget(&self, pool: &PoolRecord) -> DfsResult<Arc<PoolBudget>> {
        self.budget_locked(&mut self.lock(), pool)
    }

    /// A container's quota changed: its namespace, if open, applies it at once.
    pub(crate) fn quota_changed(&self, cont: &ContRecord) {
        let key = VolumeKey {
            pool: cont.pool_uuid.clone(),
            container: cont.uuid.clone(),
            snapshot: None,
        };
        let open = self.lock().namespaces.get(&key).cloned();
        if let Some(ns) = open {
            ns.set_quota(quota_of(cont));
        }
    }

    /// Closes a container's namespaces (its own and its snapshots'); returns its own, if it
    /// was open, so the caller can give its space back.
    pub(crate) fn close(
        &self,
        pool: &str,
        cont: &str,
        snapshot: Option<u64>,
    ) -> Option<Arc<Namespace>> {
        let mut open = self.lock();
        let own = open.namespaces.remove(&VolumeKey {
            pool: pool.to_string(),
            container: cont.to_string(),
            snapshot,
        });
        if snapshot.is_none() {
            open.namespaces
                .retain(|k, _| !(k.pool == pool && k.container == cont));
        }
        own
    }

    /// Forgets everything open in a pool that is going away.
    pub(crate) fn close_pool(&self, pool: &str) {
        let mut open = self.lock();
        open.namespaces.retain(|k, _| k.pool != pool);
        open.budgets.remove(pool);
    }

    /// The directory of `pool` on `rank` (namespaces live below it).
    pub(crate) fn pool_dir(&self, rank: u32, pool: &str) -> PathBuf {
        self.layout.pool_dir(rank, pool)
    }

    /// The store of pools and containers.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }
}
