//! Queued writes (`write_behind.rs`): answered before they land, yet never seen missing.

use crate::namespace::sim_disk::SimDisk;
use crate::namespace::*;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

const CHUNK: u64 = 1 << 16;

fn open(disk: &SimDisk) -> Arc<Namespace> {
    let cfg = NamespaceConfig {
        meta_path: PathBuf::from("/r0/c/meta.redb"),
        chunk_dirs: vec![PathBuf::from("/r0/c"), PathBuf::from("/r1/c")],
        chunk_size: CHUNK,
        quota: None,
        read_only: false,
        budget: None,
    };
    Arc::new(Namespace::open(Arc::new(disk.clone()), cfg).unwrap())
}

fn bytes(len: usize, byte: u8) -> IoBuf {
    let mut b = IoBuf::new(len);
    b.as_mut_slice().fill(byte);
    b
}

fn read(ns: &Namespace, oid: Oid, len: usize) -> Vec<u8> {
    let mut buf = vec![0xEE; len];
    let n = ns.read(oid, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Runs `f` on another thread and checks it is still waiting a while later (for the writes
/// `disk` holds; released before failing, so nothing hangs on them).
fn waiting<T: Send + 'static>(
    disk: &SimDisk,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let t = thread::spawn(f);
    thread::sleep(Duration::from_millis(100));
    if t.is_finished() {
        disk.hold_writes(false);
        panic!("did not wait for the queued write");
    }
    t
}

#[test]
fn a_queued_write_is_answered_at_once_and_read_back_once_it_lands() {
    let disk = SimDisk::default();
    let ns = open(&disk);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap().oid;
    disk.hold_writes(true);
    // Answered while the disk holds every write: it was queued, not written.
    ns.write_behind(f, 0, bytes(3 * CHUNK as usize, 0x5A))
        .unwrap();
    assert_eq!(
        ns.getattr(f).unwrap().size,
        3 * CHUNK,
        "the size is recorded"
    );
    let reader = waiting(&disk, {
        let ns = ns.clone();
        move || read(&ns, f, 3 * CHUNK as usize)
    });
    let syncer = waiting(&disk, {
        let ns = ns.clone();
        move || ns.fsync(f)
    });
    disk.hold_writes(false);
    assert_eq!(reader.join().unwrap(), vec![0x5A; 3 * CHUNK as usize]);
    syncer.join().unwrap().unwrap();
    // Durable: a crash now keeps it.
    let after = open(&disk.crash());
    assert_eq!(
        read(&after, f, 3 * CHUNK as usize),
        vec![0x5A; 3 * CHUNK as usize]
    );
}

#[test]
fn writes_to_a_chunk_land_in_order_and_cuts_wait_for_them() {
    let disk = SimDisk::default();
    let ns = open(&disk);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap().oid;
    disk.hold_writes(true);
    ns.write_behind(f, 0, bytes(CHUNK as usize, 1)).unwrap();
    let second = waiting(&disk, {
        let ns = ns.clone();
        move || ns.write_behind(f, 100, bytes(100, 2))
    });
    disk.hold_writes(false);
    second.join().unwrap().unwrap();
    let mut expect = vec![1; CHUNK as usize];
    expect[100..200].fill(2);
    assert_eq!(read(&ns, f, CHUNK as usize), expect);

    // A removal waits, so no queued byte lands in a chunk file after it was retired.
    disk.hold_writes(true);
    ns.write_behind(f, CHUNK, bytes(CHUNK as usize, 3)).unwrap();
    let unlink = waiting(&disk, {
        let ns = ns.clone();
        move || ns.unlink(ROOT, "f")
    });
    disk.hold_writes(false);
    unlink.join().unwrap().unwrap();
    assert_eq!(ns.used().unwrap(), 0);
    let g = ns.create(ROOT, "g", 0o644, 0, 0).unwrap().oid;
    ns.setattr(
        g,
        SetAttr {
            size: Some(2 * CHUNK),
            ..SetAttr::default()
        },
    )
    .unwrap();
    ns.write(g, 0, b"x").unwrap();
    ns.write(g, CHUNK, b"y").unwrap();
    let mut expect = vec![0; 2 * CHUNK as usize];
    (expect[0], expect[CHUNK as usize]) = (b'x', b'y');
    assert_eq!(
        read(&ns, g, 2 * CHUNK as usize),
        expect,
        "recycled files hold old bytes"
    );
}

/// A chmod, chown or utimes is answered while writes are queued (it cuts nothing); a
/// truncation waits for them.
#[test]
fn only_a_size_change_waits_for_queued_writes() {
    let disk = SimDisk::default();
    let ns = open(&disk);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap().oid;
    disk.hold_writes(true);
    ns.write_behind(f, 0, bytes(2 * CHUNK as usize, 7)).unwrap();
    let times = SetAttr {
        mode: Some(0o600),
        uid: Some(5),
        mtime: Some(Time { secs: 7, nanos: 0 }),
        ..SetAttr::default()
    };
    let chmod = thread::spawn({
        let ns = ns.clone();
        move || ns.setattr(f, times)
    });
    for _ in 0..50 {
        if chmod.is_finished() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    if !chmod.is_finished() {
        disk.hold_writes(false);
        panic!("a chmod waited for the queued write");
    }
    let changed = chmod.join().unwrap().unwrap();
    assert_eq!(
        (changed.mode & 0o7777, changed.uid, changed.size),
        (0o600, 5, 2 * CHUNK)
    );
    let truncate = waiting(&disk, {
        let ns = ns.clone();
        move || {
            let cut = SetAttr {
                size: Some(CHUNK),
                ..SetAttr::default()
            };
            ns.setattr(f, cut)
        }
    });
    disk.hold_writes(false);
    assert_eq!(truncate.join().unwrap().unwrap().size, CHUNK);
    assert_eq!(read(&ns, f, 2 * CHUNK as usize), vec![7; CHUNK as usize]);
    assert!(
        ns.getattr(f).unwrap().mtime.secs > 7,
        "the truncation sets its own mtime"
    );
}

#[test]
fn a_queued_write_that_fails_fails_the_next_fsync() {
    let disk = SimDisk::default();
    let ns = open(&disk);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap().oid;
    disk.fail_writes(true);
    ns.write_behind(f, 0, bytes(CHUNK as usize, 7)).unwrap();
    let e = ns.fsync(f).unwrap_err();
    assert_eq!(e.errno, Errno::IO, "{e:?}");
    disk.fail_writes(false);
    ns.fsync(f).unwrap();
}

#[test]
fn a_queued_write_that_panics_fails_fsync_and_leaves_the_io_threads_working() {
    let disk = SimDisk::default();
    let ns = open(&disk);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap().oid;
    disk.panic_in_writes(true);
    // More writes than there are I/O threads: a panic must not take its thread down.
    for i in 0..8 {
        ns.write_behind(f, i * CHUNK, bytes(CHUNK as usize, 3))
            .unwrap();
    }
    // A write that never lands would leave fsync waiting forever: fail instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = ns.clone();
    thread::spawn(move || tx.send(waiter.fsync(f)));
    let e = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("fsync returns: every queued write lands, panicked or not")
        .unwrap_err();
    assert_eq!(e.errno, Errno::IO, "{e:?}");
    assert!(e.to_string().contains("panicked"), "{e}");
    disk.panic_in_writes(false);
    ns.write_behind(f, 0, bytes(CHUNK as usize, 9)).unwrap();
    ns.fsync(f).unwrap();
    assert_eq!(read(&ns, f, CHUNK as usize), vec![9; CHUNK as usize]);
}
