// Over 600 lines: the DaosPool controller's planning functions and its executor read best side by side.
//! The DaosPool controller.
//!
//! The decisions (create spec, property drift, ACL changes, deletion
//! blockers, status) are pure functions; [`reconcile`] fetches what they
//! need, applies their result, and writes status with server-side apply.

use crate::Context;
use crate::conditions::{self, set_condition};
use crate::error::{Error, Result};
use crate::reconcile::{
    STALE_RETRY, StatusWrite, apply_status, log_results, measured, set_finalizers,
};
use dpufs_api::{
    DaosContainer, DaosPool, DaosPoolSpec, DaosPoolStatus, DeletionPolicy, POOL_FINALIZER,
    PoolProperties, Reclaim, Scrub, SelfHeal, TierUsage, condition,
};
use dpufs_daos::{DaosError, PoolInfo, PoolSize, PoolSpec};
use dpufs_proto::daos::props::PropValue;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use uuid::Uuid;

/// Field manager of the operator's server-side applies.
pub const MANAGER: &str = "dpufs-operator";
/// Annotation listing the ACL principals the operator wrote (JSON array of
/// `u:name@` / `g:name@` / `OWNER@` ... keys): only these are ever corrected
/// or removed.
pub const OWNED_ACL_ANNOTATION: &str = "dpufs.io/owned-acl";
/// The CSI driver whose PersistentVolumes block a pool's deletion.
pub const CSI_DRIVER: &str = "dfs.dpufs.io";

/// Namespace of pool UUIDs: `Uuid::new_v5(POOL_UUID_NAMESPACE, metadata.uid)`.
pub const POOL_UUID_NAMESPACE: Uuid = Uuid::from_u128(0x6470_7566_732e_696f_2f70_6f6f_6c00_0001);

/// The pool UUID of a DaosPool: stable across operator restarts, so a
/// retried PoolCreate finds the pool a crashed attempt made.
pub fn pool_uuid(object_uid: &str) -> Uuid {
    Uuid::new_v5(&POOL_UUID_NAMESPACE, object_uid.as_bytes())
}

/// The DAOS label: `spec.label`, or the object name cut to DAOS's 127
/// characters (Kubernetes names only use characters DAOS labels allow).
pub fn pool_label(pool: &DaosPool) -> String {
    match &pool.spec.label {
        Some(l) => l.clone(),
        None => pool.name_any().chars().take(127).collect(),
    }
}

fn bytes(q: &dpufs_api::ByteQuantity, what: &str) -> Result<u64> {
    q.bytes()
        .map_err(|e| Error::InvalidSpec(format!("{what}: {e}")))
}

/// The wanted pool properties as (number, value).
pub fn desired_props(props: Option<&PoolProperties>) -> Result<Vec<(u32, PropValue)>> {
    let Some(p) = props else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut num = |n: u32, v: Option<u64>| {
        if let Some(v) = v {
            out.push((n, PropValue::Num(v)));
        }
    };
    num(11, p.redundancy_factor.map(u64::from));
    num(3, p.rebuild_reserved_space_percent.map(u64::from));
    num(
        4,
        p.self_heal.as_ref().map(|flags| {
            flags.iter().fold(0, |acc, f| {
                acc | match f {
                    SelfHeal::Exclude => 1,
                    SelfHeal::Rebuild => 2,
                    SelfHeal::DelayRebuild => 4,
                }
            })
        }),
    );
    num(
        5,
        p.reclaim.map(|r| match r {
            Reclaim::Disabled => 0,
            Reclaim::Lazy => 1,
            Reclaim::Time => 4,
        }),
    );
    num(
        16,
        p.scrub.map(|s| match s {
            Scrub::Disabled => 0,
            Scrub::Lazy => 1,
            Scrub::Timed => 2,
        }),
    );
    num(17, p.scrub_frequency_seconds.map(u64::from));
    num(18, p.scrub_threshold.map(u64::from));
    num(
        22,
        p.checkpoint.map(|c| match c {
            dpufs_api::Checkpoint::Disabled => 0,
            dpufs_api::Checkpoint::Timed => 1,
            dpufs_api::Checkpoint::Lazy => 2,
        }),
    );
    num(23, p.checkpoint_frequency_seconds.map(u64::from));
    num(24, p.checkpoint_threshold_percent.map(u64::from));
    num(
        25,
        p.reintegration.map(|r| match r {
            dpufs_api::Reintegration::DataSync => 0,
            dpufs_api::Reintegration::NoDataSync => 1,
            dpufs_api::Reintegration::Incremental => 2,
        }),
    );
    if let Some(q) = &p.ec_cell_size {
        out.push((9, PropValue::Num(bytes(q, "ecCellSize")?)));
    }
    if let Some(q) = &p.data_threshold {
        out.push((10, PropValue::Num(bytes(q, "dataThreshold")?)));
    }
    Ok(out)
}

