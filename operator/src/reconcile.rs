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

/// Writes `status` with server-side apply on the status subresource, as the
/// operator's field manager, so fields it stops applying are removed.
pub(crate) async fn apply_status<K>(api: &Api<K>, name: &str, status: &impl Serialize) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
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
