//! What both ends of the DAOS management wire must agree on, beyond message
//! layouts: error codes and how errors are carried, property numbers, and the
//! label rules. Facts from DAOS v2.8.0.

pub mod der;
pub mod errinfo;
pub mod fault;
pub mod label;
pub mod props;
pub mod ranks;
pub mod tls;

/// The DAOS release whose management wire `proto/daos/mgmt` describes and the embedded
/// engine serves. (dpufs-daos also speaks 2.6's, with the messages of `mgmt::v2_6`.)
pub const WIRE_VERSION: &str = "2.8.0";

/// The default DAOS system name.
pub const DEFAULT_SYSTEM: &str = "daos_server";

/// The default management port of a DAOS server.
pub const DEFAULT_PORT: u16 = 10001;

/// gRPC metadata naming the calling component (`admin`, `agent`, `server`).
pub const COMPONENT_HEADER: &str = "x-daos-component";

/// gRPC metadata carrying the caller's DAOS version (`major.minor.patch`).
pub const VERSION_HEADER: &str = "x-daos-version";
