//! Namespaces following their containers: removed with them, copied for snapshots and
//! clones, and swept at start-up when a crash left files without a record.
//!
//! The order makes every step crash-safe: files are written before the record that refers
//! to them commits (a crash leaves unreferenced files, which start-up removes), and records
//! are deleted before their files (a crash leaves the same).

use super::volumes::Volumes;
use crate::error::Result;
use crate::namespace::SpaceBudget;
use crate::records::{ContRecord, PoolRecord};
use crate::store::Reader;
use std::collections::HashSet;
use std::path::Path;

/// Removes a directory tree, then makes its removal durable.
fn remove_durably(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    if let Some(parent) = dir.parent()
        && let Ok(d) = std::fs::File::open(parent)
    {
        d.sync_all()?;
    }
    Ok(())
}

/// Names of the entries of `dir` (none if it is missing).
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Volumes {
    /// Closes and removes a container's namespace with its snapshots (or one snapshot),
    /// giving the container's space back to the pool. Call after its record is gone.
    pub(crate) fn remove(
        &self,
        pool: &PoolRecord,
        cont: &str,
        snapshot: Option<u64>,
    ) -> Result<()> {
        if let Some(ns) = self.close(&pool.uuid, cont, snapshot)
            && snapshot.is_none()
        {
            let used = ns.used()?;
            self.pool_budget(pool)?.release(used);
        }
        for dir in self.dirs(pool, cont, snapshot) {
            remove_durably(&dir)?;
        }
        if snapshot.is_none() {
            for &rank in &pool.ranks {
                remove_durably(&self.pool_dir(rank, &pool.uuid).join("snaps").join(cont))?;
            }
        }
        Ok(())
    }

    /// Writes the namespace of snapshot `epoch` of `cont` (before its record commits).
    pub(crate) fn snapshot(&self, pool: &PoolRecord, cont: &ContRecord, epoch: u64) -> Result<()> {
        let ns = self.namespace(pool, cont, None)?;
        let target = self.config(pool, cont, Some(epoch), None);
        if let Err(e) = ns.snapshot_to(&target) {
            self.discard_dirs(pool, &cont.uuid, Some(epoch));
            return Err(e.into());
        }
        Ok(())
    }

    /// Writes a new container's namespace as a copy of a snapshot, taking the space it
    /// holds from the pool (DER_NOSPACE when it does not fit). Returns the chunk size and
    /// the bytes taken.
    pub(crate) fn clone_snapshot(
        &self,
        pool: &PoolRecord,
        source: &ContRecord,
        epoch: u64,
        target: &ContRecord,
    ) -> Result<(u64, u64)> {
        let snap = self.namespace(pool, source, Some(epoch))?;
        let used = snap.used()?;
        let budget = self.pool_budget(pool)?;
        budget.reserve(used)?;
        let cfg = self.config(pool, target, None, None);
        if let Err(e) = snap.snapshot_to(&cfg) {
            budget.release(used);
            self.discard_dirs(pool, &target.uuid, None);
            return Err(e.into());
        }
        Ok((snap.chunk_size(), used))
    }

    /// Undoes a clone whose record did not commit: its files and the space it took.
    pub(crate) fn discard_clone(&self, pool: &PoolRecord, target: &str, used: u64) {
        if let Ok(budget) = self.pool_budget(pool) {
            budget.release(used);
        }
        self.discard_dirs(pool, target, None);
    }

    fn discard_dirs(&self, pool: &PoolRecord, cont: &str, snapshot: Option<u64>) {
        for dir in self.dirs(pool, cont, snapshot) {
            if let Err(e) = remove_durably(&dir) {
                tracing::warn!(path = %dir.display(), error = %e, "leftover namespace directory");
            }
        }
    }

    /// Removes namespace directories that no record refers to: left by a create, snapshot
    /// or clone that crashed before its record committed, or a destroy that crashed after.
    pub(crate) fn remove_orphans(&self) -> Result<()> {
        let pools = self.store().read(|v| v.pools())?;
        for pool in pools {
            let conts = self.store().read(|v| v.containers(&pool.uuid))?;
            let live: HashSet<&str> = conts.iter().map(|c| c.uuid.as_str()).collect();
            for &rank in &pool.ranks {
                let base = self.pool_dir(rank, &pool.uuid);
                for name in entries(&base.join("conts")) {
                    if !live.contains(name.as_str()) {
                        tracing::info!(container = %name, "removing an orphaned namespace");
                        remove_durably(&base.join("conts").join(&name))?;
                    }
                }
                for name in entries(&base.join("snaps")) {
                    let dir = base.join("snaps").join(&name);
                    let cont = conts.iter().find(|c| c.uuid == name);
                    for epoch in entries(&dir) {
                        let known = cont.is_some_and(|c| {
                            c.snapshots.iter().any(|s| s.epoch.to_string() == epoch)
                        });
                        if !known {
                            tracing::info!(container = %name, %epoch, "removing an orphaned snapshot");
                            remove_durably(&dir.join(&epoch))?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
