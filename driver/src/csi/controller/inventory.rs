//! What the controller can tell about what exists: ListVolumes (every volume of the driver
//! in the directory's pools), ControllerGetVolume (one volume and its condition) and
//! GetCapacity (the free space of the pools a StorageClass can use, per DAOS system, for the
//! external-provisioner's capacity tracking).

use super::snapshots::hidden;
use super::*;
use crate::csi::error::InventoryError;
use dpufs_proto::csi::v1::{
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, GetCapacityRequest,
    GetCapacityResponse, ListVolumesRequest, ListVolumesResponse, VolumeCondition,
    controller_get_volume_response, list_volumes_response,
};

fn daos_err(step: String) -> impl FnOnce(DaosError) -> InventoryError {
    move |source| InventoryError::Daos { step, source }
}

/// A volume as ListVolumes and ControllerGetVolume show it.
fn listed(id: &VolumeId, info: &ContainerInfo) -> Volume {
    Volume {
        capacity_bytes: quota_of(info).map_or(0, |q| i64::try_from(q).unwrap_or(i64::MAX)),
        volume_id: id.to_string(),
        volume_context: Default::default(),
        content_source: None,
        accessible_topology: vec![Topology {
            segments: [(TOPOLOGY_SYSTEM_KEY.to_string(), id.system.clone())].into(),
        }],
    }
}

/// Abnormal when the pool has disabled targets (data may be unavailable or rebuilding).
fn condition(pool: Option<&dpufs_daos::PoolInfo>) -> VolumeCondition {
    match pool {
        Some(p) if p.is_degraded() => VolumeCondition {
            abnormal: true,
            message: format!(
                "pool {} is degraded: {} of {} targets disabled (rebuild {})",
                p.label, p.disabled_targets, p.total_targets, p.rebuild_state
            ),
        },
        Some(_) => VolumeCondition {
            abnormal: false,
            message: "the pool is healthy".into(),
        },
        None => VolumeCondition {
            abnormal: true,
            message: "the pool cannot be queried now".into(),
        },
    }
}

impl ControllerService {
    /// ListVolumes: sorted by id, `max_entries` at a time; ABORTED for a token not given.
    pub async fn volumes(
        &self,
        req: ListVolumesRequest,
    ) -> Result<ListVolumesResponse, InventoryError> {
        let system = self.dir.default_system().await?;
        let clients = self.dir.system(&system).await?;
        let mut pools = self.dir.pools(&system).await?;
        pools.extend(super::dedicated::pools(&clients).await.map_err(|source| {
            InventoryError::Daos {
                step: "listing the volumes' own pools".into(),
                source,
            }
        })?);
        let volumes = listed_volumes(&clients, &system, &pools)
            .await
            .map_err(|(step, source)| InventoryError::Daos { step, source })?;
        let mut pool_infos = HashMap::new();
        let mut entries = vec![];
        for (id, info) in volumes {
            let (pool, cont) = (id.pool.to_string(), id.container.to_string());
            if hidden(&clients, &pool, &cont).await {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = pool_infos.entry(id.pool) {
                e.insert(clients.mgmt.pool_query(&pool).await.ok());
            }
            entries.push(list_volumes_response::Entry {
                volume: Some(listed(&id, &info)),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: vec![],
                    volume_condition: Some(condition(pool_infos[&id.pool].as_ref())),
                }),
            });
        }
        entries.sort_by(|a, b| {
            let id =
                |e: &list_volumes_response::Entry| e.volume.as_ref().map(|v| v.volume_id.clone());
            id(a).cmp(&id(b))
        });
        let (start, end, next_token) = page(&req.starting_token, req.max_entries, entries.len())?;
        Ok(ListVolumesResponse {
            entries: entries.drain(start..end).collect(),
            next_token,
        })
    }

    /// ControllerGetVolume.
    pub async fn volume_status(
        &self,
        req: ControllerGetVolumeRequest,
    ) -> Result<ControllerGetVolumeResponse, InventoryError> {
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(InventoryError::MissingId),
            Err(e) => return Err(InventoryError::MalformedId(e)),
        };
        let clients = self.dir.system(&id.system).await?;
        let (pool, cont) = (id.pool.to_string(), id.container.to_string());
        let info = find(&clients, &pool, &cont)
            .await
            .map_err(daos_err(format!("looking volume {id} up")))?
            .filter(|info| label::is_volume_label(&info.label))
            .ok_or_else(|| InventoryError::NotFound(id.to_string()))?;
        if hidden(&clients, &pool, &cont).await {
            return Err(InventoryError::NotFound(id.to_string()));
        }
        let pool_info = clients.mgmt.pool_query(&pool).await.ok();
        Ok(ControllerGetVolumeResponse {
            volume: Some(listed(&id, &info)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: vec![],
                volume_condition: Some(condition(pool_info.as_ref())),
            }),
        })
    }

    /// GetCapacity: the free bytes of the data tier of the pool the parameters name (or of
    /// every pool of the system), for the system the topology names (another system: 0).
    pub async fn capacity(
        &self,
        req: GetCapacityRequest,
    ) -> Result<GetCapacityResponse, InventoryError> {
        let params = params::parse(&req.parameters)?;
        let system = match &params.system {
            Some(s) => s.clone(),
            None => self.dir.default_system().await?,
        };
        let elsewhere = req
            .accessible_topology
            .as_ref()
            .and_then(|t| t.segments.get(TOPOLOGY_SYSTEM_KEY))
            .is_some_and(|s| *s != system);
        let unsupported = req
            .volume_capabilities
            .iter()
            .any(|c| check_capability(c).is_err());
        // A volume with a pool of its own takes the system's unallocated space, which the
        // management calls the driver makes do not report (docs/csi.md, GetCapacity).
        let own_pool = params.provisioning == Provisioning::Pool;
        if elsewhere || unsupported || own_pool {
            return Ok(GetCapacityResponse::default());
        }
        let clients = self.dir.system(&system).await?;
        let pools = match &params.pool {
            Some(p) => vec![self.dir.pool(&system, p).await?],
            None => self.dir.pools(&system).await?,
        };
        let (mut free, mut largest) = (0u64, 0u64);
        for pool in pools {
            let info = match clients.mgmt.pool_query(&pool.uuid.to_string()).await {
                Ok(info) => info,
                Err(DaosError::NotFound { .. }) => continue,
                Err(e) => return Err(daos_err(format!("querying pool {}", pool.name))(e)),
            };
            if let Some(tier) = info.data_tier() {
                free += tier.free;
                largest = largest.max(tier.total);
            }
        }
        let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
        Ok(GetCapacityResponse {
            available_capacity: bytes(free),
            maximum_volume_size: (largest > 0).then(|| bytes(largest)),
            minimum_volume_size: None,
        })
    }
}

