//! The errors of the shim's CSI calls and their gRPC codes. What the shim shares with host
//! mode keeps host mode's codes (`crate::csi::error`); an answer of the agent keeps the code
//! the agent gave, so kubelet sees a refusal on the DPU as the refusal it is.

use crate::csi::error::{CsiError, PublishError, StageError, StatsError};
use tonic::{Code, Status};

/// Every error of the shim's calls.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("{0}")]
    Stage(#[from] StageError),
    #[error("{0}")]
    Publish(#[from] PublishError),
    #[error("NodeGetVolumeStats: {0}")]
    Stats(#[from] StatsError),
    #[error("the DPU agent refused {rpc}: {}", .status.message())]
    Agent { rpc: &'static str, status: Status },
    #[error("the DPU agent answered {rpc} without a device")]
    NoDevice { rpc: &'static str },
    #[error("finding the DPU agent: {0}")]
    Unreachable(String),
    #[error("mounting virtio-fs device {tag} at {path}: {detail}")]
    Mount {
        tag: String,
        path: String,
        detail: String,
    },
    #[error("{0} is mounted, but not with this volume's device {1}; not touching it")]
    StagingInUse(String, String),
    #[error("{0} is not implemented by dfs.dpufs.io (not in its capabilities)")]
    Unimplemented(&'static str),
}

impl ShimError {
    /// The gRPC code of every error: the shim's one table.
    pub fn code(self) -> (Code, String) {
        let message = self.to_string();
        let code = match self {
            ShimError::Stage(e) => CsiError::Stage(e).code(),
            ShimError::Publish(e) => CsiError::Publish(e).code(),
            ShimError::Stats(e) => CsiError::Stats(e).code(),
            ShimError::Agent { status, .. } => status.code(),
            ShimError::NoDevice { .. } => Code::Internal,
            ShimError::Unreachable(_) => Code::Unavailable,
            // The device has not appeared in the host (yet): the caller retries.
            ShimError::Mount { .. } => Code::Unavailable,
            ShimError::StagingInUse(..) => Code::FailedPrecondition,
            ShimError::Unimplemented(_) => Code::Unimplemented,
        };
        (code, message)
    }
}

impl From<ShimError> for Status {
    fn from(e: ShimError) -> Status {
        let (code, message) = e.code();
        Status::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_code_is_kept_and_the_shared_parts_keep_host_modes() {
        let refused = ShimError::Agent {
            rpc: "StageVolume",
            status: Status::permission_denied("this DPU serves host gpu-1, not gpu-2"),
        };
        let (code, message) = refused.code();
        assert_eq!(code, Code::PermissionDenied);
        assert!(message.contains("gpu-2"), "{message}");
        assert_eq!(
            ShimError::Stage(StageError::MissingId("NodeStageVolume"))
                .code()
                .0,
            Code::InvalidArgument
        );
        assert_eq!(
            ShimError::Publish(PublishError::MissingStagingPath)
                .code()
                .0,
            Code::FailedPrecondition
        );
        assert_eq!(
            ShimError::Stats(StatsError::NotFound {
                id: "v".into(),
                path: "/p".into()
            })
            .code()
            .0,
            Code::NotFound
        );
        assert_eq!(
            ShimError::Unreachable("no Node labelled".into()).code().0,
            Code::Unavailable
        );
    }
}
