//! The errors of the storage plugin and their gRPC codes.
//!
//! [`PluginError::code`] is the one place that decides codes. DPF's API is modelled on CSI
//! (a plugin socket, Identity and Probe, paginated listing with `max_entries` and
//! `starting_token`), so the codes follow CSI's rules where the two APIs meet: malformed
//! requests INVALID_ARGUMENT, an unknown volume NOT_FOUND, a starting token the plugin did not
//! give ABORTED (the caller starts its listing again), a busy volume ABORTED (retry with
//! back-off), a repeat with other settings ALREADY_EXISTS.

use crate::csi::locks::Busy;
use crate::dpf::backend::BackendError;
use tonic::{Code, Status};

/// Every error a call of the storage plugin can end with.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{rpc} needs a volume_id")]
    MissingVolumeId { rpc: &'static str },
    #[error("{rpc}: {field} is {bytes} bytes, more than the {max} CSI allows")]
    TooLong {
        rpc: &'static str,
        field: &'static str,
        bytes: usize,
        max: usize,
    },
    #[error("CreateDevice needs at least one access mode")]
    MissingAccessModes,
    #[error("access mode {0} is not one of RWO, ROX, RWX, RWOP")]
    UnknownAccessMode(i32),
    #[error("access mode RWOP (ReadWriteOncePod) cannot be combined with other access modes")]
    PodModeCombined,
    #[error(
        "volume mode Block is not supported: dfs.dpufs.io volumes are file systems (use volumeMode: Filesystem)"
    )]
    BlockVolume,
    #[error("volume mode {0:?} is not one of Filesystem, Block")]
    UnknownVolumeMode(String),
    #[error("max_entries {0} is negative")]
    NegativeMaxEntries(i32),
    #[error("starting token {0:?} is not one this plugin gave")]
    BadToken(String),
    #[error("volume {0} has no device on this DPU")]
    NotFound(String),
    #[error("volume {volume_id} has device {actual:?}, not {named:?}")]
    OtherDevice {
        volume_id: String,
        named: String,
        actual: String,
    },
    /// DeleteDevice naming another device than the volume's: removing the volume's device
    /// could take it from a newer attachment, so the plugin refuses rather than guess.
    #[error(
        "volume {volume_id} has device {actual:?}, not {named:?}; not deleting it (DeleteDevice names the device CreateDevice returned)"
    )]
    DeleteOtherDevice {
        volume_id: String,
        named: String,
        actual: String,
    },
    #[error("volume {volume_id} already has a device made with other settings: {}", .differences.join("; "))]
    Incompatible {
        volume_id: String,
        differences: Vec<String>,
    },
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("{rpc}: {source}")]
    Backend {
        rpc: &'static str,
        source: BackendError,
    },
}

impl PluginError {
    /// The gRPC code of every error: the one table of the plugin.
    pub fn code(&self) -> Code {
        use PluginError as P;
        match self {
            P::MissingVolumeId { .. }
            | P::TooLong { .. }
            | P::MissingAccessModes
            | P::UnknownAccessMode(_)
            | P::PodModeCombined
            | P::BlockVolume
            | P::UnknownVolumeMode(_)
            | P::NegativeMaxEntries(_) => Code::InvalidArgument,
            P::BadToken(_) | P::Busy(_) => Code::Aborted,
            P::NotFound(_) | P::OtherDevice { .. } => Code::NotFound,
            P::DeleteOtherDevice { .. } => Code::FailedPrecondition,
            P::Incompatible { .. } => Code::AlreadyExists,
            P::Backend { source, .. } => match source {
                BackendError::NotFound(_) => Code::NotFound,
                BackendError::Invalid(_) => Code::InvalidArgument,
                BackendError::Refused(_) => Code::PermissionDenied,
                BackendError::Precondition(_) => Code::FailedPrecondition,
                BackendError::Conflict(_) => Code::AlreadyExists,
                BackendError::Exhausted(_) => Code::ResourceExhausted,
                BackendError::Busy(_) => Code::Aborted,
                BackendError::Unavailable(_) => Code::Unavailable,
                BackendError::Failed(_) => Code::Internal,
            },
        }
    }
}

