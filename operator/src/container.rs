//! The DaosContainer controller: finalizer, ContainerCreate with a UUID
//! derived from the object's UID, ACL ownership as for pools, owner, status,
//! deletion per policy.

use crate::Context;
use crate::conditions::set_condition;
use crate::error::{Error, Result};
use crate::pool::{OWNED_ACL_ANNOTATION, owned_acl, plan_acl, publish};
use crate::reconcile::{
    STALE_RETRY, StatusWrite, apply_status, log_results, measured, set_finalizers,
};
use dpufs_api::{CONTAINER_FINALIZER, DaosContainer, DaosPool, DeletionPolicy, condition};
use dpufs_daos::{ContainerSpec, DaosError};
use dpufs_proto::daos::props::{
    CONT_DPUFS_CHUNK_SIZE, CONT_DPUFS_QUOTA, CONT_LAYOUT_TYPE, CONT_RD_FAC, LAYOUT_POSIX, PropValue,
};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;
use std::sync::Arc;
use uuid::Uuid;

/// Namespace of container UUIDs: `Uuid::new_v5(CONTAINER_UUID_NAMESPACE, metadata.uid)`.
pub const CONTAINER_UUID_NAMESPACE: Uuid =
    Uuid::from_u128(0x6470_7566_732e_696f_2f63_6f6e_7400_0001);

pub fn container_uuid(object_uid: &str) -> Uuid {
    Uuid::new_v5(&CONTAINER_UUID_NAMESPACE, object_uid.as_bytes())
}

/// The DAOS label: `spec.label`, or `<namespace>-<name>` cut to 127 characters.
pub fn container_label(c: &DaosContainer) -> String {
    match &c.spec.label {
        Some(l) => l.clone(),
        None => format!("{}-{}", c.namespace().unwrap_or_default(), c.name_any())
            .chars()
            .take(127)
            .collect(),
    }
}

fn bytes(q: &dpufs_api::ByteQuantity, what: &str) -> Result<u64> {
    q.bytes()
        .map_err(|e| Error::InvalidSpec(format!("{what}: {e}")))
}

/// The quota the spec asks for, in bytes: `capacity`, or nothing when the
/// spec names no capacity (the container's quota is then left alone).
pub fn desired_quota(c: &DaosContainer) -> Result<Option<u64>> {
    c.spec
        .capacity
        .as_ref()
        .map(|q| bytes(q, "capacity"))
        .transpose()
}

/// The object-class fields that are set; DAOS keeps object classes in the
/// DFS superblock, which only a libdaos backend writes, so they are not
/// passed (the operator records a warning event instead).
pub fn unapplied_fields(c: &DaosContainer) -> Vec<&'static str> {
    [
        ("objectClass", &c.spec.object_class),
        ("directoryObjectClass", &c.spec.directory_object_class),
        ("fileObjectClass", &c.spec.file_object_class),
    ]
    .into_iter()
    .filter(|(_, v)| v.is_some())
    .map(|(n, _)| n)
    .collect()
}

/// The ContainerCreate request: POSIX layout, `rd_fac`, the DFS chunk size
/// (`dpufs_chunk_size`) and the quota (`dpufs_quota`, from `capacity`), ACL
/// and owners. Object classes are not passed (see [`unapplied_fields`]).
pub fn create_spec(c: &DaosContainer, pool_uuid: &str, uuid: Uuid) -> Result<ContainerSpec> {
    let mut properties = vec![(CONT_LAYOUT_TYPE, PropValue::Num(LAYOUT_POSIX))];
    if let Some(rf) = c.spec.redundancy_factor {
        properties.push((CONT_RD_FAC, PropValue::Num(u64::from(rf))));
    }
    if let Some(q) = &c.spec.chunk_size {
        properties.push((
            CONT_DPUFS_CHUNK_SIZE,
            PropValue::Num(bytes(q, "chunkSize")?),
        ));
    }
    if let Some(quota) = desired_quota(c)? {
        properties.push((CONT_DPUFS_QUOTA, PropValue::Num(quota)));
    }
    Ok(ContainerSpec {
        pool: pool_uuid.to_string(),
        uuid: Some(uuid),
        label: container_label(c),
        properties,
        acl: c.spec.acl.clone().unwrap_or_default(),
        owner_user: c.spec.owner.clone().unwrap_or_default(),
        owner_group: c.spec.group.clone().unwrap_or_default(),
        ..Default::default()
    })
}

/// The pool's UUID and system, once the pool is ready.
async fn pool_of(ctx: &Context, c: &DaosContainer) -> Result<(String, String)> {
    let pools: Api<DaosPool> = Api::all(ctx.client.clone());
    let pool = pools
        .get_opt(&c.spec.pool_ref)
        .await?
        .ok_or_else(|| Error::PoolNotReady(c.spec.pool_ref.clone()))?;
    let uuid = pool
        .status
        .as_ref()
        .and_then(|s| s.uuid.clone())
        .ok_or_else(|| Error::PoolNotReady(c.spec.pool_ref.clone()))?;
    Ok((uuid, pool.spec.system_ref.clone()))
}

