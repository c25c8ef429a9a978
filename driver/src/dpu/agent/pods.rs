//! The agent does not take the host's word (docs/dpu.md, "Threat model"): before it stages a
//! volume for a pod, it asks the API server whether the pod exists with the UID the host
//! sent, runs on the host this DPU is paired with, has not finished, and uses the volume
//! through a claim that is bound, both ways, to a PersistentVolume of this driver whose handle
//! is the volume id.
//! Whether the pod's namespace belongs to the volume's tenant is decided by the caller, with
//! the tenant read from the volume's container.
//!
//! Every answer comes from `get` of one object: pods, persistentvolumeclaims,
//! persistentvolumes (nothing is listed or watched, so the agent's RBAC stays `get` on those).

use crate::csi::DRIVER_NAME;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::Api;

/// A pod, as the host names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pod {}/{}", self.namespace, self.name)
    }
}

/// What did not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodRefusal {
    #[error("{0} does not exist")]
    NoSuchPod(PodRef),
    #[error("{pod} has UID {actual}, not {}", .pod.uid)]
    OtherUid { pod: PodRef, actual: String },
    #[error("{pod} is scheduled to node {}, not to {host}, the host this DPU serves", .node.as_deref().unwrap_or("(none yet)"))]
    OtherNode {
        pod: PodRef,
        node: Option<String>,
        host: String,
    },
    #[error("{pod} has finished ({phase}); kubelet mounts nothing for it")]
    Finished { pod: PodRef, phase: String },
    #[error(
        "{pod} uses no PersistentVolumeClaim bound to a PersistentVolume of {DRIVER_NAME} with volume handle {volume_id} (its claims: {})",
        if .claims.is_empty() { "none".to_string() } else { .claims.join(", ") }
    )]
    NoClaimOfVolume {
        pod: PodRef,
        volume_id: String,
        claims: Vec<String>,
    },
}

/// Why a pod could not be checked, or was refused.
#[derive(Debug, thiserror::Error)]
pub enum PodCheckError {
    #[error("{0}")]
    Refused(#[from] PodRefusal),
    #[error("asking the Kubernetes API about the pod: {0}")]
    Kube(#[from] kube::Error),
}

/// Checks `pod` against the API server: it exists with its UID, runs on `host`, and uses
/// `volume_id` through a bound claim.
pub async fn check(
    client: &kube::Client,
    pod: &PodRef,
    host: &str,
    volume_id: &str,
) -> Result<(), PodCheckError> {
    let object = Api::<Pod>::namespaced(client.clone(), &pod.namespace)
        .get_opt(&pod.name)
        .await?
        .ok_or_else(|| PodRefusal::NoSuchPod(pod.clone()))?;
    let actual = object.metadata.uid.clone().unwrap_or_default();
    if actual != pod.uid {
        return Err(PodRefusal::OtherUid {
            pod: pod.clone(),
            actual,
        }
        .into());
    }
    let spec = object.spec.unwrap_or_default();
    if spec.node_name.as_deref() != Some(host) {
        return Err(PodRefusal::OtherNode {
            pod: pod.clone(),
            node: spec.node_name,
            host: host.to_string(),
        }
        .into());
    }
    // A pod that ran here once does not open its volumes to the host for good.
    let phase = object.status.and_then(|s| s.phase).unwrap_or_default();
    if matches!(phase.as_str(), "Succeeded" | "Failed") {
        return Err(PodRefusal::Finished {
            pod: pod.clone(),
            phase,
        }
        .into());
    }
    let claims = claims_of(&pod.name, &spec.volumes.unwrap_or_default());
    for claim in &claims {
        if claim_is_of_volume(client, &pod.namespace, claim, volume_id).await? {
            return Ok(());
        }
    }
    Err(PodRefusal::NoClaimOfVolume {
        pod: pod.clone(),
        volume_id: volume_id.to_string(),
        claims,
    }
    .into())
}

/// The claims a pod's volumes name: `persistentVolumeClaim.claimName`, and the claim
/// Kubernetes makes for a generic ephemeral volume (`<pod>-<volume>`).
fn claims_of(pod: &str, volumes: &[k8s_openapi::api::core::v1::Volume]) -> Vec<String> {
    volumes
        .iter()
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(pvc), _) => Some(pvc.claim_name.clone()),
            (None, Some(_)) => Some(format!("{pod}-{}", v.name)),
            _ => None,
        })
        .collect()
}

/// Whether the claim `namespace/claim` is bound to a PersistentVolume of this driver with
/// handle `volume_id`, and that volume to this claim (a claim that merely names a volume in
/// `spec.volumeName` while the volume is bound to another claim does not count).
async fn claim_is_of_volume(
    client: &kube::Client,
    namespace: &str,
    claim: &str,
    volume_id: &str,
) -> Result<bool, kube::Error> {
    let Some(pvc) = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get_opt(claim)
        .await?
    else {
        return Ok(false);
    };
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let Some(pv_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
        return Ok(false);
    };
    if !bound {
        return Ok(false);
    }
    let Some(pv) = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&pv_name)
        .await?
    else {
        return Ok(false);
    };
    let spec = pv.spec.unwrap_or_default();
    let ours = spec
        .csi
        .as_ref()
        .is_some_and(|csi| csi.driver == DRIVER_NAME && csi.volume_handle == volume_id);
    let claimed_back = spec.claim_ref.as_ref().is_some_and(|r| {
        r.namespace.as_deref() == Some(namespace)
            && r.name.as_deref() == Some(claim)
            && (r.uid.is_none() || r.uid == pvc.metadata.uid)
    });
    Ok(ours && claimed_back)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        EphemeralVolumeSource, PersistentVolumeClaimVolumeSource, Volume,
    };

    #[test]
    fn claims_come_from_claim_volumes_and_generic_ephemeral_volumes() {
        let volumes = vec![
            Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: "train-data".into(),
                    read_only: None,
                }),
                ..Default::default()
            },
            Volume {
                name: "scratch".into(),
                ephemeral: Some(EphemeralVolumeSource::default()),
                ..Default::default()
            },
            Volume {
                name: "config".into(),
                ..Default::default()
            },
        ];
        assert_eq!(
            claims_of("trainer-0", &volumes),
            ["train-data", "trainer-0-scratch"]
        );
    }
}
