//! A tenant over its limit must not slow another tenant (docs/reliability.md, "Per-tenant
//! limits under load"). Two tenants' volumes on one engine and one node, through the CSI
//! plugins as kubelet uses them: the victim (`team-a`) reads 4 KiB at random, direct, one at a
//! time, while the aggressor (`team-b`) is switched on and off (SIGSTOP, SIGCONT) every
//! [`PHASE`]. Each of the victim's reads is put, by when it completed, in the phase it falls in
//! (the first [`GUARD`] of each phase left out, for what the phase before left behind), and
//! its p99 completion latency with the aggressor on is compared with its p99 with it off, in
//! the same run. Interleaving is what makes the ratio worth having: on a VM the victim's p99
//! alone drifts by 2× over minutes, far more than the effect measured.
//!
//! Two runs per aggressor and round, their order rotating with the round:
//! - the aggressor trying to do far more than its cap allows (ControllerModifyVolume's
//!   `maxIops` or `maxThroughputMiBps`; the worker paces it): the figure (goal: at most 1.20);
//! - the aggressor doing a little less than its cap allows, paced by fio's `thinktime` (a
//!   pause after each I/O, which a stop cannot make it catch up on): the load the cap admits,
//!   to tell what being over the cap adds.
//!
//! Two controls: the first aggressor with no cap at all, and the same bytes as the 20 MiB/s
//! writer written by fio into the local disk, outside dpufs (what the machine itself does).
//! The figure pools every round's reads; per round ratios show the spread.
//!
//! `cargo bench -p dpufs-csi --bench tenant_isolation` (as root, for the mounts; the release build,
//! which the figures are of: the debug build's copies cost enough CPU to move the victim);
//! `TENANT_ROUNDS` (default 3), `TENANT_SECS` (seconds per run, default 16) and `TENANT_ONLY`
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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A cap on the aggressor's volume.
#[derive(Clone, Copy)]
enum Cap {
    Iops(u64),
    MiBps(u64),
    /// The control: no cap at all.
    None,
}

/// Where the aggressor's files are.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// Its own dpufs volume.
    Volume,
    /// The local disk, outside dpufs: the machine's own share of the effect.
    LocalDisk,
}

/// What the aggressor tries, and the cap it is over.
struct Aggressor {
    name: &'static str,
    /// fio's job options (it runs until killed).
    fio: &'static [&'static str],
    jobs: u64,
    /// What one of fio's I/Os moves, for pacing it to the cap.
    io_bytes: u64,
    cap: Cap,
    place: Place,
}

const AGGRESSORS: &[Aggressor] = &[
    Aggressor {
        name: "4 KiB random writes, no cap (the control)",
        fio: &["--rw=randwrite", "--bs=4k", "--size=32M"],
        jobs: 4,
        io_bytes: 4096,
        cap: Cap::None,
        place: Place::Volume,
    },
    Aggressor {
        name: "4 KiB random writes over maxIops 100",
        fio: &["--rw=randwrite", "--bs=4k", "--size=32M"],
        jobs: 4,
        io_bytes: 4096,
        cap: Cap::Iops(100),
        place: Place::Volume,
    },
    Aggressor {
        name: "4 KiB random reads over maxIops 100",
        fio: &["--rw=randread", "--bs=4k", "--size=32M"],
        jobs: 4,
        io_bytes: 4096,
        cap: Cap::Iops(100),
        place: Place::Volume,
    },
    Aggressor {
        name: "1 MiB writes over maxThroughputMiBps 5",
        fio: &["--rw=write", "--bs=1M", "--size=128M"],
        jobs: 2,
        io_bytes: 1 << 20,
        cap: Cap::MiBps(5),
        place: Place::Volume,
    },
    Aggressor {
        name: "4 KiB random writes over maxIops 500",
        fio: &["--rw=randwrite", "--bs=4k", "--size=32M"],
        jobs: 4,
        io_bytes: 4096,
        cap: Cap::Iops(500),
        place: Place::Volume,
    },
    Aggressor {
        name: "1 MiB writes over maxThroughputMiBps 20",
        fio: &["--rw=write", "--bs=1M", "--size=128M"],
        jobs: 2,
        io_bytes: 1 << 20,
        cap: Cap::MiBps(20),
        place: Place::Volume,
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
        io_bytes: 4096,
        cap: Cap::Iops(100),
        place: Place::Volume,
    },
    Aggressor {
        name: "1 MiB writes at 20 MiB/s into the local disk, outside dpufs (the control)",
        fio: &["--rw=write", "--bs=1M", "--size=128M"],
        jobs: 2,
        io_bytes: 1 << 20,
        cap: Cap::MiBps(20),
        place: Place::LocalDisk,
    },
];