impl From<PluginError> for Status {
    fn from(e: PluginError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (error, code, a fragment the message must contain)
    fn table() -> Vec<(PluginError, Code, &'static str)> {
        use PluginError as P;
        let backend = |source| P::Backend {
            rpc: "CreateDevice",
            source,
        };
        vec![
            (
                P::MissingVolumeId { rpc: "GetDevice" },
                Code::InvalidArgument,
                "GetDevice needs a volume_id",
            ),
            (
                P::TooLong {
                    rpc: "CreateDevice",
                    field: "volume_id",
                    bytes: 129,
                    max: 128,
                },
                Code::InvalidArgument,
                "volume_id is 129 bytes, more than the 128",
            ),
            (P::MissingAccessModes, Code::InvalidArgument, "access mode"),
            (P::UnknownAccessMode(9), Code::InvalidArgument, "mode 9"),
            (
                P::PodModeCombined,
                Code::InvalidArgument,
                "ReadWriteOncePod",
            ),
            (P::BlockVolume, Code::InvalidArgument, "are file systems"),
            (
                P::UnknownVolumeMode("filesystem".into()),
                Code::InvalidArgument,
                "\"filesystem\"",
            ),
            (P::NegativeMaxEntries(-1), Code::InvalidArgument, "-1"),
            (P::BadToken("zz".into()), Code::Aborted, "\"zz\""),
            (P::NotFound("v1/a".into()), Code::NotFound, "v1/a"),
            (
                P::OtherDevice {
                    volume_id: "v1/a".into(),
                    named: "x".into(),
                    actual: "y".into(),
                },
                Code::NotFound,
                "not \"x\"",
            ),
            (
                P::DeleteOtherDevice {
                    volume_id: "v1/a".into(),
                    named: "x".into(),
                    actual: "y".into(),
                },
                Code::FailedPrecondition,
                "not deleting",
            ),
            (
                P::Incompatible {
                    volume_id: "v1/a".into(),
                    differences: vec!["access modes".into(), "volume_context keys a".into()],
                },
                Code::AlreadyExists,
                "access modes; volume_context keys a",
            ),
            (
                Busy("volume v1/a".into()).into(),
                Code::Aborted,
                "already in progress",
            ),
            (
                backend(BackendError::NotFound("volume v1/a does not exist".into())),
                Code::NotFound,
                "CreateDevice: volume v1/a does not exist",
            ),
            (
                backend(BackendError::Precondition("not provisioned by".into())),
                Code::FailedPrecondition,
                "not provisioned by",
            ),
            (
                backend(BackendError::Conflict("staged read-only".into())),
                Code::AlreadyExists,
                "staged read-only",
            ),
            (
                backend(BackendError::Busy("in progress".into())),
                Code::Aborted,
                "in progress",
            ),
            (
                backend(BackendError::Invalid("bad id".into())),
                Code::InvalidArgument,
                "bad id",
            ),
            (
                backend(BackendError::Refused("other tenant".into())),
                Code::PermissionDenied,
                "other tenant",
            ),
            (
                backend(BackendError::Exhausted("64 volumes".into())),
                Code::ResourceExhausted,
                "64 volumes",
            ),
            (
                backend(BackendError::Unavailable("engine down".into())),
                Code::Unavailable,
                "engine down",
            ),
            (
                backend(BackendError::Failed("worker exited".into())),
                Code::Internal,
                "worker exited",
            ),
        ]
    }

    #[test]
    fn every_error_has_its_code_and_says_what_happened() {
        for (error, code, fragment) in table() {
            let status = Status::from(error);
            assert_eq!(status.code(), code, "{}", status.message());
            assert!(
                status.message().contains(fragment),
                "{:?} lacks {fragment:?}",
                status.message()
            );
            assert!(status.details().is_empty());
        }
    }
}
