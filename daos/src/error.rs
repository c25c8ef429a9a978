//! One typed error for everything the DAOS client does, decoded in one place
//! from the shape DAOS puts on the wire (docs/engine.md, "Semantics kept from DAOS" and "The
//! management client's calls").

use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::errinfo as ei;
use dpufs_proto::daos::fault::FaultCode;
use dpufs_proto::google::rpc;
use prost::Message;
use std::collections::HashMap;
use std::time::Duration;
use tonic::{Code, Status};

/// What a DAOS call can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DaosError {
    // The six kinds below keep the DER code they were decoded from in `der`
    // (see `DaosError::der`); it is `None` when the server sent no DER (a plain
    // gRPC code, `ErrPoolNotFound`) or the error was made up locally.
    /// The pool, container or other entity does not exist (DER_NONEXIST,
    /// DER_ENOENT, DER_CONT_NONEXIST, or DAOS's `ErrPoolNotFound`).
    #[error("not found: {message}")]
    NotFound { message: String, der: Option<Der> },
    /// The entity already exists (DER_EXIST).
    #[error("already exists: {message}")]
    Exists { message: String, der: Option<Der> },
    /// Out of space (DER_NOSPACE).
    #[error("no space: {message}")]
    NoSpace { message: String, der: Option<Der> },
    /// The resource is busy (DER_BUSY).
    #[error("busy: {message}")]
    Busy { message: String, der: Option<Der> },
    /// Bad parameters (DER_INVAL or a plain server error about the request).
    #[error("invalid request: {message}")]
    Invalid { message: String, der: Option<Der> },
    /// The caller may not do this (DER_NO_PERM or gRPC PermissionDenied).
    #[error("permission denied: {message}")]
    PermissionDenied { message: String, der: Option<Der> },
    /// A control-plane fault, with DAOS's own words and what to do.
    #[error("DAOS fault {code} ({domain}): {description}{}", hint(resolution))]
    Fault {
        code: u32,
        domain: String,
        description: String,
        resolution: String,
    },
    /// The server runs a DAOS release whose management wire dpufs does not speak.
    #[error(
        "incompatible DAOS server: {message} (dpufs speaks the DAOS {} management wires)",
        crate::wire::Wire::supported()
    )]
    Incompatible { message: String },
    /// Any other DAOS error number.
    #[error("{message}")]
    Der { code: i32, message: String },
    /// The callee is a replica but not the leader.
    #[error("not the management service leader (leader hint {leader_hint:?})")]
    NotLeader {
        leader_hint: String,
        replicas: Vec<String>,
    },
    /// The callee is not a management-service replica.
    #[error("not a management service replica (replicas {replicas:?})")]
    NotReplica { replicas: Vec<String> },
    /// No endpoint could be reached.
    #[error("no DAOS management endpoint reachable ({endpoints}): {cause}")]
    Unreachable { endpoints: String, cause: String },
    /// The call's deadline passed while retrying.
    #[error("gave up after {0:?}: {1}")]
    Timeout(Duration, Box<DaosError>),
    /// A gRPC failure that carries no DAOS error.
    #[error("gRPC {code:?}: {message}")]
    Rpc { code: Code, message: String },
    /// The client was set up wrongly (bad endpoint, unreadable certificate...).
    #[error("client configuration: {0}")]
    Config(String),
}

fn hint(resolution: &str) -> String {
    if resolution.is_empty() {
        String::new()
    } else {
        format!(" (hint: {resolution})")
    }
}

pub type Result<T, E = DaosError> = std::result::Result<T, E>;

impl DaosError {
    /// Decodes a DAOS status code as found in a response body (0 is success).
    pub fn from_der(code: i32, context: &str) -> DaosError {
        let name = match Der::from_code(code) {
            Some(d) => d.to_string(),
            None => format!("DER_UNKNOWN({code})"),
        };
        let message = if context.is_empty() {
            name
        } else {
            format!("{name}: {context}")
        };
        let der = Der::from_code(code);
        match der {
            Some(Der::Nonexist | Der::Enoent | Der::ContNonexist) => {
                DaosError::NotFound { message, der }
            }
            Some(Der::Exist) => DaosError::Exists { message, der },
            Some(Der::NoSpace) => DaosError::NoSpace { message, der },
            Some(Der::Busy) => DaosError::Busy { message, der },
            Some(Der::Inval) => DaosError::Invalid { message, der },
            Some(Der::NoPerm) => DaosError::PermissionDenied { message, der },
            _ => DaosError::Der {
                code: -code.abs(),
                message,
            },
        }
    }