/// The driver's volumes in `pools` of `system`, each with its container as DAOS lists it
/// (properties included); a pool DAOS no longer has is skipped. A failure says which step.
pub(super) async fn listed_volumes(
    clients: &SystemClients,
    system: &str,
    pools: &[PoolRef],
) -> Result<Vec<(VolumeId, ContainerInfo)>, (String, DaosError)> {
    let mut out = vec![];
    for pool in pools {
        let step = || format!("listing pool {}", pool.name);
        let containers = match clients.containers.list(&pool.uuid.to_string()).await {
            Ok(c) => c,
            Err(DaosError::NotFound { .. }) => continue,
            Err(e) => return Err((step(), e)),
        };
        for c in containers {
            if label::is_volume_label(&c.label) {
                let uuid = container_uuid(&c).map_err(|e| (step(), e))?;
                out.push((VolumeId::new(system, pool.uuid, uuid), c));
            }
        }
    }
    Ok(out)
}

/// The slice `[start, end)` of `len` entries a token and a maximum select, and the next token.
pub(super) fn page(
    token: &str,
    max_entries: i32,
    len: usize,
) -> Result<(usize, usize, String), InventoryError> {
    let start = match token {
        "" => 0,
        t => match t.parse::<usize>() {
            Ok(n) if n <= len => n,
            _ => return Err(InventoryError::BadToken(t.to_string())),
        },
    };
    let max = usize::try_from(max_entries)
        .ok()
        .filter(|&m| m > 0)
        .unwrap_or(usize::MAX);
    let end = start.saturating_add(max).min(len);
    let next = if end < len {
        end.to_string()
    } else {
        String::new()
    };
    Ok((start, end, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(disabled: u32) -> dpufs_daos::PoolInfo {
        dpufs_daos::PoolInfo {
            uuid: "p".into(),
            label: "fast".into(),
            state: "Ready".into(),
            total_targets: 8,
            active_targets: 8 - disabled,
            disabled_targets: disabled,
            tiers: vec![],
            disabled_ranks: String::new(),
            svc_leader: 0,
            svc_replicas: vec![0],
            rebuild_state: "busy".into(),
            total_engines: 2,
        }
    }

    #[test]
    fn a_degraded_or_unknown_pool_makes_the_condition_abnormal() {
        assert!(!condition(Some(&pool(0))).abnormal);
        let degraded = condition(Some(&pool(4)));
        assert!(degraded.abnormal);
        assert!(
            degraded.message.contains("4 of 8 targets disabled"),
            "{}",
            degraded.message
        );
        assert!(condition(None).abnormal);
    }

    #[test]
    fn pages_and_tokens() {
        assert_eq!(page("", 0, 3).unwrap(), (0, 3, String::new()));
        assert_eq!(page("", 2, 3).unwrap(), (0, 2, "2".into()));
        assert_eq!(page("2", 2, 3).unwrap(), (2, 3, String::new()));
        assert_eq!(page("3", 2, 3).unwrap(), (3, 3, String::new()));
        for bad in ["4", "-1", "x", "01x"] {
            assert!(
                matches!(page(bad, 1, 3), Err(InventoryError::BadToken(_))),
                "{bad}"
            );
        }
    }
}
