//! Namespace semantics, durability and snapshots on a simulated disk: what the namespace
//! coordinates between its metadata store and its chunk store.

use super::inode::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use super::sim_disk::SimDisk;
use super::*;
use std::path::PathBuf;
use std::sync::Arc;

pub(super) fn config(quota: Option<u64>) -> NamespaceConfig {
    NamespaceConfig {
        meta_path: PathBuf::from("/r0/c/meta.redb"),
        chunk_dirs: vec![PathBuf::from("/r0/c"), PathBuf::from("/r1/c")],
        chunk_size: 1 << 16,
        quota,
        read_only: false,
        budget: None,
    }
}

/// The same layout under another root, for snapshots and clones.
pub(super) fn config_at(root: &str, read_only: bool) -> NamespaceConfig {
    NamespaceConfig {
        meta_path: PathBuf::from(format!("/r0/{root}/meta.redb")),
        chunk_dirs: vec![
            PathBuf::from(format!("/r0/{root}")),
            PathBuf::from(format!("/r1/{root}")),
        ],
        chunk_size: 1 << 16,
        quota: None,
        read_only,
        budget: None,
    }
}

pub(super) fn fresh(quota: Option<u64>) -> (SimDisk, Namespace) {
    let disk = SimDisk::default();
    let ns = Namespace::open(Arc::new(disk.clone()), config(quota)).unwrap();
    (disk, ns)
}

/// Deterministic test bytes (also for the chunk store's tests).
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The whole file.
pub(crate) fn read_all(ns: &Namespace, oid: Oid) -> Vec<u8> {
    let size = ns.getattr(oid).unwrap().size as usize;
    let mut buf = vec![0xAA; size];
    assert_eq!(ns.read(oid, 0, &mut buf).unwrap(), size);
    buf
}

#[test]
fn files_span_chunks_and_holes_read_as_zero() {
    let (_, ns) = fresh(None);
    let f = ns.create(ROOT, "data", 0o644, 1, 2).unwrap();
    assert_eq!(f.mode & S_IFMT, S_IFREG);
    let data = pattern(200_000, 7);
    ns.write(f.oid, 10, &data).unwrap();
    ns.write(f.oid, 500_000, b"tail").unwrap();
    let all = read_all(&ns, f.oid);
    assert_eq!(all.len(), 500_004);
    assert!(all[..10].iter().all(|&b| b == 0));
    assert_eq!(&all[10..200_010], &data[..]);
    assert!(all[200_010..500_000].iter().all(|&b| b == 0));
    assert_eq!(&all[500_000..], b"tail");
    // Reads past the end are short.
    let mut buf = [0u8; 16];
    assert_eq!(ns.read(f.oid, 500_000, &mut buf).unwrap(), 4);
    // ... and empty at any offset a client may send (found by the fuzzer: the last
    // chunk's end overflowed).
    for offset in [500_004, i64::MAX as u64, u64::MAX - 100, u64::MAX] {
        assert_eq!(ns.read(f.oid, offset, &mut buf).unwrap(), 0, "at {offset}");
    }
}

#[test]
fn truncate_cuts_and_extends_sparsely() {
    let (_, ns) = fresh(None);
    let f = ns.create(ROOT, "t", 0o644, 0, 0).unwrap();
    ns.write(f.oid, 0, &pattern(150_000, 1)).unwrap();
    ns.setattr(
        f.oid,
        SetAttr {
            size: Some(70_000),
            ..Default::default()
        },
    )
    .unwrap();
    ns.setattr(
        f.oid,
        SetAttr {
            size: Some(140_000),
            ..Default::default()
        },
    )
    .unwrap();
    let all = read_all(&ns, f.oid);
    assert_eq!(&all[..70_000], &pattern(150_000, 1)[..70_000]);
    assert!(
        all[70_000..].iter().all(|&b| b == 0),
        "extended region must read as zeros"
    );
}

