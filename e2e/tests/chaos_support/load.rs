//! The load a chaos case puts on one node, as an application would: a writer of small files
//! (create, write, fsync, close), whose acknowledged files make the ledger checked after each
//! fault, and fio writing files and verifying them.

use dpufs_e2e::files::write_synced;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The size of a ledger file.
pub const RECORD: usize = 16 << 10;
/// The writer's pace: a file every this often, so the ledger stays small over a long run.
const PACE: Duration = Duration::from_millis(20);

/// What the application saw in one window of load.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Operations that failed, by errno name (a failed fio run counts as one).
    pub errors: BTreeMap<String, u64>,
    /// How long each ledger file took (create, write, fsync, close), failed ones too.
    pub took: Vec<Duration>,
    /// Ledger files acknowledged.
    pub acked: usize,
}

impl Seen {
    pub fn error(&mut self, name: String) {
        *self.errors.entry(name).or_default() += 1;
    }

    /// The longest a ledger file took: the longest the application stalled.
    pub fn longest(&self) -> Duration {
        self.took.iter().copied().max().unwrap_or_default()
    }

    /// The 99th percentile of the ledger files' times.
    pub fn p99(&self) -> Duration {
        let mut took = self.took.clone();
        took.sort();
        dpufs_e2e::percentile::p99(&took)
    }
}

/// The contents of ledger file `seq` of node `node`: every 8 bytes name the node, the file
/// and their own offset, so a byte in the wrong place or of the wrong file shows.
pub fn record(node: usize, seq: u64) -> Vec<u8> {
    (0..RECORD as u64 / 8)
        .flat_map(|i| ((node as u64) << 56 | seq << 24 | i).to_le_bytes())
        .collect()
}

/// Writes small files, each fsync'd; those whose fsync and close returned without an error
/// are acknowledged, and must be there, whole, after any fault.
pub struct Writer {
    node: usize,
    dir: PathBuf,
    state: Mutex<WriterState>,
}

#[derive(Default)]
struct WriterState {
    next: u64,
    /// Every acknowledged file and when it was acknowledged.
    acked: Vec<(u64, Instant)>,
    seen: Seen,
}

impl Writer {
    /// A writer of node `node`'s files in `dir` (created).
    pub fn new(node: usize, dir: PathBuf) -> Writer {
        std::fs::create_dir_all(&dir).expect("the ledger's directory");
        Writer {
            node,
            dir,
            state: Mutex::default(),
        }
    }

    /// Writes until `stop` is set.
    pub fn run(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            let seq = {
                let mut s = self.state.lock().unwrap();
                s.next += 1;
                s.next
            };
            let start = Instant::now();
            let result = write_synced(&self.dir.join(seq.to_string()), &record(self.node, seq));
            let mut s = self.state.lock().unwrap();
            s.seen.took.push(start.elapsed());
            match result {
                Ok(()) => {
                    s.acked.push((seq, Instant::now()));
                    s.seen.acked += 1;
                }
                Err(e) => s.seen.error(errno_name(&e)),
            }
            drop(s);
            std::thread::sleep(PACE);
        }
    }

    /// How many files were acknowledged after `t`, and when the first of them was.
    pub fn acked_after(&self, t: Instant) -> (usize, Option<Instant>) {
        let s = self.state.lock().unwrap();
        let after: Vec<Instant> = s
            .acked
            .iter()
            .rev()
            .map(|(_, at)| *at)
            .take_while(|at| *at > t)
            .collect();
        (after.len(), after.last().copied())
    }

    /// What the writer saw since the last call, and every file it acknowledged since it started.
    pub fn take(&self) -> (Seen, Vec<u64>) {
        let mut s = self.state.lock().unwrap();
        let seen = std::mem::take(&mut s.seen);
        (seen, s.acked.iter().map(|(seq, _)| *seq).collect())
    }
}

