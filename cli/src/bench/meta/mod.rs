//! `dpufs bench meta`: metadata and small files side by side, the way `dpufs bench` measures
//! the data path (docs/benchmarks.md: ratios measured side by side in one run).
//!
//! Protocol (printed with the results; the same for every target, peers included):
//! - mdtest-like scenarios: `--files` files of `--file-size` bytes, split evenly over
//!   `--jobs` threads, either in one shared directory or per job in a subtree of ten
//!   directories. Phases, each timed on its own: create (open O_CREAT|O_EXCL, write, close),
//!   stat, read (open, read to the end, close), unlink; files/s = files / wall time.
//! - The small-file tree: a fixed-seed tree shaped like a source tree (by default 3,300 files,
//!   ≈47 MB, mostly 1–32 KiB, a few up to 1 MiB, 329 directories, 11 symlinks), written once
//!   to local disk beside the reports, with a tar of it. Per target, with the real tools:
//!   `cp -a`, `ls -lR` and `find` (output to /dev/null), `rm -rf`, then `tar x`; wall seconds.
//! - Before lookups and reads (stat, read, unlink, ls, find, rm): sync, then page cache,
//!   dentries and inodes dropped. Before create, cp and tar: sync only, and the local sources
//!   are read once, untimed, so cp and tar read them from the page cache. Writing phases
//!   (create, unlink, cp, rm, tar) end with syncfs(2), `sync -f`, on the target, counted in the
//!   time, so the kernel's write-back cannot hide work; files are not fsynced one by one.
//! - CPU = this process's (the job threads per getrusage, and the tools it ran) plus the
//!   serving processes' (/proc), as the fio matrix charges them.
//! - Targets take turns per scenario, the order rotating with every scenario and round;
//!   medians over rounds with min and max; ratios are of speed (files/s, or 1/seconds), to
//!   the baseline and, for targets, to the fastest peer.
//! - Everything happens in TARGET/dpufs-bench-meta, removed after every scenario.

mod mdtest;
mod measure;
mod phase;
mod report;
mod tools;
mod tree;

use super::{Lineup, Target, TargetArgs, turns};
use crate::output::bytes;
use crate::size::parse_size;
use anyhow::{Context, bail};
use clap::Args;
use phase::{Layout, MdOp, Phase, TreeOp};
use report::{Header, Run, Sample};
use serde::Serialize;
use std::path::{Path, PathBuf};
use tree::{Rng, Source, Tree};

/// The directory each target's work happens in, removed after every scenario.
const WORK_DIR: &str = "dpufs-bench-meta";

#[derive(Debug, Args)]
pub struct MetaArgs {
    #[command(flatten)]
    common: TargetArgs,
    /// Files per mdtest-like phase, over all jobs.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    files: u64,
    /// Job (thread) counts of the mdtest-like phases.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,4",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    jobs: Vec<u32>,
    /// Bytes each mdtest-like file holds.
    #[arg(long, value_parser = parse_size, default_value = "4K")]
    file_size: u64,
    /// Files of the small-file tree (its directories and symlinks scale with it).
    #[arg(long, default_value_t = 3300, value_parser = clap::value_parser!(u64).range(1..))]
    tree_files: u64,
}

/// The run's parameters, as the JSON report records them.
#[derive(Debug, Serialize)]
struct Setup {
    files: u64,
    jobs: Vec<u32>,
    file_size: u64,
    rounds: usize,
    tree_files: usize,
    tree_dirs: usize,
    tree_symlinks: usize,
    tree_bytes: u64,
}

/// The phases one target runs in one turn, in order, on a work directory of its own.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    Md { layout: Layout, jobs: u32 },
    Tree,
}

const MD_OPS: [MdOp; 4] = [MdOp::Create, MdOp::Stat, MdOp::Read, MdOp::Unlink];
/// Removal before unpacking: each needs the tree the step before left.
const TREE_OPS: [TreeOp; 5] = [
    TreeOp::Copy,
    TreeOp::List,
    TreeOp::Find,
    TreeOp::Remove,
    TreeOp::Untar,
];

impl Scenario {
    fn all(jobs: &[u32]) -> Vec<Scenario> {
        let md = [Layout::SharedDir, Layout::Tree]
            .into_iter()
            .flat_map(|layout| jobs.iter().map(move |&jobs| Scenario::Md { layout, jobs }));
        md.chain([Scenario::Tree]).collect()
    }

    fn phases(self) -> Vec<Phase> {
        match self {
            Scenario::Md { layout, jobs } => {
                MD_OPS.map(|op| Phase::Md { layout, jobs, op }).to_vec()
            }
            Scenario::Tree => TREE_OPS.map(|op| Phase::Tree { op }).to_vec(),
        }
    }
}

