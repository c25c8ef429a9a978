//! What every controller's reconcile shares: the status write, the metrics and
//! backoff bookkeeping around one reconcile, and the log of a controller's
//! results.

use crate::Context;
use crate::error::Result;
use crate::pool::MANAGER;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use std::fmt::{Debug, Display};
use std::time::Instant;

/// What became of a status write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum StatusWrite {
    Written,
    /// The object changed since this reconcile read it: the status was
    /// computed from a stale copy and not written. The newer version's watch
    /// event brings another reconcile.
    Stale,
}

/// How soon a reconcile that met a stale object looks again, should the
/// watch event that supersedes it be lost.
pub(crate) const STALE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes `status` with server-side apply on the status subresource, as the
/// operator's field manager, so fields it stops applying are removed. The
/// object's resourceVersion is a precondition: a reconcile that read the
/// object before its previous status write landed in the cache would
/// otherwise write again (new condition times), and each write wakes
/// another reconcile.
pub(crate) async fn apply_status<K>(
    api: &Api<K>,
    obj: &K,
    status: &impl Serialize,
) -> Result<StatusWrite>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"resourceVersion": obj.meta().resource_version},
        "status": status,
    });
    let name = obj.meta().name.as_deref().unwrap_or_default();
    match api
        .patch_status(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => Ok(StatusWrite::Written),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::debug!(kind = %K::kind(&()), object = %name, "status from a stale copy not written");
            Ok(StatusWrite::Stale)
        }
        Err(e) => Err(e.into()),
    }
}

/// Replaces the object's finalizers, with its resourceVersion as a
/// precondition; returns the object as written, whose resourceVersion the
/// reconcile's later writes must carry.
pub(crate) async fn set_finalizers<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": obj.meta().resource_version,
    }});
    let name = obj.meta().name.as_deref().unwrap_or_default();
    Ok(api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}

/// Runs one reconcile of the object with backoff key `key`: records its
/// duration and outcome, and forgets the object's failures once it succeeds.
pub(crate) async fn measured(
    ctx: &Context,
    kind: &str,
    key: &str,
    reconcile: impl Future<Output = Result<Action>>,
) -> Result<Action> {
    let start = Instant::now();
    let result = reconcile.await;
    ctx.metrics
        .observe(kind, start.elapsed(), result.as_ref().err());
    if result.is_ok() {
        ctx.backoff.reset(key);
    }
    result
}

/// Drives a controller's result stream to its end, logging each failure
/// (reconcile errors are already counted and turned into conditions).
pub(crate) async fn log_results<T: Debug, E: Display>(
    kind: &'static str,
    results: impl Stream<Item = std::result::Result<T, E>>,
) {
    results
        .for_each(|res| async move {
            match res {
                Ok(obj) => tracing::debug!(kind, object = ?obj, "reconciled"),
                Err(e) => tracing::debug!(kind, error = %e, "reconcile error"),
            }
        })
        .await;
}
