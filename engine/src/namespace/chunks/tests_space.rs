//! Space accounting (`space.rs`) on a simulated disk: quotas, a pool shared by containers,
//! concurrent writers and allocation, each counted once and refused without a trace.

use crate::namespace::sim_disk::SimDisk;
use crate::namespace::tests::{pattern, read_all};
use crate::namespace::*;
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
            return Err(err(Errno::NOSPC, "pool full"));
        }
        *used += bytes;
        Ok(())
    }
    fn release(&self, bytes: u64) {
        *self.used.lock().unwrap() -= bytes;
    }
}

#[test]
fn quota_gives_enospc_and_keeps_old_data() {
    let cfg = NamespaceConfig {
        quota: Some(100_000),
        ..config("c", 1 << 16, None)
    };
    let ns = Namespace::open(Arc::new(SimDisk::default()), cfg).unwrap();
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let first = pattern(90_000, 3);
    ns.write(f.oid, 0, &first).unwrap();
    let err = ns.write(f.oid, 90_000, &pattern(20_000, 4)).unwrap_err();
    assert_eq!(err.errno, Errno::NOSPC);
    assert_eq!(
        read_all(&ns, f.oid),
        first,
        "a refused write changes nothing"
    );
    // Overwriting in place needs no new space.
    ns.write(f.oid, 0, &pattern(1000, 5)).unwrap();
    // Freeing space makes room again.
    ns.setattr(
        f.oid,
        SetAttr {
            size: Some(10_000),
            ..Default::default()
        },
    )
    .unwrap();
    ns.write(f.oid, 10_000, &pattern(50_000, 6)).unwrap();
    assert_eq!(ns.statfs(1 << 30).unwrap().total_bytes, 100_000);
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
    assert_eq!(full.errno, Errno::NOSPC);
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
        Errno::NOSPC
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
                        Err(e) => assert_eq!(e.errno, Errno::NOSPC),
                    }
                }
            });
        }
    });
    let written = written.into_inner();
    assert_eq!(written, 16 * BLOCK, "the quota admits exactly its bytes");
    assert_eq!(ns.used().unwrap(), written);
}

/// An allocation over the limit is refused before any chunk file is made: a tenant's
/// fallocate of 2^62 bytes into a 150 kB pool must cost nothing, not one file per chunk.
#[test]
fn a_refused_allocation_makes_no_chunk_files_however_long_its_range() {
    let pool = Arc::new(TestPool {
        capacity: 150_000,
        used: Mutex::new(0),
    });
    let disk = SimDisk::default();
    let cfg = config("c", 1 << 16, Some(pool.clone() as Arc<dyn SpaceBudget>));
    let ns = Namespace::open(Arc::new(disk.clone()), cfg.clone()).unwrap();
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    ns.write(f.oid, 0, &[1; 1000]).unwrap();
    let files = || {
        let dirs = cfg.chunk_dirs.iter();
        dirs.map(|d| Disk::list(&disk, d).unwrap().len())
            .sum::<usize>()
    };
    let before = files();
    // 5,000 chunks of 64 KiB: refused by the pool.
    let refused = ns.allocate(f.oid, 0, 5_000 << 16, false).unwrap_err();
    assert_eq!(refused.errno, Errno::NOSPC);
    assert_eq!(files(), before, "a refused allocation made chunk files");
    let huge = ns.allocate(f.oid, 1 << 20, 1 << 62, true);
    assert_eq!(
        huge.map_err(|e| e.errno),
        Ok(()),
        "KEEP_SIZE past the end is a no-op"
    );
    let huge = ns.allocate(f.oid, 1 << 20, 1 << 62, false).unwrap_err();
    assert_eq!(huge.errno, Errno::NOSPC);
    assert_eq!(files(), before);
    assert_eq!(*pool.used.lock().unwrap(), 1000, "nothing was taken");
    assert_eq!(read_all(&ns, f.oid), vec![1; 1000]);
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
    assert_eq!(full.errno, Errno::NOSPC);
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

/// A punched hole reads as zeros and gives its space back: the chunks inside it whole, and
/// a chunk's tail from the hole's start; the chunk its end falls in keeps its length (data
/// follows). The size stays, and past it there is nothing to punch.
#[test]
fn a_punched_hole_reads_as_zeros_and_frees_its_chunks() {
    let pool = Arc::new(TestPool {
        capacity: 1 << 20,
        used: Mutex::new(0),
    });
    let cs = 1u64 << 16;
    let cfg = config("c", cs, Some(pool.clone() as Arc<dyn SpaceBudget>));
    let ns = Namespace::open(Arc::new(SimDisk::default()), cfg).unwrap();
    let f = ns.create(ROOT, "f", 0o644, 0, 0).unwrap();
    let data = pattern(5 * cs as usize, 7);
    ns.write(f.oid, 0, &data).unwrap();
    let used = || *pool.used.lock().unwrap();
    assert_eq!(used(), 5 * cs);
    // From inside chunk 1 to inside chunk 3: chunk 1 is cut to 100 bytes, chunk 2 goes,
    // chunk 3 gets 200 zeros.
    let (start, end) = (cs + 100, 3 * cs + 200);
    ns.punch(f.oid, start, end - start).unwrap();
    let mut want = data.clone();
    want[start as usize..end as usize].fill(0);
    assert_eq!(read_all(&ns, f.oid), want);
    assert_eq!(used(), 3 * cs + 100);
    // To past the end, from inside chunk 4: its tail is cut, the size stays.
    ns.punch(f.oid, 4 * cs + 10, 10 * cs).unwrap();
    want[(4 * cs + 10) as usize..].fill(0);
    assert_eq!(ns.getattr(f.oid).unwrap().size, 5 * cs);
    assert_eq!(read_all(&ns, f.oid), want);
    assert_eq!(used(), 2 * cs + 110);
    // Past the size: nothing.
    ns.punch(f.oid, 6 * cs, 1 << 40).unwrap();
    assert_eq!(
        (ns.getattr(f.oid).unwrap().size, used()),
        (5 * cs, 2 * cs + 110)
    );
    // A hole's space is taken again by the writes that fill it.
    ns.write(f.oid, 2 * cs, &pattern(cs as usize, 8)).unwrap();
    assert_eq!(used(), 3 * cs + 110);
    let dir = ns.mkdir(ROOT, "d", 0o755, 0, 0).unwrap();
    assert_eq!(ns.punch(dir.oid, 0, 1).unwrap_err().errno, Errno::ISDIR);
    ns.unlink(ROOT, "f").unwrap();
    assert_eq!(used(), 0);
}
