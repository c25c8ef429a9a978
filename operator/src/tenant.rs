//! The DaosTenant controller: reports which namespaces belong to a tenant
//! and whether it can be used (`Ready`: a valid principal and every allowed
//! pool existing as a DaosPool). It writes only status; the CSI driver acts
//! on tenants.
//!
//! [`plan_status`] decides the status from the tenant, the DaosPools and the
//! Namespaces (pure, unit-tested); [`reconcile`] lists those, writes the
//! status with server-side apply only when it changed, and records an event
//! when `Ready` flips. DaosPool and Namespace changes re-trigger the tenants
//! they concern.

use crate::Context;
use crate::conditions::set_condition;
use crate::error::Result;
use crate::pool::publish;
use crate::reconcile::{STALE_RETRY, StatusWrite, apply_status, log_results, measured};
use dpufs_api::{DaosPool, DaosTenant, DaosTenantSpec, DaosTenantStatus, condition};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Reason of `Ready=True`.
pub const TENANT_READY: &str = "TenantReady";
/// Reason of `Ready=False` when allowed pools are missing.
pub const POOL_NOT_FOUND: &str = "PoolNotFound";
/// Reason of `Ready=False` for a principal DAOS cannot use.
pub const INVALID_PRINCIPAL: &str = "InvalidPrincipal";
/// Reason of `Ready=False` for a namespace selector Kubernetes would refuse.
pub const INVALID_SELECTOR: &str = "InvalidSelector";

// Which namespaces belong to a tenant is shared with the CSI driver, which
// decides volumes' tenants by the same rules.
pub use dpufs_kube::tenancy::{
    NamespaceView, SelectorError, matched_namespaces, principal_problem, selector_matches,
};

/// The tenant's status: matched namespaces and `Ready`. Returns the status
/// and whether `Ready` changed.
pub fn plan_status(
    previous: &DaosTenantStatus,
    generation: Option<i64>,
    spec: &DaosTenantSpec,
    pools: &BTreeSet<String>,
    namespaces: &[NamespaceView],
) -> (DaosTenantStatus, bool) {
    let mut status = DaosTenantStatus {
        observed_generation: generation,
        conditions: previous.conditions.clone(),
        ..Default::default()
    };
    let matched = matched_namespaces(spec, namespaces);
    let missing: Vec<&str> = spec
        .allowed_pools
        .iter()
        .filter(|p| !pools.contains(*p))
        .map(String::as_str)
        .collect();
    let (ready, reason, message) = if let Some(problem) = principal_problem(&spec.principal) {
        (false, INVALID_PRINCIPAL, problem)
    } else if let Err(problem) = &matched {
        (false, INVALID_SELECTOR, problem.to_string())
    } else if !missing.is_empty() {
        (
            false,
            POOL_NOT_FOUND,
            format!("allowed pools without a DaosPool: {}", missing.join(", ")),
        )
    } else {
        (
            true,
            TENANT_READY,
            format!(
                "principal {}; all {} allowed pools exist",
                spec.principal,
                spec.allowed_pools.len()
            ),
        )
    };
    status.namespaces = matched.unwrap_or_default();
    let changed = set_condition(
        &mut status.conditions,
        condition::READY,
        ready,
        reason,
        &message,
        generation,
    );
    (status, changed)
}

fn key(t: &DaosTenant) -> String {
    format!("DaosTenant/{}", t.name_any())
}

/// Reconciles one DaosTenant.
pub async fn reconcile(tenant: Arc<DaosTenant>, ctx: Arc<Context>) -> Result<Action> {
    measured(
        &ctx,
        "DaosTenant",
        &key(&tenant),
        reconcile_inner(&tenant, &ctx),
    )
    .await
}

async fn reconcile_inner(tenant: &DaosTenant, ctx: &Context) -> Result<Action> {
    let api: Api<DaosTenant> = Api::all(ctx.client.clone());
    let pools: BTreeSet<String> = Api::<DaosPool>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .iter()
        .map(|p| p.name_any())
        .collect();
    let namespaces: Vec<NamespaceView> = Api::<Namespace>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .iter()
        .map(NamespaceView::from)
        .collect();
    let previous = tenant.status.clone().unwrap_or_default();
    let (status, changed) = plan_status(
        &previous,
        tenant.metadata.generation,
        &tenant.spec,
        &pools,
        &namespaces,
    );
    if status != previous && apply_status(&api, tenant, &status).await? == StatusWrite::Stale {
        return Ok(Action::requeue(STALE_RETRY));
    }
    if changed && let Some(c) = crate::conditions::get(&status.conditions, condition::READY) {
        let t = if c.status == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let reason = if c.status == "True" {
            "Ready"
        } else {
            &c.reason
        };
        publish(ctx, tenant, t, reason, c.message.clone()).await;
    }
    Ok(Action::requeue(ctx.resync))
}

