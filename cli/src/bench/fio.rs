//! One fio run: the job line for a case, and what its JSON output says.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// What the application does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// 1 MiB sequential reads.
    SeqRead,
    /// 1 MiB sequential writes.
    SeqWrite,
    /// 4 KiB random reads.
    RandRead,
    /// 4 KiB random writes.
    RandWrite,
}

impl Pattern {
    fn rw(self) -> &'static str {
        match self {
            Pattern::SeqRead => "read",
            Pattern::SeqWrite => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
        }
    }

    pub fn block_size(self) -> u64 {
        match self {
            Pattern::SeqRead | Pattern::SeqWrite => 1 << 20,
            Pattern::RandRead | Pattern::RandWrite => 4 << 10,
        }
    }

    pub fn is_write(self) -> bool {
        matches!(self, Pattern::SeqWrite | Pattern::RandWrite)
    }

    pub fn label(self) -> &'static str {
        match self {
            Pattern::SeqRead => "1 MiB seq read",
            Pattern::SeqWrite => "1 MiB seq write",
            Pattern::RandRead => "4 KiB rand read",
            Pattern::RandWrite => "4 KiB rand write",
        }
    }
}

/// One row of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Case {
    pub pattern: Pattern,
    pub jobs: u32,
    /// O_DIRECT, else buffered.
    pub direct: bool,
}

impl Case {
    pub fn label(&self) -> String {
        format!(
            "{}, {} job{}, {}",
            self.pattern.label(),
            self.jobs,
            if self.jobs == 1 { "" } else { "s" },
            if self.direct { "direct" } else { "buffered" }
        )
    }
}

/// How every run is made (printed with the report).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Protocol {
    /// Bytes per job file.
    pub size: u64,
    /// Measured time per run.
    pub runtime: Duration,
    /// fio's I/O engine.
    pub ioengine: String,
    /// Queue depth per job (only async engines use more than 1).
    pub iodepth: u32,
}

/// What one run measured.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Measured {
    pub bytes: u64,
    pub mib_per_s: f64,
    pub iops: f64,
    pub p99_us: f64,
    /// CPU seconds fio itself spent (user + system, all jobs).
    pub fio_cpu_s: f64,
}

/// Name of job `n`'s file: reads share files laid out once, writes start from none.
fn file_format(case: &Case) -> String {
    let prefix = if case.pattern.is_write() {
        WRITE_FILES
    } else {
        READ_FILES
    };
    format!("{prefix}$jobnum")
}

fn base_command(dir: &Path, case: &Case, protocol: &Protocol) -> Command {
    let mut cmd = Command::new("fio");
    cmd.arg("--name=dpufs-bench")
        .arg(format!("--directory={}", dir.display()))
        .arg(format!("--filename_format={}", file_format(case)))
        .arg(format!("--size={}", protocol.size))
        .arg(format!("--numjobs={}", case.jobs))
        .arg(format!("--bs={}", case.pattern.block_size()))
        .arg(format!("--direct={}", u8::from(case.direct)))
        .arg("--group_reporting")
        .arg("--output-format=json");
    cmd
}

/// Lays out the read files once per target (not measured).
pub fn lay_out(dir: &Path, case: &Case, protocol: &Protocol) -> anyhow::Result<()> {
    let mut cmd = base_command(dir, case, protocol);
    cmd.arg("--rw=write")
        .arg("--ioengine=psync")
        .arg("--end_fsync=1");
    run(cmd).map(|_| ())
}

/// Prefix of the files read runs use (laid out once per target).
pub const READ_FILES: &str = "dpufs-bench-r.";
/// Prefix of the files write runs create (removed before every write run).
pub const WRITE_FILES: &str = "dpufs-bench-w.";

/// Deletes the files in `dir` whose names start with `prefix`.
pub fn remove_files(dir: &Path, prefix: &str) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let path = entry?.path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix))
        {
            std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
        }
    }
    Ok(())
}

