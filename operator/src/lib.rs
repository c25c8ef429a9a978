//! dpufs-operator: controllers that reconcile DaosPool and DaosContainer
//! resources against the DAOS management service, and report the state of
//! DaosSystems and DaosTenants.
//!
//! See `docs/operator.md`. Layout: [`pool`] is the DaosPool controller (pure
//! planning functions plus a thin executor), [`container`] the DaosContainer
//! controller, [`system`] the DaosSystem controller (leader, ranks,
//! reachability), [`tenant`] the DaosTenant controller (matched namespaces,
//! allowed pools), [`systems`] caches one DAOS client per DaosSystem,
//! [`leader`] elects one active replica over a Lease, [`metrics`] and
//! [`error`] are shared. The tests run on the fake API server of
//! `dpufs_kube::testing`.

pub mod conditions;
pub mod container;
pub mod error;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod pool;
mod reconcile;
pub mod system;
pub mod systems;
pub mod tenant;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Per-object exponential backoff after failed reconciles.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            failures: Mutex::default(),
        }
    }

    /// The delay before retrying `key` after one more failure.
    pub fn next(&self, key: &str) -> Duration {
        let mut f = self.failures.lock().expect("lock");
        let n = f.entry(key.to_string()).or_insert(0);
        let delay = self.base.saturating_mul(1 << (*n).min(16)).min(self.max);
        *n += 1;
        delay
    }

    /// Forgets `key`'s failures.
    pub fn reset(&self, key: &str) {
        self.failures.lock().expect("lock").remove(key);
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: kube::Client,
    pub systems: systems::SystemClients,
    pub recorder: kube::runtime::events::Recorder,
    pub metrics: Arc<metrics::Metrics>,
    pub backoff: Backoff,
    /// How often a healthy object is re-read from DAOS.
    pub resync: Duration,
    /// How often a blocked deletion is re-checked.
    pub blocked_retry: Duration,
    /// How often each DaosSystem's management service is asked who leads and
    /// which ranks are up: shorter than `resync`, so READY and LEADER stop
    /// claiming a stopped system within seconds (one cheap query per system).
    pub system_probe: Duration,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("systems", &self.systems)
            .field("resync", &self.resync)
            .field("blocked_retry", &self.blocked_retry)
            .field("system_probe", &self.system_probe)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context with production timings.
    pub fn new(client: kube::Client, tls_root: std::path::PathBuf) -> Context {
        let reporter = kube::runtime::events::Reporter {
            controller: pool::MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            systems: systems::SystemClients::new(client.clone(), tls_root),
            recorder: kube::runtime::events::Recorder::new(client.clone(), reporter),
            client,
            metrics: Arc::default(),
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
            resync: Duration::from_secs(60),
            blocked_retry: Duration::from_secs(15),
            system_probe: Duration::from_secs(10),
        }
    }
}

/// Why [`run_as_leader`] returned.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    #[error("leader election: {0}")]
    Lease(#[from] kube::Error),
    #[error("lost leadership: {0}")]
    LostLeadership(#[from] leader::LeaseLost),
    #[error("a controller stream ended")]
    ControllerEnded,
}

/// Runs every controller (DaosSystem, DaosPool, DaosContainer, DaosTenant)
/// until one of them ends.
pub async fn run_controllers(ctx: Arc<Context>) {
    tokio::select! {
        () = system::run(ctx.clone()) => {}
        () = pool::run(ctx.clone()) => {}
        () = container::run(ctx.clone()) => {}
        () = tenant::run(ctx) => {}
    }
}

/// Waits for the Lease, then runs the controllers while renewing it.
/// Returns when leadership is lost (the caller should exit: a replica that
/// may no longer lead must stop acting).
pub async fn run_as_leader(ctx: Arc<Context>, lock: leader::LeaseLock) -> Result<(), Stopped> {
    lock.acquire().await?;
    tokio::select! {
        () = run_controllers(ctx) => Err(Stopped::ControllerEnded),
        lost = lock.hold() => Err(Stopped::LostLeadership(lost)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_max_and_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let d: Vec<u64> = (0..5).map(|_| b.next("p").as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 5, 5]);
        b.reset("p");
        assert_eq!(b.next("p").as_secs(), 1);
    }
}
