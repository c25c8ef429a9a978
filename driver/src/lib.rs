//! The dpufs CSI driver (design.md §Flows, §Node plugin and worker lifetime).
//!
//! Not built yet: controller, node plugin, volume worker and mount keeper
//! arrive with their issues.
