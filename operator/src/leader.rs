//! Leader election over a coordination.k8s.io Lease (kube-runtime has none):
//! one replica holds the Lease and renews it; the others wait until it
//! expires. Writes use the Lease's resourceVersion, so two replicas racing
//! for it cannot both win.
//!
//! Time follows client-go's rules, so that clocks that disagree between nodes cannot
//! make two replicas lead at once:
//! - A waiting replica never compares the holder's `renewTime` with its own clock: it
//!   notes, on its own monotonic clock, when it last saw the Lease change, and takes over
//!   only after the Lease has stayed unchanged for a whole lease duration.
//! - The leader must renew within the renew deadline (two thirds of the lease duration),
//!   each attempt bounded by what is left of it; a renewal that hangs or keeps failing
//!   ends its leadership before another replica may take over.

use crate::health::Liveness;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One replica's view of the Lease.
#[derive(Debug)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// The Lease as last seen (holder, renew time, transitions) and when, on this
    /// replica's monotonic clock.
    observed: Mutex<Option<(String, Instant)>>,
    /// Told of every answered Lease call, for `/healthz`.
    liveness: Option<Arc<Liveness>>,
}

/// Why a leader stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum LeaseLost {
    /// Another replica holds the Lease.
    #[error("another replica took the Lease")]
    TakenOver,
    /// No renewal succeeded within the renew deadline.
    #[error("no renewal succeeded within the renew deadline of {deadline:?} (last error: {last})")]
    RenewDeadline { deadline: Duration, last: String },
}

impl LeaseLock {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> LeaseLock {
        LeaseLock {
            api,
            name: name.into(),
            identity: identity.into(),
            duration,
            observed: Mutex::new(None),
            liveness: None,
        }
    }

    /// Reports every answered Lease call to `liveness`.
    pub fn with_liveness(mut self, liveness: Arc<Liveness>) -> LeaseLock {
        self.liveness = Some(liveness);
        self
    }

    /// How long the leader may go without a successful renewal.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// Whether the Lease record `seen` has stayed unchanged for `held_for` (the duration its
    /// holder declared) on this replica's clock; notes the time when it differs from the
    /// last one seen.
    fn expired(&self, seen: String, held_for: Duration) -> bool {
        let mut observed = self.observed.lock().expect("lock");
        match observed.as_ref() {
            Some((last, at)) if *last == seen => at.elapsed() > held_for,
            _ => {
                *observed = Some((seen, Instant::now()));
                false
            }
        }
    }

    fn spec(&self, now: Timestamp, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Acquires or renews the Lease; `Ok(true)` while this replica leads.
    pub async fn try_acquire_or_renew(&self) -> kube::Result<bool> {
        let answered = self.acquire_or_renew().await;
        if answered.is_ok()
            && let Some(l) = &self.liveness
        {
            l.beat();
        }
        answered
    }

    async fn acquire_or_renew(&self) -> kube::Result<bool> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let mut lease = Lease::default();
            lease.metadata.name = Some(self.name.clone());
            lease.spec = Some(self.spec(now, 0, None));
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let seen = format!(
            "{:?}/{:?}/{:?}",
            spec.holder_identity, spec.renew_time, spec.lease_transitions
        );
        // The holder's own duration counts, as in client-go: replicas configured apart
        // (during a rolling change of the setting) still wait as long as the leader renews.
        let held_for = spec
            .lease_duration_seconds
            .filter(|s| *s > 0)
            .map_or(self.duration, |s| Duration::from_secs(s as u64));
        if !ours && spec.holder_identity.is_some() && !self.expired(seen, held_for) {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquired = if ours {
            spec.acquire_time.clone()
        } else {
            None
        };
        lease.spec = Some(self.spec(now, transitions, acquired));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica leads, polling every `duration / 3`.
    pub async fn acquire(&self) -> kube::Result<()> {
        loop {
            if self.try_acquire_or_renew().await? {
                tracing::info!(identity = %self.identity, lease = %self.name, "became leader");
                return Ok(());
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews every `duration / 3` while it leads; returns why it stopped (the caller
    /// must then stop acting, normally by exiting): another replica holds the Lease, or
    /// no renewal succeeded within the renew deadline.
    pub async fn hold(&self) -> LeaseLost {
        let deadline = self.renew_deadline();
        let mut renewed = Instant::now();
        let mut last = String::from("none");
        loop {
            tokio::time::sleep(self.duration / 3).await;
            let left = deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => renewed = Instant::now(),
                Ok(Ok(false)) => {
                    tracing::warn!(identity = %self.identity, "lost the leader Lease");
                    return LeaseLost::TakenOver;
                }
                Ok(Err(e)) => {
                    tracing::warn!(identity = %self.identity, error = %e, "renewing the Lease failed");
                    last = e.to_string();
                }
                Err(_) => last = format!("a renewal still unanswered after {left:?}"),
            }
            if renewed.elapsed() >= deadline {
                tracing::error!(identity = %self.identity, %last, "renew deadline passed");
                return LeaseLost::RenewDeadline { deadline, last };
            }
        }
    }
}