#[test]
fn directories_entries_and_errors() {
    let (_, ns) = fresh(None);
    let d = ns.mkdir(ROOT, "d", 0o755, 0, 0).unwrap();
    assert_eq!(d.mode & S_IFMT, S_IFDIR);
    for n in ["b", "a", "c"] {
        ns.create(d.oid, n, 0o600, 0, 0).unwrap();
    }
    let page = ns.readdir(d.oid, 0, 10).unwrap();
    assert!(page.end);
    let mut names: Vec<_> = page.entries.iter().map(|e| e.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
    let first = ns.readdir(d.oid, 0, 1).unwrap();
    assert!(!first.end);
    let rest = ns.readdir(d.oid, first.entries[0].cookie, 10).unwrap();
    assert_eq!(
        rest.entries[..],
        page.entries[1..],
        "resuming after a cookie"
    );
    assert_eq!(
        ns.create(d.oid, "a", 0o600, 0, 0).unwrap_err().errno,
        Errno::EXIST
    );
    assert_eq!(ns.rmdir(ROOT, "d").unwrap_err().errno, Errno::NOTEMPTY);
    assert_eq!(ns.unlink(ROOT, "d").unwrap_err().errno, Errno::ISDIR);
    assert_eq!(ns.rmdir(d.oid, "a").unwrap_err().errno, Errno::NOTDIR);
    assert_eq!(ns.lookup(d.oid, "zzz").unwrap_err().errno, Errno::NOENT);
    assert_eq!(
        ns.create(ROOT, &"x".repeat(256), 0o600, 0, 0)
            .unwrap_err()
            .errno,
        Errno::NAMETOOLONG
    );
    assert_eq!(
        ns.create(d.oid, "a/b", 0o600, 0, 0).unwrap_err().errno,
        Errno::INVAL
    );
    let file = ns.lookup(d.oid, "a").unwrap();
    assert_eq!(
        ns.create(file.oid, "x", 0o600, 0, 0).unwrap_err().errno,
        Errno::NOTDIR
    );
    for n in ["a", "b", "c"] {
        ns.unlink(d.oid, n).unwrap();
    }
    ns.rmdir(ROOT, "d").unwrap();
    assert!(ns.readdir(ROOT, 0, 10).unwrap().entries.is_empty());
}

#[test]
fn rename_follows_posix() {
    let (_, ns) = fresh(None);
    let a = ns.mkdir(ROOT, "a", 0o755, 0, 0).unwrap();
    let b = ns.mkdir(a.oid, "b", 0o755, 0, 0).unwrap();
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    ns.write(f.oid, 0, b"one").unwrap();
    let g = ns.create(ROOT, "g", 0o644, 0, 0).unwrap();
    ns.write(g.oid, 0, b"two").unwrap();
    // Over an existing file: replaced atomically, the old object is gone.
    ns.rename(ROOT, "f", ROOT, "g", false).unwrap();
    assert_eq!(ns.lookup(ROOT, "g").unwrap().oid, f.oid);
    assert_eq!(ns.getattr(g.oid).unwrap_err().errno, Errno::STALE);
    assert_eq!(read_all(&ns, f.oid), b"one");
    // Into its own subtree: EINVAL. Onto a non-empty directory: ENOTEMPTY.
    assert_eq!(
        ns.rename(ROOT, "a", b.oid, "x", false).unwrap_err().errno,
        Errno::INVAL
    );
    let c = ns.mkdir(ROOT, "c", 0o755, 0, 0).unwrap();
    ns.create(c.oid, "inner", 0o644, 0, 0).unwrap();
    assert_eq!(
        ns.rename(a.oid, "b", ROOT, "c", false).unwrap_err().errno,
        Errno::NOTEMPTY
    );
    assert_eq!(
        ns.rename(ROOT, "g", ROOT, "a", false).unwrap_err().errno,
        Errno::ISDIR
    );
    assert_eq!(
        ns.rename(ROOT, "a", ROOT, "g", false).unwrap_err().errno,
        Errno::NOTDIR
    );
    assert_eq!(
        ns.rename(ROOT, "g", ROOT, "c", true).unwrap_err().errno,
        Errno::EXIST
    );
    // A directory moves with its contents.
    ns.rename(a.oid, "b", c.oid, "b2", false).unwrap();
    assert_eq!(ns.lookup(c.oid, "b2").unwrap().oid, b.oid);
    assert_eq!(ns.getattr(b.oid).unwrap().parent, c.oid);
}

#[test]
fn symlinks_and_xattrs() {
    let (_, ns) = fresh(None);
    let l = ns.symlink(ROOT, "l", "../target", 0, 0).unwrap();
    assert_eq!(l.mode & S_IFMT, S_IFLNK);
    assert_eq!(l.size, 9);
    assert_eq!(ns.readlink(l.oid).unwrap(), "../target");
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    assert_eq!(ns.readlink(f.oid).unwrap_err().errno, Errno::INVAL);
    ns.setxattr(f.oid, "user.a", b"1", XattrSet::Any).unwrap();
    ns.setxattr(f.oid, "user.b", b"", XattrSet::Create).unwrap();
    let exists = ns.setxattr(f.oid, "user.b", b"", XattrSet::Create);
    assert_eq!(exists.unwrap_err().errno, Errno::EXIST);
    let absent = ns.setxattr(f.oid, "user.c", b"", XattrSet::Replace);
    assert_eq!(absent.unwrap_err().errno, Errno::NODATA);
    let unprefixed = ns.setxattr(f.oid, "plain", b"", XattrSet::Any);
    assert_eq!(unprefixed.unwrap_err().errno, Errno::OPNOTSUPP);
    let on_link = ns.setxattr(l.oid, "user.a", b"", XattrSet::Any);
    assert_eq!(on_link.unwrap_err().errno, Errno::PERM);
    let big = ns.setxattr(f.oid, "user.big", &[0; XATTR_VALUE_MAX + 1], XattrSet::Any);
    assert_eq!(big.unwrap_err().errno, Errno::TOOBIG);
    assert_eq!(ns.listxattr(f.oid).unwrap(), ["user.a", "user.b"]);
    assert_eq!(ns.getxattr(f.oid, "user.a").unwrap(), b"1");
    ns.removexattr(f.oid, "user.a").unwrap();
    assert_eq!(
        ns.getxattr(f.oid, "user.a").unwrap_err().errno,
        Errno::NODATA
    );
    ns.unlink(ROOT, "f").unwrap();
    assert_eq!(ns.listxattr(f.oid).unwrap_err().errno, Errno::STALE);
}

/// Writes, fsyncs some of it, writes more without fsync, and "crashes".
fn crash_scenario() -> (Vec<u8>, Vec<u8>) {
    let (disk, ns) = fresh(None);
    let kept = ns.create(ROOT, "kept", 0o644, 0, 0).unwrap();
    let synced = pattern(150_000, 9);
    ns.write(kept.oid, 0, &synced).unwrap();
    ns.fsync(kept.oid).unwrap();
    ns.write(kept.oid, 150_000, &pattern(50_000, 10)).unwrap();
    let lost = ns.create(ROOT, "lost", 0o644, 0, 0).unwrap();
    ns.write(lost.oid, 0, b"never synced").unwrap();
    // Power is lost now: the image is taken before any orderly shutdown.
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    let got = after
        .lookup(ROOT, "kept")
        .map(|i| read_all(&after, i.oid))
        .unwrap_or_default();
    (synced, got)
}

#[test]
fn fsynced_data_survives_a_crash() {
    let (synced, got) = crash_scenario();
    assert_eq!(
        got.len(),
        synced.len(),
        "size after the crash is the fsynced size"
    );
    assert_eq!(got, synced);
}

#[test]
fn an_oid_a_crash_took_back_is_never_handed_out_again() {
    let (disk, ns) = fresh(None);
    let lost = ns.create(ROOT, "lost", 0o644, 0, 0).unwrap();
    ns.write(lost.oid, 0, b"a lost file's bytes").unwrap();
    // The kernel wrote the chunk back; the create itself never became durable.
    let chunk = ns.chunks().chunk_path(lost.oid, 0);
    disk.open(&chunk, false).unwrap().sync().unwrap();
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed.clone()), config(None)).unwrap();
    assert_eq!(after.lookup(ROOT, "lost").unwrap_err().errno, Errno::NOENT);
    assert_eq!(
        crashed.size_of(&chunk).unwrap(),
        Some(19),
        "the orphan stays"
    );

    let new = after.create(ROOT, "new", 0o644, 0, 0).unwrap();
    assert_ne!(new.oid, lost.oid);
    let grow = SetAttr {
        size: Some(19),
        ..SetAttr::default()
    };
    after.setattr(new.oid, grow).unwrap();
    assert_eq!(read_all(&after, new.oid), vec![0; 19]);
}