/// The properties whose observed value differs from the wanted one.
pub fn plan_props(
    desired: &[(u32, PropValue)],
    observed: &[(u32, PropValue)],
) -> Vec<(u32, PropValue)> {
    desired
        .iter()
        .filter(|(n, v)| !observed.iter().any(|(on, ov)| on == n && ov == v))
        .cloned()
        .collect()
}

/// The PoolCreate request of a DaosPool.
pub fn create_spec(pool: &DaosPool, uuid: Uuid) -> Result<PoolSpec> {
    let spec: &DaosPoolSpec = &pool.spec;
    let size = match (&spec.size.total_bytes, &spec.size.tier_bytes) {
        (Some(total), _) => {
            let bytes = bytes(total, "size.totalBytes")?;
            match spec.size.tier_ratio.as_deref() {
                Some([meta, data]) => PoolSize::Total {
                    bytes,
                    tier_ratio: [f64::from(*meta) / 100.0, f64::from(*data) / 100.0],
                },
                Some(_) => {
                    return Err(Error::InvalidSpec(
                        "size.tierRatio needs two entries".into(),
                    ));
                }
                None => PoolSize::total(bytes),
            }
        }
        (None, Some(tiers)) => match tiers.as_slice() {
            [meta, data] => PoolSize::PerRank {
                tier_bytes: [
                    bytes(meta, "size.tierBytes")?,
                    bytes(data, "size.tierBytes")?,
                ],
            },
            _ => {
                return Err(Error::InvalidSpec(
                    "size.tierBytes needs two entries".into(),
                ));
            }
        },
        (None, None) => {
            return Err(Error::InvalidSpec(
                "set size.totalBytes or size.tierBytes".into(),
            ));
        }
    };
    let mut out = PoolSpec::new(pool_label(pool), size);
    out.uuid = uuid;
    out.ranks = spec.ranks.clone().unwrap_or_default();
    out.num_ranks = spec.num_ranks.unwrap_or(0);
    out.num_svc_reps = spec.service_replicas.map_or(0, u32::from);
    out.properties = desired_props(spec.properties.as_ref())?;
    out.acl = spec.acl.clone().unwrap_or_default();
    out.owner_user = spec.owner.clone().unwrap_or_default();
    out.owner_group = spec.group.clone().unwrap_or_default();
    Ok(out)
}

/// The principal key of an ACE (`A:G:admins@:rw` → `g:admins@`), as
/// PoolDeleteACL takes it.
pub fn ace_principal(ace: &str) -> Option<String> {
    let mut parts = ace.splitn(4, ':');
    let (_ty, flags, who) = (parts.next()?, parts.next()?, parts.next()?);
    parts.next()?;
    Some(match who {
        "OWNER@" | "GROUP@" | "EVERYONE@" => who.to_string(),
        _ if flags.contains('G') => format!("g:{who}"),
        _ => format!("u:{who}"),
    })
}

