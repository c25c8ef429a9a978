//! The default pool of the local stack, made if missing, reused otherwise. Its volume is the
//! CSI driver's to make (CreateVolume).

use crate::output;
use dpufs_daos::{MgmtClient, PoolSize, PoolSpec};
use uuid::Uuid;

/// The label of the pool `up` provides (and its DaosPool name in the CSI directory).
pub const DEFAULT_LABEL: &str = "default";
const DEFAULT_POOL_SIZE: u64 = 1 << 30;

/// The pool `up` provides.
#[derive(Debug, Clone)]
pub struct Stack {
    pub pool: String,
    /// Its data tier's size: the default volume's capacity.
    pub bytes: u64,
}

/// The `default` pool (of `pool_size` bytes when it is made) and container.
pub async fn provision(addr: &str, system: &str, pool_size: Option<u64>) -> anyhow::Result<Stack> {
    // `up` started this engine in insecure mode itself.
    let mgmt = crate::connect(None, addr, system)?;
    let size = pool_size.unwrap_or(DEFAULT_POOL_SIZE);
    let (pool, made) = default_pool(&mgmt, system, size).await?;
    let info = mgmt.pool_query(&pool).await?;
    let size: u64 = info.tiers.iter().map(|t| t.total).sum();
    println!(
        "✓ pool {DEFAULT_LABEL} ({pool}) {}, {}",
        output::bytes(size),
        if made { "created" } else { "reused" }
    );
    Ok(Stack {
        bytes: info.data_bytes().unwrap_or(size),
        pool,
    })
}

/// The pool labelled `default`; made with a UUID derived from the system
/// name, so that a create interrupted and repeated finds its own pool.
async fn default_pool(
    mgmt: &MgmtClient,
    system: &str,
    size: u64,
) -> anyhow::Result<(String, bool)> {
    if let Some(p) = mgmt
        .list_pools()
        .await?
        .into_iter()
        .find(|p| p.label == DEFAULT_LABEL)
    {
        return Ok((p.uuid, false));
    }
    let mut spec = PoolSpec::new(DEFAULT_LABEL, PoolSize::total(size));
    spec.uuid = stable_uuid(&format!("{system}/pool/{DEFAULT_LABEL}"));
    Ok((mgmt.pool_create(&spec).await?.uuid, true))
}

/// A UUID derived from `name`: the same on every run.
fn stable_uuid(name: &str) -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("dpufs-up/{name}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_uuids_are_stable() {
        assert_eq!(stable_uuid("a"), stable_uuid("a"));
        assert_ne!(stable_uuid("a"), stable_uuid("b"));
    }
}
