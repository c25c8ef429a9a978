//! Peer process of the conformance suite and the benchmark: serves the JSON-lines control
//! protocol of `dpufs_fabric::conformance` on stdin/stdout against the software provider.
//!
//! Usage: `fabric-peer <device-dir>`. Devices are opened by name in that directory; set
//! `DPUFS_FABRIC_DISABLE_CHECKS` to run this process's responders with checks switched off
//! (test-only). Built only with the feature `testing` (`required-features`), as the tests do.

use std::io;
use std::process::ExitCode;

use dpufs_fabric::conformance::serve;
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: fabric-peer <device-dir>");
        return ExitCode::from(2);
    };
    let open = |name: &str| SoftDevice::open(&DeviceOptions::new(name).in_dir(&dir));
    match serve(&open, io::stdin().lock(), io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fabric-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