/// What to change in a pool ACL.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AclPlan {
    /// Entries to add or replace (PoolUpdateACL).
    pub update: Vec<String>,
    /// Principals to remove (PoolDeleteACL), only ones the operator owned.
    pub delete: Vec<String>,
    /// The principals the operator owns afterwards.
    pub owned: Vec<String>,
}

/// The ACL rule: wanted entries that are missing or differ are written;
/// principals the operator wrote earlier and no longer wants are removed;
/// every other entry is left alone.
pub fn plan_acl(desired: &[String], owned: &[String], observed: &[String]) -> AclPlan {
    let mut plan = AclPlan::default();
    for ace in desired {
        if !observed.contains(ace) {
            plan.update.push(ace.clone());
        }
        if let Some(p) = ace_principal(ace)
            && !plan.owned.contains(&p)
        {
            plan.owned.push(p);
        }
    }
    let observed_principals: Vec<String> =
        observed.iter().filter_map(|a| ace_principal(a)).collect();
    for p in owned {
        if !plan.owned.contains(p) && observed_principals.contains(p) {
            plan.delete.push(p.clone());
        }
    }
    plan.owned.sort();
    plan
}

pub(crate) fn owned_acl<K: ResourceExt>(pool: &K) -> Vec<String> {
    pool.annotations()
        .get(OWNED_ACL_ANNOTATION)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// Status fields from a PoolQuery answer (conditions are set separately).
pub fn status_from(info: &PoolInfo, previous: Option<&DaosPoolStatus>) -> DaosPoolStatus {
    DaosPoolStatus {
        uuid: Some(info.uuid.clone()),
        label: Some(info.label.clone()),
        state: Some(info.state.clone()),
        service_leader: Some(info.svc_leader),
        service_replicas: info.svc_replicas.clone(),
        tiers: info
            .tiers
            .iter()
            .map(|t| TierUsage {
                media_type: t.media.clone(),
                total_bytes: t.total,
                free_bytes: t.free,
            })
            .collect(),
        rebuild_state: (!info.rebuild_state.is_empty()).then(|| info.rebuild_state.clone()),
        observed_generation: previous.and_then(|p| p.observed_generation),
        conditions: previous.map(|p| p.conditions.clone()).unwrap_or_default(),
    }
}

/// Publishes an event about `obj`; failures are logged, never fatal.
pub(crate) async fn publish<K>(ctx: &Context, obj: &K, type_: EventType, reason: &str, note: String)
where
    K: Resource<DynamicType = ()>,
{
    let ev = kube::runtime::events::Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        tracing::warn!(object = %obj.meta().name.as_deref().unwrap_or(""), error = %e, "publishing event failed");
    }
}

/// Reconciles one DaosPool.
pub async fn reconcile(pool: Arc<DaosPool>, ctx: Arc<Context>) -> Result<Action> {
    let key = pool.name_any();
    measured(&ctx, "DaosPool", &key, reconcile_inner(&pool, &ctx)).await
}

