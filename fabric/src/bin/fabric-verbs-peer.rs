//! Peer process of the conformance suite against the verbs provider (feature `rdma`): serves
//! the JSON-lines control protocol of `dpufs_fabric::conformance` on stdin/stdout, opening real
//! RDMA devices by name (`IbvDevice::open`). `fabric-peer` is its software-provider twin.
//!
//! Usage: `fabric-verbs-peer`. Built only with the feature `testing` (`required-features`), as
//! the tests do; built without feature `rdma`, it only says so and exits 2.

use std::process::ExitCode;

#[cfg(feature = "rdma")]
fn main() -> ExitCode {
    use dpufs_fabric::conformance::serve;
    use dpufs_fabric::ibv::IbvDevice;

    let open = |name: &str| IbvDevice::open(Some(name));
    match serve(&open, std::io::stdin().lock(), std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fabric-verbs-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "rdma"))]
fn main() -> ExitCode {
    eprintln!("fabric-verbs-peer: built without the `rdma` feature of dpufs-fabric");
    ExitCode::from(2)
}
