//! A volume's QoS limits (`dpufs_node_api::qos`) between the controller and the nodes.
//!
//! The controller keeps them in the volume's container, in the [`QOS_ATTR`] attribute
//! (CreateVolume's and ControllerModifyVolume's `mutable_parameters`). A node plugin reads
//! them at stage, and every `--qos-refresh-secs` after, into the QoS file its worker re-reads
//! every second (`crate::worker::throttle`). A modified volume is capped on every node within
//! the two periods, without a restage.

use crate::csi::directory::{Directory, SystemClients};
use crate::csi::label::QOS_ATTR;
use crate::csi::node::record::{StagedVolume, VolumeFiles};
use crate::csi::volume_id::VolumeId;
use dpufs_daos::DaosError;
use dpufs_node_api::qos::QosLimits;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The limits in a container's attributes. A value that does not parse (not written by a
/// controller) is no limit, and said so: QoS fails open, never a volume.
pub fn of(volume: &VolumeId, attrs: &BTreeMap<String, Vec<u8>>) -> QosLimits {
    let Some(raw) = attrs.get(QOS_ATTR) else {
        return QosLimits::UNLIMITED;
    };
    QosLimits::decode(raw).unwrap_or_else(|e| {
        tracing::warn!(volume_id = %volume, "attribute {QOS_ATTR}: {e}; the volume is not capped");
        QosLimits::UNLIMITED
    })
}

/// The limits of `volume`, from DAOS.
pub async fn read(clients: &SystemClients, volume: &VolumeId) -> Result<QosLimits, DaosError> {
    let attrs = clients
        .containers
        .get_attributes(&volume.pool.to_string(), &volume.container.to_string())
        .await?;
    Ok(of(volume, &attrs))
}

/// Re-reads the limits of every volume staged under `records` every `every`, until the task
/// is dropped.
pub async fn refresh_forever(dir: Arc<dyn Directory>, records: PathBuf, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = refresh_all(&*dir, &records).await {
            tracing::warn!("refreshing QoS limits: {e}");
        }
    }
}

async fn refresh_all(dir: &dyn Directory, records: &Path) -> Result<(), String> {
    let staged = StagedVolume::all(records).map_err(|e| format!("{}: {e}", records.display()))?;
    for volume in staged {
        let Ok(id) = VolumeId::parse(&volume.volume_id) else {
            continue;
        };
        if let Err(e) = refresh(dir, records, &id).await {
            tracing::warn!(volume_id = %id, "refreshing its QoS limits: {e}");
        }
    }
    Ok(())
}

async fn refresh(dir: &dyn Directory, records: &Path, id: &VolumeId) -> Result<(), String> {
    let file = VolumeFiles::of(records, id).qos;
    let clients = dir.system(&id.system).await.map_err(|e| e.to_string())?;
    let limits = read(&clients, id).await.map_err(|e| e.to_string())?;
    let current = QosLimits::load(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    // Only a file the stage wrote is rewritten: a volume unstaged meanwhile gets none back.
    if limits != current && file.exists() {
        limits
            .store(&file)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        tracing::info!(volume_id = %id, "QoS limits now {limits}");
    }
    Ok(())
}
