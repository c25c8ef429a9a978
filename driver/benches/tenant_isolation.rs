//! A tenant over its limit must not slow another tenant (docs/reliability.md, "Per-tenant
//! limits under load"). Two tenants' volumes on one engine and one node, through the CSI
//! plugins as kubelet uses them: the victim (`team-a`) reads 4 KiB at random, direct, one at a
//! time, and its p99 completion latency is measured in three runs per aggressor and round, in
//! an order that rotates with the round:
//!
//! - alone;
//! - beside the aggressor (`team-b`) doing exactly what its cap allows (fio paces itself,
//!   the volume has no cap): the load the cap admits;
//! - beside the aggressor trying to do far more than its cap allows (ControllerModifyVolume's
//!   `maxIops` or `maxThroughputMiBps`; the worker paces it).
//!
//! The report gives the victim's p99 over the aggressor's cap against alone (goal: at most
//! 1.20) and against the admitted load alone (what being over the cap adds), medians over
//! rounds. A control row runs the first aggressor without any cap.
//!
//! `cargo bench -p dpufs-csi --bench tenant_isolation` (as root, for the mounts; the release build,
//! which the figures are of: the debug build's copies cost enough CPU to move the victim);
//! `TENANT_ROUNDS` (default 3), `TENANT_SECS` (seconds per run, default 10) and `TENANT_ONLY`
//! (only the aggressors whose name contains it, e.g. `TENANT_ONLY="MiBps 20"`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::csi_bed::bed;
use dpufs_csi::csi::VolumeId;
use dpufs_csi::csi::node::record::VolumeFiles;
use dpufs_e2e::csi_bed::{Bed, MIB, wait_until};
use dpufs_proto::csi::v1 as csi;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A cap on the aggressor's volume.
#[derive(Clone, Copy)]
enum Cap {
    Iops(u64),
    MiBps(u64),
    /// The control: no cap at all.
    None,
}

/// What the aggressor tries, and the cap it is over.
struct Aggressor {
    name: &'static str,
    /// fio's job options (it runs in the aggressor's volume until killed).
    fio: &'static [&'static str],
    jobs: u64,
    cap: Cap,
}

const AGGRESSORS: &[Aggressor] = &[
    Aggressor {
        name: "4 KiB random writes, no cap (the control)",
        fio: &["--rw=randwrite", "--bs=4k", "--size=32M"],
        jobs: 4,
        cap: Cap::None,
    },
    Aggressor {
        name: "4 KiB random writes over maxIops 100",
        fio: &["--rw=randwrite", "--bs=4k", "--size=32M"],
        jobs: 4,
        cap: Cap::Iops(100),
    },
    Aggressor {
        name: "4 KiB random reads over maxIops 100",
        fio: &["--rw=randread", "--bs=4k", "--size=32M"],
        jobs: 4,
        cap: Cap::Iops(100),
    },
    Aggressor {
        name: "1 MiB writes over maxThroughputMiBps 5",
        fio: &["--rw=write", "--bs=1M", "--size=128M"],
        jobs: 2,
        cap: Cap::MiBps(5),
    },
    Aggressor {
        name: "4 KiB random writes over maxIops 500",
        fio: &["--rw=randwrite", "--bs=4k", "--size=32M"],
        jobs: 4,
        cap: Cap::Iops(500),
    },
    Aggressor {
        name: "1 MiB writes over maxThroughputMiBps 20",
        fio: &["--rw=write", "--bs=1M", "--size=128M"],
        jobs: 2,
        cap: Cap::MiBps(20),
    },
    Aggressor {
        // Each of fio's "I/Os" opens (creating, the first time) one of its files: metadata
        // requests only, which `maxIops` counts as well.
        name: "file creates and opens over maxIops 100",
        fio: &[
            "--ioengine=filecreate",
            "--nrfiles=2000",
            "--filesize=4k",
            "--openfiles=64",
        ],
        jobs: 4,
        cap: Cap::Iops(100),
    },
];

