//! The dpufs CSI driver (design.md §Flows, §Node plugin and worker lifetime).
//!
//! Built so far: the volume worker ([`worker`]), which serves one DFS container through
//! FUSE, and the mount keeper ([`keeper`]), which holds each mount's connection and hands it
//! to workers. The controller and node plugin arrive with their issues.

pub mod keeper;
pub mod worker;
