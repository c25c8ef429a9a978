//! DFS through DAOS's own libdfs (`dpufs_daos::libdaos::LibDfs`, feature `daos-ffi`) on a
//! real DAOS system: the differential suite of `dpufs_daos::dfs::conformance` against a
//! container the `daos` tool made. One DAOS release per test process (`libdfs_2_6.rs`,
//! `libdfs_2_8.rs`): a process loads one DAOS installation.

use dpufs_daos::dfs::{LocalDfs, conformance};
use dpufs_daos::libdaos::{LibDaos, LibDfs};
use dpufs_e2e::daos_system;

/// Where DFS through libdfs differs from a local directory, beyond the suite's own list
/// (`conformance::ALLOWED_DIFFERENCES`): (case, step, why). The same list is in
/// docs/real-daos.md.
const LIBDFS_DIFFERENCES: &[(&str, &str, &str)] = &[
    ("allocate_extends_or_keeps_the_size", "extend", NO_FALLOCATE),
    ("allocate_extends_or_keeps_the_size", "inside", NO_FALLOCATE),
    (
        "allocate_extends_or_keeps_the_size",
        "keep size past the end",
        NO_FALLOCATE,
    ),
    (
        "allocate_extends_or_keeps_the_size",
        "keep size beyond the end",
        NO_FALLOCATE,
    ),
    (
        "allocate_extends_or_keeps_the_size",
        "write into it",
        NO_FALLOCATE,
    ),
    ("setattr_mode_owner_times", "chmod d 1777", NO_STICKY),
    ("setattr_mode_owner_times", "chown", NO_STICKY),
    ("setattr_mode_owner_times", "chgrp only", NO_STICKY),
    ("setattr_mode_owner_times", "set times", NO_ATIME),
    ("setattr_mode_owner_times", "set mtime only", NO_ATIME),
    ("fsync_and_statfs", "statfs is sane", NO_FILE_COUNT),
];

const NO_FALLOCATE: &str = "DFS cannot reserve space: fallocate is EOPNOTSUPP (posix_fallocate(3) \
     then writes zeros), so the later steps see the file unextended";
const NO_STICKY: &str = "DFS refuses the sticky bit (EOPNOTSUPP, as through dfuse), so the \
     later steps see the mode without it";
const NO_FILE_COUNT: &str = "DFS counts no objects: statfs has the pool's bytes and 0 files \
     (dfuse reports no count either)";
const NO_ATIME: &str = "DFS stores no atime: it reports the later of mtime and ctime";

pub fn libdfs_agrees_with_a_local_directory(test: &str, version: &str) {
    let Some(daos) = daos_system::with_pool(test, version, "1GiB", &[]) else {
        return;
    };
    daos.daos(&["cont", "create", "tank", "vol", "--type=POSIX"])
        .expect("daos cont create");
    // SAFETY: set before libdaos starts and before this test starts any thread; the
    // process runs this one test.
    unsafe { std::env::set_var("DAOS_AGENT_DRPC_DIR", daos.agent_dir()) };
    let lib = LibDaos::load(&daos.prefix.lib_dir()).expect("loading libdaos");
    let subject = LibDfs::mount(lib, "tank", "vol", false).expect("mounting the container");
    let local = tempfile::tempdir().unwrap();
    let reference = LocalDfs::open(local.path()).unwrap();
    let report = conformance::run_all(&reference, &subject);
    eprintln!(
        "libdfs {version}: {} cases passed, {} failed",
        report.passed.len(),
        report.failed.len()
    );
    report.assert_passed_except(LIBDFS_DIFFERENCES);
    drop(subject);
}