/// Checks node `node`'s acknowledged files `seqs` under `dir` (the ledger's directory as
/// another node mounts it): (bytes checked, bytes lost, the first lost file).
pub fn check(node: usize, dir: &Path, seqs: &[u64]) -> (u64, u64, Option<String>) {
    let (mut checked, mut lost, mut first) = (0, 0, None);
    for &seq in seqs {
        let want = record(node, seq);
        checked += want.len() as u64;
        let path = dir.join(seq.to_string());
        let problem = match std::fs::read(&path) {
            Ok(got) if got == want => continue,
            Ok(got) => format!(
                "{}: {} bytes, not what was written",
                path.display(),
                got.len()
            ),
            Err(e) => format!("{}: {e}", path.display()),
        };
        lost += want.len() as u64;
        first.get_or_insert(problem);
    }
    (checked, lost, first)
}

/// fio writing a file with verification headers, reading it back and checking every block,
/// one file after another; keeps the last file that passed.
pub struct FioLoop {
    dir: PathBuf,
    state: Mutex<FioState>,
}

#[derive(Default)]
struct FioState {
    runs: u64,
    seen: Seen,
    /// Runs whose verification found a wrong block.
    corrupt: Vec<String>,
    /// The last run that passed: its file, and when it started.
    passed: Option<(String, Instant)>,
}

/// The fio job of every run; `verify_only` reads a file an earlier run wrote and checks it.
pub fn fio_job(file: &Path, verify_only: bool) -> Command {
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=chaos",
        "--rw=write",
        "--bs=64k",
        "--size=4M",
        "--direct=1",
        "--ioengine=psync",
        "--verify=crc32c",
        // No verify-state files in the working directory.
        "--verify_state_save=0",
    ])
    .arg(format!("--filename={}", file.display()));
    if verify_only {
        cmd.arg("--verify_only");
    } else {
        cmd.args(["--do_verify=1", "--end_fsync=1", "--rate=8m"]);
    }
    cmd
}

/// Runs `cmd` (a fio job): `Ok` when it passed, else its output's tail; and whether a block
/// failed verification.
pub fn run_fio(mut cmd: Command) -> (Result<(), String>, bool) {
    let out = cmd.output().expect("run fio");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let corrupt = text.contains("verify failed") || text.contains("bad magic");
    if out.status.success() {
        return (Ok(()), corrupt);
    }
    let tail: String = text.lines().rev().take(4).collect::<Vec<_>>().join(" | ");
    (Err(tail), corrupt)
}

impl FioLoop {
    pub fn new(dir: PathBuf) -> FioLoop {
        std::fs::create_dir_all(&dir).expect("fio's directory");
        FioLoop {
            dir,
            state: Mutex::default(),
        }
    }

    /// Runs fio until `stop` is set.
    pub fn run(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            let name = {
                let mut s = self.state.lock().unwrap();
                s.runs += 1;
                format!("fio-{}", s.runs)
            };
            let start = Instant::now();
            let (result, corrupt) = run_fio(fio_job(&self.dir.join(&name), false));
            let mut s = self.state.lock().unwrap();
            if corrupt {
                s.corrupt.push(name.clone());
            }
            match result {
                Ok(()) => {
                    // Only the last file that passed is kept, for the other node to check.
                    if let Some((old, _)) = s.passed.replace((name, start)) {
                        let _ = std::fs::remove_file(self.dir.join(old));
                    }
                }
                Err(tail) => {
                    eprintln!("fio {name} in {}: {tail}", self.dir.display());
                    s.seen.error("fio run failed".into());
                }
            }
        }
    }

    /// Whether a run that started after `t` passed.
    pub fn passed_after(&self, t: Instant) -> bool {
        let s = self.state.lock().unwrap();
        s.passed.as_ref().is_some_and(|(_, at)| *at > t)
    }

    /// What fio saw since the last call, the runs that found a wrong block, and the file of
    /// the last run that passed.
    pub fn take(&self) -> (Seen, Vec<String>, Option<String>) {
        let mut s = self.state.lock().unwrap();
        let seen = std::mem::take(&mut s.seen);
        let corrupt = std::mem::take(&mut s.corrupt);
        (seen, corrupt, s.passed.as_ref().map(|(f, _)| f.clone()))
    }
}

/// An I/O error's errno name (`EIO`), as the application sees it.
pub fn errno_name(e: &std::io::Error) -> String {
    dpufs_daos::dfs::Errno(e.raw_os_error().unwrap_or(-1)).name()
}
