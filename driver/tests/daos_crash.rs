//! A crash of the DAOS engine under a dpufs volume on real DAOS: every byte a writer had
//! fsync'd before the engine was killed with SIGKILL is there once the engine is back,
//! read through a fresh worker.

mod common;

use common::{DaosBacking, WorkerProc, can_mount};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One write and fsync.
const RECORD: usize = 64 << 10;

/// The bytes of record `i`: its number, repeated, so a misplaced record shows.
fn record(i: u64) -> Vec<u8> {
    (0..RECORD)
        .map(|j| (i.wrapping_mul(131) as usize + j / 8) as u8)
        .collect()
}

/// Writes records to `file` with an fsync after each until `stop` or an error, counting the
/// records whose fsync returned in `acked`.
fn write_until(file: &Path, stop: &AtomicBool, acked: &AtomicU64) {
    let Ok(f) = OpenOptions::new().create_new(true).write(true).open(file) else {
        return;
    };
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if f.write_all_at(&record(i), i * RECORD as u64).is_err() || f.sync_data().is_err() {
            return;
        }
        i += 1;
        acked.store(i, Ordering::SeqCst);
    }
}

#[test]
fn fsynced_bytes_survive_an_engine_kill_on_daos_2_8_0() {
    survive_engine_kill(
        "fsynced_bytes_survive_an_engine_kill_on_daos_2_8_0",
        "2.8.0",
    );
}

#[test]
fn fsynced_bytes_survive_an_engine_kill_on_daos_2_6_5() {
    survive_engine_kill(
        "fsynced_bytes_survive_an_engine_kill_on_daos_2_6_5",
        "2.6.5",
    );
}

fn survive_engine_kill(test: &str, version: &str) {
    if !can_mount() {
        return;
    }
    let Some(mut backing) = DaosBacking::start(test, version) else {
        return;
    };
    let worker = WorkerProc::start(&backing, Default::default());
    let file = worker.path("log");
    let (stop, acked) = (AtomicBool::new(false), AtomicU64::new(0));
    let acked_at_kill = std::thread::scope(|s| {
        let writer = s.spawn(|| write_until(&file, &stop, &acked));
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked.load(Ordering::SeqCst) < 64 {
            assert!(Instant::now() < deadline, "the writer made no progress");
            std::thread::sleep(Duration::from_millis(20));
        }
        let killed = backing.daos.kill_engine().expect("killing the engine");
        let at_kill = acked.load(Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
        backing
            .daos
            .restart_engine(killed)
            .expect("restarting the engine");
        // The writer's last call may be stuck until its worker goes: stopping the worker
        // aborts the mount, which fails the call.
        drop(worker);
        writer.join().unwrap();
        at_kill
    });
    let acked = acked.load(Ordering::SeqCst);
    assert!(acked >= acked_at_kill);
    // A fresh worker (new pool and container handles) reads every acknowledged record.
    let fresh = WorkerProc::start(&backing, Default::default());
    let f = std::fs::File::open(fresh.path("log")).unwrap();
    let len = f.metadata().unwrap().len();
    assert!(
        len >= acked * RECORD as u64,
        "{len} bytes after {acked} acknowledged records"
    );
    let mut buf = vec![0u8; RECORD];
    for i in 0..acked {
        f.read_exact_at(&mut buf, i * RECORD as u64).unwrap();
        assert!(buf == record(i), "record {i} of {acked} differs");
    }
    eprintln!("{acked} fsync'd records ({acked_at_kill} when the engine was killed) survived");
}