    /// Decodes a gRPC status from a DAOS (or dpufs engine) server.
    pub fn from_status(status: &Status) -> DaosError {
        let message = status.message().to_string();
        if let Some(info) = error_info(status) {
            return from_error_info(info, message);
        }
        match status.code() {
            Code::PermissionDenied | Code::Unauthenticated => {
                DaosError::PermissionDenied { message, der: None }
            }
            Code::Unavailable => DaosError::Unreachable {
                endpoints: String::new(),
                cause: message,
            },
            // Raised locally by the channel (a status from the server has no source).
            Code::Unknown if std::error::Error::source(status).is_some() => {
                DaosError::Unreachable {
                    endpoints: String::new(),
                    cause: format!(
                        "{message}: {}",
                        std::error::Error::source(status)
                            .map(|s| s.to_string())
                            .unwrap_or_default()
                    ),
                }
            }
            // DAOS reports PoolCreate sizes it cannot use as a plain Go error
            // ("unexpected pool create params", docs/engine.md), which gRPC
            // turns into `Unknown` with no ErrorInfo: its text is the only
            // thing that tells it from any other server failure.
            Code::Unknown if message.contains("unexpected pool create params") => {
                DaosError::Invalid { message, der: None }
            }
            code => DaosError::Rpc { code, message },
        }
    }

    /// The DER code behind this error, where the server sent one: the
    /// ErrorInfo's status key or a response body's status, as decoded.
    pub fn der(&self) -> Option<Der> {
        match self {
            DaosError::Der { code, .. } => Der::from_code(*code),
            DaosError::NotFound { der, .. }
            | DaosError::Exists { der, .. }
            | DaosError::NoSpace { der, .. }
            | DaosError::Busy { der, .. }
            | DaosError::Invalid { der, .. }
            | DaosError::PermissionDenied { der, .. } => *der,
            _ => None,
        }
    }

    /// The fault code behind this error, where there is one.
    pub fn fault(&self) -> Option<FaultCode> {
        match self {
            DaosError::Fault { code, .. } => FaultCode::from_code(*code),
            _ => None,
        }
    }

    /// Whether the call failed because the TLS handshake was refused: the
    /// server refused the client certificate, the client refused the
    /// server's (another CA, not a DAOS server certificate), or the peer does
    /// not speak TLS. Such errors are [`DaosError::Unreachable`] too.
    pub fn is_tls_rejection(&self) -> bool {
        match self {
            DaosError::Unreachable { cause, .. } => {
                cause.contains(crate::tls::HANDSHAKE_FAILED)
                    || cause.contains(crate::tls::WRONG_SERVER)
            }
            DaosError::Timeout(_, inner) => inner.is_tls_rejection(),
            _ => false,
        }
    }

    /// Whether DAOS's own clients would retry the call.
    pub fn is_retryable(&self) -> bool {
        self.der().is_some_and(Der::is_retryable)
            || self.fault().is_some_and(FaultCode::is_retryable)
    }
}

fn error_info(status: &Status) -> Option<rpc::ErrorInfo> {
    let details = rpc::Status::decode(status.details()).ok()?;
    details
        .details
        .iter()
        .find_map(|any| any.to_msg::<rpc::ErrorInfo>().ok())
}

fn from_error_info(info: rpc::ErrorInfo, message: String) -> DaosError {
    let md = |k: &str| info.metadata.get(k).cloned().unwrap_or_default();
    let list = |k: &str| serde_json::from_str::<Vec<String>>(&md(k)).unwrap_or_default();
    match info.reason.as_str() {
        ei::REASON_DAOS_STATUS => match md(ei::KEY_STATUS).parse::<i32>() {
            Ok(code) => DaosError::from_der(code, &detail_of(&message)),
            Err(_) => DaosError::Rpc {
                code: Code::Internal,
                message,
            },
        },
        ei::REASON_FAULT => {
            let code: u32 = md(ei::KEY_FAULT_CODE).parse().unwrap_or(0);
            let description = md(ei::KEY_FAULT_DESCRIPTION);
            match FaultCode::from_code(code) {
                Some(FaultCode::IncompatibleComponents | FaultCode::NoCompatibilityInsecure) => {
                    DaosError::Incompatible {
                        message: description,
                    }
                }
                _ => DaosError::Fault {
                    code,
                    domain: md(ei::KEY_FAULT_DOMAIN),
                    description,
                    resolution: md(ei::KEY_FAULT_RESOLUTION),
                },
            }
        }
        ei::REASON_NOT_LEADER => DaosError::NotLeader {
            leader_hint: md(ei::KEY_LEADER_HINT),
            replicas: list(ei::KEY_REPLICAS),
        },
        ei::REASON_NOT_REPLICA => DaosError::NotReplica {
            replicas: list(ei::KEY_REPLICAS),
        },
        ei::REASON_POOL_NOT_FOUND => DaosError::NotFound {
            message: pool_not_found_text(&md(ei::KEY_POOL_INFO), &message),
            der: None,
        },
        _ => DaosError::Rpc {
            code: Code::Internal,
            message,
        },
    }
}

/// The server's words after the `DER_X(-n): description: ` prefix it adds.
fn detail_of(message: &str) -> String {
    message
        .splitn(3, ": ")
        .nth(2)
        .unwrap_or_default()
        .to_string()
}

