//! One fuzz target under AFL++ (`tools/fuzz.sh`): `dpufs-fuzz <target>`.

use dpufs_fuzz::{Harness, Target};
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(target) = Target::from_name(&name) else {
        let names: Vec<_> = Target::ALL.iter().map(|t| t.name()).collect();
        eprintln!("usage: dpufs-fuzz <{}>", names.join("|"));
        std::process::exit(2);
    };
    // Made in the forked child on its first input: threads made before AFL's fork server
    // forks (an engine's runtime and I/O threads) would not exist in the child.
    // Unwind safety does not matter: a panic is a crash, and AFL's hook aborts the process.
    let harness = AssertUnwindSafe(OnceLock::new());
    afl::fuzz!(|data: &[u8]| run(&harness, target, data));
}

fn run(harness: &AssertUnwindSafe<OnceLock<Harness>>, target: Target, data: &[u8]) {
    let _accepted = harness.get_or_init(|| target.harness()).run(data);
}