async fn reconcile_inner(pool: &DaosPool, ctx: &Context) -> Result<Action> {
    let name = pool.name_any();
    let api: Api<DaosPool> = Api::all(ctx.client.clone());
    let uid = pool.metadata.uid.as_deref().ok_or(Error::MissingUid)?;
    let uuid = pool_uuid(uid);
    if pool.metadata.deletion_timestamp.is_some() {
        return cleanup(pool, ctx, &api, uuid).await;
    }
    let fresh;
    let pool = if pool.finalizers().iter().any(|f| f == POOL_FINALIZER) {
        pool
    } else {
        let mut f = pool.finalizers().to_vec();
        f.push(POOL_FINALIZER.to_string());
        fresh = set_finalizers(&api, pool, f).await?;
        tracing::info!(pool = %name, "finalizer added");
        &fresh
    };
    let previous = pool.status.clone().unwrap_or_default();
    match ensure(pool, ctx, &api, uuid, &previous).await {
        Ok(mut status) => {
            let generation = pool.metadata.generation;
            status.observed_generation = generation;
            let degraded = status.state.as_deref() != Some("Ready");
            let ready_changed = set_condition(
                &mut status.conditions,
                condition::READY,
                true,
                "PoolReady",
                "the pool exists and answers PoolQuery",
                generation,
            );
            let degraded_changed = set_condition(
                &mut status.conditions,
                condition::DEGRADED,
                degraded,
                if degraded {
                    "TargetsExcluded"
                } else {
                    "AllTargetsUp"
                },
                &format!("pool state {}", status.state.as_deref().unwrap_or("?")),
                generation,
            );
            conditions::remove(&mut status.conditions, condition::DELETION_BLOCKED);
            if status != previous && apply_status(&api, pool, &status).await? == StatusWrite::Stale
            {
                return Ok(Action::requeue(STALE_RETRY));
            }
            if ready_changed {
                publish(
                    ctx,
                    pool,
                    EventType::Normal,
                    "Ready",
                    format!("pool {uuid} is ready"),
                )
                .await;
            }
            if degraded_changed && degraded {
                publish(
                    ctx,
                    pool,
                    EventType::Warning,
                    "Degraded",
                    format!("pool state {}", status.state.as_deref().unwrap_or("?")),
                )
                .await;
            }
            ctx.metrics.pool_capacity(&name, &status.tiers);
            Ok(Action::requeue(ctx.resync))
        }
        Err(e) => {
            let mut status = previous.clone();
            let changed = set_condition(
                &mut status.conditions,
                condition::READY,
                false,
                e.reason(),
                &e.to_string(),
                pool.metadata.generation,
            );
            if status != previous {
                // Best effort: the reconcile error is what matters.
                if let Err(se) = apply_status(&api, pool, &status).await {
                    tracing::warn!(pool = %name, error = %se, "writing status failed");
                }
            }
            if changed {
                publish(ctx, pool, EventType::Warning, e.reason(), e.to_string()).await;
            }
            Err(e)
        }
    }
}