/// Runs `case` against `dir` for the protocol's time (reads: at most one pass of the files).
pub fn measure(dir: &Path, case: &Case, protocol: &Protocol) -> anyhow::Result<Measured> {
    let mut cmd = base_command(dir, case, protocol);
    cmd.arg(format!("--rw={}", case.pattern.rw()))
        .arg(format!("--ioengine={}", protocol.ioengine))
        .arg(format!("--iodepth={}", protocol.iodepth))
        .arg(format!("--runtime={}ms", protocol.runtime.as_millis()))
        .arg("--randrepeat=0");
    if case.pattern.is_write() {
        cmd.arg("--time_based").arg("--end_fsync=1");
    }
    // Reads are not time-based: a run ends at the end of the file (sequential) or when the
    // runtime is up, and fio's random map reads no block twice. So no read is served by a
    // cache the run itself warmed — the engine's chunk files and the backing directory sit in
    // the same page cache, which is far larger than any file we can lay out here.
    let out = run(cmd)?;
    parse(&out, case.pattern.is_write())
}

fn run(mut cmd: Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .context("run fio (install it: apt-get install fio)")?;
    if !out.status.success() {
        bail!(
            "fio failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[derive(Deserialize)]
struct Report {
    jobs: Vec<Job>,
}

#[derive(Deserialize)]
struct Job {
    read: Direction,
    write: Direction,
    usr_cpu: f64,
    sys_cpu: f64,
    job_runtime: f64,
    error: i32,
}

#[derive(Deserialize)]
struct Direction {
    io_bytes: u64,
    bw_bytes: f64,
    iops: f64,
    clat_ns: Latency,
}

#[derive(Deserialize)]
struct Latency {
    #[serde(default)]
    percentile: std::collections::BTreeMap<String, f64>,
}

/// Reads fio's JSON (it may print warnings before the document).
pub fn parse(output: &str, write: bool) -> anyhow::Result<Measured> {
    let start = output.find('{').context("fio printed no JSON")?;
    let report: Report = serde_json::from_str(&output[start..]).context("fio's JSON")?;
    let job = report.jobs.first().context("fio reported no job")?;
    if job.error != 0 {
        bail!(
            "fio job failed with {}",
            std::io::Error::from_raw_os_error(job.error)
        );
    }
    let d = if write { &job.write } else { &job.read };
    // With group_reporting, usr/sys are percentages of one CPU over the job's runtime.
    let fio_cpu_s = (job.usr_cpu + job.sys_cpu) / 100.0 * job.job_runtime / 1000.0;
    Ok(Measured {
        bytes: d.io_bytes,
        mib_per_s: d.bw_bytes / f64::from(1 << 20),
        iops: d.iops,
        p99_us: d
            .clat_ns
            .percentile
            .get("99.000000")
            .copied()
            .unwrap_or(0.0)
            / 1000.0,
        fio_cpu_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "dpufs-bench", "error" : 0, "job_runtime" : 2000,
      "usr_cpu" : 10.0, "sys_cpu" : 40.0,
      "read" : { "io_bytes" : 2147483648, "bw_bytes" : 1073741824, "iops" : 1024.0,
                 "clat_ns" : { "percentile" : { "50.000000" : 800000, "99.000000" : 1500000 } } },
      "write" : { "io_bytes" : 0, "bw_bytes" : 0, "iops" : 0.0, "clat_ns" : { } }
    }
  ]
}"#;

    #[test]
    fn reads_the_direction_that_ran_and_fios_cpu() {
        let m = parse(SAMPLE, false).unwrap();
        assert_eq!(m.bytes, 2 << 30);
        assert_eq!(m.mib_per_s, 1024.0);
        assert_eq!(m.iops, 1024.0);
        assert_eq!(m.p99_us, 1500.0);
        assert!((m.fio_cpu_s - 1.0).abs() < 1e-9);
        let w = parse(SAMPLE, true).unwrap();
        assert_eq!((w.bytes, w.p99_us), (0, 0.0));
    }

    #[test]
    fn a_failed_job_is_an_error() {
        let failed = SAMPLE.replace("\"error\" : 0", "\"error\" : 22");
        let e = parse(&failed, false).unwrap_err().to_string();
        assert!(e.contains("Invalid argument"), "{e}");
        assert!(parse("no json here", false).is_err());
    }
}
