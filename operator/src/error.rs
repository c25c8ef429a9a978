//! The operator's one error type and its mapping to condition reasons.

use dpufs_daos::DaosError;
use dpufs_kube::SystemClientError;
use dpufs_proto::daos::fault::FaultCode;

/// What a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// `spec.systemRef` names no DaosSystem.
    #[error("DaosSystem {0:?} not found")]
    SystemNotFound(String),
    /// No client can be built from the DaosSystem (its TLS Secret, its
    /// endpoints, its version); the text is the shared client builder's.
    #[error("{0}")]
    System(SystemClientError),
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
    /// The `reason` of the `Ready=False` condition this error sets on a
    /// DaosPool or DaosContainer (whose readiness depends on DAOS).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubernetesError",
            Error::SystemNotFound(_) => "SystemNotFound",
            Error::System(
                SystemClientError::VersionUnsupported { .. }
                | SystemClientError::VersionMismatch { .. },
            ) => "DaosIncompatible",
            Error::System(_) => "SystemConfigInvalid",
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

    /// The `reason` of a DaosSystem's `Ready=False` condition: what is wrong
    /// with reaching the management service itself.
    pub fn system_reason(&self) -> &'static str {
        match self {
            Error::Kube(_) | Error::MissingUid => "KubernetesError",
            Error::SystemNotFound(_) => "SystemNotFound",
            Error::System(e) => match e {
                SystemClientError::SecretMissing { .. } => "SecretMissing",
                SystemClientError::SecretInvalid { .. } => "SecretInvalid",
                SystemClientError::VersionUnsupported { .. }
                | SystemClientError::VersionMismatch { .. } => "VersionIncompatible",
                // Kube and Daos never stay wrapped (`From<SystemClientError>`).
                _ => "ConfigInvalid",
            },
            Error::Daos(e) if e.is_tls_rejection() => "TlsRejected",
            Error::Daos(e) => match e {
                DaosError::Unreachable { .. } | DaosError::Timeout(..) => "Unreachable",
                // The server refused these credentials (e.g. not an admin certificate).
                DaosError::PermissionDenied { .. } => "TlsRejected",
                DaosError::Incompatible { .. } => "VersionIncompatible",
                DaosError::Config(_) => "ConfigInvalid",
                DaosError::Fault { .. } if e.fault() == Some(FaultCode::WrongSystem) => {
                    "WrongSystem"
                }
                _ => "DaosError",
            },
            Error::InvalidSpec(_) => "InvalidSpec",
            Error::PoolNotReady(_) => "PoolNotReady",
        }
    }

    /// The reason in the vocabulary of `kind`'s conditions: [`Error::system_reason`]
    /// for DaosSystems, [`Error::reason`] for the other kinds.
    pub fn reason_for(&self, kind: &str) -> &'static str {
        match kind {
            "DaosSystem" => self.system_reason(),
            _ => self.reason(),
        }
    }

    /// A short label for the `errors` metric of `kind`: its condition reason.
    pub fn metric_label(&self, kind: &str) -> &'static str {
        self.reason_for(kind)
    }
}