#[test]
fn unsynced_work_is_really_lost_in_the_simulation() {
    // Guards the durability test: the simulated crash must discard unsynced data.
    let (disk, ns) = fresh(None);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    ns.write(f.oid, 0, b"volatile").unwrap();
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    assert_eq!(after.lookup(ROOT, "f").unwrap_err().errno, Errno::NOENT);
}

/// A hole punched across five chunks (a tail cut, two retired, one zeroed) is what the
/// file holds after a crash once fsync'd, and a snapshot taken before it keeps every byte.
#[test]
fn a_punch_outlives_a_crash_once_synced_and_leaves_snapshots_their_bytes() {
    let (disk, ns) = fresh(None);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let before = pattern(300_000, 13);
    ns.write(f.oid, 0, &before).unwrap();
    ns.snapshot_to(&config_at("snap", true)).unwrap();
    ns.punch(f.oid, 1000, 250_000).unwrap();
    ns.fsync(f.oid).unwrap();
    let mut want = before.clone();
    want[1000..251_000].fill(0);
    assert_eq!(read_all(&ns, f.oid), want);
    let crashed = disk.crash();
    drop(ns);
    let disk: Arc<dyn Disk> = Arc::new(crashed);
    let after = Namespace::open(disk.clone(), config(None)).unwrap();
    assert_eq!(read_all(&after, f.oid), want, "the synced punch is kept");
    let snap = Namespace::open(disk, config_at("snap", true)).unwrap();
    assert_eq!(
        read_all(&snap, f.oid),
        before,
        "the snapshot keeps the punched bytes"
    );
}

