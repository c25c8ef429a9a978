//! `provisioning: pool`: a volume with a DAOS pool of its own, the hard-capacity mode (a
//! pool's size is enforced by DAOS itself, where a container quota is advisory on real DAOS).
//!
//! The pool carries the volume's label (the digest of the CSI name) and a UUID derived from
//! the system and the name, so a retried CreateVolume finds the pool it made; its data tier
//! holds the requested capacity, and its ACL lets the tenant's principal connect. The
//! volume's container in it is made as in a shared pool. A pool whose label is its
//! container's is the volume's own: it goes when the container goes (DeleteVolume, or the
//! last snapshot of a deleted volume).

use super::*;
use dpufs_daos::{PoolSize, PoolSpec};

/// The metadata (SCM) share of a pool in DAOS's default tier split: 6 %, 94 % data.
const METADATA_PERCENT: u64 = 6;
/// The least metadata tier a volume's pool gets: DAOS refuses pools whose metadata tier is
/// below a per-target minimum (16 MiB per rank of 4 targets on the embedded engine), which
/// 6 % of a small volume is.
const MIN_METADATA: u64 = 64 << 20;
/// Slack for the per-target rounding of the split, so the data tier is never below the
/// capacity asked for.
const ROUNDING_SLACK: u64 = 1 << 20;

/// The UUID of the pool of the volume named `name` in `system`.
pub(super) fn pool_uuid(system: &str, name: &str) -> Uuid {
    Uuid::new_v5(
        &Uuid::NAMESPACE_OID,
        format!("dpufs-csi/pool/{system}/{name}").as_bytes(),
    )
}

/// PoolCreate of a volume's own pool: `bytes` of data tier, the tenant's principal may
/// connect and read the pool's properties (its container has the volume's own ACL).
pub(super) fn pool_spec(label: &str, uuid: Uuid, bytes: u64, principal: &str) -> PoolSpec {
    let data = bytes.saturating_add(ROUNDING_SLACK);
    let metadata = (data / (100 - METADATA_PERCENT) * METADATA_PERCENT).max(MIN_METADATA);
    let total = data.saturating_add(metadata);
    let data_share = data as f64 / total as f64;
    let size = PoolSize::Total {
        bytes: total,
        tier_ratio: [1.0 - data_share, data_share],
    };
    let mut spec = PoolSpec::new(label, size);
    spec.uuid = uuid;
    spec.acl = vec![
        "A::OWNER@:rw".into(),
        "A:G:GROUP@:rw".into(),
        format!("A::{principal}:r"),
    ];
    spec
}

/// Makes the pool unless it exists (made by an earlier attempt: same UUID).
pub(super) async fn ensure_pool(clients: &SystemClients, spec: &PoolSpec) -> Result<(), DaosError> {
    match clients.mgmt.pool_query(&spec.uuid.to_string()).await {
        Ok(_) => return Ok(()),
        Err(DaosError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    match clients.mgmt.pool_create(spec).await {
        Ok(_) | Err(DaosError::Exists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The volumes' own pools in the system (labelled with a volume label).
pub(super) async fn pools(clients: &SystemClients) -> Result<Vec<PoolRef>, DaosError> {
    Ok(clients
        .mgmt
        .list_pools()
        .await?
        .into_iter()
        .filter(|p| label::is_volume_label(&p.label))
        .filter_map(|p| {
            Some(PoolRef {
                uuid: Uuid::parse_str(&p.uuid).ok()?,
                name: p.label,
            })
        })
        .collect())
}

/// Destroys a volume's container (labelled `label`) and, when the pool is the volume's own,
/// the pool. What is already gone is fine.
pub(super) async fn destroy_volume(
    clients: &SystemClients,
    pool: &str,
    cont: &str,
    label: &str,
) -> Result<(), DaosError> {
    match clients.containers.destroy(pool, cont, false).await {
        Ok(()) | Err(DaosError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let own = match clients.mgmt.pool_query(pool).await {
        Ok(info) => info.label == label,
        Err(DaosError::NotFound { .. }) => false,
        Err(e) => return Err(e),
    };
    if own {
        match clients.mgmt.pool_destroy(pool, false, false).await {
            Ok(()) | Err(DaosError::NotFound { .. }) => {
                tracing::info!(pool, "the volume's own pool destroyed")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_uuid_is_stable_per_system_and_name() {
        assert_eq!(pool_uuid("s", "pvc-1"), pool_uuid("s", "pvc-1"));
        assert_ne!(pool_uuid("s", "pvc-1"), pool_uuid("s", "pvc-2"));
        assert_ne!(pool_uuid("s", "pvc-1"), pool_uuid("t", "pvc-1"));
    }

    #[test]
    fn the_data_tier_holds_the_capacity_and_the_tenant_may_connect() {
        let spec = pool_spec("csi-x", Uuid::nil(), 10 << 30, "team-a@");
        let PoolSize::Total { bytes, tier_ratio } = spec.size else {
            panic!("{:?}", spec.size)
        };
        assert!((bytes as f64 * tier_ratio[1]) as u64 >= 10 << 30);
        assert!(bytes < (11 << 30), "not much more: {bytes}");
        let small = pool_spec("csi-y", Uuid::nil(), 1 << 20, "team-a@");
        let PoolSize::Total { bytes, tier_ratio } = small.size else {
            panic!("{:?}", small.size)
        };
        assert!((bytes as f64 * tier_ratio[0]) as u64 >= MIN_METADATA - 1);
        assert!((bytes as f64 * tier_ratio[1]) as u64 >= 1 << 20);
        assert!(spec.acl.contains(&"A::team-a@:r".to_string()));
        assert_eq!(spec.label, "csi-x");
    }
}
