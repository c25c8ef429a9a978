//! Container snapshots (DAOS's: read-only, point in time, named by an increasing epoch) and
//! clones of them (a dpufs extension), each with its DFS namespace.

use crate::containers::{cont_info, new_container};
use crate::engine::Engine;
use crate::error::{Result, der};
use crate::records::{ContRecord, SnapshotRecord, now_unix};
use crate::store::Reader;
use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::props;
use dpufs_proto::engine::v1 as eng;

impl Engine {
    /// Creates a snapshot with an epoch above every earlier one: its namespace is
    /// written (durably) before the record that names it commits.
    pub fn snapshot_create(&self, req: eng::SnapshotCreateReq) -> Result<eng::Snapshot> {
        let cref = Self::cont_ref(req.cont)?;
        let _serial = self.volumes().lifecycle();
        let (pool, cont) = self.store().read(|v| self.resolve(v, &cref))?;
        let name_taken = |cont: &ContRecord| {
            if !req.name.is_empty() && cont.snapshots.iter().any(|s| s.name == req.name) {
                return Err(der(Der::Exist, format!("snapshot {:?} exists", req.name)));
            }
            Ok(())
        };
        name_taken(&cont)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let last = cont.snapshots.iter().map(|s| s.epoch).max().unwrap_or(0);
        let snap = SnapshotRecord {
            epoch: now.max(last + 1),
            name: req.name.clone(),
            created_unix: now_unix(),
        };
        self.volumes().snapshot(&pool, &cont, snap.epoch)?;
        let recorded = self.update_container(&cref, |_, cont| {
            name_taken(cont)?;
            cont.snapshots.push(snap.clone());
            Ok(())
        });
        if let Err(e) = recorded {
            self.volumes().remove(&pool, &cont.uuid, Some(snap.epoch))?;
            return Err(e);
        }
        Ok(snapshot(snap))
    }

    /// Creates a container whose namespace starts as a copy of a snapshot of another
    /// (copy-on-write): an independent, writable volume. A retry with the same UUID and
    /// label returns the clone made before.
    pub fn cont_clone_snapshot(&self, req: eng::ContCloneReq) -> Result<eng::ContInfo> {
        let src_ref = Self::cont_ref(req.source)?;
        let mut target = req
            .target
            .ok_or_else(|| der(Der::Inval, "no container to create"))?;
        let _serial = self.volumes().lifecycle();
        let (pool, source) = self.store().read(|v| self.resolve(v, &src_ref))?;
        if !target.pool.is_empty()
            && self.store().read(|v| v.resolve_pool(&target.pool))?.uuid != pool.uuid
        {
            return Err(der(Der::Inval, "a clone must be in its source's pool"));
        }
        target.pool = pool.uuid.clone();
        let snap = source
            .snapshots
            .iter()
            .find(|s| match req.epoch {
                0 => !req.snapshot_name.is_empty() && s.name == req.snapshot_name,
                epoch => s.epoch == epoch,
            })
            .ok_or_else(|| der(Der::Nonexist, "no such snapshot"))?
            .clone();
        let uuid = Self::new_container_uuid(&target.label, &target.uuid)?;
        if let Some(existing) = self.store().read(|v| v.find_container(&pool.uuid, &uuid))? {
            if existing.label == target.label {
                return Ok(cont_info(&existing));
            }
            return Err(der(Der::Exist, format!("container {uuid} exists")));
        }
        target.uuid = uuid.clone();
        // The copy's chunk files are cut by the source's chunk size, so the clone keeps it.
        let chunk_size = self
            .volumes()
            .namespace(&pool, &source, Some(snap.epoch))?
            .chunk_size();
        let mut asked = target
            .properties
            .iter()
            .filter(|p| p.number == props::CONT_DPUFS_CHUNK_SIZE);
        if asked.any(|p| p.value != Some(eng::cont_property::Value::Numval(chunk_size))) {
            return Err(der(Der::Inval, "a clone keeps its source's chunk size"));
        }
        target
            .properties
            .retain(|p| p.number != props::CONT_DPUFS_CHUNK_SIZE);
        target.properties.push(eng::ContProperty {
            number: props::CONT_DPUFS_CHUNK_SIZE,
            value: Some(eng::cont_property::Value::Numval(chunk_size)),
        });
        let record = new_container(&pool, uuid.clone(), &target)?;
        let (_, used) = self
            .volumes()
            .clone_snapshot(&pool, &source, snap.epoch, &record)?;
        self.cont_create(target)
            .inspect_err(|_| self.volumes().discard_clone(&pool, &uuid, used))
    }

    pub fn snapshot_list(&self, cref: eng::ContRef) -> Result<eng::SnapshotListResp> {
        let (_, cont) = self.store().read(|v| self.resolve(v, &cref))?;
        Ok(eng::SnapshotListResp {
            snapshots: cont.snapshots.into_iter().map(snapshot).collect(),
        })
    }

    /// Destroys a snapshot named by epoch or name, with its namespace.
    pub fn snapshot_destroy(&self, req: eng::SnapshotDestroyReq) -> Result<eng::SnapshotListResp> {
        let cref = Self::cont_ref(req.cont)?;
        let _serial = self.volumes().lifecycle();
        let (pool, before) = self.store().read(|v| self.resolve(v, &cref))?;
        let mut left = Vec::new();
        self.update_container(&cref, |_, cont| {
            let before = cont.snapshots.len();
            cont.snapshots.retain(|s| {
                if req.epoch != 0 {
                    s.epoch != req.epoch
                } else {
                    req.name.is_empty() || s.name != req.name
                }
            });
            if cont.snapshots.len() == before {
                return Err(der(Der::Nonexist, "no such snapshot"));
            }
            left = cont.snapshots.clone();
            Ok(())
        })?;
        for gone in before.snapshots.iter().filter(|s| !left.contains(s)) {
            self.volumes()
                .remove(&pool, &before.uuid, Some(gone.epoch))?;
        }
        Ok(eng::SnapshotListResp {
            snapshots: left.into_iter().map(snapshot).collect(),
        })
    }
}

fn snapshot(s: SnapshotRecord) -> eng::Snapshot {
    eng::Snapshot {
        epoch: s.epoch,
        name: s.name,
        created_unix: s.created_unix,
    }
}
