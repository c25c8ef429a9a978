//! Read-ahead (`read_ahead.rs`): used by sequential readers, dropped whenever its chunk changes.

use crate::namespace::disk::Disk;
use crate::namespace::sim_disk::SimDisk;
use crate::namespace::*;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHUNK: u64 = 1 << 16;

fn open(disk: &SimDisk) -> Namespace {
    let cfg = NamespaceConfig {
        meta_path: PathBuf::from("/r0/c/meta.redb"),
        chunk_dirs: vec![PathBuf::from("/r0/c")],
        chunk_size: CHUNK,
        quota: None,
        read_only: false,
        budget: None,
    };
    Namespace::open(Arc::new(disk.clone()), cfg).unwrap()
}

fn chunk(ns: &Namespace, oid: Oid, idx: u64) -> Vec<u8> {
    let mut buf = vec![0xEE; CHUNK as usize];
    let n = ns.read(oid, idx * CHUNK, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// A file of four chunks of 1s, read sequentially up to chunk 1: chunks 2 and 3 are then
/// read ahead (this waits until they are in memory).
fn read_two_chunks(ns: &Namespace) -> Oid {
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap().oid;
    ns.write(f, 0, &vec![1; 4 * CHUNK as usize]).unwrap();
    chunk(ns, f, 0);
    chunk(ns, f, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ![2, 3].iter().all(|&i| ns.chunks().holds_read_ahead((f, i))) {
        assert!(
            Instant::now() < deadline,
            "chunks 2 and 3 were not read ahead"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    f
}

#[test]
fn the_next_chunks_of_a_sequential_reader_are_read_ahead() {
    let disk = SimDisk::default();
    let ns = open(&disk);
    let f = read_two_chunks(&ns);
    // Changed behind the namespace's back: a read served from memory does not see it.
    let path = ns.chunks().chunk_path(f, 2);
    disk.open(&path, false)
        .unwrap()
        .write_at(0, &[9; 10])
        .unwrap();
    assert_eq!(chunk(&ns, f, 2), vec![1; CHUNK as usize]);
}

#[test]
fn a_write_drops_what_was_read_ahead_of_its_chunk() {
    let ns = open(&SimDisk::default());
    let f = read_two_chunks(&ns);
    ns.write(f, 2 * CHUNK + 5, &[2; 3]).unwrap();
    let mut expect = vec![1; CHUNK as usize];
    expect[5..8].fill(2);
    assert_eq!(chunk(&ns, f, 2), expect);
}

#[test]
fn a_cut_drops_what_was_read_ahead() {
    let ns = open(&SimDisk::default());
    let f = read_two_chunks(&ns);
    for size in [2 * CHUNK, 4 * CHUNK] {
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        ns.setattr(f, set).unwrap();
    }
    assert_eq!(chunk(&ns, f, 3), vec![0; CHUNK as usize], "a hole now");
}
