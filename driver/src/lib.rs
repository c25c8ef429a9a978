//! The dpufs CSI driver (design.md §Flows, §Node plugin and worker lifetime).
//!
//! Built so far: the volume worker ([`worker`]), which serves one DFS container through
//! FUSE. The controller, node plugin and mount keeper arrive with their issues.

pub mod worker;