/// Reconciles one DaosContainer.
pub async fn reconcile(c: Arc<DaosContainer>, ctx: Arc<Context>) -> Result<Action> {
    measured(&ctx, "DaosContainer", &key(&c), reconcile_inner(&c, &ctx)).await
}

fn key(c: &DaosContainer) -> String {
    format!(
        "DaosContainer/{}/{}",
        c.namespace().unwrap_or_default(),
        c.name_any()
    )
}

async fn reconcile_inner(c: &DaosContainer, ctx: &Context) -> Result<Action> {
    let ns = c.namespace().unwrap_or_default();
    let api: Api<DaosContainer> = Api::namespaced(ctx.client.clone(), &ns);
    let derived = container_uuid(c.metadata.uid.as_deref().ok_or(Error::MissingUid)?);
    // The container's UUID: the one DAOS reported once it exists (a real DAOS system
    // picks its own; the engine takes the derived one), else the derived one.
    let uuid = c
        .status
        .as_ref()
        .and_then(|s| s.uuid.as_deref())
        .and_then(|u| Uuid::parse_str(u).ok())
        .unwrap_or(derived);
    let has_finalizer = c.finalizers().iter().any(|f| f == CONTAINER_FINALIZER);
    if c.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        let rest: Vec<String> = c
            .finalizers()
            .iter()
            .filter(|f| *f != CONTAINER_FINALIZER)
            .cloned()
            .collect();
        if c.spec.deletion_policy == DeletionPolicy::Delete {
            // A pool that is gone took the container with it.
            if let Ok((pool_uuid, system)) = pool_of(ctx, c).await {
                let sys = ctx.systems.get(&system).await?;
                match sys
                    .containers
                    .destroy(&pool_uuid, &uuid.to_string(), false)
                    .await
                {
                    Ok(()) | Err(DaosError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                publish(
                    ctx,
                    c,
                    EventType::Normal,
                    "Destroyed",
                    format!("container {uuid} destroyed"),
                )
                .await;
            }
        }
        set_finalizers(&api, c, rest).await?;
        return Ok(Action::await_change());
    }
    let fresh;
    let c = if has_finalizer {
        c
    } else {
        let mut f = c.finalizers().to_vec();
        f.push(CONTAINER_FINALIZER.to_string());
        fresh = set_finalizers(&api, c, f).await?;
        &fresh
    };
    let previous = c.status.clone().unwrap_or_default();
    let mut status = previous.clone();
    let result = ensure(c, ctx, &api, uuid).await;
    let (ok, reason, message) = match &result {
        Ok((pool_uuid, label, actual)) => {
            status.uuid = Some(actual.clone());
            status.label = Some(label.clone());
            status.pool_uuid = Some(pool_uuid.clone());
            status.observed_generation = c.metadata.generation;
            (true, "ContainerReady", "the container exists".to_string())
        }
        Err(e) => (false, e.reason(), e.to_string()),
    };
    let changed = set_condition(
        &mut status.conditions,
        condition::READY,
        ok,
        reason,
        &message,
        c.metadata.generation,
    );
    if status != previous && apply_status(&api, c, &status).await? == StatusWrite::Stale {
        return Ok(Action::requeue(STALE_RETRY));
    }
    if changed {
        let t = if ok {
            EventType::Normal
        } else {
            EventType::Warning
        };
        publish(ctx, c, t, reason, message).await;
    }
    result.map(|_| Action::requeue(ctx.resync))
}

async fn ensure(
    c: &DaosContainer,
    ctx: &Context,
    api: &Api<DaosContainer>,
    uuid: Uuid,
) -> Result<(String, String, String)> {
    let (pool_uuid, system) = pool_of(ctx, c).await?;
    let sys = ctx.systems.get(&system).await?;
    let info = match sys.containers.query(&pool_uuid, &uuid.to_string()).await {
        Ok(info) => info,
        Err(DaosError::NotFound { .. }) => {
            let spec = create_spec(c, &pool_uuid, uuid)?;
            tracing::info!(container = %c.name_any(), %uuid, "creating container");
            let info = sys.containers.create(&spec).await?;
            publish(
                ctx,
                c,
                EventType::Normal,
                "Created",
                format!("created container {}", info.uuid),
            )
            .await;
            let unapplied = unapplied_fields(c);
            if !unapplied.is_empty() {
                publish(
                    ctx,
                    c,
                    EventType::Warning,
                    "ObjectClassNotApplied",
                    format!(
                        "{} not applied: DAOS keeps object classes in the DFS superblock, which this DAOS client cannot write; the container uses the default object classes",
                        unapplied.join(", ")
                    ),
                )
                .await;
            }
            info
        }
        Err(e) => return Err(e.into()),
    };
    let cont = info.uuid.clone();
    // The quota follows the spec (a changed capacity, drift behind the
    // operator's back); the other properties are create-only.
    if let Some(quota) = desired_quota(c)?
        && info.properties.get(&CONT_DPUFS_QUOTA) != Some(&PropValue::Num(quota))
    {
        tracing::info!(container = %c.name_any(), quota, "setting the container quota");
        sys.containers
            .set_properties(
                &pool_uuid,
                &cont,
                vec![(CONT_DPUFS_QUOTA, PropValue::Num(quota))],
            )
            .await?;
        publish(
            ctx,
            c,
            EventType::Normal,
            "PropertiesUpdated",
            format!("set dpufs_quota to {quota} bytes"),
        )
        .await;
    }
    let owned = owned_acl(c);
    let plan = plan_acl(
        c.spec.acl.as_deref().unwrap_or_default(),
        &owned,
        &info.acl.entries,
    );
    if !plan.update.is_empty() {
        sys.containers
            .update_acl(&pool_uuid, &cont, plan.update.clone())
            .await?;
    }
    for p in &plan.delete {
        sys.containers.delete_acl(&pool_uuid, &cont, p).await?;
    }
    if plan.owned != owned {
        let value = serde_json::to_string(&plan.owned).expect("JSON");
        let patch = json!({"metadata": {"annotations": {OWNED_ACL_ANNOTATION: value}}});
        api.patch(
            &c.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    let user = c.spec.owner.clone().unwrap_or_default();
    let group = c.spec.group.clone().unwrap_or_default();
    if (!user.is_empty() && user != info.acl.owner_user)
        || (!group.is_empty() && group != info.acl.owner_group)
    {
        sys.mgmt
            .cont_set_owner(&pool_uuid, &cont, &user, &group)
            .await?;
    }
    Ok((pool_uuid, info.label, info.uuid))
}

pub fn error_policy(c: Arc<DaosContainer>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next(&key(&c));
    tracing::warn!(container = %key(&c), error = %err, reason = err.reason(), ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Runs the DaosContainer controller; pool changes re-trigger their containers.
pub async fn run(ctx: Arc<Context>) {
    let conts: Api<DaosContainer> = Api::all(ctx.client.clone());
    let pools: Api<DaosPool> = Api::all(ctx.client.clone());
    let controller = Controller::new(conts, watcher::Config::default());
    let store = controller.store();
    let results = controller
        .watches(pools, watcher::Config::default(), move |p| {
            let name = p.name_any();
            store
                .state()
                .into_iter()
                .filter(|c| c.spec.pool_ref == name)
                .map(|c| ObjectRef::from_obj(&*c))
                .collect::<Vec<_>>()
        })
        .run(reconcile, error_policy, ctx);
    log_results("DaosContainer", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_spec_is_posix_with_derived_uuid() {
        let c: DaosContainer = serde_json::from_value(json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosContainer",
            "metadata": {"name": "data", "namespace": "team", "uid": "u1"},
            "spec": {"poolRef": "tank", "redundancyFactor": 1}
        }))
        .unwrap();
        let spec = create_spec(&c, "P", container_uuid("u1")).unwrap();
        assert_eq!(spec.label, "team-data");
        assert_eq!(spec.uuid, Some(container_uuid("u1")));
        assert!(
            spec.properties
                .contains(&(CONT_LAYOUT_TYPE, PropValue::Num(LAYOUT_POSIX)))
        );
        assert!(spec.properties.contains(&(CONT_RD_FAC, PropValue::Num(1))));
        assert!(
            !spec
                .properties
                .iter()
                .any(|(n, _)| *n == CONT_DPUFS_CHUNK_SIZE || *n == CONT_DPUFS_QUOTA),
            "nothing the spec does not ask for"
        );
        assert!(unapplied_fields(&c).is_empty());
    }

    #[test]
    fn chunk_size_and_capacity_become_properties() {
        let c: DaosContainer = serde_json::from_value(json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosContainer",
            "metadata": {"name": "data", "namespace": "team", "uid": "u1"},
            "spec": {"poolRef": "tank", "chunkSize": "64Ki", "capacity": "1.5Gi",
                     "objectClass": "SX", "fileObjectClass": "EC_8P2GX"}
        }))
        .unwrap();
        let spec = create_spec(&c, "P", container_uuid("u1")).unwrap();
        assert!(
            spec.properties
                .contains(&(CONT_DPUFS_CHUNK_SIZE, PropValue::Num(64 << 10)))
        );
        assert!(
            spec.properties
                .contains(&(CONT_DPUFS_QUOTA, PropValue::Num(3 << 29)))
        );
        assert_eq!(desired_quota(&c).unwrap(), Some(3 << 29));
        assert_eq!(unapplied_fields(&c), vec!["objectClass", "fileObjectClass"]);
    }
}
