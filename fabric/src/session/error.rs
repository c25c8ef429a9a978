//! What tenant sessions and the session server fail with. Every message says what went wrong
//! and, where there is one, what to change.

use std::net::SocketAddr;
use std::time::Duration;

use super::capability::CapabilityError;
use crate::error::FabricError;
use dpufs_proto::dfs::{DfsError, Errno};

/// Errors of [`TenantSession`](super::TenantSession), [`Connection`](super::Connection) and
/// [`SessionServer`](super::SessionServer).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The server refused the connection handshake (capability, version, limits, quarantine).
    /// No QP was created on the server.
    #[error("server {peer} refused the connection: {reason}")]
    Refused {
        /// The server.
        peer: SocketAddr,
        /// The server's reason.
        reason: String,
    },
    /// The server refused one request without moving any data (replayed or old request id,
    /// rights the capability does not grant, malformed bulk description).
    #[error("server refused the request: {reason}")]
    RequestRefused {
        /// The server's reason.
        reason: String,
    },
    /// Creating, signing or checking a capability failed.
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    /// The peer is quarantined after repeated RDMA access errors; new calls are refused until
    /// the quarantine ends.
    #[error(
        "server {peer} is quarantined after {errors} RDMA access errors within a minute; \
         new calls are refused for another {remaining:?}"
    )]
    Quarantined {
        /// The quarantined server.
        peer: SocketAddr,
        /// Access errors that triggered it.
        errors: u32,
        /// Time left.
        remaining: Duration,
    },
    /// The call did not complete in time. Its buffer and memory window stay out of use until
    /// the window is invalidated or the QP is destroyed.
    #[error("request {request_id} to {peer} timed out after {after:?}")]
    Timeout {
        /// The server.
        peer: SocketAddr,
        /// Request id of the call (0 if it was never sent).
        request_id: u64,
        /// How long the call waited.
        after: Duration,
    },
    /// The connection's QP failed with an RDMA access error: a peer named memory it may not
    /// touch (a probe, a stale or foreign rkey, a late access after a timeout). The QP is dead;
    /// the next call reconnects.
    #[error("RDMA access error on the connection to {peer} (QP {qp_num}): {detail}")]
    AccessError {
        /// The server.
        peer: SocketAddr,
        /// Our QP.
        qp_num: u32,
        /// What was seen.
        detail: String,
    },
    /// The connection broke (peer gone, transport error); the next call reconnects.
    #[error("connection to {peer} lost: {detail}")]
    ConnectionLost {
        /// The server.
        peer: SocketAddr,
        /// What was seen.
        detail: String,
    },
    /// A per-tenant resource cap would be exceeded.
    #[error(
        "tenant limit reached: {resource} would be {requested}, the limit is {limit} \
         (raise the limit in the session's `Limits`, or close connections)"
    )]
    LimitExceeded {
        /// Which resource (`qps`, `mrs`, `windows`, `registered_bytes`, `connections`).
        resource: &'static str,
        /// Amount after the request.
        requested: u64,
        /// The cap.
        limit: u64,
    },
    /// A control message is larger than [`MAX_CONTROL_MESSAGE`](super::MAX_CONTROL_MESSAGE).
    #[error("control message of {len} bytes exceeds the {max}-byte limit; move data as bulk")]
    MessageTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A bulk transfer is larger than one buffer slot.
    #[error("bulk transfer of {len} bytes exceeds the {max}-byte slot; split the I/O")]
    BulkTooLarge {
        /// Its length.
        len: usize,
        /// The slot size.
        max: usize,
    },
    /// A handler used the bulk accessor wrongly (no bulk, wrong direction, out of range).
    #[error("bulk access refused: {0}")]
    BulkMisuse(String),
    /// The peer broke the session protocol.
    #[error("protocol error with {peer}: {detail}")]
    Protocol {
        /// The peer.
        peer: SocketAddr,
        /// What was wrong.
        detail: String,
    },
    /// A verbs call failed.
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    /// A socket operation of the handshake failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is unusable.
    #[error("invalid session configuration: {0}")]
    Config(String),
    /// The server is shutting down.
    #[error("session server is shutting down")]
    Shutdown,
}

impl SessionError {
    pub(crate) fn io(op: impl Into<String>, source: std::io::Error) -> SessionError {
        SessionError::Io {
            op: op.into(),
            source,
        }
    }

    /// Whether the error broke the connection (the next call reconnects).
    pub fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            SessionError::AccessError { .. } | SessionError::ConnectionLost { .. }
        )
    }

    /// The errno a file-system caller sees when its request failed this way: EACCES when the
    /// server refused the capability, ETIMEDOUT when no reply came in time, EIO for the rest
    /// (a broken connection, a refused request, a protocol error).
    pub fn errno(&self) -> Errno {
        match self {
            SessionError::Refused { .. } | SessionError::Capability(_) => Errno::ACCES,
            SessionError::Timeout { .. } => Errno::TIMEDOUT,
            _ => Errno::IO,
        }
    }
}

/// A failed call as the DFS error its caller sees (the one mapping of session errors to errno).
impl From<SessionError> for DfsError {
    fn from(e: SessionError) -> DfsError {
        DfsError::new(e.errno(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_say_what_the_caller_can_do() {
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let refused = SessionError::Refused {
            peer,
            reason: "capability expired".into(),
        };
        let e = DfsError::from(refused);
        assert_eq!(e.errno, Errno::ACCES);
        assert!(e.detail.contains("capability expired"), "{e}");
        let timeout = SessionError::Timeout {
            peer,
            request_id: 7,
            after: Duration::from_secs(5),
        };
        assert_eq!(timeout.errno(), Errno::TIMEDOUT);
        let lost = SessionError::ConnectionLost {
            peer,
            detail: "reset".into(),
        };
        assert_eq!(lost.errno(), Errno::IO);
        assert_eq!(SessionError::Shutdown.errno(), Errno::IO);
    }
}
