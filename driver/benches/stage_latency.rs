//! NodeStage → mount-ready latency of the CSI node plugin, as kubelet sees it: the time from
//! sending NodeStageVolume until a statfs of the staging path answers from the volume's own
//! worker (a FUSE mount served over the fabric by a new worker with its own tenant session).
//! Prints p50, p90, p99 and max over `STAGE_ROUNDS` volumes (default 40); goal p50 < 100 ms.
//!
//! `cargo bench -p dpufs-csi --bench stage_latency` (as root, for the mounts).

#[path = "../tests/common/mod.rs"]
mod common;

use common::csi_bed::bed;
use std::time::{Duration, Instant};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if !common::can_mount() {
        println!("stage_latency: SKIPPED (needs root and /dev/fuse)");
        return;
    }
    let rounds: usize = std::env::var("STAGE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let bed = bed().await;
    let mut took = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let id = bed
            .create(&format!("pvc-bench-{round}"), "ns-a")
            .await
            .volume_id;
        let staging = bed.path(&format!("stage-{round}"));
        std::fs::create_dir_all(&staging).unwrap();
        let start = Instant::now();
        bed.stage(&id, &staging).await.expect("NodeStage");
        let st = nix_statfs(&staging);
        took.push(start.elapsed());
        assert!(st > 0, "the staged volume answers statfs");
        bed.unstage(&id, &staging).await.expect("NodeUnstage");
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "NodeStage -> mount-ready over {rounds} volumes: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (goal: p50 < 100 ms)",
        ms(percentile(&took, 0.5)),
        ms(percentile(&took, 0.9)),
        ms(percentile(&took, 0.99)),
        ms(*took.last().unwrap()),
    );
}

/// The total blocks statfs reports for `path` (it must answer from the mount).
fn nix_statfs(path: &std::path::Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: plain data, overwritten by statfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statfs(p.as_ptr(), &mut st) }, 0, "statfs");
    st.f_blocks
}
