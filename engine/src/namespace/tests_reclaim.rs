//! Removed files' chunk files are cut after the removal is answered (`reclaim.rs`): the space
//! is given back at once, the chunk files are cut only once the removal is durable, and what
//! a crash left uncut is cut at the next open.

use super::sim_disk::SimDisk;
use super::tests::{config, config_at, fresh, pattern, read_all};
use super::*;
use std::path::PathBuf;

const LEN: usize = 150_000;

/// A file of three chunks of known bytes, fsync'd.
fn fsynced_file(ns: &Namespace, name: &str) -> (Oid, Vec<u8>) {
    let f = ns.create(ROOT, name, 0o644, 0, 0).unwrap();
    let bytes = pattern(LEN, 7);
    ns.write(f.oid, 0, &bytes).unwrap();
    ns.fsync(f.oid).unwrap();
    (f.oid, bytes)
}

/// How many of `oid`'s chunk files exist on `disk`, laid out as `ns`.
fn chunk_files(ns: &Namespace, disk: &SimDisk, oid: Oid) -> usize {
    let chunks = (LEN as u64).div_ceil(ns.chunk_size());
    (0..chunks)
        .filter(|&idx| {
            let path = ns.chunks().chunk_path(oid, idx);
            disk.size_of(&path).unwrap().is_some()
        })
        .count()
}

#[test]
fn a_removal_lost_in_a_crash_leaves_the_file_with_its_fsynced_bytes() {
    let (disk, ns) = fresh(None);
    let (oid, bytes) = fsynced_file(&ns, "f");
    ns.hold_reclaim(true);
    ns.unlink(ROOT, "f").unwrap();
    assert_eq!(ns.lookup(ROOT, "f").unwrap_err().errno, Errno::NOENT);
    assert_eq!(ns.used().unwrap(), 0, "the space is given back at once");
    assert_eq!(chunk_files(&ns, &disk, oid), 3, "cut before it was durable");
    // Power is lost before anything made the removal durable: the file is back, whole.
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    let back = after.lookup(ROOT, "f").unwrap();
    assert_eq!(read_all(&after, back.oid), bytes);
    assert_eq!(after.used().unwrap(), LEN as u64);
}

#[test]
fn removals_are_made_durable_before_their_chunk_files_are_cut() {
    let (disk, ns) = fresh(None);
    let (oid, _) = fsynced_file(&ns, "f");
    ns.unlink(ROOT, "f").unwrap();
    ns.wait_reclaimed();
    assert_eq!(chunk_files(&ns, &disk, oid), 0);
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    assert_eq!(after.lookup(ROOT, "f").unwrap_err().errno, Errno::NOENT);
    assert_eq!(after.used().unwrap(), 0);
}

#[test]
fn chunk_files_a_crash_left_uncut_are_cut_at_the_next_open() {
    let (disk, ns) = fresh(None);
    let (oid, _) = fsynced_file(&ns, "f");
    let (kept, kept_bytes) = fsynced_file(&ns, "g");
    ns.hold_reclaim(true);
    ns.unlink(ROOT, "f").unwrap();
    // Makes the removal durable too; its chunk files are still there.
    ns.fsync(kept).unwrap();
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed.clone()), config(None)).unwrap();
    assert_eq!(after.lookup(ROOT, "f").unwrap_err().errno, Errno::NOENT);
    after.wait_reclaimed();
    assert_eq!(chunk_files(&after, &crashed, oid), 0, "left behind");
    assert_eq!(after.used().unwrap(), LEN as u64, "counted once, not twice");
    assert_eq!(read_all(&after, kept), kept_bytes);
    // Nothing is left to cut at a further open.
    drop(after);
    let again = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    assert_eq!(again.meta.unreclaimed().unwrap(), vec![]);
}

#[test]
fn a_file_replaced_by_a_rename_is_cut_like_a_removed_one() {
    let (disk, ns) = fresh(None);
    let (replaced, _) = fsynced_file(&ns, "f");
    let (moved, moved_bytes) = fsynced_file(&ns, "g");
    ns.rename(ROOT, "g", ROOT, "f", false).unwrap();
    assert_eq!(ns.used().unwrap(), LEN as u64);
    ns.wait_reclaimed();
    assert_eq!(chunk_files(&ns, &disk, replaced), 0);
    assert_eq!(chunk_files(&ns, &disk, moved), 3);
    assert_eq!(
        read_all(&ns, ns.lookup(ROOT, "f").unwrap().oid),
        moved_bytes
    );
}

#[test]
fn a_snapshot_cuts_removed_files_first_and_links_none_of_their_chunks() {
    let (disk, ns) = fresh(None);
    let (oid, _) = fsynced_file(&ns, "f");
    ns.hold_reclaim(true);
    ns.unlink(ROOT, "f").unwrap();
    ns.snapshot_to(&config_at("snap", true)).unwrap();
    assert_eq!(chunk_files(&ns, &disk, oid), 0);
    let in_snapshot = (0..3u64)
        .map(|idx| {
            let rank = (oid + idx) % 2;
            PathBuf::from(format!("/r{rank}/snap/{oid:x}.{idx}"))
        })
        .filter(|p| disk.size_of(p).unwrap().is_some())
        .count();
    assert_eq!(
        in_snapshot, 0,
        "a removed file's chunk linked into the snapshot"
    );
    let snap = Namespace::open(Arc::new(disk), config_at("snap", true)).unwrap();
    assert_eq!(snap.meta.unreclaimed().unwrap(), vec![]);
}

#[test]
fn a_sparse_file_is_cut_and_removed_for_the_chunks_it_holds_not_for_its_size() {
    let (disk, ns) = fresh(None);
    let f = ns.create(ROOT, "sparse", 0o644, 0, 0).unwrap();
    let cs = ns.chunk_size();
    // A million chunks long, two of them written: probing each chunk of the size would open
    // a file a million times (and a tenant may set the size to 2^63).
    let far = 900_000 * cs + 5;
    ns.write(f.oid, 0, b"near").unwrap();
    ns.write(f.oid, far, b"far").unwrap();
    let size = |size| SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    ns.setattr(f.oid, size(1_000_000 * cs)).unwrap();
    let held = |idx| disk.size_of(&ns.chunks().chunk_path(f.oid, idx)).unwrap();
    assert_eq!(held(900_000), Some(8));

    let before = disk.data_file_probes();
    ns.setattr(f.oid, size(2)).unwrap();
    assert_eq!(held(900_000), None, "the far chunk is cut");
    assert_eq!(held(0), Some(2));
    assert_eq!(ns.used().unwrap(), 2);
    // Removed while a million chunks long.
    ns.write(f.oid, far, b"far").unwrap();
    ns.setattr(f.oid, size(1_000_000 * cs)).unwrap();
    ns.unlink(ROOT, "sparse").unwrap();
    assert_eq!(ns.used().unwrap(), 0);
    ns.wait_reclaimed();
    assert_eq!((held(0), held(900_000)), (None, None));
    let probes = disk.data_file_probes() - before;
    assert!(probes < 100, "{probes} chunk files probed");
}