/// The victim's three runs of one aggressor and round.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    Alone,
    AtCap,
    OverCap,
}

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
    let only = std::env::var("TENANT_ONLY").unwrap_or_default();
    let chosen: Vec<(usize, &Aggressor)> = AGGRESSORS
        .iter()
        .enumerate()
        .filter(|(_, agg)| agg.name.contains(only.as_str()))
        .collect();
    assert!(
        !chosen.is_empty(),
        "TENANT_ONLY={only:?} names no aggressor"
    );
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
    for &(a, agg) in &chosen {
        let status = aggressor_fio(&aggressor_dir, a, agg, false)
            .arg("--create_only=1")
            .stderr(Stdio::inherit())
            .status()
            .expect("run fio");
        assert!(status.success(), "laying out {}: {status}", agg.name);
    }

    // Per aggressor: (over / alone, over / at cap) of each round.
    let mut ratios: Vec<Vec<(f64, f64)>> = vec![Vec::new(); AGGRESSORS.len()];
    for round in 0..rounds {
        for &(a, agg) in &chosen {
            let mut runs = vec![Run::Alone, Run::OverCap];
            if !matches!(agg.cap, Cap::None) {
                runs.insert(1, Run::AtCap);
            }
            let turn = round % runs.len();
            runs.rotate_left(turn);
            let mut p99 = [f64::NAN; 3];
            for run in runs {
                let cap = if run == Run::OverCap {
                    agg.cap
                } else {
                    Cap::None
                };
                set_cap(&bed, &aggressor, cap).await;
                // What an earlier run left (queued requests, the engine's writeback) settles.
                std::thread::sleep(SETTLE);
                let load = (run != Run::Alone)
                    .then(|| Running::start(&aggressor_dir, a, agg, run == Run::AtCap));
                std::thread::sleep(Duration::from_secs(1));
                p99[run as usize] = victim_p99(&victim_dir, secs);
                drop(load);
            }
            let [alone, at, over] = p99;
            println!(
                "round {round}: {}: victim p99 alone {:.0} µs, beside the admitted load {:.0} µs, beside it over its cap {:.0} µs",
                agg.name,
                alone / 1e3,
                at / 1e3,
                over / 1e3
            );
            ratios[a].push((over / alone, over / at));
        }
    }
    report(&ratios);
}

fn report(ratios: &[Vec<(f64, f64)>]) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let list = |v: &[f64]| {
        let all: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
        all.join(", ")
    };
    println!(
        "\n| aggressor | victim's p99 over the cap / alone, per round | median | goal ≤ 1.20 | over the cap / the admitted load, median |"
    );
    println!("|---|---|---:|---|---:|");
    for (agg, r) in AGGRESSORS.iter().zip(ratios).filter(|(_, r)| !r.is_empty()) {
        let vs_alone: Vec<f64> = r.iter().map(|x| x.0).collect();
        let vs_at: Vec<f64> = r.iter().map(|x| x.1).collect();
        let m = median(vs_alone.clone());
        let (goal, at) = match agg.cap {
            Cap::None => ("— (no cap)".to_string(), "—".to_string()),
            _ if m <= 1.20 => ("met".into(), format!("{:.2}", median(vs_at))),
            _ => ("MISSED".into(), format!("{:.2}", median(vs_at))),
        };
        println!(
            "| {} | {} | {m:.2} | {goal} | {at} |",
            agg.name,
            list(&vs_alone)
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

/// Puts `cap` on the aggressor's volume (the other cap lifted) and waits until its worker has
/// it.
async fn set_cap(bed: &Bed, id: &str, cap: Cap) {
    let (iops, mibps) = match cap {
        Cap::Iops(n) => (Some(n), None),
        Cap::MiBps(n) => (None, Some(n)),
        Cap::None => (None, None),
    };
    let value = |v: Option<u64>| v.map_or("unlimited".to_string(), |n| n.to_string());
    let req = csi::ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: [
            ("maxIops".to_string(), value(iops)),
            ("maxThroughputMiBps".to_string(), value(mibps)),
        ]
        .into(),
        ..Default::default()
    };
    bed.ctl
        .clone()
        .controller_modify_volume(req)
        .await
        .expect("ControllerModifyVolume");
    let volume =
        VolumeFiles::of(&bed.state.join("csi"), &VolumeId::parse(id).expect("an id")).keeper_volume;
    wait_until("the aggressor's worker has its cap", || {
        let qos = bed.worker_health(&volume).qos;
        qos.max_iops == iops && qos.max_throughput_mibps == mibps
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

/// A running aggressor, killed on drop. Its jobs are threads of one fio process (`--thread`):
/// fio's job processes would start sessions of their own and outlive a kill of the first.
struct Running(Child);

impl Running {
    /// Aggressor `a`, paced by fio itself to exactly its cap when `at_cap`.
    fn start(dir: &Path, a: usize, agg: &Aggressor, at_cap: bool) -> Running {
        let child = aggressor_fio(dir, a, agg, at_cap)
            .spawn()
            .expect("start fio");
        Running(child)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Aggressor `a`'s fio (files of its own), running until killed; with `at_cap`, its jobs
/// together move exactly what its cap allows.
fn aggressor_fio(dir: &Path, a: usize, agg: &Aggressor, at_cap: bool) -> Command {
    let mut cmd = Command::new(common::FIO);
    cmd.arg(format!("--directory={}", dir.display()))
        .arg(format!("--name=aggressor{a}"))
        .arg(format!("--numjobs={}", agg.jobs))
        .args(["--direct=1", "--ioengine=psync", "--thread"])
        .args(["--time_based", "--runtime=3600", "--group_reporting"])
        .args(agg.fio)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match (at_cap, agg.cap) {
        (true, Cap::Iops(n)) => cmd.arg(format!("--rate_iops={}", n / agg.jobs)),
        (true, Cap::MiBps(n)) => cmd.arg(format!("--rate={}k", n * 1024 / agg.jobs)),
        _ => &mut cmd,
    };
    cmd
}
