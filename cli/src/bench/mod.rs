//! `dpufs bench`: the fio matrix and the metadata phases (`bench meta`) side by side
//! (docs/benchmarks.md: ratios measured side by side in one run).
//!
//! Every case runs against every target round by round, the target order rotating each round,
//! so drift on a shared machine hits all targets alike; the report gives medians over rounds
//! and ratios to the baseline (the engine's backing directory: the local limit). The protocol
//! is fixed and printed with the results: caches dropped before every read run, read files
//! laid out once with fsync, write runs start from no file and end with fsync (`end_fsync=1`),
//! the same for every target, peers included. `dpufs bench meta` (meta/) measures metadata and
//! small files with the same targets, rotation and CPU accounting.

mod cpu;
mod fio;
mod meta;
mod report;

use crate::size::parse_size;
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use fio::{Case, Measured, Pattern, Protocol};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    sub: Option<BenchSub>,
    #[command(flatten)]
    matrix: MatrixArgs,
}

#[derive(Debug, Subcommand)]
enum BenchSub {
    /// The fabric benchmarks (RDMA vs plain TCP between two processes), from a source tree.
    Fabric,
    /// Metadata and small files side by side: mdtest-like phases and a source-like tree
    /// through cp, ls, find, tar and rm.
    // Boxed: its arguments would make every `dpufs` command as large as they are.
    Meta(Box<meta::MetaArgs>),
}

/// What every side-by-side benchmark takes: the targets, the rounds, where the reports go.
#[derive(Debug, Args)]
struct TargetArgs {
    /// The mount under test, NAME=PATH[@PROC,...] (PROCs: the processes whose CPU time is
    /// charged to it; known names get defaults: dpufs, moosefs, glusterfs).
    #[arg(long = "target", value_parser = parse_target)]
    targets: Vec<Target>,
    /// The local limit the ratios are taken against, NAME=PATH (the engine's backing directory).
    #[arg(long, value_parser = parse_target)]
    baseline: Option<Target>,
    /// A comparison mount, NAME=PATH[@PROC,...] (repeatable; see bench/peers.sh).
    #[arg(long = "peer", value_parser = parse_target)]
    peers: Vec<Target>,
    /// Rounds; the report gives the median.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where the JSON and Markdown reports go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// The checked targets of one run, in report order: targets, baseline, peers.
#[derive(Clone, Debug)]
struct Lineup {
    all: Vec<Target>,
    baseline: String,
    peers: Vec<String>,
}

impl TargetArgs {
    /// The lineup, once this process may drop caches and every target is a directory.
    fn lineup(&self, verb: &str) -> anyhow::Result<Lineup> {
        let Some(baseline) = self.baseline.clone() else {
            bail!(
                "give --baseline NAME=PATH (the engine's backing directory) and --target NAME=PATH"
            );
        };
        if !rustix::process::geteuid().is_root() {
            bail!(
                "{verb} drops the page cache between runs (/proc/sys/vm/drop_caches), \
                 which needs root: run it as root"
            );
        }
        let mut all = self.targets.clone();
        all.push(baseline.clone());
        all.extend(self.peers.iter().cloned());
        for t in &all {
            if !t.path.is_dir() {
                bail!("{}: {} is not a directory", t.name, t.path.display());
            }
        }
        Ok(Lineup {
            all,
            baseline: baseline.name,
            peers: self.peers.iter().map(|p| p.name.clone()).collect(),
        })
    }
}

/// The order in which the targets take turns at `case` of `round`: who goes first changes
/// with every case and round, since the first run after a layout or a write run can meet a
/// busier disk, and drift on a shared machine should hit all targets alike.
fn turns(targets: usize, round: usize, case: usize) -> impl Iterator<Item = usize> {
    (0..targets).map(move |i| (i + round + case) % targets)
}

#[derive(Debug, Args)]
struct MatrixArgs {
    #[command(flatten)]
    common: TargetArgs,
    /// File size per job.
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    size: u64,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10.0)]
    runtime: f64,
    /// Job counts.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    jobs: Vec<u32>,
    /// Patterns.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "seq-read,seq-write,rand-read,rand-write"
    )]
    patterns: Vec<Pattern>,
    /// I/O modes: direct, buffered.
    #[arg(long, value_delimiter = ',', default_value = "direct,buffered")]
    modes: Vec<Mode>,
    /// fio I/O engine.
    #[arg(long, default_value = "psync")]
    ioengine: String,
    /// Queue depth per job (async engines).
    #[arg(long, default_value_t = 1)]
    iodepth: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    Direct,
    Buffered,
}

