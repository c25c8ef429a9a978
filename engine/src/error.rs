//! The engine's error type and its one mapping to gRPC statuses, in the exact
//! shape DAOS's control plane sends (docs/engine.md, "Semantics kept from DAOS"): code
//! `Internal` with a `google.rpc.Status` detail holding one `ErrorInfo`.

use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::errinfo as ei;
use dpufs_proto::daos::fault::FaultCode;
use dpufs_proto::google::rpc;
use prost::Message;
use std::collections::HashMap;
use tonic::{Code, Status};

/// Everything an engine request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A DAOS error number, with what went wrong in words.
    #[error("{der}: {detail}")]
    Der { der: Der, detail: String },
    /// A control-plane fault.
    #[error("code = {code:?} description = {description:?}")]
    Fault {
        code: FaultCode,
        description: String,
    },
    /// The pool UUID or label is unknown.
    #[error("unable to find pool service {id}")]
    PoolNotFound { id: String },
    /// This engine is a replica that does not lead: go to the hint.
    #[error("not the management service leader; try {hint}")]
    NotLeader { hint: String, replicas: Vec<String> },
    /// A plain error without a DAOS code; DAOS sends these as `Unknown`.
    #[error("{0}")]
    Plain(String),
    /// The caller's certificate does not allow this call.
    #[error("{0}")]
    PermissionDenied(String),
    /// The embedded store failed; reported to clients as DER_IO.
    #[error("engine store: {0}")]
    Store(String),
}

/// Shorthand for a DER error with a detail message.
pub fn der(der: Der, detail: impl Into<String>) -> EngineError {
    EngineError::Der {
        der,
        detail: detail.into(),
    }
}