/// How the aggressor is held to its cap in one run (the volume has the cap in both).
#[derive(Clone, Copy, PartialEq)]
enum Pacing {
    /// By fio itself, a little under the cap: the load the cap admits. (The cap holds what
    /// fio does not pace: its start, which looks at every file it will use.)
    ByFio,
    /// By the worker: fio tries for all it can.
    ByTheCap,
}

/// How long the aggressor is on, then off.
const PHASE: Duration = Duration::from_secs(1);

/// The start of each phase that is left out: requests the aggressor had in flight when it was
/// stopped, and the engine's write-back of what it wrote, finish within it.
const GUARD: Duration = Duration::from_millis(250);

/// The pause before each run, for what the run before left behind.
const SETTLE: Duration = Duration::from_secs(3);

/// The victim's completion latencies (ns) of one run, by whether the aggressor was on.
#[derive(Clone, Default)]
struct Samples {
    on: Vec<u64>,
    off: Vec<u64>,
}

impl Samples {
    /// The victim's p99 with the aggressor on, over its p99 with it off.
    fn ratio(&self) -> f64 {
        p99(&self.on) / p99(&self.off)
    }

    /// The victim's p99 with the aggressor on and off, in µs: shown beside the ratio, since a
    /// change that makes the victim slower with the aggressor off makes the ratio look better.
    fn p99s_us(&self) -> (f64, f64) {
        (p99(&self.on) / 1e3, p99(&self.off) / 1e3)
    }
}

/// One run's result.
#[derive(Clone)]
struct RunResult {
    samples: Samples,
    moved: Moved,
}

/// The runs of one aggressor and round.
#[derive(Clone, Default)]
struct Round {
    by_the_cap: Option<RunResult>,
    by_fio: Option<RunResult>,
}

impl Round {
    fn get(&self, pacing: Pacing) -> Option<&RunResult> {
        match pacing {
            Pacing::ByTheCap => self.by_the_cap.as_ref(),
            Pacing::ByFio => self.by_fio.as_ref(),
        }
    }
}

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
    let secs = env("TENANT_SECS", 16);
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
    let dirs = Dirs {
        victim: victim_dir,
        volume: mount_for(&bed, &aggressor, "aggressor", "ns-b").await,
        local_disk: bed.path("local-disk"),
        logs: bed.path("victim-logs"),
    };
    std::fs::create_dir_all(&dirs.local_disk).expect("local disk dir");
    std::fs::create_dir_all(&dirs.logs).expect("log dir");
    // Every file, laid out once, before any cap.
    run_fio(&dirs.victim, &victim_job(1));
    for &(a, agg) in &chosen {
        let status = aggressor_fio(dirs.of(agg), a, agg, Pacing::ByTheCap)
            .arg("--create_only=1")
            .stderr(Stdio::inherit())
            .status()
            .expect("run fio");
        assert!(status.success(), "laying out {}: {status}", agg.name);
    }

    let mut rounds_of: Vec<Vec<Round>> = vec![Vec::new(); AGGRESSORS.len()];
    for round in 0..rounds {
        for &(a, agg) in &chosen {
            let r = one_round(&bed, &aggressor, &dirs, a, agg, round, secs).await;
            for (pacing, what) in [
                (Pacing::ByTheCap, "over its cap"),
                (Pacing::ByFio, "paced by fio"),
            ] {
                if let Some(run) = r.get(pacing) {
                    let (on_us, off_us) = run.samples.p99s_us();
                    println!(
                        "round {round}: {}: {what}: victim p99 on / off {:.2} ({:.0} / {:.0} µs); the aggressor moved {:.1} MiB/s, {:.0} I/Os a second while on",
                        agg.name,
                        run.samples.ratio(),
                        on_us,
                        off_us,
                        run.moved.mib,
                        run.moved.ios
                    );
                }
            }
            rounds_of[a].push(r);
        }
    }
    report(&rounds_of);
}

