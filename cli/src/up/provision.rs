//! The default pool and container of the local stack, made if missing, reused otherwise.

use crate::output;
use dpufs_daos::{ContainerAdmin, ContainerSpec, EngineContainers, MgmtClient, PoolSize, PoolSpec};
use dpufs_proto::daos::props::{CONT_LAYOUT_TYPE, LAYOUT_POSIX, PropValue};
use uuid::Uuid;

/// The label of the pool and container `up` provides.
pub const DEFAULT_LABEL: &str = "default";
const DEFAULT_POOL_SIZE: u64 = 1 << 30;

/// The pool and container `up` provides.
#[derive(Debug, Clone)]
pub struct Stack {
    pub pool: String,
    pub container: String,
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
    let (cont, made) = default_container(&mgmt, &pool).await?;
    println!(
        "✓ container {DEFAULT_LABEL} ({cont}) POSIX, {}",
        if made { "created" } else { "reused" }
    );
    Ok(Stack {
        pool,
        container: cont,
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

/// The POSIX container labelled `default` in `pool`, made like the pool.
async fn default_container(mgmt: &MgmtClient, pool: &str) -> anyhow::Result<(String, bool)> {
    let admin = EngineContainers::new(mgmt);
    if let Some(c) = admin
        .list(pool)
        .await?
        .into_iter()
        .find(|c| c.label == DEFAULT_LABEL)
    {
        return Ok((c.uuid, false));
    }
    let spec = ContainerSpec {
        pool: pool.to_string(),
        uuid: Some(stable_uuid(&format!("{pool}/container/{DEFAULT_LABEL}"))),
        label: DEFAULT_LABEL.into(),
        properties: vec![(CONT_LAYOUT_TYPE, PropValue::Num(LAYOUT_POSIX))],
        ..ContainerSpec::default()
    };
    Ok((admin.create(&spec).await?.uuid, true))
}

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