#[test]
fn snapshots_keep_old_data_and_clones_are_independent() {
    let (disk, ns) = fresh(None);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let before = pattern(150_000, 11);
    ns.write(f.oid, 0, &before).unwrap();
    ns.snapshot_to(&config_at("snap", true)).unwrap();
    ns.snapshot_to(&config_at("clone", false)).unwrap();

    ns.write(f.oid, 1000, &pattern(70_000, 12)).unwrap();
    ns.create(ROOT, "new", 0o644, 0, 0).unwrap();
    let after = read_all(&ns, f.oid);
    assert_ne!(after, before);

    let disk: Arc<dyn Disk> = Arc::new(disk);
    let snap = Namespace::open(disk.clone(), config_at("snap", true)).unwrap();
    assert_eq!(
        read_all(&snap, f.oid),
        before,
        "the snapshot shows the old data"
    );
    assert_eq!(snap.lookup(ROOT, "new").unwrap_err().errno, Errno::NOENT);
    assert_eq!(snap.write(f.oid, 0, b"x").unwrap_err().errno, Errno::ROFS);
    assert_eq!(
        snap.create(ROOT, "y", 0o644, 0, 0).unwrap_err().errno,
        Errno::ROFS
    );

    let clone = Namespace::open(disk, config_at("clone", false)).unwrap();
    assert_eq!(read_all(&clone, f.oid), before);
    clone.write(f.oid, 0, b"clone's own").unwrap();
    assert_eq!(&read_all(&clone, f.oid)[..11], b"clone's own");
    assert_eq!(
        read_all(&snap, f.oid),
        before,
        "writing the clone leaves the snapshot alone"
    );
    assert_eq!(read_all(&ns, f.oid), after, "and the source");
}

