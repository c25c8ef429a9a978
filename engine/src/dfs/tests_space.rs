//! Cookies, copy-on-write corner cases and space accounting on a simulated disk.

use super::disk::SimDisk;
use super::*;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

fn config(root: &str, chunk_size: u64, budget: Option<Arc<dyn SpaceBudget>>) -> NamespaceConfig {
    NamespaceConfig {
        meta_path: PathBuf::from(format!("/r0/{root}/meta.redb")),
        chunk_dirs: vec![
            PathBuf::from(format!("/r0/{root}")),
            PathBuf::from(format!("/r1/{root}")),
        ],
        chunk_size,
        quota: None,
        read_only: false,
        budget,
    }
}

fn open(disk: &SimDisk, root: &str) -> Namespace {
    Namespace::open(Arc::new(disk.clone()), config(root, 1 << 16, None)).unwrap()
}

/// A pool of `capacity` bytes.
#[derive(Debug)]
struct TestPool {
    capacity: u64,
    used: Mutex<u64>,
}

impl SpaceBudget for TestPool {
    fn reserve(&self, bytes: u64) -> DfsResult<()> {
        let mut used = self.used.lock().unwrap();
        if *used + bytes > self.capacity {
            return Err(err(Errno::NoSpc, "pool full"));
        }
        *used += bytes;
        Ok(())
    }
    fn release(&self, bytes: u64) {
        *self.used.lock().unwrap() -= bytes;
    }
}

#[test]
fn listings_resume_after_their_cookie_whatever_was_removed() {
    let ns = open(&SimDisk::default(), "c");
    for i in 0..100 {
        ns.create(ROOT, &format!("f{i}"), 0o644, 0, 0).unwrap();
    }
    let first = ns.readdir(ROOT, 0, 10).unwrap();
    let last = first.entries.last().unwrap().clone();
    // Remove the entry the cookie belongs to and one not listed yet.
    ns.unlink(ROOT, &last.name).unwrap();
    let later = ns.readdir(ROOT, last.cookie, 1).unwrap().entries[0].clone();
    ns.unlink(ROOT, &later.name).unwrap();
    let mut seen: Vec<String> = first.entries.iter().map(|e| e.name.clone()).collect();
    let mut cookie = last.cookie;
    loop {
        let page = ns.readdir(ROOT, cookie, 7).unwrap();
        seen.extend(page.entries.iter().map(|e| e.name.clone()));
        cookie = page.entries.last().map_or(cookie, |e| e.cookie);
        if page.end {
            break;
        }
    }
    assert_eq!(
        seen.len(),
        99,
        "each survivor once, plus the one removed after it was seen"
    );
    assert!(!seen.contains(&later.name));
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 99);
    // A cookie is the entry's own: listing again gives it the same one.
    let again = ns.readdir(ROOT, 0, 200).unwrap();
    let e = again
        .entries
        .iter()
        .find(|e| e.name == first.entries[0].name)
        .unwrap();
    assert_eq!(e.cookie, first.entries[0].cookie);
    assert_eq!(e.cookie, name_hash(&e.name));
}

#[test]
fn name_hash_is_pinned() {
    // Stored in every entry key: changing the function orphans existing entries.
    assert_eq!(name_hash("a"), 0x4151_54ac_54df_672d);
}

