//! Recycled chunk files: reused by later chunks, never leaking a byte, never linked into a
//! snapshot, and adopted (emptied) after a restart.

use super::disk::{RealDisk, SimDisk};
use super::*;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
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

/// Inode numbers of the files in the chunk directory whose names pass `keep`.
fn inodes(root: &Path, keep: impl Fn(&str) -> bool) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(root.join("r0")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name != "meta.redb" && keep(&name) {
            out.insert(e.metadata().unwrap().ino());
        }
    }
    out
}

fn is_spare_name(name: &str) -> bool {
    name.starts_with("spare.")
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

/// Writes three full chunks of 0x77 in a new file `name`, then unlinks it.
fn write_and_unlink(ns: &Namespace, name: &str) {
    let f = ns.create(ROOT, name, 0o644, 0, 0).unwrap();
    ns.write(f.oid, 0, &vec![0x77; 3 * CHUNK as usize]).unwrap();
    ns.unlink(ROOT, name).unwrap();
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
    let retired = inodes(root.path(), |_| true);
    assert_eq!(retired.len(), 3, "three chunk files kept as spares");
    assert_eq!(inodes(root.path(), |n| !is_spare_name(n)).len(), 0);

    sparse_file_reads_only_its_own_bytes(&ns);
    let chunks = inodes(root.path(), |n| !is_spare_name(n));
    assert_eq!(chunks, retired, "the new chunks are the recycled files");
    assert_eq!(inodes(root.path(), is_spare_name).len(), 0);
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
    // A crash between emptying and renaming cannot leave bytes in a spare, but a spare that
    // somehow holds some must not hand them on.
    for e in std::fs::read_dir(root.path().join("r0")).unwrap() {
        let path = e.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("spare.")
        {
            std::fs::write(&path, vec![0x99; CHUNK as usize]).unwrap();
        }
    }
    let spares = inodes(root.path(), is_spare_name);
    assert_eq!(spares.len(), 3);
    let ns = on_disk(root.path());
    sparse_file_reads_only_its_own_bytes(&ns);
    assert_eq!(inodes(root.path(), |n| !is_spare_name(n)), spares);
}

#[test]
fn snapshots_keep_shared_chunks_and_never_link_spares() {
    let disk = SimDisk::default();
    let dir = |root: &str| config(&PathBuf::from(format!("/{root}")));
    let ns = Namespace::open(Arc::new(disk.clone()), dir("src")).unwrap();
    let a = ns.create(ROOT, "a", 0o644, 0, 0).unwrap();
    ns.write(a.oid, 0, &vec![0x11; 2 * CHUNK as usize]).unwrap();
    ns.snapshot_to(&NamespaceConfig {
        read_only: true,
        ..dir("snap1")
    })
    .unwrap();
    // Shared with the snapshot: deleted from the source, not recycled.
    ns.unlink(ROOT, "a").unwrap();
    let spares = |root: &str| -> usize {
        ["r0", "r1"]
            .iter()
            .map(|r| {
                disk.list(&PathBuf::from(format!("/{root}/{r}")))
                    .unwrap()
                    .iter()
                    .filter(|p| spares::is_spare(p))
                    .count()
            })
            .sum()
    };
    assert_eq!(spares("src"), 0, "a shared chunk file became a spare");
    let snap = Namespace::open(
        Arc::new(disk.clone()),
        NamespaceConfig {
            read_only: true,
            ..dir("snap1")
        },
    )
    .unwrap();
    let a_in_snap = snap.lookup(ROOT, "a").unwrap();
    assert_eq!(
        read_all(&snap, a_in_snap.oid),
        vec![0x11; 2 * CHUNK as usize]
    );
    // Unshared: recycled; the next snapshot links chunks only.
    write_and_unlink(&ns, "b");
    assert_eq!(spares("src"), 3);
    ns.snapshot_to(&NamespaceConfig {
        read_only: true,
        ..dir("snap2")
    })
    .unwrap();
    assert_eq!(spares("snap2"), 0, "a spare was linked into a snapshot");
}