pub fn error_policy(
    tenant: Arc<DaosTenant>,
    err: &crate::error::Error,
    ctx: Arc<Context>,
) -> Action {
    let delay = ctx.backoff.next(&key(&tenant)).min(ctx.resync);
    tracing::warn!(tenant = %tenant.name_any(), error = %err, reason = err.reason(), ?delay, "DaosTenant reconcile failed");
    Action::requeue(delay)
}

/// Whether a namespace change can change `tenant`'s namespaces: it is named,
/// was matched, or matches the selector now.
fn concerns(tenant: &DaosTenant, ns: &NamespaceView) -> bool {
    let named = tenant
        .spec
        .namespaces
        .as_ref()
        .is_some_and(|n| n.contains(&ns.name));
    let was_matched = tenant
        .status
        .as_ref()
        .is_some_and(|s| s.namespaces.contains(&ns.name));
    let matches_now = tenant
        .spec
        .namespace_selector
        .as_ref()
        .is_some_and(|sel| selector_matches(sel, &ns.labels).unwrap_or(true));
    named || was_matched || matches_now
}

/// Runs the DaosTenant controller; DaosPool and Namespace changes re-trigger
/// the tenants they concern.
pub async fn run(ctx: Arc<Context>) {
    let tenants: Api<DaosTenant> = Api::all(ctx.client.clone());
    let pools: Api<DaosPool> = Api::all(ctx.client.clone());
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let controller = Controller::new(tenants, watcher::Config::default());
    let by_pool = controller.store();
    let by_namespace = controller.store();
    let results = controller
        .watches(pools, watcher::Config::default(), move |p| {
            let name = p.name_any();
            by_pool
                .state()
                .into_iter()
                .filter(|t| t.spec.allowed_pools.contains(&name))
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        .watches(namespaces, watcher::Config::default(), move |ns| {
            let view = NamespaceView::from(&ns);
            by_namespace
                .state()
                .into_iter()
                .filter(|t| concerns(t, &view))
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        .run(reconcile, error_policy, ctx);
    log_results("DaosTenant", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ns(name: &str, pairs: &[(&str, &str)]) -> NamespaceView {
        NamespaceView {
            name: name.into(),
            labels: labels(pairs),
            deleting: false,
        }
    }

    fn spec(v: serde_json::Value) -> DaosTenantSpec {
        serde_json::from_value(v).unwrap()
    }

    fn ready(s: &DaosTenantStatus) -> (String, String, String) {
        let c = crate::conditions::get(&s.conditions, condition::READY).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn ready_needs_every_pool_and_a_valid_principal() {
        let s = spec(serde_json::json!({
            "namespaces": ["a"], "allowedPools": ["p1", "p2", "p3"], "principal": "team@"
        }));
        let nss = [ns("a", &[])];
        let some: BTreeSet<String> = ["p2".to_string()].into();
        let (st, changed) = plan_status(&DaosTenantStatus::default(), Some(1), &s, &some, &nss);
        assert!(changed);
        let (status, reason, msg) = ready(&st);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", POOL_NOT_FOUND)
        );
        assert!(msg.contains("p1, p3") && !msg.contains("p2"), "{msg}");
        assert_eq!(st.namespaces, vec!["a"]);
        assert_eq!(st.observed_generation, Some(1));

        let all: BTreeSet<String> = ["p1", "p2", "p3"].map(String::from).into();
        let (st2, changed) = plan_status(&st, Some(1), &s, &all, &nss);
        assert!(changed);
        assert_eq!(ready(&st2).0, "True");
        assert_eq!(ready(&st2).1, TENANT_READY);
        let (st3, changed) = plan_status(&st2, Some(1), &s, &all, &nss);
        assert!(!changed);
        assert_eq!(st3, st2, "nothing new, nothing to write");

        for bad in ["OWNER@", "team", "a:b@", "@", "a@b@"] {
            let mut s = s.clone();
            s.principal = bad.into();
            let (st, _) = plan_status(&st2, Some(2), &s, &all, &nss);
            assert_eq!(ready(&st).1, INVALID_PRINCIPAL, "{bad}");
        }
        assert_eq!(principal_problem("team-a@"), None);
        assert_eq!(principal_problem("alice@example.com"), None);
    }

    #[test]
    fn an_invalid_selector_is_reported() {
        let s = spec(serde_json::json!({
            "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]},
            "allowedPools": ["p"], "principal": "t@"
        }));
        let pools: BTreeSet<String> = ["p".to_string()].into();
        let (st, _) = plan_status(
            &DaosTenantStatus::default(),
            None,
            &s,
            &pools,
            &[ns("a", &[("k", "v")])],
        );
        let (status, reason, msg) = ready(&st);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", INVALID_SELECTOR)
        );
        assert!(msg.contains("needs values"), "{msg}");
        assert!(st.namespaces.is_empty());
    }
}