#[test]
fn errors_name_the_right_culprit() {
    let (_, ns) = fresh(None);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    assert_eq!(ns.lookup(f.oid, "x").unwrap_err().errno, Errno::NOTDIR);
    assert_eq!(ns.unlink(f.oid, "x").unwrap_err().errno, Errno::NOTDIR);
    assert_eq!(
        ns.rename(f.oid, "x", ROOT, "y", false).unwrap_err().errno,
        Errno::NOTDIR
    );
    assert_eq!(ns.readdir(f.oid, 0, 1).unwrap_err().errno, Errno::NOTDIR);
    assert_eq!(
        ns.rename(ROOT, "f", ROOT, "f", true).unwrap_err().errno,
        Errno::EXIST
    );
    ns.rename(ROOT, "f", ROOT, "f", false).unwrap();
    let l = ns.symlink(ROOT, "l", "f", 0, 0).unwrap();
    assert_eq!(
        ns.read(l.oid, 0, &mut [0; 4]).unwrap_err().errno,
        Errno::INVAL
    );
    assert_eq!(ns.open_object(l.oid, false).unwrap_err().errno, Errno::LOOP);
    assert_eq!(ns.open_object(ROOT, true).unwrap_err().errno, Errno::ISDIR);
    // Only regular files have holes: a directory is EISDIR, anything else EINVAL.
    let punched = ns.punch(ROOT, 0, 10).unwrap_err();
    assert_eq!(punched.errno, Errno::ISDIR);
    assert!(
        punched
            .to_string()
            .contains("can only punch holes in regular files")
    );
    assert_eq!(ns.punch(l.oid, 0, 10).unwrap_err().errno, Errno::INVAL);
    assert_eq!(
        ns.write(f.oid, u64::MAX - 1, b"xx").unwrap_err().errno,
        Errno::FBIG
    );
    let long = "t".repeat(SYMLINK_MAX + 1);
    assert_eq!(
        ns.symlink(ROOT, "m", &long, 0, 0).unwrap_err().errno,
        Errno::NAMETOOLONG
    );
}

#[test]
fn truncating_a_shared_chunk_leaves_the_snapshot_alone() {
    let (disk, ns) = fresh(None);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    ns.write(f.oid, 0, &data).unwrap();
    let snap_cfg = config_at("snap", true);
    ns.snapshot_to(&snap_cfg).unwrap();
    ns.setattr(
        f.oid,
        SetAttr {
            size: Some(70_000),
            ..Default::default()
        },
    )
    .unwrap();
    let snap = Namespace::open(Arc::new(disk), snap_cfg).unwrap();
    let mut buf = vec![0; 100_000];
    assert_eq!(snap.read(f.oid, 0, &mut buf).unwrap(), 100_000);
    assert_eq!(buf, data);
}

#[test]
fn chunk_size_is_fixed_at_creation() {
    let (disk, ns) = fresh(None);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    ns.write(f.oid, 3, &data).unwrap();
    ns.fsync(f.oid).unwrap();
    drop(ns);
    let cfg = NamespaceConfig {
        chunk_size: 1 << 20,
        ..config(None)
    };
    let again = Namespace::open(Arc::new(disk), cfg).unwrap();
    assert_eq!(again.chunk_size(), 1 << 16, "the superblock's size wins");
    let mut buf = vec![0; 200_000];
    again.read(f.oid, 3, &mut buf).unwrap();
    assert_eq!(buf, data);
}