async fn ensure(
    pool: &DaosPool,
    ctx: &Context,
    api: &Api<DaosPool>,
    uuid: Uuid,
    previous: &DaosPoolStatus,
) -> Result<DaosPoolStatus> {
    let name = pool.name_any();
    let sys = ctx.systems.get(&pool.spec.system_ref).await?;
    let id = uuid.to_string();
    let info = match sys.mgmt.pool_query(&id).await {
        Ok(info) => info,
        Err(DaosError::NotFound { .. }) => {
            let spec = create_spec(pool, uuid)?;
            tracing::info!(pool = %name, %uuid, label = %spec.label, "creating pool");
            sys.mgmt.pool_create(&spec).await?;
            publish(
                ctx,
                pool,
                EventType::Normal,
                "Created",
                format!("created pool {uuid}"),
            )
            .await;
            sys.mgmt.pool_query(&id).await?
        }
        Err(e) => return Err(e.into()),
    };

    let desired = desired_props(pool.spec.properties.as_ref())?;
    if !desired.is_empty() {
        let numbers: Vec<u32> = desired.iter().map(|(n, _)| *n).collect();
        let observed = sys.mgmt.pool_get_props(&id, &numbers).await?;
        let changes = plan_props(&desired, &observed);
        if !changes.is_empty() {
            tracing::info!(pool = %name, ?changes, "correcting properties");
            sys.mgmt.pool_set_props(&id, changes.clone()).await?;
            publish(
                ctx,
                pool,
                EventType::Normal,
                "PropertiesUpdated",
                format!("set {} properties", changes.len()),
            )
            .await;
        }
    }

    let owned = owned_acl(pool);
    let acl = sys.mgmt.pool_get_acl(&id).await?;
    let plan = plan_acl(
        pool.spec.acl.as_deref().unwrap_or_default(),
        &owned,
        &acl.entries,
    );
    if !plan.update.is_empty() {
        tracing::info!(pool = %name, entries = ?plan.update, "updating ACL entries");
        sys.mgmt.pool_update_acl(&id, plan.update.clone()).await?;
    }
    for principal in &plan.delete {
        tracing::info!(pool = %name, %principal, "removing ACL entry the operator wrote");
        sys.mgmt.pool_delete_acl(&id, principal).await?;
    }
    if plan.owned != owned {
        let value = serde_json::to_string(&plan.owned).expect("JSON");
        let patch = json!({"metadata": {"annotations": {OWNED_ACL_ANNOTATION: value}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(status_from(&info, Some(previous)))
}

/// Why deleting the pool must wait, if it must.
async fn blockers(
    pool: &DaosPool,
    ctx: &Context,
    daos_containers: &[String],
    uuid: Uuid,
) -> Result<Vec<String>> {
    let mut out: Vec<String> = daos_containers
        .iter()
        .map(|c| format!("DAOS container {c}"))
        .collect();
    let name = pool.name_any();
    let conts: Api<DaosContainer> = Api::all(ctx.client.clone());
    for c in conts.list(&ListParams::default()).await? {
        if c.spec.pool_ref == name {
            out.push(format!(
                "DaosContainer {}/{}",
                c.namespace().unwrap_or_default(),
                c.name_any()
            ));
        }
    }
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let uuid = uuid.to_string();
    for pv in pvs.list(&ListParams::default()).await? {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
            continue;
        };
        let attrs = csi.volume_attributes.clone().unwrap_or_default();
        if csi.driver == CSI_DRIVER
            && (attrs.values().any(|v| *v == uuid) || attrs.get("pool") == Some(&name))
        {
            out.push(format!("PersistentVolume {}", pv.name_any()));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

async fn cleanup(
    pool: &DaosPool,
    ctx: &Context,
    api: &Api<DaosPool>,
    uuid: Uuid,
) -> Result<Action> {
    let name = pool.name_any();
    if !pool.finalizers().iter().any(|f| f == POOL_FINALIZER) {
        return Ok(Action::await_change());
    }
    let rest: Vec<String> = pool
        .finalizers()
        .iter()
        .filter(|f| *f != POOL_FINALIZER)
        .cloned()
        .collect();
    if pool.spec.deletion_policy == DeletionPolicy::Retain {
        tracing::info!(pool = %name, %uuid, "deletionPolicy Retain: leaving the DAOS pool");
        publish(
            ctx,
            pool,
            EventType::Normal,
            "Retained",
            format!("pool {uuid} retained in DAOS"),
        )
        .await;
        set_finalizers(api, pool, rest).await?;
        return Ok(Action::await_change());
    }
    let sys = ctx.systems.get(&pool.spec.system_ref).await?;
    let id = uuid.to_string();
    let containers = match sys.mgmt.list_containers(&id).await {
        Ok(c) => Some(c),
        Err(DaosError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    if let Some(containers) = containers {
        let blocked = blockers(pool, ctx, &containers, uuid).await?;
        let previous = pool.status.clone().unwrap_or_default();
        let mut status = previous.clone();
        if !blocked.is_empty() {
            let msg = format!("deletion waits for: {}", blocked.join(", "));
            let changed = set_condition(
                &mut status.conditions,
                condition::DELETION_BLOCKED,
                true,
                "InUse",
                &msg,
                pool.metadata.generation,
            );
            if status != previous && apply_status(api, pool, &status).await? == StatusWrite::Stale {
                return Ok(Action::requeue(STALE_RETRY));
            }
            if changed {
                publish(ctx, pool, EventType::Warning, "DeletionBlocked", msg).await;
            }
            return Ok(Action::requeue(ctx.blocked_retry));
        }
        tracing::info!(pool = %name, %uuid, "destroying pool");
        match sys.mgmt.pool_destroy(&id, false, false).await {
            Ok(()) | Err(DaosError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        publish(
            ctx,
            pool,
            EventType::Normal,
            "Destroyed",
            format!("pool {uuid} destroyed"),
        )
        .await;
    }
    set_finalizers(api, pool, rest).await?;
    Ok(Action::await_change())
}

/// Backoff after a failed reconcile; the condition already carries the error.
pub fn error_policy(pool: Arc<DaosPool>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next(&pool.name_any());
    tracing::warn!(pool = %pool.name_any(), error = %err, reason = err.reason(), ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Runs the DaosPool controller until the stream ends.
pub async fn run(ctx: Arc<Context>) {
    let pools: Api<DaosPool> = Api::all(ctx.client.clone());
    let systems: Api<dpufs_api::DaosSystem> = Api::all(ctx.client.clone());
    let containers: Api<DaosContainer> = Api::all(ctx.client.clone());
    let controller = Controller::new(pools, watcher::Config::default());
    let store = controller.store();
    let results = controller
        .watches(systems, watcher::Config::default(), move |sys| {
            let name = sys.name_any();
            store
                .state()
                .into_iter()
                .filter(|p| p.spec.system_ref == name)
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
        .watches(containers, watcher::Config::default(), |c| {
            Some(ObjectRef::<DaosPool>::new(&c.spec.pool_ref))
        })
        .run(reconcile, error_policy, ctx);
    log_results("DaosPool", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_plan_keeps_foreign_entries_and_corrects_own() {
        let desired = vec![
            "A::alice@:rw".to_string(),
            "A:G:admins@:rwcdtTaA".to_string(),
        ];
        let owned = vec!["u:alice@".to_string(), "u:old@".to_string()];
        let observed = vec![
            "A::OWNER@:rwdtTaAo".to_string(),
            "A::alice@:r".to_string(),
            "A::old@:rw".to_string(),
            "A::tenant@:rw".to_string(),
        ];
        let plan = plan_acl(&desired, &owned, &observed);
        assert_eq!(plan.update, desired);
        assert_eq!(plan.delete, vec!["u:old@".to_string()]);
        assert_eq!(
            plan.owned,
            vec!["g:admins@".to_string(), "u:alice@".to_string()]
        );
        let in_sync = plan_acl(&desired, &plan.owned, &[desired.clone(), observed].concat());
        assert!(in_sync.update.is_empty());
        assert!(
            in_sync.delete.is_empty(),
            "tenant@ and OWNER@ are not ours: {in_sync:?}"
        );
    }

    #[test]
    fn props_plan_only_changes_differences() {
        let desired = desired_props(Some(&PoolProperties {
            redundancy_factor: Some(1),
            reclaim: Some(Reclaim::Disabled),
            self_heal: Some(vec![SelfHeal::Exclude, SelfHeal::DelayRebuild]),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(
            desired,
            vec![
                (11, PropValue::Num(1)),
                (4, PropValue::Num(5)),
                (5, PropValue::Num(0))
            ]
        );
        let observed = vec![
            (11, PropValue::Num(1)),
            (4, PropValue::Num(3)),
            (5, PropValue::Num(0)),
        ];
        assert_eq!(
            plan_props(&desired, &observed),
            vec![(4, PropValue::Num(5))]
        );
    }

    #[test]
    fn uuid_is_stable_per_object_uid() {
        assert_eq!(pool_uuid("abc"), pool_uuid("abc"));
        assert_ne!(pool_uuid("abc"), pool_uuid("abd"));
        assert_eq!(ace_principal("A:G:x@:r").as_deref(), Some("g:x@"));
        assert_eq!(
            ace_principal("A::EVERYONE@:r").as_deref(),
            Some("EVERYONE@")
        );
        assert_eq!(ace_principal("junk"), None);
    }
}