/// What every turn uses.
struct Bench {
    files: u64,
    /// The contents of every mdtest-like file (incompressible).
    data: Vec<u8>,
    source: Source,
    tree_files: u64,
}

pub fn run(a: MetaArgs) -> anyhow::Result<()> {
    let lineup = a.common.lineup("dpufs bench meta")?;
    for t in &lineup.all {
        let dir = t.path.join(WORK_DIR);
        if dir.symlink_metadata().is_ok() {
            bail!(
                "{}: {} exists (left by an interrupted run?); remove it first",
                t.name,
                dir.display()
            );
        }
    }
    let out = &a.common.out;
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix(".meta-source.")
        .tempdir_in(out)
        .with_context(|| format!("create a scratch directory in {}", out.display()))?;
    let tree = Tree::source_like(a.tree_files as usize);
    let setup = Setup {
        files: a.files,
        jobs: a.jobs.clone(),
        file_size: a.file_size,
        rounds: a.common.rounds,
        tree_files: tree.files.len(),
        tree_dirs: tree.dirs.len(),
        tree_symlinks: tree.links.len(),
        tree_bytes: tree.bytes(),
    };
    let protocol = protocol_text(&setup, &lineup);
    eprintln!(
        "{protocol}\nwriting the source tree to {}",
        scratch.path().display()
    );
    let mut data = vec![0; a.file_size as usize];
    Rng::new(a.file_size).fill(&mut data);
    let bench = Bench {
        files: a.files,
        data,
        source: Source::write(&tree, scratch.path())?,
        tree_files: a.tree_files,
    };
    let scenarios = Scenario::all(&a.jobs);
    let mut runs = Vec::new();
    for round in 0..a.common.rounds {
        for (c, &scenario) in scenarios.iter().enumerate() {
            for i in turns(lineup.all.len(), round, c) {
                runs.extend(turn(&lineup.all[i], scenario, &bench, round)?);
            }
        }
    }
    let phases: Vec<Phase> = scenarios.iter().flat_map(|s| s.phases()).collect();
    let header = Header {
        command: &report::command_line(),
        protocol: &protocol,
        setup: &setup,
    };
    report::write(out, &header, &lineup, &phases, &runs)
}

/// One target runs one scenario's phases; its work directory is removed afterwards, and an
/// error here (the target could not be left as found) ends the benchmark.
fn turn(
    target: &Target,
    scenario: Scenario,
    bench: &Bench,
    round: usize,
) -> anyhow::Result<Vec<Run>> {
    let dir = target.path.join(WORK_DIR);
    let results = match scenario {
        Scenario::Md { layout, jobs } => md_turn(target, &dir, layout, jobs, bench),
        Scenario::Tree => tree_turn(target, &dir, bench),
    };
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("{}: remove {}", target.name, dir.display()));
        }
        _ => {}
    }
    Ok(scenario
        .phases()
        .into_iter()
        .zip(results)
        .map(|(phase, result)| {
            eprintln!(
                "round {} {:<24} {:<10} {}",
                round + 1,
                phase.label(),
                target.name,
                progress(phase, &result)
            );
            Run {
                target: target.name.clone(),
                phase,
                round,
                result,
            }
        })
        .collect())
}

fn progress(phase: Phase, result: &Result<Sample, String>) -> String {
    match result {
        Ok(s) => format!(
            "{:>10.3} {:<8} CPU {:.2} s",
            s.value,
            phase.unit().label(),
            s.cpu_s()
        ),
        Err(e) => e.clone(),
    }
}

fn md_turn(
    target: &Target,
    dir: &Path,
    layout: Layout,
    jobs: u32,
    bench: &Bench,
) -> Vec<Result<Sample, String>> {
    let files = mdtest::job_files(dir, layout, jobs, bench.files);
    let setup = make_dirs(dir, &mdtest::dirs(dir, layout, jobs));
    let phase = |op| Phase::Md { layout, jobs, op };
    in_order(&MD_OPS, setup, |op| {
        let cost = measure::phase(target, dir, phase(op).rules(), || {
            mdtest::run(op, &files, &bench.data)
        })?;
        Ok(Sample::new(phase(op), bench.files, cost))
    })
}

fn tree_turn(target: &Target, dir: &Path, bench: &Bench) -> Vec<Result<Sample, String>> {
    let setup = make_dirs(dir, &[]);
    in_order(&TREE_OPS, setup, |op| {
        let phase = Phase::Tree { op };
        if !phase.rules().cold {
            bench.source.warm()?;
        }
        let cost = measure::phase(target, dir, phase.rules(), || {
            tools::run(op, &bench.source, dir).map(|()| 0.0)
        })?;
        Ok(Sample::new(phase, bench.tree_files, cost))
    })
}

