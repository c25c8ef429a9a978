//! Where the engine keeps its state under the data directory: the management store
//! `engine.redb`, and per rank `ranks/<n>/`, which holds a directory per pool on that rank,
//! `ranks/<n>/pools/<pool uuid>/` (the DFS service lays out containers' namespaces inside).

use std::path::{Path, PathBuf};

/// The paths under one data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    data_dir: PathBuf,
}

impl Layout {
    pub fn new(data_dir: PathBuf) -> Layout {
        Layout { data_dir }
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The management store: pools, containers and their indexes.
    pub fn store(&self) -> PathBuf {
        self.data_dir.join("engine.redb")
    }

    /// The write verifier an orderly stop leaves for the next start (`dfs_service::verifier`).
    pub fn verifier(&self) -> PathBuf {
        self.data_dir.join("verifier")
    }

    /// The directory of `rank`.
    pub fn rank_dir(&self, rank: u32) -> PathBuf {
        self.data_dir.join("ranks").join(rank.to_string())
    }

    /// Where the pools on `rank` have their directories.
    pub fn pools_dir(&self, rank: u32) -> PathBuf {
        self.rank_dir(rank).join("pools")
    }

    /// The directory of `pool` on `rank`.
    pub fn pool_dir(&self, rank: u32, pool_uuid: &str) -> PathBuf {
        self.pools_dir(rank).join(pool_uuid)
    }
}
