//! The dpufs CSI driver (design.md §Flows, §Node plugin and worker lifetime).
//!
//! Built so far: the volume worker ([`worker`]), which serves one DFS container through
//! FUSE; the mount keeper ([`keeper`]), which holds each mount's connection and hands it to
//! workers; and the [`launcher`], which adopts or starts the keeper so that both outlive the
//! node plugin. The controller and the CSI node service arrive with their issues.

pub mod keeper;
pub mod launcher;
pub mod worker;
