//! CreateSnapshot, DeleteSnapshot and ListSnapshots: DAOS container snapshots of volumes.
//!
//! A snapshot is named in DAOS by a digest of its CSI name ([`label::label_for`]), so a
//! retried CreateSnapshot finds it. Its id is the volume id and the snapshot's epoch
//! ([`SnapshotId`]). A volume deleted while it has snapshots is only hidden (the attribute
//! [`DELETED_ATTR`]): its container goes with its last snapshot, never under one.

use super::*;
use crate::csi::error::SnapshotError;
use crate::csi::volume_id::SnapshotId;
use dpufs_daos::{Snapshot, SnapshotRef};
use dpufs_proto::csi::v1::{
    CreateSnapshotRequest, DeleteSnapshotRequest, ListSnapshotsRequest, ListSnapshotsResponse,
    list_snapshots_response::Entry,
};

/// Marks the container of a volume DeleteVolume hid because snapshots still need it.
pub const DELETED_ATTR: &str = "dpufs.csi/deleted";

/// The snapshot parameters the driver takes: only the sidecar's own metadata.
const SIDECAR_PREFIX: &str = "csi.storage.k8s.io/";

fn daos_err(step: String) -> impl FnOnce(DaosError) -> SnapshotError {
    move |source| SnapshotError::Daos { step, source }
}

impl ControllerService {
    /// CreateSnapshot.
    pub async fn take_snapshot(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<csi::Snapshot, SnapshotError> {
        const RPC: &str = "CreateSnapshot";
        if req.name.is_empty() {
            return Err(SnapshotError::MissingName(RPC));
        }
        let mut unknown: Vec<String> = req
            .parameters
            .keys()
            .filter(|k| !k.starts_with(SIDECAR_PREFIX))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            unknown.sort();
            return Err(SnapshotError::UnknownParameters(unknown));
        }
        let source = match VolumeId::parse(&req.source_volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(SnapshotError::MissingSource(RPC)),
            Err(VolumeIdError::Foreign(id)) => return Err(SnapshotError::SourceNotFound(id)),
            Err(e) => return Err(SnapshotError::MalformedId(e)),
        };
        let _guard = self
            .locks
            .try_lock(format!("snapshot name {:?}", req.name))?;
        let clients = self.dir.system(&source.system).await?;
        let (pool, cont) = (source.pool.to_string(), source.container.to_string());
        let info = match find(&clients, &pool, &cont)
            .await
            .map_err(daos_err(format!("looking volume {source} up")))?
        {
            Some(info) if !hidden(&clients, &pool, &cont).await => info,
            _ => return Err(SnapshotError::SourceNotFound(source.to_string())),
        };
        let name = label::label_for(&req.name);
        let existing = clients
            .containers
            .snapshot_list(&pool, &cont)
            .await
            .map_err(daos_err(format!("listing the snapshots of {source}")))?;
        let snap = match existing.into_iter().find(|s| s.name == name) {
            Some(s) => s,
            None => {
                if let Some(other) = self.name_taken_elsewhere(&source, &clients, &name).await? {
                    return Err(SnapshotError::NameTaken {
                        name: req.name,
                        volume: other.to_string(),
                    });
                }
                clients
                    .containers
                    .snapshot_create(&pool, &cont, &name)
                    .await
                    .map_err(daos_err(format!("snapshotting volume {source}")))?
            }
        };
        tracing::info!(source = %source, epoch = snap.epoch, "snapshot ready");
        Ok(entry(&source, &snap, quota_of(&info).unwrap_or(0)))
    }

