//! The CSI test bed of the driver's tests and benchmarks: [`dpufs_e2e::csi_bed`] (engine,
//! keeper, `dpufs-csi controller` and `dpufs-csi node` processes, clients over their sockets)
//! running the `dpufs-csi` binary cargo built for this crate's tests.

use dpufs_e2e::csi_bed::{Bed, BedOptions};

/// A bed with every process.
pub async fn bed() -> Bed {
    Bed::new(super::worker_bin()).await
}

/// A bed whose node plugin also gets `node_args`.
pub async fn bed_with_node_args(node_args: &[&str]) -> Bed {
    let mut opts = BedOptions::new(super::worker_bin());
    opts.node_args = node_args.iter().map(|a| a.to_string()).collect();
    Bed::start(opts).await
}
