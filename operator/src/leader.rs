//! Leader election over a coordination.k8s.io Lease (kube-runtime has none):
//! one replica holds the Lease and renews it; the others wait until it
//! expires. Writes use the Lease's resourceVersion, so two replicas racing
//! for it cannot both win.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use std::time::Duration;

/// One replica's view of the Lease.
#[derive(Debug, Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaseLock {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> LeaseLock {
        LeaseLock {
            api,
            name: name.into(),
            identity: identity.into(),
            duration,
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
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(secs)) => {
                renewed.0 + SignedDuration::from_secs(i64::from(secs)) < now
            }
            _ => true,
        };
        if !ours && !expired && spec.holder_identity.is_some() {
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

    /// Renews every `duration / 3`; returns when leadership is lost (the
    /// caller should then stop acting, normally by exiting).
    pub async fn hold(&self) -> kube::Result<()> {
        loop {
            tokio::time::sleep(self.duration / 3).await;
            if !self.try_acquire_or_renew().await? {
                tracing::warn!(identity = %self.identity, "lost the leader Lease");
                return Ok(());
            }
        }
    }
}
