//! Peer process of the conformance suite and the benchmark: serves the JSON-lines control
//! protocol of `dpufs_fabric::conformance` on stdin/stdout against the software provider.
//!
//! Usage: `fabric-peer <device-dir> [--responder-poll-us N]`. Devices are opened by name in
//! that directory, with responders that poll for N µs before they sleep (default 0, see
//! `DeviceOptions::responder_poll`); set `DPUFS_FABRIC_DISABLE_CHECKS` to run this process's
//! responders with checks switched off (test-only).

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use dpufs_fabric::conformance::serve;
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};

const USAGE: &str = "usage: fabric-peer <device-dir> [--responder-poll-us N]";

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let (dir, poll_us) = match args.as_slice() {
        [dir] => (dir, 0),
        [dir, flag, n] if flag == "--responder-poll-us" => {
            match n.to_str().and_then(|n| n.parse().ok()) {
                Some(n) => (dir, n),
                None => {
                    eprintln!("fabric-peer: --responder-poll-us takes microseconds\n{USAGE}");
                    return ExitCode::from(2);
                }
            }
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let open = |name: &str| {
        let mut opts = DeviceOptions::new(name).in_dir(dir);
        opts.responder_poll = Duration::from_micros(poll_us);
        SoftDevice::open(&opts)
    };
    match serve(&open, io::stdin().lock(), io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fabric-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
