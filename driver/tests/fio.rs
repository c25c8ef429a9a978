//! fio with `--verify=crc32c` through a real mount served by a `dpufs-csi worker` child
//! process: sequential and random writes, concurrent writers to different files, a 256 MiB
//! file and a sparse file. Each workload is verified twice: by fio right after writing (the
//! page cache may answer), then by a second fio run with `--verify_only --direct=1`, whose
//! reads all go through the worker to the backend.

mod common;

use common::{EngineBacking, WorkerProc, can_mount, fio_available, tempdir, write_and_verify};
use std::os::unix::fs::MetadataExt;

/// Sequential 1 MiB writes.
const SEQUENTIAL: &[&str] = &[
    "--name=seq",
    "--rw=write",
    "--bs=1M",
    "--size=64M",
    "--ioengine=psync",
];
/// Direct, asynchronous 4 KiB random writes (FUSE async direct I/O, many in flight).
const RANDOM_DIRECT: &[&str] = &[
    "--name=rand-direct",
    "--rw=randwrite",
    "--bs=4k",
    "--size=16M",
    "--ioengine=libaio",
    "--iodepth=16",
    "--direct=1",
];
/// Four writers, one file each.
const CONCURRENT: &[&str] = &[
    "--name=conc",
    "--numjobs=4",
    "--rw=write",
    "--bs=256k",
    "--size=16M",
    "--ioengine=psync",
];
/// 64 KiB written at the start of each MiB, across 63 MiB + 64 KiB (so the last block ends
/// the file, and reading it back lays nothing out).
const SPARSE: &[&str] = &[
    "--name=sparse",
    "--filename=sparse",
    "--rw=write:960k",
    "--bs=64k",
    "--size=66125824",
    "--ioengine=psync",
    // fio reserves a new file's space with fallocate by default, and the mount honours it:
    // a sparse file is one nobody reserved.
    "--fallocate=none",
];

fn worker() -> (tempfile::TempDir, WorkerProc) {
    let backing = tempdir("dpufs-fio-backing-");
    let w = WorkerProc::start(backing.path(), Default::default());
    (backing, w)
}

#[test]
fn sequential_writes_verify() {
    if !can_mount() || !fio_available() {
        return;
    }
    let (_b, w) = worker();
    write_and_verify(&w.mountpoint, SEQUENTIAL);
    let stats = w.stats();
    assert!(
        stats["bytes_written"].as_u64().unwrap() >= 64 << 20,
        "{stats}"
    );
    assert_eq!(stats["transport_errors"], 0, "{stats}");
}

#[test]
fn random_writes_verify() {
    if !can_mount() || !fio_available() {
        return;
    }
    let (_b, w) = worker();
    // Direct, asynchronous 4 KiB writes (FUSE async direct I/O, many in flight)...
    write_and_verify(&w.mountpoint, RANDOM_DIRECT);
    // ... and buffered ones of mixed sizes.
    write_and_verify(
        &w.mountpoint,
        &[
            "--name=rand-buffered",
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--size=16M",
            "--ioengine=psync",
        ],
    );
}

#[test]
fn concurrent_writers_to_different_files_verify() {
    if !can_mount() || !fio_available() {
        return;
    }
    let (backing, w) = worker();
    write_and_verify(&w.mountpoint, CONCURRENT);
    let files = std::fs::read_dir(backing.path()).unwrap().count();
    assert_eq!(files, 4, "one file per writer");
}

#[test]
fn large_file_verify() {
    if !can_mount() || !fio_available() {
        return;
    }
    let (backing, w) = worker();
    write_and_verify(
        &w.mountpoint,
        &[
            "--name=large",
            "--filename=large",
            "--rw=write",
            "--bs=1M",
            "--size=256M",
            "--ioengine=psync",
        ],
    );
    let meta = std::fs::metadata(backing.path().join("large")).unwrap();
    assert_eq!(meta.len(), 256 << 20);
}

