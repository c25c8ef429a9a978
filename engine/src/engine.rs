//! The engine: configuration and management state (the store of pools and containers, the
//! ranks), and start-up housekeeping. Its management API is implemented by topic in
//! `pools.rs`, `containers.rs`, `snapshots.rs` and `system.rs`; the data plane is the DFS
//! service (`dfs_service`), which owns the open namespaces.

use crate::dfs_service::Volumes;
use crate::error::Result;
use crate::layout::Layout;
use crate::ranks::RankSet;
use crate::store::{Reader, Store};
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

/// DAOS's default pool tier split for "auto" sizing (metadata, data).
pub const DEFAULT_TIER_RATIO: [f64; 2] = [0.06, 0.94];

/// Smallest tier per target the engine accepts. Real DAOS asks 16 MiB of SCM
/// and 1 GiB of NVMe per target because those tiers are preallocated media;
/// the engine's tiers are accounting over files, so it asks 4 MiB of each and
/// laptop-sized pools (1 GiB over 4 targets) work. The faults are the same.
pub const MIN_TIER_BYTES_PER_TARGET: u64 = 4 << 20;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    /// DAOS system name (`daos_server` by default).
    pub system: String,
    /// Number of simulated ranks.
    pub ranks: u32,
    /// Storage each rank offers, both tiers together.
    pub capacity_per_rank: u64,
    /// Targets (DAOS I/O threads) per rank.
    pub targets_per_rank: u32,
    /// Address the ranks' endpoints bind to.
    pub rank_host: IpAddr,
    /// When set, this engine is a management-service replica that does not
    /// lead: it answers LeaderQuery and sends every other call to this leader.
    pub leader: Option<String>,
}

impl EngineConfig {
    /// A config with DAOS's defaults for everything but the data directory.
    pub fn new(data_dir: PathBuf) -> EngineConfig {
        EngineConfig {
            data_dir,
            system: dpufs_proto::daos::DEFAULT_SYSTEM.to_string(),
            ranks: 1,
            capacity_per_rank: 64 << 30,
            targets_per_rank: 4,
            rank_host: IpAddr::from([127, 0, 0, 1]),
            leader: None,
        }
    }
}

/// The running engine's shared state.
#[derive(Debug)]
pub struct Engine {
    pub(crate) cfg: EngineConfig,
    layout: Layout,
    store: Arc<Store>,
    ranks: RankSet,
    /// The management address this engine answers on, as replicas see it.
    advertise: SocketAddr,
    /// The DFS service's open namespaces and pool budgets. The engine holds them only to tell
    /// the service what management calls do to a container's namespace (destroy, snapshot,
    /// clone, a new quota) and to report pool usage.
    volumes: Arc<Volumes>,
}

impl Engine {
    /// The configuration the engine was started with.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Opens the store, starts the ranks and removes what a crash left behind.
    pub async fn start(cfg: EngineConfig, advertise: SocketAddr) -> Result<Engine> {
        std::fs::create_dir_all(&cfg.data_dir)?;
        let layout = Layout::new(cfg.data_dir.clone());
        let store = Arc::new(Store::open(&layout.store())?);
        let ranks = RankSet::start(cfg.ranks, cfg.rank_host, &layout, &cfg.system).await?;
        let volumes = Arc::new(Volumes::new(layout.clone(), store.clone()));
        let engine = Engine {
            cfg,
            layout,
            store,
            ranks,
            advertise,
            volumes,
        };
        engine.remove_orphan_pool_dirs()?;
        engine.volumes.remove_orphans()?;
        Ok(engine)
    }

    /// The store of pools and containers.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn ranks(&self) -> &RankSet {
        &self.ranks
    }

    /// The management address, as replicas see it.
    pub fn advertise(&self) -> SocketAddr {
        self.advertise
    }

    /// The DFS service's open volumes.
    pub(crate) fn volumes(&self) -> &Arc<Volumes> {
        &self.volumes
    }

    /// An orderly stop of the data path, once the data service serves no more requests:
    /// every open volume made durable and the write verifier kept for the next start
    /// (`dfs_service::verifier`).
    pub fn stop_volumes(&self) -> crate::namespace::DfsResult<()> {
        self.volumes.stop()
    }

    /// Makes every open volume durable, keeping no verifier (a stop that could not make sure
    /// no request was still being served).
    pub fn sync_volumes(&self) -> crate::namespace::DfsResult<()> {
        self.volumes.sync_open().map(drop)
    }

    /// The directory of `pool` on `rank`.
    pub fn pool_dir(&self, rank: u32, pool_uuid: &str) -> PathBuf {
        self.layout.pool_dir(rank, pool_uuid)
    }

    /// Pool directories whose pool is not in the store were created by a
    /// create that never committed, or left by a destroy that crashed.
    fn remove_orphan_pool_dirs(&self) -> Result<()> {
        let known: HashSet<String> = self
            .store
            .read(|v| Ok(v.pools()?.into_iter().map(|p| p.uuid).collect()))?;
        for rank in 0..self.ranks.count() {
            let dir = self.layout.pools_dir(rank);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if !known.contains(entry.file_name().to_string_lossy().as_ref()) {
                    tracing::info!(path = %entry.path().display(), "removing orphaned pool directory");
                    std::fs::remove_dir_all(entry.path())?;
                }
            }
        }
        Ok(())
    }
}
