//! A tenant over its limit must not slow another tenant (docs/reliability.md, "Per-tenant
//! limits under load"). Two tenants' volumes on one engine and one node, through the CSI
//! plugins as kubelet uses them: the victim (`team-a`) reads 4 KiB at random, direct, one at a
//! time, and its p99 completion latency is measured alone and while the aggressor (`team-b`)
//! tries to do far more than its caps allow (ControllerModifyVolume's `maxIops` and
//! `maxThroughputMiBps`). Each round runs each aggressor once, the two runs of a pair in
//! alternating order; the report is the victim's p99 with the aggressor over its p99 alone,
//! per round and the median (goal: at most 1.20 on every aggressor).
//!
//! `cargo bench --profile dev -p dpufs-csi --bench tenant_isolation` (as root, for the mounts);
//! `TENANT_ROUNDS` (default 3) and `TENANT_SECS` (seconds per run, default 10).

#[path = "../tests/common/mod.rs"]
mod common;

use common::csi_bed::bed;
use dpufs_e2e::csi_bed::{Bed, MIB, wait_until};
use dpufs_proto::csi::v1 as csi;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// What the aggressor tries, and the caps it is over.
struct Aggressor {
    name: &'static str,
    /// Without a cap: the control, which shows what the caps prevent (no goal).
    control: bool,
    /// fio's job options (it runs in the aggressor's volume until killed).
    fio: &'static [&'static str],
    caps: &'static [(&'static str, &'static str)],
}

const AGGRESSORS: &[Aggressor] = &[
    Aggressor {
        name: "4 KiB random writes, 4 jobs, no cap (the control)",
        control: true,
        fio: &["--rw=randwrite", "--bs=4k", "--numjobs=4", "--size=32M"],
        caps: &[
            ("maxIops", "unlimited"),
            ("maxThroughputMiBps", "unlimited"),
        ],
    },
    Aggressor {
        name: "4 KiB random writes, 4 jobs, over maxIops 500",
        control: false,
        fio: &["--rw=randwrite", "--bs=4k", "--numjobs=4", "--size=32M"],
        caps: &[("maxIops", "500"), ("maxThroughputMiBps", "unlimited")],
    },
    Aggressor {
        name: "1 MiB writes, 2 jobs, over maxThroughputMiBps 20",
        control: false,
        fio: &["--rw=write", "--bs=1M", "--numjobs=2", "--size=128M"],
        caps: &[("maxIops", "unlimited"), ("maxThroughputMiBps", "20")],
    },
    Aggressor {
        name: "4 KiB random reads, 4 jobs, over maxIops 500",
        control: false,
        fio: &["--rw=randread", "--bs=4k", "--numjobs=4", "--size=32M"],
        caps: &[("maxIops", "500"), ("maxThroughputMiBps", "unlimited")],
    },
];

/// The pause before each run.
const SETTLE: Duration = Duration::from_secs(3);

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if !common::can_mount() || !common::fio_available() {
        println!("tenant_isolation: SKIPPED (needs root, /dev/fuse and fio)");
        return;
    }
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rounds = env("TENANT_ROUNDS", 3) as usize;
    let secs = env("TENANT_SECS", 10);
    let bed = bed().await;
    let victim = bed.create("victim", "ns-a").await.volume_id;
    let aggressor = bed
        .create_sized("aggressor", "ns-b", 1024 * MIB)
        .await
        .volume_id;
    let (_, victim_dir) = bed.mount(&victim, "victim").await;
    let aggressor_dir = mount_for(&bed, &aggressor, "aggressor", "ns-b").await;
    // Every file, laid out once, before any cap.
    run_fio(&victim_dir, &victim_job(1));
    for (a, agg) in AGGRESSORS.iter().enumerate() {
        let status = aggressor_fio(&aggressor_dir, a, agg)
            .arg("--create_only=1")
            .stderr(Stdio::inherit())
            .status()
            .expect("run fio");
        assert!(status.success(), "laying out {}: {status}", agg.name);
    }

    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); AGGRESSORS.len()];
    for round in 0..rounds {
        for (a, agg) in AGGRESSORS.iter().enumerate() {
            set_caps(&bed, &aggressor, agg.caps).await;
            let mut pair = [None, None];
            for turn in 0..2 {
                let with = (turn + round) % 2 == 1;
                // What an earlier run left (queued requests, the engine's writeback) settles.
                std::thread::sleep(SETTLE);
                let p99 = if with {
                    let mut load = aggressor_fio(&aggressor_dir, a, agg)
                        .spawn()
                        .expect("start fio");
                    std::thread::sleep(Duration::from_secs(1));
                    let p99 = victim_p99(&victim_dir, secs);
                    let _ = load.kill();
                    let _ = load.wait();
                    p99
                } else {
                    victim_p99(&victim_dir, secs)
                };
                pair[usize::from(with)] = Some(p99);
            }
            let (alone, with) = (pair[0].unwrap(), pair[1].unwrap());
            let ratio = with / alone;
            println!(
                "round {round}: {}: victim p99 alone {:.0} µs, with it {:.0} µs: {ratio:.2}",
                agg.name,
                alone / 1e3,
                with / 1e3
            );
            ratios[a].push(ratio);
        }
    }
    println!("\n| aggressor | victim's p99 with it / alone, per round | median | goal ≤ 1.20 |");
    println!("|---|---|---:|---|");
    for (agg, mut r) in AGGRESSORS.iter().zip(ratios) {
        let rounds: Vec<String> = r.iter().map(|x| format!("{x:.2}")).collect();
        r.sort_by(f64::total_cmp);
        let median = r[r.len() / 2];
        let met = match (agg.control, median <= 1.20) {
            (true, _) => "— (no cap)",
            (false, true) => "met",
            (false, false) => "MISSED",
        };
        println!(
            "| {} | {} | {median:.2} | {met} |",
            agg.name,
            rounds.join(", ")
        );
    }
}