#[test]
fn sparse_file_verify() {
    if !can_mount() || !fio_available() {
        return;
    }
    let (backing, w) = worker();
    write_and_verify(&w.mountpoint, SPARSE);
    let back = std::fs::metadata(backing.path().join("sparse")).unwrap();
    let mnt = std::fs::metadata(w.path("sparse")).unwrap();
    assert_eq!(back.len(), mnt.len());
    // The holes stayed holes in the backend...
    assert!(
        back.blocks() * 512 < back.len() / 4,
        "allocated {} of {} bytes",
        back.blocks() * 512,
        back.len()
    );
    // ... and read as zeros through the mount.
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(w.path("sparse")).unwrap();
    let mut buf = vec![1u8; 960 << 10];
    f.read_exact_at(&mut buf, 64 << 10).unwrap();
    assert!(buf.iter().all(|b| *b == 0), "a hole reads as zeros");
}

/// The same workloads through a worker serving an engine container over the fabric: every
/// byte crosses the tenant session (scoped rkeys, one-sided RMA) into the engine's chunk
/// store and back.
#[test]
fn engine_backed_workloads_verify() {
    if !can_mount() || !fio_available() {
        return;
    }
    let backing = EngineBacking::start();
    let w = WorkerProc::start(&backing, Default::default());
    for job in [SEQUENTIAL, RANDOM_DIRECT, CONCURRENT, SPARSE] {
        write_and_verify(&w.mountpoint, job);
    }
    let stats = w.stats();
    assert!(
        stats["bytes_written"].as_u64().unwrap() >= 100 << 20,
        "{stats}"
    );
    assert_eq!(stats["transport_errors"], 0, "{stats}");
    assert_eq!(
        std::fs::metadata(w.path("sparse")).unwrap().len(),
        (63 << 20) + (64 << 10)
    );
}

/// The same workloads through a worker serving a container of a real DAOS system through
/// libdfs; then every file reads the same through DAOS's own dfuse.
#[test]
fn daos_backed_workloads_verify_on_daos_2_8_0() {
    daos_backed_workloads_verify("daos_backed_workloads_verify_on_daos_2_8_0", "2.8.0");
}

/// And on DAOS 2.6.5.
#[test]
fn daos_backed_workloads_verify_on_daos_2_6_5() {
    daos_backed_workloads_verify("daos_backed_workloads_verify_on_daos_2_6_5", "2.6.5");
}

fn daos_backed_workloads_verify(test: &str, version: &str) {
    if !can_mount() || !fio_available() {
        return;
    }
    let Some(backing) = common::DaosBacking::start(test, version) else {
        return;
    };
    let w = WorkerProc::start(&backing, Default::default());
    // DFS cannot reserve space (fallocate is EOPNOTSUPP): fio is told not to try.
    for job in [SEQUENTIAL, RANDOM_DIRECT, CONCURRENT, SPARSE] {
        let mut job = job.to_vec();
        if !job.contains(&"--fallocate=none") {
            job.push("--fallocate=none");
        }
        write_and_verify(&w.mountpoint, &job);
    }
    let stats = w.stats();
    assert!(
        stats["bytes_written"].as_u64().unwrap() >= 100 << 20,
        "{stats}"
    );
    let mnt = tempdir("dpufs-dfuse-");
    let dfuse = dpufs_e2e::dfuse::Dfuse::mount(&backing.daos, "tank", "vol", mnt.path())
        .expect("mounting dfuse");
    let mut names = 0;
    for entry in std::fs::read_dir(&w.mountpoint).unwrap() {
        let name = entry.unwrap().file_name();
        let ours = std::fs::read(w.mountpoint.join(&name)).unwrap();
        let theirs = std::fs::read(mnt.path().join(&name)).unwrap();
        assert!(ours == theirs, "{name:?} reads differently through dfuse");
        names += 1;
    }
    assert!(names >= 7, "{names} files");
    drop(dfuse);
}