fn pool_not_found_text(info: &str, message: &str) -> String {
    let parsed: HashMap<String, Option<serde_json::Value>> =
        serde_json::from_str(info).unwrap_or_default();
    let field = |k: &str| {
        parsed
            .get(k)
            .cloned()
            .flatten()
            .and_then(|v| v.as_str().map(str::to_string))
    };
    match field("Label").or_else(|| field("UUID")) {
        Some(id) => format!("pool {id:?} ({message})"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_status_codes_map_to_kinds() {
        assert!(matches!(
            DaosError::from_der(-1005, "x"),
            DaosError::NotFound { .. }
        ));
        assert!(matches!(
            DaosError::from_der(-1007, "x"),
            DaosError::NoSpace { .. }
        ));
        assert!(matches!(
            DaosError::from_der(-1012, "x"),
            DaosError::Busy { .. }
        ));
        let again = DaosError::from_der(-1013, "x");
        assert_eq!(again.der(), Some(Der::Again));
        assert!(again.is_retryable());
        assert_eq!(DaosError::from_der(-1003, "x").der(), Some(Der::Inval));
        assert!(!DaosError::from_der(-1003, "x").is_retryable());
    }

    #[test]
    fn tls_rejections_are_told_from_unreachable_servers() {
        let refused = DaosError::Unreachable {
            endpoints: "h:1".into(),
            cause: format!(
                "transport error: {} h:1 failed: tlsv1 alert unknown ca",
                crate::tls::HANDSHAKE_FAILED
            ),
        };
        assert!(refused.is_tls_rejection());
        assert!(DaosError::Timeout(Duration::from_secs(1), Box::new(refused)).is_tls_rejection());
        let down = DaosError::Unreachable {
            endpoints: "h:1".into(),
            cause: "transport error: Connection refused (os error 111)".into(),
        };
        assert!(!down.is_tls_rejection());
        assert!(!DaosError::Config("x".into()).is_tls_rejection());
    }

    #[test]
    fn plain_status_codes() {
        let e = DaosError::from_status(&Status::permission_denied("no"));
        assert!(matches!(e, DaosError::PermissionDenied { der: None, .. }));
        let e = DaosError::from_status(&Status::unknown("unexpected pool create params: x"));
        assert!(matches!(e, DaosError::Invalid { der: None, .. }));
    }

    /// A status as DAOS sends a DER: `Internal` with one ErrorInfo whose
    /// status key holds the (negative) code.
    fn der_status(code: i32, message: &str) -> Status {
        let info = rpc::ErrorInfo {
            reason: ei::REASON_DAOS_STATUS.into(),
            domain: ei::DOMAIN.into(),
            metadata: HashMap::from([(ei::KEY_STATUS.to_string(), code.to_string())]),
        };
        let details = rpc::Status {
            code: Code::Internal as i32,
            message: message.into(),
            details: vec![prost_types::Any::from_msg(&info).unwrap()],
        };
        Status::with_details(Code::Internal, message, details.encode_to_vec().into())
    }

    #[test]
    fn der_comes_from_error_info_not_from_the_message() {
        for message in [
            "DER_BUSY(-1012): Device or resource busy: pool (-1012) in use",
            "pool tank (42) is gone",
            "no code in these words",
            "",
        ] {
            let e = DaosError::from_status(&der_status(-1005, message));
            assert!(
                matches!(e, DaosError::NotFound { .. }),
                "{message:?}: {e:?}"
            );
            assert_eq!(e.der(), Some(Der::Nonexist), "{message:?}: {e:?}");
            assert!(!e.is_retryable(), "{message:?}: {e:?}");
        }
        // The other way round: the message names one DER, the status key another.
        let e = DaosError::from_status(&der_status(-1012, "DER_NONEXIST(-1005)"));
        assert_eq!(e.der(), Some(Der::Busy), "{e:?}");
        // Display still names the DER the code stands for.
        let e = DaosError::from_status(&der_status(-1005, "x"));
        assert!(
            e.to_string().starts_with("not found: DER_NONEXIST(-1005)"),
            "{e}"
        );
    }

    #[test]
    fn der_looking_text_without_error_info_is_no_der() {
        let text = "DER_BUSY(-1012): Device or resource busy";
        let e = DaosError::from_status(&Status::permission_denied(text));
        assert!(matches!(e, DaosError::PermissionDenied { .. }), "{e:?}");
        assert_eq!(e.der(), None, "{e:?}");
        assert!(!e.is_retryable(), "{e:?}");
        let e = DaosError::from_status(&Status::unknown(format!(
            "unexpected pool create params: {text}"
        )));
        assert!(matches!(e, DaosError::Invalid { .. }), "{e:?}");
        assert_eq!(e.der(), None, "{e:?}");
        let e = DaosError::from_status(&Status::internal(text));
        assert_eq!(e.der(), None, "{e:?}");
        let e = DaosError::Busy {
            message: text.into(),
            der: None,
        };
        assert_eq!(e.der(), None);
        assert_eq!(e.to_string(), format!("busy: {text}"));
    }

    #[test]
    fn body_status_keeps_its_der() {
        for &d in Der::ALL {
            let e = DaosError::from_der(d.wire(), "(-1) context");
            assert_eq!(e.der(), Some(d), "{e:?}");
        }
        assert_eq!(DaosError::from_der(-999_999, "x").der(), None);
    }
}