#[test]
fn errors_name_the_right_culprit() {
    let ns = open(&SimDisk::default(), "c");
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    assert_eq!(ns.lookup(f.oid, "x").unwrap_err().errno, Errno::NotDir);
    assert_eq!(ns.unlink(f.oid, "x").unwrap_err().errno, Errno::NotDir);
    assert_eq!(
        ns.rename(f.oid, "x", ROOT, "y", false).unwrap_err().errno,
        Errno::NotDir
    );
    assert_eq!(ns.readdir(f.oid, 0, 1).unwrap_err().errno, Errno::NotDir);
    assert_eq!(
        ns.rename(ROOT, "f", ROOT, "f", true).unwrap_err().errno,
        Errno::Exist
    );
    ns.rename(ROOT, "f", ROOT, "f", false).unwrap();
    let l = ns.symlink(ROOT, "l", "f", 0, 0).unwrap();
    assert_eq!(
        ns.read(l.oid, 0, &mut [0; 4]).unwrap_err().errno,
        Errno::Inval
    );
    assert_eq!(ns.open_object(l.oid, false).unwrap_err().errno, Errno::Loop);
    assert_eq!(ns.open_object(ROOT, true).unwrap_err().errno, Errno::IsDir);
    assert_eq!(
        ns.write(f.oid, u64::MAX - 1, b"xx").unwrap_err().errno,
        Errno::FBig
    );
    let long = "t".repeat(SYMLINK_MAX + 1);
    assert_eq!(
        ns.symlink(ROOT, "m", &long, 0, 0).unwrap_err().errno,
        Errno::NameTooLong
    );
}

#[test]
fn truncating_a_shared_chunk_leaves_the_snapshot_alone() {
    let disk = SimDisk::default();
    let ns = open(&disk, "c");
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    ns.write(f.oid, 0, &data).unwrap();
    let mut snap_cfg = config("snap", 1 << 16, None);
    snap_cfg.read_only = true;
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
    let disk = SimDisk::default();
    let ns = open(&disk, "c");
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    ns.write(f.oid, 3, &data).unwrap();
    ns.fsync(f.oid).unwrap();
    drop(ns);
    let again = Namespace::open(Arc::new(disk), config("c", 1 << 20, None)).unwrap();
    assert_eq!(again.chunk_size(), 1 << 16, "the superblock's size wins");
    let mut buf = vec![0; 200_000];
    again.read(f.oid, 3, &mut buf).unwrap();
    assert_eq!(buf, data);
}