/// Shorthand for a fault with a description.
pub fn fault(code: FaultCode, description: impl Into<String>) -> EngineError {
    EngineError::Fault {
        code,
        description: description.into(),
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl From<redb::Error> for EngineError {
    fn from(e: redb::Error) -> Self {
        EngineError::Store(e.to_string())
    }
}

macro_rules! store_errors {
    ($($t:ty),*) => {$(
        impl From<$t> for EngineError {
            fn from(e: $t) -> Self { EngineError::Store(e.to_string()) }
        }
    )*};
}
store_errors!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::DatabaseError,
    serde_json::Error,
    std::io::Error
);

/// Namespace failures on the management side: DAOS's codes for the same conditions.
impl From<crate::namespace::DfsError> for EngineError {
    fn from(e: crate::namespace::DfsError) -> Self {
        use crate::namespace::Errno;
        let code = match e.errno {
            Errno::NOSPC => Der::NoSpace,
            Errno::NOENT | Errno::STALE => Der::Nonexist,
            Errno::EXIST => Der::Exist,
            Errno::INVAL | Errno::NAMETOOLONG | Errno::RANGE | Errno::TOOBIG => Der::Inval,
            Errno::ROFS | Errno::PERM => Der::NoPerm,
            Errno::OPNOTSUPP | Errno::NOSYS => Der::NotSupported,
            _ => Der::Io,
        };
        der(code, e.detail)
    }
}

/// Management failures met by the data service (resolving a connection's container).
impl From<EngineError> for crate::namespace::DfsError {
    fn from(e: EngineError) -> Self {
        use crate::namespace::Errno;
        let errno = match &e {
            EngineError::PoolNotFound { .. } => Errno::STALE,
            EngineError::Der {
                der: Der::Nonexist, ..
            } => Errno::STALE,
            EngineError::Der {
                der: Der::NoSpace, ..
            } => Errno::NOSPC,
            _ => Errno::IO,
        };
        crate::namespace::DfsError {
            errno,
            detail: e.to_string(),
        }
    }
}

impl From<EngineError> for Status {
    fn from(e: EngineError) -> Status {
        let message = e.to_string();
        let (reason, metadata) = match e {
            EngineError::Der { der, .. } => (
                ei::REASON_DAOS_STATUS,
                vec![(ei::KEY_STATUS, der.wire().to_string())],
            ),
            EngineError::Store(_) => (
                ei::REASON_DAOS_STATUS,
                vec![(ei::KEY_STATUS, Der::Io.wire().to_string())],
            ),
            EngineError::Fault { code, description } => (
                ei::REASON_FAULT,
                vec![
                    (ei::KEY_FAULT_DOMAIN, code.domain().to_string()),
                    (ei::KEY_FAULT_CODE, (code as u32).to_string()),
                    (ei::KEY_FAULT_DESCRIPTION, description),
                    (ei::KEY_FAULT_REASON, String::new()),
                    (ei::KEY_FAULT_RESOLUTION, code.resolution().to_string()),
                ],
            ),
            EngineError::PoolNotFound { id } => (
                ei::REASON_POOL_NOT_FOUND,
                vec![(ei::KEY_POOL_INFO, pool_info_json(&id))],
            ),
            EngineError::NotLeader { hint, replicas } => (
                ei::REASON_NOT_LEADER,
                vec![
                    (ei::KEY_LEADER_HINT, hint),
                    (
                        ei::KEY_REPLICAS,
                        serde_json::to_string(&replicas).unwrap_or_default(),
                    ),
                ],
            ),
            EngineError::Plain(_) => return Status::unknown(message),
            EngineError::PermissionDenied(_) => return Status::permission_denied(message),
        };
        with_error_info(Code::Internal, message, reason, metadata)
    }
}

/// The `PoolInfo` metadata DAOS sends with ErrPoolNotFound: the id as UUID or
/// label, whichever it is, and nulls for the rest.
fn pool_info_json(id: &str) -> String {
    let is_uuid = uuid::Uuid::parse_str(id).is_ok();
    serde_json::json!({
        "Rank": null,
        "UUID": if is_uuid { Some(id) } else { None },
        "Label": if is_uuid { None } else { Some(id) },
    })
    .to_string()
}

/// Builds a status carrying one ErrorInfo in `grpc-status-details-bin`.
pub fn with_error_info(
    code: Code,
    message: String,
    reason: &str,
    metadata: Vec<(&str, String)>,
) -> Status {
    let info = rpc::ErrorInfo {
        reason: reason.to_string(),
        domain: ei::DOMAIN.to_string(),
        metadata: metadata
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<HashMap<_, _>>(),
    };
    let details = rpc::Status {
        code: code as i32,
        message: message.clone(),
        details: vec![prost_types::Any::from_msg(&info).expect("ErrorInfo always encodes")],
    };
    Status::with_details(code, message, details.encode_to_vec().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_info(status: &Status) -> rpc::ErrorInfo {
        let details = rpc::Status::decode(status.details()).expect("details decode");
        details.details[0].to_msg().expect("ErrorInfo")
    }

    #[test]
    fn der_errors_carry_the_negative_code() {
        for &d in Der::ALL {
            let status = Status::from(der(d, "x"));
            assert_eq!(status.code(), Code::Internal);
            let info = error_info(&status);
            assert_eq!(info.reason, ei::REASON_DAOS_STATUS);
            assert_eq!(info.domain, "DAOS");
            assert_eq!(info.metadata[ei::KEY_STATUS], d.wire().to_string());
        }
    }

    #[test]
    fn faults_carry_code_and_domain() {
        for &f in FaultCode::ALL {
            let info = error_info(&Status::from(fault(f, "why")));
            assert_eq!(info.reason, ei::REASON_FAULT);
            assert_eq!(info.metadata[ei::KEY_FAULT_CODE], (f as u32).to_string());
            assert_eq!(info.metadata[ei::KEY_FAULT_DOMAIN], f.domain());
            assert_eq!(info.metadata[ei::KEY_FAULT_DESCRIPTION], "why");
        }
    }

    #[test]
    fn pool_not_found_names_label_or_uuid() {
        let info = error_info(&Status::from(EngineError::PoolNotFound {
            id: "tank".into(),
        }));
        assert_eq!(info.reason, ei::REASON_POOL_NOT_FOUND);
        let v: serde_json::Value = serde_json::from_str(&info.metadata[ei::KEY_POOL_INFO]).unwrap();
        assert_eq!(v["Label"], "tank");
        assert!(v["UUID"].is_null());
    }

    #[test]
    fn plain_and_permission_errors_have_no_details() {
        assert_eq!(
            Status::from(EngineError::Plain("x".into())).code(),
            Code::Unknown
        );
        assert_eq!(
            Status::from(EngineError::PermissionDenied("x".into())).code(),
            Code::PermissionDenied
        );
    }
}
