//! The errors of the agent's calls and their gRPC codes: [`AgentError::code`] is the one place
//! that decides them. The part of staging the agent shares with host mode keeps host mode's
//! codes (`crate::csi::error`), so a volume refused on a host is refused the same way from a
//! DPU.

use super::pods::PodCheckError;
use crate::csi::error::{StageError, TenantError, stage_code, tenant_code};
use crate::csi::locks::Busy;
use crate::dpu::attach::AttachError;
use tonic::{Code, Status};

/// Every error of the agent's calls.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0} needs a volume id")]
    MissingId(&'static str),
    #[error("{0} needs the calling host's node name")]
    MissingHost(&'static str),
    #[error(
        "StageVolume needs the pod's namespace, name and uid (kubelet sends them when the CSIDriver has podInfoOnMount: true)"
    )]
    MissingPod,
    #[error("this DPU serves host {paired}, not {asked}")]
    OtherHost { asked: String, paired: String },
    #[error("the agent does not know yet which host it serves: {0}")]
    HostUnknown(String),
    #[error("{0}")]
    Pod(Box<PodCheckError>),
    #[error("{0}")]
    Tenant(#[from] TenantError),
    #[error("{0}")]
    Stage(#[from] StageError),
    #[error("volume {0} is not staged on this DPU")]
    NotStaged(String),
    #[error("starting token {0:?} is not one this agent gave")]
    BadToken(String),
    #[error("{0}")]
    Busy(#[from] Busy),
    #[error("the volume's device: {0}")]
    Attach(#[from] AttachError),
}

impl AgentError {
    /// The gRPC code of every error: the agent's one table.
    pub fn code(&self) -> Code {
        use AgentError as A;
        match self {
            A::MissingId(_) | A::MissingHost(_) | A::MissingPod => Code::InvalidArgument,
            // The host asked for something its pod, its node or its tenant does not allow.
            A::OtherHost { .. } => Code::PermissionDenied,
            // As host mode's NodePublishVolume decides it.
            A::Tenant(e) => tenant_code(e),
            A::Pod(e) => match **e {
                PodCheckError::Refused(_) => Code::PermissionDenied,
                PodCheckError::Kube(_) => Code::Unavailable,
            },
            A::HostUnknown(_) => Code::Unavailable,
            A::Stage(e) => stage_code(e),
            A::NotStaged(_) => Code::NotFound,
            A::BadToken(_) | A::Busy(_) => Code::Aborted,
            A::Attach(AttachError::NoFreePort) => Code::ResourceExhausted,
            A::Attach(AttachError::Unsupported(_)) => Code::FailedPrecondition,
            // The host has not let the device go yet: the caller retries.
            A::Attach(AttachError::NotReleased { .. }) => Code::Unavailable,
            // The worker's socket does not take QEMU's connection (yet): the caller retries.
            A::Attach(AttachError::NotConnected { .. }) => Code::Unavailable,
            A::Attach(AttachError::Qmp(_)) => Code::Internal,
        }
    }
}

impl From<PodCheckError> for AgentError {
    fn from(e: PodCheckError) -> AgentError {
        AgentError::Pod(Box::new(e))
    }
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}
