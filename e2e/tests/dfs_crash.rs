//! kill -9 of an engine process during writes: after a restart on the same data, every
//! byte acknowledged as fsync'd is there, and the store is consistent and usable.
//!
//! The writer is this test binary re-executed (so the engine runs in a process of its own
//! that really dies by SIGKILL); it reports each fsync on stdout as it returns.

use dpufs_daos::dfs::{
    Dfs, ROOT_OID,
    conformance::{list, pattern},
};
use dpufs_e2e::in_process::TestEngine;
use dpufs_engine::dfs_service::Rights;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const RECORD: usize = 96 << 10;
const CHILD_ENV: &str = "DPUFS_CRASH_WRITER_DIR";

fn record(i: u64) -> Vec<u8> {
    pattern(RECORD, (i % 251) as u8)
}

/// A writer's engine and container, announced on stdout, when re-executed by a test below.
fn writer_volume() -> Option<(TestEngine, dpufs_daos::dfs::EngineDfs)> {
    let dir = std::env::var(CHILD_ENV).ok()?;
    let engine = TestEngine::start_at(std::path::Path::new(&dir), 2);
    let pool = engine.pool("tank", 64 << 20, 1 << 30);
    let cont = engine.container(&pool, "vol", &[]);
    let dfs = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    println!("pool {pool} cont {cont}");
    Some((engine, dfs))
}

/// The writer: runs only when re-executed by the test below.
#[test]
fn crash_writer() {
    let Some((_engine, dfs)) = writer_volume() else {
        return;
    };
    let mut out = std::io::stdout().lock();
    let log = dfs.create(ROOT_OID, "log", 0o644, 0, 0).unwrap();
    for i in 0u64.. {
        dfs.write(log.oid, i * RECORD as u64, &record(i)).unwrap();
        if i % 5 == 0 {
            dfs.create(ROOT_OID, &format!("marker-{i}"), 0o644, 0, 0)
                .unwrap();
        }
        if i % 3 == 2 {
            dfs.fsync(log.oid, false).unwrap();
            writeln!(out, "synced {i}").unwrap();
            out.flush().unwrap();
        }
    }
}

/// Runs the writer test `writer` in a process of its own on `scratch` until it reported
/// `enough` fsyncs, then kills it with SIGKILL mid-write. Returns the pool, the container and
/// the last fsync it reported.
fn kill_writer_after(
    writer: &str,
    scratch: &std::path::Path,
    enough: u64,
) -> (String, String, u64) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", writer, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scratch)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut pool, mut cont, mut synced) = (String::new(), String::new(), None);
    for line in lines.by_ref() {
        let line = line.unwrap();
        // The harness's "test crash_writer ... " may lead the first line.
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "pool" || *w == "synced");
        match &words[at.unwrap_or(words.len())..] {
            ["pool", p, "cont", c] => (pool, cont) = (p.to_string(), c.to_string()),
            ["synced", n] => {
                synced = Some(n.parse::<u64>().unwrap());
                if synced >= Some(enough) {
                    break;
                }
            }
            _ => {}
        }
    }
    // Mid-write: the writer is between fsyncs, with more written than synced.
    child.kill().unwrap();
    child.wait().unwrap();
    (pool, cont, synced.expect("the writer synced something"))
}

#[test]
fn fsynced_data_survives_kill_9() {
    let scratch = tempfile::tempdir().unwrap();
    let (pool, cont, synced) = kill_writer_after("crash_writer", scratch.path(), 60);

    let engine = TestEngine::start_at(scratch.path(), 2);
    let dfs = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    let log = dfs.lookup(ROOT_OID, "log").unwrap();
    assert!(
        log.size >= (synced + 1) * RECORD as u64,
        "size covers every synced record"
    );
    let mut buf = vec![0; RECORD];
    for i in 0..=synced {
        assert_eq!(
            dfs.read(log.oid, i * RECORD as u64, &mut buf).unwrap(),
            RECORD
        );
        assert!(
            buf == record(i),
            "record {i} (of {synced} synced) is intact"
        );
    }
    let names = list(&dfs, ROOT_OID, 50).unwrap();
    for i in (0..=synced).step_by(5) {
        assert!(
            names.contains(&format!("marker-{i}")),
            "marker-{i} was synced"
        );
    }
    // Consistent and usable: every entry resolves, and new writes work.
    for n in &names {
        dfs.lookup(ROOT_OID, n).unwrap();
    }
    dfs.write(log.oid, 0, b"after the crash").unwrap();
    dfs.fsync(log.oid, true).unwrap();
}

/// The bytes of small file `i`: 4 KiB and a few, inline on the wire.
fn small(i: u64) -> Vec<u8> {
    pattern(4096 + (i % 7) as usize, (i % 251) as u8)
}

/// The small-file writer: creates files, writes each once, fsyncs each and reports it; the
/// sizes live only in the engine's memory until the fsync records them.
#[test]
fn small_files_writer() {
    let Some((_engine, dfs)) = writer_volume() else {
        return;
    };
    let mut out = std::io::stdout().lock();
    for i in 0u64.. {
        let f = dfs.create(ROOT_OID, &format!("s{i}"), 0o644, 0, 0).unwrap();
        dfs.write(f.oid, 0, &small(i)).unwrap();
        // Unsynced writes to earlier files between fsyncs, as an application makes them.
        if i > 0 {
            let prev = dfs.lookup(ROOT_OID, &format!("s{}", i - 1)).unwrap();
            dfs.write(prev.oid, 1 << 20, b"unsynced tail").unwrap();
        }
        dfs.fsync(f.oid, false).unwrap();
        writeln!(out, "synced {i}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn fsynced_small_files_survive_kill_9_with_their_sizes() {
    let scratch = tempfile::tempdir().unwrap();
    let (pool, cont, synced) = kill_writer_after("small_files_writer", scratch.path(), 300);
    let engine = TestEngine::start_at(scratch.path(), 2);
    let dfs = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    for i in 0..=synced {
        let f = dfs.lookup(ROOT_OID, &format!("s{i}")).unwrap();
        let want = small(i);
        // The tail written after the file's own fsync may or may not have survived; a
        // later file's fsync records it. What was fsync'd is there, whole.
        assert!(
            f.size == want.len() as u64 || f.size == (1 << 20) + 13,
            "s{i}: size {}",
            f.size
        );
        let mut buf = vec![0; want.len()];
        assert_eq!(dfs.read(f.oid, 0, &mut buf).unwrap(), want.len());
        assert!(buf == want, "s{i} (of {synced} synced) is intact");
    }
}