    /// DeleteSnapshot: unknown ids are OK. A hidden volume's last snapshot takes the
    /// volume's container with it.
    pub async fn drop_snapshot(&self, req: DeleteSnapshotRequest) -> Result<(), SnapshotError> {
        let id = match SnapshotId::parse(&req.snapshot_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(SnapshotError::MissingId("DeleteSnapshot")),
            Err(VolumeIdError::Foreign(_)) => return Ok(()),
            Err(e) => return Err(SnapshotError::MalformedId(e)),
        };
        let _guard = self.locks.try_lock(format!("volume {}", id.volume))?;
        let clients = self.dir.system(&id.volume.system).await?;
        let (pool, cont) = (id.volume.pool.to_string(), id.volume.container.to_string());
        let left = match clients
            .containers
            .snapshot_destroy(&pool, &cont, SnapshotRef::Epoch(id.epoch))
            .await
        {
            Ok(left) => left,
            Err(DaosError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(daos_err(format!("deleting snapshot {id}"))(e)),
        };
        if left.is_empty() && hidden(&clients, &pool, &cont).await {
            let deleting = || daos_err(format!("deleting volume {}", id.volume));
            if let Some(info) = find(&clients, &pool, &cont).await.map_err(deleting())? {
                super::dedicated::destroy_volume(&clients, &pool, &cont, &info.label)
                    .await
                    .map_err(deleting())?;
            }
            tracing::info!(volume_id = %id.volume, "the deleted volume's last snapshot is gone: container destroyed");
        }
        tracing::info!(snapshot_id = %id, "snapshot deleted");
        Ok(())
    }

    /// ListSnapshots: by id, by source volume, or every snapshot of every volume in the
    /// directory's pools; sorted by id, `max_entries` at a time.
    pub async fn find_snapshots(
        &self,
        req: ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse, SnapshotError> {
        let mut entries = self.matching_snapshots(&req).await?;
        entries.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
        let (start, end, next_token) =
            super::inventory::page(&req.starting_token, req.max_entries, entries.len())
                .map_err(|_| SnapshotError::BadToken(req.starting_token.clone()))?;
        Ok(ListSnapshotsResponse {
            entries: entries[start..end]
                .iter()
                .map(|s| Entry {
                    snapshot: Some(s.clone()),
                })
                .collect(),
            next_token,
        })
    }

    async fn matching_snapshots(
        &self,
        req: &ListSnapshotsRequest,
    ) -> Result<Vec<csi::Snapshot>, SnapshotError> {
        if !req.snapshot_id.is_empty() {
            let Ok(id) = SnapshotId::parse(&req.snapshot_id) else {
                return Ok(vec![]);
            };
            let all = self.volume_snapshots(&id.volume).await?;
            return Ok(all
                .into_iter()
                .filter(|s| s.snapshot_id == req.snapshot_id)
                .collect());
        }
        if !req.source_volume_id.is_empty() {
            let Ok(volume) = VolumeId::parse(&req.source_volume_id) else {
                return Ok(vec![]);
            };
            return self.volume_snapshots(&volume).await;
        }
        let system = self.dir.default_system().await?;
        let mut out = vec![];
        for volume in self.all_volumes(&system).await? {
            out.extend(self.volume_snapshots(&volume).await?);
        }
        Ok(out)
    }

    /// Every volume of the driver in `system`: in the directory's pools and in pools of
    /// their own.
    async fn all_volumes(&self, system: &str) -> Result<Vec<VolumeId>, SnapshotError> {
        let clients = self.dir.system(system).await?;
        let mut pools = self.dir.pools(system).await?;
        pools.extend(super::dedicated::pools(&clients).await.map_err(|source| {
            SnapshotError::Daos {
                step: "listing the volumes' own pools".into(),
                source,
            }
        })?);
        let volumes = super::inventory::listed_volumes(&clients, system, &pools)
            .await
            .map_err(|(step, source)| SnapshotError::Daos { step, source })?;
        Ok(volumes.into_iter().map(|(id, _)| id).collect())
    }

    /// The volume other than `source` that has a snapshot named `name` (a digest label):
    /// CSI snapshot names are unique in the driver, not per volume.
    async fn name_taken_elsewhere(
        &self,
        source: &VolumeId,
        clients: &SystemClients,
        name: &str,
    ) -> Result<Option<VolumeId>, SnapshotError> {
        for volume in self.all_volumes(&source.system).await? {
            if volume == *source {
                continue;
            }
            let (pool, cont) = (volume.pool.to_string(), volume.container.to_string());
            match clients.containers.snapshot_list(&pool, &cont).await {
                Ok(snaps) if snaps.iter().any(|s| s.name == name) => return Ok(Some(volume)),
                Ok(_) | Err(DaosError::NotFound { .. }) => {}
                Err(e) => return Err(daos_err(format!("listing the snapshots of {volume}"))(e)),
            }
        }
        Ok(None)
    }

    /// The snapshots of one volume; none when it does not exist.
    async fn volume_snapshots(
        &self,
        volume: &VolumeId,
    ) -> Result<Vec<csi::Snapshot>, SnapshotError> {
        let clients = self.dir.system(&volume.system).await?;
        let (pool, cont) = (volume.pool.to_string(), volume.container.to_string());
        let Some(info) = find(&clients, &pool, &cont)
            .await
            .map_err(daos_err(format!("looking volume {volume} up")))?
        else {
            return Ok(vec![]);
        };
        let snaps = match clients.containers.snapshot_list(&pool, &cont).await {
            Ok(s) => s,
            Err(DaosError::NotFound { .. }) => return Ok(vec![]),
            Err(e) => return Err(daos_err(format!("listing the snapshots of {volume}"))(e)),
        };
        let size = quota_of(&info).unwrap_or(0);
        Ok(snaps
            .iter()
            .filter(|s| label::is_volume_label(&s.name))
            .map(|s| entry(volume, s, size))
            .collect())
    }
}

/// Whether DeleteVolume hid the volume (its snapshots keep the container).
pub(super) async fn hidden(clients: &SystemClients, pool: &str, cont: &str) -> bool {
    clients
        .containers
        .get_attributes(pool, cont)
        .await
        .is_ok_and(|a| a.contains_key(DELETED_ATTR))
}

fn entry(volume: &VolumeId, snap: &Snapshot, size: u64) -> csi::Snapshot {
    let id = SnapshotId {
        volume: volume.clone(),
        epoch: snap.epoch,
    };
    csi::Snapshot {
        size_bytes: size as i64,
        snapshot_id: id.to_string(),
        source_volume_id: volume.to_string(),
        creation_time: Some(prost_types::Timestamp {
            seconds: snap.created_unix as i64,
            nanos: 0,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}