/// The directories a run uses.
struct Dirs {
    victim: PathBuf,
    /// The aggressor's volume.
    volume: PathBuf,
    local_disk: PathBuf,
    /// The victim's latency logs (on the local disk, outside both volumes).
    logs: PathBuf,
}

impl Dirs {
    fn of(&self, agg: &Aggressor) -> &Path {
        match agg.place {
            Place::Volume => &self.volume,
            Place::LocalDisk => &self.local_disk,
        }
    }
}

/// The runs of one aggressor and round: the runs a cap applies to, in an order that rotates
/// with the round.
async fn one_round(
    bed: &Bed,
    id: &str,
    dirs: &Dirs,
    a: usize,
    agg: &Aggressor,
    round: usize,
    secs: u64,
) -> Round {
    let mut runs = match (agg.place, agg.cap) {
        // A local disk has no cap to be over, and a volume without one no pace to keep.
        (Place::LocalDisk, _) => vec![Pacing::ByFio],
        (_, Cap::None) => vec![Pacing::ByTheCap],
        _ => vec![Pacing::ByTheCap, Pacing::ByFio],
    };
    let turn = round % runs.len();
    runs.rotate_left(turn);
    let mut r = Round::default();
    if agg.place == Place::Volume {
        set_cap(bed, id, agg.cap).await;
    }
    for pacing in runs {
        std::thread::sleep(SETTLE);
        let aggressor = Switched::start(aggressor_fio(dirs.of(agg), a, agg, pacing));
        let (samples, moved) = interleaved(&dirs.victim, &dirs.logs, aggressor, secs);
        let run = Some(RunResult { samples, moved });
        match pacing {
            Pacing::ByTheCap => r.by_the_cap = run,
            Pacing::ByFio => r.by_fio = run,
        }
    }
    r
}

/// The table. The figure is the victim's p99 over every read of every round with the
/// aggressor on, against its p99 over every read with it off: the rounds pooled, which a
/// run's interleaving makes fair (a drift of the machine meets both sides alike) and which
/// ranks five times the reads a round has. Per round ratios show the spread.
fn report(rounds_of: &[Vec<Round>]) {
    println!(
        "\n| aggressor | victim's p99 on / off, per round | all rounds pooled | pooled p99 on / off, µs | goal ≤ 1.20 | paced by fio below its cap, pooled | the aggressor while on, median |"
    );
    println!("|---|---|---:|---:|---|---:|---:|");
    for (agg, rounds) in AGGRESSORS
        .iter()
        .zip(rounds_of)
        .filter(|(_, r)| !r.is_empty())
    {
        let of = |pacing: Pacing| -> Vec<&RunResult> {
            rounds.iter().filter_map(|r| r.get(pacing)).collect()
        };
        // The figure: over the cap, or paced by fio where there is no cap to be over.
        let figure = if agg.place == Place::LocalDisk {
            of(Pacing::ByFio)
        } else {
            of(Pacing::ByTheCap)
        };
        let pooled_samples = pool(&figure);
        let pooled = pooled_samples.ratio();
        let (on_us, off_us) = pooled_samples.p99s_us();
        let absolute = format!("{on_us:.0} / {off_us:.0}");
        let (goal, paced) = match (agg.place, agg.cap) {
            (Place::LocalDisk, _) => ("— (control)".to_string(), "—".to_string()),
            (_, Cap::None) => ("— (no cap)".to_string(), "—".to_string()),
            _ => {
                let met = if pooled <= 1.20 { "met" } else { "MISSED" };
                let by_fio = pool(&of(Pacing::ByFio)).ratio();
                (met.to_string(), format!("{by_fio:.2}"))
            }
        };
        let all: Vec<String> = (figure.iter())
            .map(|r| format!("{:.2}", r.samples.ratio()))
            .collect();
        println!(
            "| {} | {} | {pooled:.2} | {absolute} | {goal} | {paced} | {} |",
            agg.name,
            all.join(", "),
            moved(agg, &figure)
        );
    }
}