/// A directory to measure and the processes that serve it.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub name: String,
    pub path: PathBuf,
    pub procs: Vec<String>,
}

fn default_procs(name: &str) -> &'static [&'static str] {
    match name {
        "dpufs" => &["dpufs-csi", "dpufs-engine"],
        "moosefs" => &["mfsmount", "mfschunkserver", "mfsmaster"],
        "glusterfs" => &["glusterfs", "glusterfsd"],
        _ => &[],
    }
}

fn parse_target(text: &str) -> Result<Target, String> {
    let (name, rest) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=PATH[@PROC,...]"))?;
    let (path, procs) = match rest.split_once('@') {
        Some((p, procs)) => (p, procs.split(',').map(str::to_string).collect()),
        None => (
            rest,
            default_procs(name).iter().map(|s| s.to_string()).collect(),
        ),
    };
    if name.is_empty() || path.is_empty() {
        return Err(format!("{text:?}: expected NAME=PATH[@PROC,...]"));
    }
    Ok(Target {
        name: name.to_string(),
        path: PathBuf::from(path),
        procs,
    })
}

/// One run's outcome: measured, or why it could not run (e.g. O_DIRECT refused).
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub target: String,
    pub case: Case,
    pub round: usize,
    pub result: Result<Sample, String>,
}

/// A measurement with the CPU of everything involved.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sample {
    pub fio: Measured,
    /// CPU seconds of the target's serving processes during the run.
    pub server_cpu_s: f64,
}

