//! Load on a mount while processes come and go: fio, and a watcher thread that reads a
//! probe file the whole time and counts errors by errno.

use super::{FIO, errno_of};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Observes the mount from another thread the whole time: a stat and a read per
/// iteration, errors counted by errno.
pub struct Watcher {
    stop: AtomicBool,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Watcher {
    pub fn new() -> Watcher {
        Watcher {
            stop: AtomicBool::new(false),
            errors: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn run(&self, file: &Path) {
        while !self.stop.load(Ordering::Acquire) {
            if let Err(e) = std::fs::read(file) {
                *self.errors.lock().unwrap().entry(errno_of(&e)).or_default() += 1;
            }
        }
    }

    /// Stops the watcher when dropped, also while unwinding from a failed assertion (or the
    /// scope would wait forever for it).
    pub fn stopper(&self) -> impl Drop + '_ {
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        Stop(&self.stop)
    }

    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().unwrap().clone()
    }
}

/// fio writing and reading through the mount for `secs` (its files laid out beforehand, so
/// the whole measured run is I/O); returns (exit ok, total errors, report).
pub fn fio(dir: &Path, secs: u32, continue_on_error: bool) -> (bool, u64, String) {
    let layout = fio_cmd(dir, secs)
        .arg("--create_only=1")
        .output()
        .expect("run fio");
    assert!(layout.status.success(), "fio layout: {layout:?}");
    let mut cmd = fio_cmd(dir, secs);
    if continue_on_error {
        // A request the killed worker held fails with ECONNABORTED (103): fio counts it and
        // goes on.
        cmd.args(["--continue_on_error=io", "--ignore_error=103,5:103,5"]);
    }
    parse_fio(cmd.output().expect("run fio"))
}

fn fio_cmd(dir: &Path, secs: u32) -> Command {
    let mut cmd = Command::new(FIO);
    cmd.arg(format!("--directory={}", dir.display()))
        .args([
            "--name=load",
            "--rw=randrw",
            "--bs=64k",
            "--size=16M",
            "--numjobs=2",
            "--ioengine=psync",
            "--direct=1",
            "--time_based",
            "--output-format=json",
        ])
        .arg(format!("--runtime={secs}"));
    cmd
}

fn parse_fio(out: std::process::Output) -> (bool, u64, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let errors = stdout
        .find('{')
        .and_then(|i| serde_json::from_str::<Value>(&stdout[i..]).ok())
        .map_or(u64::MAX, |v| {
            v["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["total_err"].as_u64().unwrap_or(0))
                .sum()
        });
    let report = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), errors, report)
}

/// Runs fio on `dir` for `secs` with a [`Watcher`] reading `probe`, and `meanwhile` two
/// seconds in; fio's outcome and the watcher.
pub fn under_load(
    dir: &Path,
    probe: &Path,
    secs: u32,
    continue_on_error: bool,
    meanwhile: impl FnOnce(),
) -> ((bool, u64, String), Watcher) {
    let watcher = Watcher::new();
    let outcome = std::thread::scope(|s| {
        let _stop = watcher.stopper();
        s.spawn(|| watcher.run(probe));
        let load = s.spawn(|| fio(dir, secs, continue_on_error));
        std::thread::sleep(Duration::from_secs(2));
        meanwhile();
        load.join().unwrap()
    });
    (outcome, watcher)
}

pub fn kill9(pid: u64) {
    dpufs_e2e::kill9(pid as u32);
}
