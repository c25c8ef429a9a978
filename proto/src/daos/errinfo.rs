//! How DAOS carries errors: gRPC status `Internal` with a `google.rpc.Status`
//! in the `grpc-status-details-bin` trailer holding one `ErrorInfo`.

/// `ErrorInfo.domain` of every DAOS error.
pub const DOMAIN: &str = "DAOS";

/// `ErrorInfo.reason` of a DER status; metadata [`KEY_STATUS`].
pub const REASON_DAOS_STATUS: &str = "proto.daos.DaosStatus";
/// `ErrorInfo.reason` of a control-plane fault; metadata `KEY_FAULT_*`.
pub const REASON_FAULT: &str = "proto.fault.Fault";
/// `ErrorInfo.reason` when the callee is a replica but not the leader.
pub const REASON_NOT_LEADER: &str = "proto.system.ErrNotLeader";
/// `ErrorInfo.reason` when the callee is not a management-service replica.
pub const REASON_NOT_REPLICA: &str = "proto.system.ErrNotReplica";
/// `ErrorInfo.reason` when a pool UUID or label is unknown.
pub const REASON_POOL_NOT_FOUND: &str = "proto.system.ErrPoolNotFound";

/// The negative DER code, in decimal.
pub const KEY_STATUS: &str = "Status";
pub const KEY_FAULT_DOMAIN: &str = "Domain";
pub const KEY_FAULT_CODE: &str = "Code";
pub const KEY_FAULT_DESCRIPTION: &str = "Description";
pub const KEY_FAULT_REASON: &str = "Reason";
pub const KEY_FAULT_RESOLUTION: &str = "Resolution";
/// `"ip:port"` of the leader, possibly empty.
pub const KEY_LEADER_HINT: &str = "LeaderHint";
/// JSON array of `"ip:port"` strings.
pub const KEY_REPLICAS: &str = "Replicas";
/// JSON object `{"Rank":…,"UUID":…,"Label":…}`, null for unset members.
pub const KEY_POOL_INFO: &str = "PoolInfo";
