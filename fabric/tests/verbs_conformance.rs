//! The conformance suite against the verbs provider (feature `rdma`), across real processes:
//! this test process holds a context of the device `$DPUFS_RDMA_DEVICE` names (node 1's tenant
//! side), a `fabric-verbs-peer` process another context of the same device (the engine, and the
//! second tenant of the cross-tenant case), connected by RC QPs through the device's own port.
//! One test per case; each is skipped, saying why, when `DPUFS_RDMA_DEVICE` is unset.
//!
//! The other tests need no device: the "no RDMA device" error of `IbvDevice::open`, and the
//! agreement of the C shim with the Rust bindings.
//!
//! On hardware: `DPUFS_RDMA_DEVICE=mlx5_0 cargo test -p dpufs-fabric --features rdma`
//! (`DPUFS_RDMA_PORT` and `DPUFS_RDMA_GID_INDEX` override port 1 and the GID choice).

#![cfg(feature = "rdma")]

mod common;

use std::process::Command;

use common::case_tests;
use dpufs_fabric::FabricError;
use dpufs_fabric::conformance::{self, Env, Peer};
use dpufs_fabric::ibv::{self, DEVICE_ENV, IbvDevice};

/// The device under test, or `None` (with the reason printed) when none is named.
fn device_under_test(test: &str) -> Option<String> {
    match std::env::var(DEVICE_ENV) {
        Ok(name) if !name.trim().is_empty() => Some(name.trim().to_owned()),
        _ => {
            eprintln!(
                "SKIPPED {test}: {DEVICE_ENV} is not set; set it to an RDMA device (e.g. \
                 {DEVICE_ENV}=mlx5_0) to run the conformance suite on the verbs provider"
            );
            None
        }
    }
}

/// Node 1 opened here, the engine in a `fabric-verbs-peer` process, on the same device.
fn env(device: &str) -> Env<IbvDevice> {
    let dev = IbvDevice::open(Some(device)).unwrap_or_else(|e| panic!("open {device}: {e}"));
    eprintln!(
        "verbs conformance on {dev} (GID index {}, type-2B windows advertised: {})",
        dev.gid_index(),
        dev.supports_type2_windows()
    );
    let peer = Peer::spawn(Command::new(env!("CARGO_BIN_EXE_fabric-verbs-peer")))
        .expect("spawn fabric-verbs-peer");
    Env::new(dev, device, peer, device).expect("engine setup in the peer")
}

fn run_case(name: &str) {
    let Some(device) = device_under_test(name) else {
        return;
    };
    let env = env(&device);
    if let Err(failure) = conformance::run_case(&env, name) {
        panic!("{name} on {device}: {failure}");
    }
}

/// The provider the per-case tests run on.
type Device = IbvDevice;

dpufs_fabric::conformance_cases!(case_tests);

/// Without RDMA, opening a device fails with the clear `NoDevice` error, never a panic.
#[test]
fn open_without_rdma_says_no_device() {
    if std::env::var_os(DEVICE_ENV).is_some() {
        eprintln!("SKIPPED open_without_rdma_says_no_device: {DEVICE_ENV} names a device");
        return;
    }
    let names = match ibv::device_names() {
        Ok(names) if !names.is_empty() => {
            eprintln!("SKIPPED open_without_rdma_says_no_device: RDMA devices present: {names:?}");
            return;
        }
        other => other,
    };
    let no_kernel_rdma = !std::path::Path::new("/sys/class/infiniband").exists();
    for name in [None, Some("mlx5_0")] {
        match IbvDevice::open(name) {
            Err(FabricError::NoDevice(why)) => {
                let message = FabricError::NoDevice(why.clone()).to_string();
                eprintln!("IbvDevice::open({name:?}): {message}");
                assert!(message.starts_with("no RDMA device: "), "{message}");
                assert!(
                    message.contains("software provider") || message.contains("no device named"),
                    "{message}"
                );
                if no_kernel_rdma {
                    assert!(
                        why.contains("ENOSYS") && why.contains("/sys/class/infiniband"),
                        "without /sys/class/infiniband the reason names ENOSYS: {why}"
                    );
                }
            }
            Err(other) => panic!("IbvDevice::open({name:?}) failed with {other:?}, not NoDevice"),
            Ok(dev) => panic!("IbvDevice::open({name:?}) opened {dev} though {names:?}"),
        }
    }
    if let Err(e) = &names {
        assert!(matches!(e, FabricError::NoDevice(_)), "device_names: {e:?}");
    }
}

/// The C shim (compiled against the system's libibverbs headers) and the Rust bindings
/// (ibverbs-sys' vendored rdma-core) agree on every struct layout passed between them, and on
/// `ibv_inc_rkey`.
#[test]
fn shim_agrees_with_bindings() {
    ibv::shim_self_check().unwrap();
}