/// Makes the work directory `dir` and `below` it, parents first (untimed).
fn make_dirs(dir: &Path, below: &[PathBuf]) -> anyhow::Result<()> {
    for d in std::iter::once(dir).chain(below.iter().map(PathBuf::as_path)) {
        std::fs::create_dir(d).with_context(|| format!("create {}", d.display()))?;
    }
    Ok(())
}

/// Runs `one` for each step after `setup`; once something fails, the later steps are not run,
/// since each needs what the one before left.
fn in_order<T: Copy>(
    steps: &[T],
    setup: anyhow::Result<()>,
    mut one: impl FnMut(T) -> anyhow::Result<Sample>,
) -> Vec<Result<Sample, String>> {
    let mut blocked = setup.err().map(|e| format!("not run: {e:#}"));
    steps
        .iter()
        .map(|&step| match &blocked {
            Some(why) => Err(why.clone()),
            None => one(step).map_err(|e| {
                let e = format!("{e:#}");
                blocked = Some(format!("not run after: {e}"));
                e
            }),
        })
        .collect()
}

/// The protocol as printed before the runs and at the top of the report.
fn protocol_text(s: &Setup, lineup: &Lineup) -> String {
    let names: Vec<String> = lineup
        .all
        .iter()
        .map(|t| format!("{} ({})", t.name, t.path.display()))
        .collect();
    let jobs: Vec<String> = s.jobs.iter().map(u32::to_string).collect();
    format!(
        "Protocol:\n\
         - mdtest-like: {files} files of {size} per phase, split evenly over {jobs} jobs \
         (threads), in one shared directory or per job a subtree of {dirs} directories. Phases \
         timed one by one: create (open O_CREAT|O_EXCL, write, close), stat, read (open, read \
         to the end, close), unlink; files/s = files / wall time.\n\
         - Small-file tree: a fixed-seed source-like tree of {tf} files ({tb}), {td} directories \
         and {tl} symlinks, written once on local disk with a tar of it. Per target, with the \
         real tools: cp -a, ls -lR and find (output to /dev/null), rm -rf, tar x; wall seconds.\n\
         - Before stat, read, unlink, ls, find and rm: sync, then page cache, dentries and \
         inodes dropped. Before create, cp and tar: sync only; the local sources are read once, \
         untimed, so cp and tar read them from the page cache.\n\
         - Create, unlink, cp, rm and tar end with syncfs(2) (sync -f) on the target, counted \
         in the time, so write-back caches cannot hide work. Files are not fsynced one by one; \
         on FUSE, syncfs writes the kernel's dirty pages back and is not passed to the daemon.\n\
         - CPU s = this process's CPU (job threads per getrusage, the tools it ran) plus the \
         serving processes' (/proc).\n\
         - {rounds} round(s), the target order rotating with every scenario and round; medians \
         with min and max over rounds. Ratios are of speed (files/s, or 1/seconds): \
         vs {baseline} = target / baseline, vs best peer = target / fastest peer.\n\
         - Work directory TARGET/{WORK_DIR}, removed after every scenario.\n\
         \n\
         Targets: {targets}",
        files = s.files,
        size = bytes(s.file_size),
        jobs = jobs.join(" and "),
        dirs = mdtest::TREE_DIRS,
        tf = s.tree_files,
        tb = bytes(s.tree_bytes),
        td = s.tree_dirs,
        tl = s.tree_symlinks,
        rounds = s.rounds,
        baseline = lineup.baseline,
        targets = names.join(", "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_count_runs_in_both_layouts_then_the_tree() {
        let phases: Vec<String> = Scenario::all(&[1, 4])
            .into_iter()
            .flat_map(Scenario::phases)
            .map(Phase::label)
            .collect();
        assert_eq!(phases.len(), 4 * 4 + 5);
        assert_eq!(phases[0], "create, one dir, 1 job");
        assert_eq!(phases[15], "unlink, tree, 4 jobs");
        assert_eq!(phases[16..], ["cp -a", "ls -lR", "find", "rm -rf", "tar x"]);
    }

    #[test]
    fn after_a_failure_the_later_steps_are_not_run() {
        let mut ran = Vec::new();
        let results = in_order(&[1, 2, 3], Ok(()), |step| {
            ran.push(step);
            bail!("step {step} broke")
        });
        assert_eq!(ran, [1]);
        assert_eq!(results[0].as_ref().unwrap_err(), "step 1 broke");
        assert_eq!(
            results[2].as_ref().unwrap_err(),
            "not run after: step 1 broke"
        );
        let results = in_order(&[1], Err(anyhow::anyhow!("mkdir")), |_| unreachable!());
        assert_eq!(results[0].as_ref().unwrap_err(), "not run: mkdir");
    }
}