#[test]
fn writes_are_recorded_late_but_seen_at_once() {
    let (_, ns) = fresh(None);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let before = ns.getattr(f.oid).unwrap();
    ns.write(f.oid, 0, &pattern(10_000, 1)).unwrap();
    ns.write(f.oid, 20_000, &pattern(4096, 2)).unwrap();
    assert_eq!(ns.unrecorded_files(), 1, "the writes cost no transaction");
    let seen = ns.lookup(ROOT, "f").unwrap();
    assert_eq!(seen.size, 24_096);
    assert!(seen.mtime >= before.mtime && seen.ctime == seen.mtime);
    assert_eq!(ns.getattr(f.oid).unwrap(), seen);
    assert_eq!(read_all(&ns, f.oid)[20_000..], pattern(4096, 2)[..]);
    // Space is counted by chunk file length: the hole inside the chunk counts too.
    assert_eq!(ns.used().unwrap(), 24_096);
    // A truncation records them first, then cuts.
    let cut = ns
        .setattr(
            f.oid,
            SetAttr {
                size: Some(5_000),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!((cut.size, ns.unrecorded_files()), (5_000, 0));
    assert_eq!(ns.getattr(f.oid).unwrap().size, 5_000);
    assert_eq!(ns.used().unwrap(), 5_000);
    // A removal frees what pending writes took.
    ns.write(f.oid, 5_000, &pattern(3_000, 3)).unwrap();
    assert_eq!(ns.used().unwrap(), 8_000);
    ns.unlink(ROOT, "f").unwrap();
    assert_eq!((ns.used().unwrap(), ns.unrecorded_files()), (0, 0));
}

#[test]
fn pending_writes_are_recorded_before_they_pile_up() {
    let (_, ns) = fresh(None);
    let files = meta::RECORD_AT + 10;
    for i in 0..files {
        let f = ns.create(ROOT, &format!("f{i}"), 0o644, 0, 0).unwrap();
        ns.write(f.oid, 0, b"x").unwrap();
    }
    assert!(ns.unrecorded_files() < meta::RECORD_AT);
    assert_eq!(ns.used().unwrap(), files as u64);
    assert_eq!(ns.lookup(ROOT, "f0").unwrap().size, 1);
}

#[test]
fn fsync_of_many_small_files_survives_a_crash_with_every_size() {
    let (disk, ns) = fresh(None);
    for i in 0..50u8 {
        let f = ns.create(ROOT, &format!("f{i}"), 0o644, 0, 0).unwrap();
        ns.write(f.oid, 0, &pattern(4096 + usize::from(i), i))
            .unwrap();
        ns.fsync(f.oid).unwrap();
    }
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    for i in 0..50u8 {
        let f = after.lookup(ROOT, &format!("f{i}")).unwrap();
        assert_eq!(read_all(&after, f.oid), pattern(4096 + usize::from(i), i));
    }
    assert_eq!(
        after.used().unwrap(),
        (0..50).map(|i| 4096 + i).sum::<u64>()
    );
}

#[test]
fn a_set_group_id_directory_hands_down_its_group_in_the_create_itself() {
    // Clients pass the caller's group and do not read the parent first (Dfs::owner_in).
    let (_disk, ns) = fresh(None);
    let sg = ns.mkdir(ROOT, "sg", 0o755, 0, 1234).unwrap();
    let set = SetAttr {
        mode: Some(0o2775),
        ..SetAttr::default()
    };
    ns.setattr(sg.oid, set).unwrap();
    let file = ns.create(sg.oid, "file", 0o644, 1000, 1000).unwrap();
    assert_eq!(
        (file.uid, file.gid, file.mode & 0o7777),
        (1000, 1234, 0o644)
    );
    let dir = ns.mkdir(sg.oid, "dir", 0o755, 1000, 1000).unwrap();
    assert_eq!((dir.gid, dir.mode & 0o7777), (1234, 0o2755));
    let link = ns.symlink(sg.oid, "link", "file", 1000, 1000).unwrap();
    assert_eq!(link.gid, 1234);
    let plain = ns.create(ROOT, "plain", 0o644, 1000, 1000).unwrap();
    assert_eq!(plain.gid, 1000, "outside it the caller's group");
}

#[test]
fn many_small_files_cost_no_sync_until_fsync_which_finds_closed_chunks() {
    // More files than the open-chunk cache holds: emptying it must not sync them, and an
    // fsync later must still reach a chunk the cache has closed.
    let (disk, ns) = fresh(None);
    let files: Vec<Oid> = (0..1100u32)
        .map(|i| {
            let f = ns.create(ROOT, &format!("f{i}"), 0o644, 0, 0).unwrap();
            ns.write(f.oid, 0, &pattern(4096, i as u8)).unwrap();
            f.oid
        })
        .collect();
    assert_eq!(
        disk.data_file_syncs(),
        0,
        "writes without fsync synced data files"
    );
    ns.fsync(files[0]).unwrap();
    assert_eq!(
        disk.data_file_syncs(),
        1,
        "fsync syncs exactly its file's chunk"
    );
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    let first = after.lookup(ROOT, "f0").unwrap();
    assert_eq!(read_all(&after, first.oid), pattern(4096, 0));
    let other = after.lookup(ROOT, "f1").unwrap();
    assert_ne!(
        read_all(&after, other.oid),
        pattern(4096, 1),
        "never synced"
    );
}

#[test]
fn an_orderly_close_keeps_unrecorded_writes() {
    let (disk, ns) = fresh(None);
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    ns.write(f.oid, 0, &pattern(5000, 4)).unwrap();
    assert_eq!(ns.unrecorded_files(), 1);
    // Closed in order (an engine stop), not crashed: nothing it answered is lost.
    drop(ns);
    let again = Namespace::open(Arc::new(disk), config(None)).unwrap();
    let f = again.lookup(ROOT, "f").unwrap();
    assert_eq!(read_all(&again, f.oid), pattern(5000, 4));
    assert_eq!(again.used().unwrap(), 5000);
}

#[test]
fn a_sync_of_everything_makes_every_objects_writes_survive_a_crash() {
    let (disk, ns) = fresh(None);
    let a = ns.create(ROOT, "a", 0o644, 0, 0).unwrap();
    let b = ns.create(ROOT, "b", 0o644, 0, 0).unwrap();
    ns.write(a.oid, 0, b"first file").unwrap();
    ns.write(b.oid, 4096, b"second file").unwrap();
    assert!(ns.sync_all().unwrap(), "nothing failed");
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    let a = after.lookup(ROOT, "a").unwrap();
    let b = after.lookup(ROOT, "b").unwrap();
    assert_eq!(read_all(&after, a.oid), b"first file");
    let second = read_all(&after, b.oid);
    assert_eq!((second.len(), &second[4096..]), (4107, &b"second file"[..]));
}

#[test]
fn a_chunk_that_fails_to_sync_for_everything_is_reported_to_its_own_fsync() {
    let (disk, ns) = fresh(None);
    let a = ns.create(ROOT, "a", 0o644, 0, 0).unwrap();
    let b = ns.create(ROOT, "b", 0o644, 0, 0).unwrap();
    ns.write(a.oid, 0, b"first file").unwrap();
    disk.fail_syncs(true);
    assert!(!ns.sync_all().unwrap(), "a failure waits for its fsync");
    disk.fail_syncs(false);
    // b had nothing to sync; a's failure is a's, once.
    ns.fsync(b.oid).unwrap();
    assert_eq!(ns.fsync(a.oid).unwrap_err().errno, Errno::IO);
    // The chunk stayed dirty: this fsync syncs it.
    ns.fsync(a.oid).unwrap();
    assert!(ns.sync_all().unwrap());
    let crashed = disk.crash();
    drop(ns);
    let after = Namespace::open(Arc::new(crashed), config(None)).unwrap();
    let a = after.lookup(ROOT, "a").unwrap();
    assert_eq!(read_all(&after, a.oid), b"first file");
}
