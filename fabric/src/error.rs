//! Errors returned by the verbs-like calls (the synchronous part of the API).
//!
//! Work-request outcomes are not errors of this kind: they arrive as completions with a
//! [`WcStatus`](crate::WcStatus), as on hardware.

use std::io;

/// What a synchronous fabric call can fail with. The variants mirror the errno values the
/// verbs calls return (`EBUSY`, `EINVAL`, `ENOMEM`, ...) so a verbs provider maps onto them.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The object is still in use (`EBUSY`), e.g. deregistering an MR with bound windows.
    #[error("resource busy: {0}")]
    Busy(&'static str),
    /// An argument is invalid for the object or its state (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The QP cannot make this transition from its current state (`EINVAL` from modify_qp).
    #[error("invalid QP state transition from {from:?} with {to}")]
    InvalidTransition {
        /// State the QP was in.
        from: crate::QpState,
        /// Transition that was asked for.
        to: &'static str,
    },
    /// The work queue is full (`ENOMEM` from post_send/post_recv).
    #[error("work queue full")]
    QueueFull,
    /// Every key index of the device is in use.
    #[error("no free key index in the device table")]
    TableFull,
    /// The device file is missing, foreign or of another version.
    #[error("device {path}: {reason}")]
    Device {
        /// Device file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The peer refused or broke the connection setup.
    #[error("connection setup: {0}")]
    Connect(String),
    /// There is no RDMA device, or none of the requested name (the verbs provider's `open`).
    /// `ibv_get_device_list` failing with `ENOSYS` means the kernel has no RDMA support at all
    /// (no `/sys/class/infiniband`): use the software provider instead.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
}

impl FabricError {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(op: impl Into<String>, source: io::Error) -> Self {
        FabricError::Io {
            op: op.into(),
            source,
        }
    }
}

/// Result of the synchronous fabric calls.
pub type Result<T, E = FabricError> = std::result::Result<T, E>;

/// `dereg_mr` failed; the memory region is handed back unchanged, as `ibv_dereg_mr` leaves it
/// registered on failure.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct DeregError<M> {
    /// The region, still registered.
    pub mr: M,
    /// Why deregistration failed.
    #[source]
    pub error: FabricError,
}
