//! Recycled chunk files (`spares.rs`): reused by later chunks (written or allocated), never
//! leaking a byte, never linked into a snapshot, and adopted (emptied) after a restart.

use crate::namespace::*;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

const CHUNK: u64 = 1 << 16;

/// Two ranks; `on_disk` uses the first only, so every new chunk finds the spares.
fn config(root: &Path) -> NamespaceConfig {
    NamespaceConfig {
        meta_path: root.join("r0/meta.redb"),
        chunk_dirs: vec![root.join("r0"), root.join("r1")],
        chunk_size: CHUNK,
        quota: None,
        read_only: false,
        budget: None,
    }
}

fn on_disk(root: &Path) -> Namespace {
    let cfg = NamespaceConfig {
        chunk_dirs: vec![root.join("r0")],
        ..config(root)
    };
    Namespace::open(Arc::new(RealDisk), cfg).unwrap()
}

/// Inode numbers of the regular files in `dir` but the metadata store (none if `dir` is
/// missing).
fn inodes(dir: &Path) -> BTreeSet<u64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    entries
        .map(Result::unwrap)
        .filter(|e| e.file_type().unwrap().is_file() && e.file_name() != "meta.redb")
        .map(|e| e.metadata().unwrap().ino())
        .collect()
}

fn chunk_files(root: &Path) -> BTreeSet<u64> {
    inodes(&root.join("r0"))
}

fn spare_files(root: &Path) -> BTreeSet<u64> {
    inodes(&root.join("r0/spares"))
}

fn read_all(ns: &Namespace, oid: Oid) -> Vec<u8> {
    let size = ns.getattr(oid).unwrap().size as usize;
    let mut buf = vec![0xAA; size];
    assert_eq!(ns.read(oid, 0, &mut buf).unwrap(), size);
    buf
}

fn grow(ns: &Namespace, oid: Oid, size: u64) {
    let set = SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    ns.setattr(oid, set).unwrap();
}

/// Writes three full chunks of 0x77 in a new file `name`, then unlinks it and waits for its
/// chunk files to be cut.
fn write_and_unlink(ns: &Namespace, name: &str) {
    let f = ns.create(ROOT, name, 0o644, 0, 0).unwrap();
    ns.write(f.oid, 0, &vec![0x77; 3 * CHUNK as usize]).unwrap();
    ns.unlink(ROOT, name).unwrap();
    ns.wait_reclaimed();
}

/// A new file that writes a few bytes into each of three chunks and is sparse elsewhere:
/// everything else must read as zeros, whatever the recycled files held.
fn sparse_file_reads_only_its_own_bytes(ns: &Namespace) {
    let b = ns.create(ROOT, "b", 0o644, 0, 0).unwrap();
    for idx in 0..3 {
        ns.write(b.oid, idx * CHUNK + 100, b"new").unwrap();
    }
    grow(ns, b.oid, 3 * CHUNK);
    let all = read_all(ns, b.oid);
    for (i, &byte) in all.iter().enumerate() {
        let off = i as u64 % CHUNK;
        let expect = if (100..103).contains(&off) {
            b"new"[(off - 100) as usize]
        } else {
            0
        };
        assert_eq!(byte, expect, "byte {i} of the new file");
    }
}

#[test]
fn removed_chunk_files_become_the_next_chunks_and_leak_nothing() {
    let root = tempfile::tempdir().unwrap();
    let ns = on_disk(root.path());
    write_and_unlink(&ns, "a");
    let retired = spare_files(root.path());
    assert_eq!(retired.len(), 3, "three chunk files kept as spares");
    assert!(chunk_files(root.path()).is_empty());

    sparse_file_reads_only_its_own_bytes(&ns);
    let chunks = chunk_files(root.path());
    assert_eq!(chunks, retired, "the new chunks are the recycled files");
    assert!(spare_files(root.path()).is_empty());
    // Each chunk file counts up to its end (103 bytes); nothing of the old file's.
    assert_eq!(
        ns.used().unwrap(),
        3 * 103,
        "space counts the new file only"
    );
}

#[test]
fn spares_left_by_a_previous_run_are_emptied_and_used() {
    let root = tempfile::tempdir().unwrap();
    {
        let ns = on_disk(root.path());
        write_and_unlink(&ns, "a");
    }
    // The rename of a retired chunk may outlive the loss of its truncation in a crash: a
    // spare holding bytes must not hand them on.
    for e in std::fs::read_dir(root.path().join("r0/spares")).unwrap() {
        std::fs::write(e.unwrap().path(), vec![0x99; CHUNK as usize]).unwrap();
    }
    let spares = spare_files(root.path());
    assert_eq!(spares.len(), 3);
    let ns = on_disk(root.path());
    sparse_file_reads_only_its_own_bytes(&ns);
    assert_eq!(chunk_files(root.path()), spares);
}

#[test]
fn snapshots_keep_shared_chunks_and_never_link_spares() {
    let root = tempfile::tempdir().unwrap();
    let at = |name: &str| config(&root.path().join(name));
    let snapshot = |name: &str| NamespaceConfig {
        read_only: true,
        ..at(name)
    };
    let ns = Namespace::open(Arc::new(RealDisk), at("src")).unwrap();
    let a = ns.create(ROOT, "a", 0o644, 0, 0).unwrap();
    ns.write(a.oid, 0, &vec![0x11; 2 * CHUNK as usize]).unwrap();
    ns.snapshot_to(&snapshot("snap1")).unwrap();
    // Shared with the snapshot: deleted from the source, not recycled.
    ns.unlink(ROOT, "a").unwrap();
    ns.wait_reclaimed();
    let spares = |name: &str| -> usize {
        ["r0", "r1"]
            .iter()
            .map(|r| inodes(&root.path().join(name).join(r).join("spares")).len())
            .sum()
    };
    assert_eq!(spares("src"), 0, "a shared chunk file became a spare");
    let snap = Namespace::open(Arc::new(RealDisk), snapshot("snap1")).unwrap();
    let a_in_snap = snap.lookup(ROOT, "a").unwrap();
    assert_eq!(
        read_all(&snap, a_in_snap.oid),
        vec![0x11; 2 * CHUNK as usize]
    );
    // Unshared: recycled; the next snapshot links chunk files only.
    write_and_unlink(&ns, "b");
    assert_eq!(spares("src"), 3);
    ns.snapshot_to(&snapshot("snap2")).unwrap();
    assert_eq!(spares("snap2"), 0, "a spare was linked into a snapshot");
}

#[test]
fn allocation_reserves_blocks_of_recycled_chunk_files_that_read_as_zeros() {
    let root = tempfile::tempdir().unwrap();
    let ns = on_disk(root.path());
    write_and_unlink(&ns, "a");
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let spares = spare_files(root.path());
    ns.allocate(f.oid, 0, 3 * CHUNK, false).unwrap();
    assert_eq!(chunk_files(root.path()), spares, "the spares were taken");
    for e in std::fs::read_dir(root.path().join("r0")).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() && e.file_name() != "meta.redb" {
            let blocks = e.metadata().unwrap().blocks() * 512;
            assert!(blocks >= CHUNK, "{:?}: {blocks} bytes of blocks", e.path());
        }
    }
    // They held 0x77 before they were recycled.
    assert_eq!(read_all(&ns, f.oid), vec![0; 3 * CHUNK as usize]);
}