/// Stages `id` and publishes it for a pod of `namespace`; the pod's target.
async fn mount_for(bed: &Bed, id: &str, name: &str, namespace: &str) -> PathBuf {
    let staging = bed.path(&format!("{name}-globalmount"));
    std::fs::create_dir_all(&staging).expect("staging dir");
    bed.stage(id, &staging).await.expect("NodeStage");
    let target = bed.path(&format!("{name}/mount"));
    std::fs::create_dir_all(&target).expect("target");
    bed.publish(id, &staging, &target, namespace, false)
        .await
        .expect("publish");
    target
}

/// Puts `caps` on the aggressor's volume and waits until its worker has them.
async fn set_caps(bed: &Bed, id: &str, caps: &[(&str, &str)]) {
    let req = csi::ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: caps
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    bed.ctl
        .clone()
        .controller_modify_volume(req)
        .await
        .expect("ControllerModifyVolume");
    // "unlimited" parses as no cap.
    let cap = |key: &str| {
        let v = caps.iter().find(|(k, _)| *k == key).expect("every cap").1;
        v.parse::<u64>().ok()
    };
    wait_until("the aggressor's worker has its caps", || {
        bed.keeper_volumes().into_iter().any(|(v, _)| {
            let qos = bed.worker_health(&v).qos;
            qos.max_iops == cap("maxIops") && qos.max_throughput_mibps == cap("maxThroughputMiBps")
        })
    });
}

/// The victim's job: 4 KiB random reads, direct, one at a time, for `secs`.
fn victim_job(secs: u64) -> Vec<String> {
    let job = [
        "--name=victim",
        "--rw=randread",
        "--bs=4k",
        "--size=64M",
        "--direct=1",
        "--ioengine=psync",
        "--time_based",
    ];
    let mut job: Vec<String> = job.iter().map(|a| a.to_string()).collect();
    job.push(format!("--runtime={secs}"));
    job
}

fn run_fio(dir: &Path, job: &[String]) -> Value {
    let job: Vec<&str> = job.iter().map(String::as_str).collect();
    common::fio(dir, &job)
}

/// The victim's p99 completion latency over `secs`, in ns.
fn victim_p99(dir: &Path, secs: u64) -> f64 {
    let v = run_fio(dir, &victim_job(secs));
    v["jobs"][0]["read"]["clat_ns"]["percentile"]["99.000000"]
        .as_f64()
        .expect("fio's p99")
}

/// Aggressor `a`'s fio (files of its own), running until killed.
fn aggressor_fio(dir: &Path, a: usize, agg: &Aggressor) -> Command {
    let mut cmd = Command::new(common::FIO);
    cmd.arg(format!("--directory={}", dir.display()))
        .arg(format!("--name=aggressor{a}"))
        .args(["--direct=1", "--ioengine=psync"])
        .args(["--time_based", "--runtime=3600", "--group_reporting"])
        .args(agg.fio)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}