#[test]
fn containers_share_the_pool_and_freed_space_returns() {
    let disk = SimDisk::default();
    let pool = Arc::new(TestPool {
        capacity: 150_000,
        used: Mutex::new(0),
    });
    let budget = || Some(pool.clone() as Arc<dyn SpaceBudget>);
    let a = Namespace::open(Arc::new(disk.clone()), config("a", 1 << 16, budget())).unwrap();
    let b = Namespace::open(Arc::new(disk.clone()), config("b", 1 << 16, budget())).unwrap();
    let fa = a.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let fb = b.create(ROOT, "f", 0o644, 0, 0).unwrap();
    a.write(fa.oid, 0, &[1; 100_000]).unwrap();
    let full = b.write(fb.oid, 0, &[2; 60_000]).unwrap_err();
    assert_eq!(full.errno, Errno::NoSpc);
    assert_eq!(
        b.getattr(fb.oid).unwrap().size,
        0,
        "a refused write leaves no trace"
    );
    assert_eq!(*pool.used.lock().unwrap(), 100_000);
    b.write(fb.oid, 0, &[2; 50_000]).unwrap();
    assert_eq!(
        a.used().unwrap() + b.used().unwrap(),
        *pool.used.lock().unwrap()
    );
    a.setattr(
        fa.oid,
        SetAttr {
            size: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    a.unlink(ROOT, "f").unwrap();
    assert_eq!(*pool.used.lock().unwrap(), 50_000);
    b.write(fb.oid, 50_000, &[3; 90_000]).unwrap();
    let mut buf = vec![0; 140_000];
    b.read(fb.oid, 0, &mut buf).unwrap();
    assert!(buf[..50_000].iter().all(|&x| x == 2) && buf[50_000..].iter().all(|&x| x == 3));
}

#[test]
fn quota_changes_apply_to_an_open_namespace() {
    let ns = open(&SimDisk::default(), "c");
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    ns.write(f.oid, 0, &[1; 1000]).unwrap();
    ns.set_quota(Some(1500));
    assert_eq!(
        ns.write(f.oid, 1000, &[1; 1000]).unwrap_err().errno,
        Errno::NoSpc
    );
    ns.set_quota(None);
    ns.write(f.oid, 1000, &[1; 1000]).unwrap();
    assert_eq!(ns.statfs(1 << 20).unwrap().free_bytes, (1 << 20) - 2000);
}

#[test]
fn concurrent_writes_count_their_space_once_and_keep_their_bytes() {
    let ns = open(&SimDisk::default(), "c");
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    const BLOCK: u64 = 4096;
    // Eight writers interleave the 4 KiB blocks of two 64 KiB chunks: each chunk grows under
    // several writes in flight at once.
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let ns = &ns;
            s.spawn(move || {
                for b in (t..32).step_by(8) {
                    ns.write(f.oid, b * BLOCK, &[b as u8 + 1; BLOCK as usize])
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(ns.used().unwrap(), 32 * BLOCK);
    assert_eq!(ns.getattr(f.oid).unwrap().size, 32 * BLOCK);
    let mut buf = [0u8; BLOCK as usize];
    for b in 0..32u64 {
        ns.read(f.oid, b * BLOCK, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == b as u8 + 1), "block {b}");
    }
}

#[test]
fn a_quota_holds_against_concurrent_writers() {
    const BLOCK: u64 = 4096;
    let cfg = NamespaceConfig {
        quota: Some(16 * BLOCK),
        ..config("q", 1 << 16, None)
    };
    let ns = Namespace::open(Arc::new(SimDisk::default()), cfg).unwrap();
    let files: Vec<_> = (0..8)
        .map(|i| ns.create(ROOT, &format!("f{i}"), 0o644, 0, 0).unwrap().oid)
        .collect();
    let written = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for &oid in &files {
            let (ns, written) = (&ns, &written);
            s.spawn(move || {
                for b in 0..16 {
                    match ns.write(oid, b * BLOCK, &[7; BLOCK as usize]) {
                        Ok(()) => {
                            written.fetch_add(BLOCK, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => assert_eq!(e.errno, Errno::NoSpc),
                    }
                }
            });
        }
    });
    let written = written.into_inner();
    assert_eq!(written, 16 * BLOCK, "the quota admits exactly its bytes");
    assert_eq!(ns.used().unwrap(), written);
}

#[test]
fn allocated_space_is_counted_refused_over_the_limit_and_freed_with_the_file() {
    let pool = Arc::new(TestPool {
        capacity: 150_000,
        used: Mutex::new(0),
    });
    let cfg = config("c", 1 << 16, Some(pool.clone() as Arc<dyn SpaceBudget>));
    let ns = Namespace::open(Arc::new(SimDisk::default()), cfg).unwrap();
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let used = || *pool.used.lock().unwrap();
    ns.allocate(f.oid, 0, 100_000, false).unwrap();
    assert_eq!(
        (ns.getattr(f.oid).unwrap().size, used()),
        (100_000, 100_000)
    );
    ns.write(f.oid, 70_000, &[5; 30_000]).unwrap();
    assert_eq!(used(), 100_000, "writes into allocated space take no more");
    let full = ns.allocate(f.oid, 100_000, 60_000, false).unwrap_err();
    assert_eq!(full.errno, Errno::NoSpc);
    assert_eq!(
        (ns.getattr(f.oid).unwrap().size, used()),
        (100_000, 100_000),
        "a refused allocation changes nothing"
    );
    // KEEP_SIZE past the end reserves nothing there (it would outlive a truncation).
    ns.allocate(f.oid, 90_000, 50_000, true).unwrap();
    assert_eq!(
        (ns.getattr(f.oid).unwrap().size, used()),
        (100_000, 100_000)
    );
    let mut buf = vec![9; 100_000];
    ns.read(f.oid, 0, &mut buf).unwrap();
    assert!(buf[..70_000].iter().all(|&b| b == 0) && buf[70_000..].iter().all(|&b| b == 5));
    ns.unlink(ROOT, "f").unwrap();
    assert_eq!(used(), 0);
}