/// A Kubernetes or DAOS failure met while building a client is that failure,
/// with its own reasons; the rest are the DaosSystem's.
impl From<SystemClientError> for Error {
    fn from(e: SystemClientError) -> Error {
        match e {
            SystemClientError::Kube(e) => Error::Kube(e),
            SystemClientError::Daos(e) => Error::Daos(e),
            other => Error::System(other),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_proto::daos::der::Der;

    #[test]
    fn errors_map_to_condition_reasons() {
        let cases = [
            (Error::SystemNotFound("s".into()), "SystemNotFound"),
            (
                Error::System(SystemClientError::Config {
                    system: "s".into(),
                    message: "m".into(),
                }),
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
                    der: Some(Der::NoSpace),
                }),
                "DaosNoSpace",
            ),
            (
                Error::Daos(DaosError::PermissionDenied {
                    message: "m".into(),
                    der: None,
                }),
                "DaosPermissionDenied",
            ),
            (
                Error::Daos(DaosError::Invalid {
                    message: "m".into(),
                    der: None,
                }),
                "DaosInvalidRequest",
            ),
            (
                Error::Daos(DaosError::Busy {
                    message: "m".into(),
                    der: None,
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
        let secret = Error::System(SystemClientError::SecretMissing {
            system: "s".into(),
            secret: "ns/n".into(),
        });
        assert_eq!(
            secret.reason(),
            "SystemConfigInvalid",
            "pools keep their reasons"
        );
        let e = Error::Daos(DaosError::NoSpace {
            message: "DER_NOSPACE(-1007): No space on storage target".into(),
            der: Some(Der::NoSpace),
        });
        assert!(
            e.to_string().contains("No space on storage target"),
            "DAOS text kept"
        );
    }

    #[test]
    fn system_errors_map_to_daos_system_reasons() {
        let unreachable = DaosError::Unreachable {
            endpoints: "10.0.0.1:10001".into(),
            cause: "transport error: Connection refused (os error 111)".into(),
        };
        // What the DAOS client reports when either side refuses the handshake.
        let tls = DaosError::Unreachable {
            endpoints: "10.0.0.1:10001".into(),
            cause: "transport error: TLS handshake with 10.0.0.1:10001 failed: unknown ca".into(),
        };
        let cases = [
            (Error::Daos(unreachable.clone()), "Unreachable"),
            (
                Error::Daos(DaosError::Timeout(
                    std::time::Duration::from_secs(30),
                    Box::new(unreachable.clone()),
                )),
                "Unreachable",
            ),
            (Error::Daos(tls.clone()), "TlsRejected"),
            (
                Error::Daos(DaosError::Timeout(
                    std::time::Duration::from_secs(30),
                    Box::new(tls),
                )),
                "TlsRejected",
            ),
            (
                Error::Daos(DaosError::PermissionDenied {
                    message: "component mismatch".into(),
                    der: None,
                }),
                "TlsRejected",
            ),
            (
                Error::Daos(DaosError::Incompatible {
                    message: "admin version 2.6.0 is incompatible".into(),
                }),
                "VersionIncompatible",
            ),
            (
                Error::System(SystemClientError::VersionUnsupported {
                    system: "s".into(),
                    version: "2.6.0".into(),
                }),
                "VersionIncompatible",
            ),
            (
                Error::System(SystemClientError::SecretMissing {
                    system: "s".into(),
                    secret: "ns/n".into(),
                }),
                "SecretMissing",
            ),
            (
                Error::System(SystemClientError::SecretInvalid {
                    system: "s".into(),
                    secret: "ns/n".into(),
                    message: "lacks key admin.key".into(),
                }),
                "SecretInvalid",
            ),
            (
                Error::System(SystemClientError::Config {
                    system: "s".into(),
                    message: "m".into(),
                }),
                "ConfigInvalid",
            ),
            (
                Error::Daos(DaosError::Config("endpoint \"x\"".into())),
                "ConfigInvalid",
            ),
            (
                Error::Daos(DaosError::Fault {
                    code: FaultCode::WrongSystem as u32,
                    domain: "server".into(),
                    description: "request was for system \"a\"".into(),
                    resolution: String::new(),
                }),
                "WrongSystem",
            ),
            (
                Error::Daos(DaosError::Busy {
                    message: "m".into(),
                    der: None,
                }),
                "DaosError",
            ),
            (Error::SystemNotFound("s".into()), "SystemNotFound"),
            (Error::MissingUid, "KubernetesError"),
        ];
        for (err, reason) in cases {
            assert_eq!(err.system_reason(), reason, "{err}");
        }
        let e = Error::Daos(unreachable);
        assert!(
            e.to_string().contains("10.0.0.1:10001"),
            "the message names the endpoint: {e}"
        );
    }
}