/// Every run's samples together.
fn pool(runs: &[&RunResult]) -> Samples {
    let mut all = Samples::default();
    for r in runs {
        all.on.extend_from_slice(&r.samples.on);
        all.off.extend_from_slice(&r.samples.off);
    }
    all
}

/// What the aggressor moved while on, median over the runs, in the unit of its cap.
fn moved(agg: &Aggressor, runs: &[&RunResult]) -> String {
    let (mut v, unit): (Vec<f64>, _) = match agg.cap {
        Cap::MiBps(_) => (runs.iter().map(|r| r.moved.mib).collect(), "MiB/s"),
        _ => (runs.iter().map(|r| r.moved.ios).collect(), "I/Os a second"),
    };
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        // fio reports nothing when it is stopped before it has finished its start.
        return "— (fio still starting)".to_string();
    }
    v.sort_by(f64::total_cmp);
    format!("{:.1} {unit}", v[v.len() / 2])
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

/// Runs the victim for `secs` while `aggressor` is switched on and off by phases; the
/// victim's p99 with it on over its p99 with it off, and what the aggressor moved.
fn interleaved(victim: &Path, logs: &Path, aggressor: Switched, secs: u64) -> (Samples, Moved) {
    let prefix = logs.join("victim");
    let mut job = victim_job(secs);
    job.push(format!("--write_lat_log={}", prefix.display()));
    job.extend(["--log_unix_epoch=1", "--log_avg_msec=0"].map(String::from));
    let phases = std::thread::scope(|s| {
        let switching = s.spawn(|| aggressor.switch_for(Duration::from_secs(secs)));
        run_fio(victim, &job);
        switching.join().expect("the switching thread")
    });
    let on_ms: u64 = (phases.windows(2))
        .filter(|w| w[0].1)
        .map(|w| w[1].0 - w[0].0)
        .sum();
    let moved = aggressor.finish(on_ms);
    let log = logs.join("victim_clat.1.log");
    let samples = std::fs::read_to_string(&log).expect("the victim's latency log");
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for (at_ms, clat_ns) in samples.lines().filter_map(parse_sample) {
        match phase_at(&phases, at_ms) {
            Some(true) => on.push(clat_ns),
            Some(false) => off.push(clat_ns),
            None => {}
        }
    }
    std::fs::remove_file(&log).expect("remove the latency log");
    assert!(
        on.len() > 100 && off.len() > 100,
        "too few reads to rank: {} on, {} off",
        on.len(),
        off.len()
    );
    (Samples { on, off }, moved)
}

fn run_fio(dir: &Path, job: &[String]) -> Value {
    let job: Vec<&str> = job.iter().map(String::as_str).collect();
    common::fio(dir, &job)
}

