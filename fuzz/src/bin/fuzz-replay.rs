//! Replays inputs through one harness in order, as AFL++'s persistent mode feeds them to one
//! process: `fuzz-replay <target> FILE...`. A crash or hang AFL++ reports may need the inputs
//! before it (the engine's state carries over); this prints each input's time, slowest last.

use dpufs_fuzz::Target;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_default();
    let Some(target) = Target::from_name(&name) else {
        eprintln!("usage: fuzz-replay <target> FILE...");
        std::process::exit(2);
    };
    let harness = target.harness();
    let mut slowest: Vec<(Duration, String)> = Vec::new();
    for path in args {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let start = Instant::now();
        let accepted = harness.run(&data);
        let took = start.elapsed();
        if took > Duration::from_millis(100) {
            eprintln!("{path}: {took:?} (accepted: {accepted})");
        }
        slowest.push((took, path));
    }
    slowest.sort();
    for (took, path) in slowest.iter().rev().take(5) {
        println!("{took:>12.3?} {path}");
    }
}
