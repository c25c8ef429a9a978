//! Skipped tests are loud, and fail where they must not skip. A test that cannot run here
//! (no root, no fio, no DAOS, no Kubernetes binaries, no QEMU guest) says so on the
//! terminal, past libtest's capture, and passes; with its `DPUFS_REQUIRE_*` variable set
//! to 1 (CI sets each one whose resource its machine is meant to have) the same test
//! fails instead, so a lost precondition can never turn a suite silently green.

use std::io::Write;

/// The host's resources the FUSE, fio and namespace tests need (root, /dev/fuse, fio,
/// unshare).
pub const REQUIRE_HOST: &str = "DPUFS_REQUIRE_HOST";

/// Says loudly that `test` did not run and why, or fails it when `require` is 1.
pub fn skip(require: &str, test: &str, why: &str) {
    let required = std::env::var(require).as_deref() == Ok("1");
    skip_unless(required.then(|| format!("{require}=1")), test, why);
}

/// Says loudly that `test` did not run and why, or fails it when `required_by` names what
/// says it must run.
pub fn skip_unless(required_by: Option<String>, test: &str, why: &str) {
    let msg = format!("SKIPPED {test}: {why}");
    if let Some(by) = required_by {
        panic!("{msg}, and {by}");
    }
    // Straight to stderr: libtest captures eprintln! and shows it only for failures.
    let _ = writeln!(std::io::stderr(), "\n!!!!! {msg}\n");
}

/// The running test's name (libtest names each test's thread after it).
pub fn this_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string()
}

/// Whether the host has what `what` needs; says loudly that the running test skips when
/// it has not (or fails it under `DPUFS_REQUIRE_HOST=1`).
pub fn host_has(ok: bool, what: &str) -> bool {
    if !ok {
        skip(REQUIRE_HOST, &this_test(), what);
    }
    ok
}
