//! The operator's one error type and its mapping to condition reasons.

use dpufs_daos::DaosError;

/// What a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// `spec.systemRef` names no DaosSystem.
    #[error("DaosSystem {0:?} not found")]
    SystemNotFound(String),
    /// The DaosSystem exists but dpufs cannot build a client from it
    /// (missing TLS Secret, bad endpoints...).
    #[error("DaosSystem {system:?}: {message}")]
    SystemConfig { system: String, message: String },
    /// DAOS failed the call; the text is DAOS's own.
    #[error("{0}")]
    Daos(#[from] DaosError),
    /// The spec cannot be turned into a DAOS request.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// A DaosContainer's pool does not exist or is not ready yet.
    #[error("DaosPool {0:?} is not ready")]
    PoolNotReady(String),
    /// The object has no UID yet (never happens with a real API server).
    #[error("object has no metadata.uid")]
    MissingUid,
}

impl Error {
    /// The `reason` of the `Ready=False` condition this error sets.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubernetesError",
            Error::SystemNotFound(_) => "SystemNotFound",
            Error::SystemConfig { .. } => "SystemConfigInvalid",
            Error::Daos(e) => match e {
                DaosError::Unreachable { .. } | DaosError::Timeout(..) => "DaosUnavailable",
                DaosError::NoSpace { .. } => "DaosNoSpace",
                DaosError::PermissionDenied { .. } => "DaosPermissionDenied",
                DaosError::Invalid { .. } => "DaosInvalidRequest",
                DaosError::Incompatible { .. } => "DaosIncompatible",
                DaosError::Config(_) => "SystemConfigInvalid",
                _ => "DaosError",
            },
            Error::InvalidSpec(_) => "InvalidSpec",
            Error::PoolNotReady(_) => "PoolNotReady",
            Error::MissingUid => "KubernetesError",
        }
    }

    /// A short label for the `errors` metric.
    pub fn metric_label(&self) -> &'static str {
        self.reason()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_condition_reasons() {
        let cases = [
            (Error::SystemNotFound("s".into()), "SystemNotFound"),
            (
                Error::SystemConfig {
                    system: "s".into(),
                    message: "m".into(),
                },
                "SystemConfigInvalid",
            ),
            (
                Error::Daos(DaosError::Unreachable {
                    endpoints: "e".into(),
                    cause: "c".into(),
                }),
                "DaosUnavailable",
            ),
            (
                Error::Daos(DaosError::NoSpace {
                    message: "DER_NOSPACE".into(),
                }),
                "DaosNoSpace",
            ),
            (
                Error::Daos(DaosError::PermissionDenied {
                    message: "m".into(),
                }),
                "DaosPermissionDenied",
            ),
            (
                Error::Daos(DaosError::Invalid {
                    message: "m".into(),
                }),
                "DaosInvalidRequest",
            ),
            (
                Error::Daos(DaosError::Busy {
                    message: "m".into(),
                }),
                "DaosError",
            ),
            (Error::InvalidSpec("x".into()), "InvalidSpec"),
            (Error::PoolNotReady("p".into()), "PoolNotReady"),
            (
                Error::Daos(DaosError::Config("bad key mode".into())),
                "SystemConfigInvalid",
            ),
            (Error::MissingUid, "KubernetesError"),
        ];
        for (err, reason) in cases {
            assert_eq!(err.reason(), reason, "{err}");
        }
        let e = Error::Daos(DaosError::NoSpace {
            message: "DER_NOSPACE(-1007): No space on storage target".into(),
        });
        assert!(
            e.to_string().contains("No space on storage target"),
            "DAOS text kept"
        );
    }
}
