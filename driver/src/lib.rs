//! The dpufs CSI driver (docs/architecture.md, "Flows" and "Worker lifetime").
//!
//! Built so far: the volume worker ([`worker`]), which serves one DFS container through
//! FUSE; the mount keeper ([`keeper`]), which holds each mount's connection and hands it to
//! workers; and the [`launcher`], which adopts or starts the keeper so that both outlive the
//! node plugin. The controller and the CSI node service arrive with their issues.
//!
//! The keeper and the worker share the FUSE device ([`fuse`]) and the node's sockets
//! ([`ipc`]); neither imports the other. Their messages are the types of `dpufs_node_api`.

pub mod csi;
pub mod dpf;
pub mod dpu;
pub mod fuse;
pub mod ipc;
pub mod keeper;
pub mod launcher;
pub mod worker;