/// `(completion time in ms since the epoch, completion latency in ns)` of one line of fio's
/// latency log (`time, value, direction, size, offset[, priority]`).
fn parse_sample(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split(',').map(str::trim);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// Whether the aggressor was on at `at_ms` (`None` in a phase's guard or outside the run).
/// `phases`: each phase's start (ms since the epoch) and whether the aggressor was on in it,
/// then the end of the last one.
fn phase_at(phases: &[(u64, bool)], at_ms: u64) -> Option<bool> {
    let guard = GUARD.as_millis() as u64;
    phases
        .windows(2)
        .find(|w| w[0].0 + guard <= at_ms && at_ms < w[1].0)
        .map(|w| w[0].1)
}

fn p99(v: &[u64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[(v.len() * 99 / 100).min(v.len() - 1)] as f64
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as u64
}

/// A running aggressor that can be stopped and continued as a whole (its jobs are threads of
/// one fio process, `--thread`: fio's job processes would start sessions of their own and
/// outlive a signal to the first); killed on drop.
struct Switched(Option<Child>);

/// What the aggressor moved while it was on, per second.
#[derive(Clone, Copy, Default)]
struct Moved {
    mib: f64,
    ios: f64,
}

impl Switched {
    /// Starts `fio`, stopped at once: it moves nothing outside the phases it is on in.
    fn start(mut fio: Command) -> Switched {
        let child = (fio.stdout(Stdio::piped()).stderr(Stdio::piped()))
            .spawn()
            .expect("start fio");
        let me = Switched(Some(child));
        me.signal(libc::SIGSTOP);
        me
    }

    /// Switches the aggressor off and on by [`PHASE`]s for `total`, starting off; each phase's
    /// start and whether it was on, then the end.
    fn switch_for(&self, total: Duration) -> Vec<(u64, bool)> {
        let mut phases = Vec::new();
        let mut on = false;
        let start = std::time::Instant::now();
        while start.elapsed() + PHASE <= total {
            self.signal(if on { libc::SIGCONT } else { libc::SIGSTOP });
            phases.push((epoch_ms(), on));
            std::thread::sleep(PHASE);
            on = !on;
        }
        self.signal(libc::SIGSTOP);
        phases.push((epoch_ms(), false));
        phases
    }

    /// Ends fio (it reports on SIGINT) and returns what it moved over `on_ms` of being on.
    fn finish(mut self, on_ms: u64) -> Moved {
        self.signal(libc::SIGINT);
        self.signal(libc::SIGCONT);
        // fio can miss the SIGINT: a file-create job once ran on for 15 minutes after it, at
        // its cap's rate, until a second one. Ask again until it ends.
        let mut asked = std::time::Instant::now();
        while (self.0.as_mut().expect("a running fio").try_wait())
            .expect("wait for fio")
            .is_none()
        {
            if asked.elapsed() >= Duration::from_secs(5) {
                self.signal(libc::SIGINT);
                asked = std::time::Instant::now();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Its report (a few KiB) waits in the pipe.
        let out = self.0.take().expect("a running fio").wait_with_output();
        let out = out.expect("fio's report");
        let Some(report) = common::fio_report(&String::from_utf8_lossy(&out.stdout)) else {
            // fio ends without a report when the signal comes before it set up its handler:
            // still laying out its files (2,000 opens per job, at the cap's rate).
            println!(
                "the aggressor's fio reported nothing ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return Moved {
                mib: f64::NAN,
                ios: f64::NAN,
            };
        };
        let job = &report["jobs"][0];
        let sum = |field: &str| {
            ["read", "write"]
                .iter()
                .map(|d| job[d][field].as_f64().unwrap_or(0.0))
                .sum::<f64>()
        };
        let secs = on_ms as f64 / 1e3;
        Moved {
            mib: sum("io_bytes") / MIB as f64 / secs,
            ios: sum("total_ios") / secs,
        }
    }

    fn signal(&self, signal: libc::c_int) {
        let child = self.0.as_ref().expect("a running fio");
        // SAFETY: kill(2) on our own child, which has not been waited for yet.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        assert_eq!(
            rc,
            0,
            "signal the aggressor: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Switched {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Aggressor `a`'s fio (files of its own), running until killed. Paced [`Pacing::ByFio`], its
/// jobs pause after each I/O for as long as the cap allows per I/O of each job: a little under
/// the cap, by the I/O's own time.
fn aggressor_fio(dir: &Path, a: usize, agg: &Aggressor, pacing: Pacing) -> Command {
    let mut cmd = Command::new(common::FIO);
    cmd.arg(format!("--directory={}", dir.display()))
        .arg(format!("--name=aggressor{a}"))
        .arg(format!("--numjobs={}", agg.jobs))
        .args(["--direct=1", "--ioengine=psync", "--thread"])
        .args(["--time_based", "--runtime=3600", "--group_reporting"])
        .arg("--output-format=json")
        .args(agg.fio)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let per_second = match agg.cap {
        Cap::Iops(n) => n as f64,
        Cap::MiBps(n) => (n << 20) as f64 / agg.io_bytes as f64,
        Cap::None => return cmd,
    };
    if pacing == Pacing::ByFio {
        let pause_us = agg.jobs as f64 * 1e6 / per_second;
        cmd.arg(format!("--thinktime={}", pause_us as u64))
            .arg("--thinktime_blocks=1");
    }
    cmd
}