impl Sample {
    /// CPU seconds (fio + servers) per GiB moved.
    pub fn cpu_s_per_gib(&self) -> f64 {
        let gib = self.fio.bytes as f64 / f64::from(1 << 30);
        if gib > 0.0 {
            (self.fio.fio_cpu_s + self.server_cpu_s) / gib
        } else {
            0.0
        }
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.sub {
        Some(BenchSub::Fabric) => fabric(),
        Some(BenchSub::Meta(a)) => tokio::task::spawn_blocking(move || meta::run(*a)).await?,
        None => tokio::task::spawn_blocking(move || matrix(args.matrix)).await?,
    }
}

/// `dpufs bench fabric`: the criterion benchmark of the fabric crate, from a source tree.
fn fabric() -> anyhow::Result<()> {
    let status = std::process::Command::new("cargo")
        .args(["bench", "-p", "dpufs-fabric", "--bench", "rma"])
        .status()
        .context("run cargo (dpufs bench fabric runs from a dpufs source tree)")?;
    if !status.success() {
        bail!("cargo bench failed ({status})");
    }
    Ok(())
}

fn matrix(a: MatrixArgs) -> anyhow::Result<()> {
    let lineup = a.common.lineup("dpufs bench")?;
    let targets = &lineup.all;
    let protocol = Protocol {
        size: a.size,
        runtime: Duration::from_secs_f64(a.runtime),
        ioengine: a.ioengine.clone(),
        iodepth: a.iodepth,
    };
    let cases = cases(&a);
    let rounds = a.common.rounds;
    eprintln!("{}", report::protocol_text(&protocol, targets, rounds));
    lay_out(targets, &cases, &protocol)?;
    let mut runs = Vec::new();
    for round in 0..rounds {
        for (c, case) in cases.iter().enumerate() {
            for i in turns(targets.len(), round, c) {
                let target = &targets[i];
                let result = run_one(target, case, &protocol).map_err(|e| format!("{e:#}"));
                match &result {
                    Ok(s) => eprintln!(
                        "round {} {:<40} {:<10} {:>9.1} MiB/s {:>9.0} IOPS",
                        round + 1,
                        case.label(),
                        target.name,
                        s.fio.mib_per_s,
                        s.fio.iops
                    ),
                    Err(e) => {
                        eprintln!("round {} {} {}: {e}", round + 1, case.label(), target.name)
                    }
                }
                runs.push(Run {
                    target: target.name.clone(),
                    case: *case,
                    round,
                    result,
                });
            }
        }
    }
    for t in targets {
        // Leave the targets as found.
        let _ = fio::remove_files(&t.path, fio::WRITE_FILES);
        let _ = fio::remove_files(&t.path, fio::READ_FILES);
    }
    report::write(
        &a.common.out,
        &protocol,
        targets,
        &lineup.baseline,
        &cases,
        &runs,
    )
}

fn cases(a: &MatrixArgs) -> Vec<Case> {
    let mut out = Vec::new();
    for &pattern in &a.patterns {
        for &jobs in &a.jobs {
            for &mode in &a.modes {
                out.push(Case {
                    pattern,
                    jobs,
                    direct: mode == Mode::Direct,
                });
            }
        }
    }
    out
}

/// Lays out the read files on every target, once per job count.
fn lay_out(targets: &[Target], cases: &[Case], protocol: &Protocol) -> anyhow::Result<()> {
    let mut jobs: Vec<u32> = cases
        .iter()
        .filter(|c| !c.pattern.is_write())
        .map(|c| c.jobs)
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    if let Some(&max) = jobs.last() {
        // Files are per job number, so the largest job count lays out every file.
        let case = Case {
            pattern: Pattern::SeqRead,
            jobs: max,
            direct: false,
        };
        for t in targets {
            eprintln!("laying out {max} × {} bytes on {}", protocol.size, t.name);
            fio::lay_out(&t.path, &case, protocol)
                .with_context(|| format!("lay out read files on {}", t.name))?;
        }
    }
    Ok(())
}

fn run_one(target: &Target, case: &Case, protocol: &Protocol) -> anyhow::Result<Sample> {
    if case.pattern.is_write() {
        fio::remove_files(&target.path, fio::WRITE_FILES)?;
    }
    drop_caches()?;
    let before = cpu::snapshot(&target.procs);
    let fio = fio::measure(&target.path, case, protocol)?;
    let after = cpu::snapshot(&target.procs);
    Ok(Sample {
        fio,
        server_cpu_s: cpu::spent(&before, &after),
    })
}

/// Writes every file system's dirty pages back, so no earlier run's write-back lands in the next.
fn sync() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

/// Writes dirty pages back and empties the page cache, dentries and inodes, so reads and
/// lookups come from the target.
fn drop_caches() -> anyhow::Result<()> {
    sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .context("drop the page cache (dpufs bench must run as root)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_take_known_process_defaults_or_an_explicit_list() {
        let t = parse_target("moosefs=/mnt/mfs").unwrap();
        assert_eq!(t.procs, ["mfsmount", "mfschunkserver", "mfsmaster"]);
        let t = parse_target("x=/a@p1,p2").unwrap();
        assert_eq!((t.path.to_str(), t.procs.len()), (Some("/a"), 2));
        assert!(parse_target("/just/a/path").is_err());
        assert!(parse_target("=/p").is_err());
    }

    #[test]
    fn every_target_takes_one_turn_and_the_first_moves_on() {
        for (round, case) in [(0, 0), (0, 1), (1, 0), (2, 5)] {
            let mut order: Vec<usize> = turns(3, round, case).collect();
            assert_eq!(order[0], (round + case) % 3);
            order.sort_unstable();
            assert_eq!(order, [0, 1, 2]);
        }
    }

    #[test]
    fn the_lineup_puts_targets_then_baseline_then_peers() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| parse_target(&format!("{name}={}", dir.path().display())).unwrap();
        let args = TargetArgs {
            targets: vec![at("dpufs")],
            baseline: Some(at("backing")),
            peers: vec![at("moosefs"), at("glusterfs")],
            rounds: 1,
            out: dir.path().into(),
        };
        if !rustix::process::geteuid().is_root() {
            let e = args.lineup("bench").unwrap_err().to_string();
            assert!(e.contains("needs root"), "{e}");
            return;
        }
        let lineup = args.lineup("bench").unwrap();
        let names: Vec<&str> = lineup.all.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["dpufs", "backing", "moosefs", "glusterfs"]);
        assert_eq!(
            (lineup.baseline.as_str(), lineup.peers.len()),
            ("backing", 2)
        );
        let missing = TargetArgs {
            targets: vec![parse_target("x=/no/such/dir").unwrap()],
            ..args
        };
        let e = missing.lineup("bench").unwrap_err().to_string();
        assert!(e.contains("x: /no/such/dir is not a directory"), "{e}");
    }
}
