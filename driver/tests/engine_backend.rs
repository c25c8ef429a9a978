//! A worker serving an engine container over the fabric (`--backend engine:<addr>`): the mount
//! outlives an engine crash (the tenant session reconnects, nothing fsync'd is lost, and an
//! fsync after it reports the unsynced writes the crash may have taken), the
//! capability file is renewed in place and presented at the next reconnect, an expired one is
//! refused there, and a worker holding an untrusted capability does not start.

mod common;

use common::{EngineBacking, Opts, WorkerProc, can_mount, errno_of, tempdir, worker_bin};
use dpufs_daos::capability::{AgentKey, Rights};
use dpufs_e2e::files::write_synced;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Every read and write reaches the worker (and so the engine).
fn uncached() -> Opts {
    Opts {
        args: vec!["--data-cache".into(), "off".into()],
        fuse_fd: None,
    }
}

fn body(seed: u8) -> Vec<u8> {
    (0..(3 << 20) + 17)
        .map(|i| (i as u8).wrapping_mul(seed))
        .collect()
}

#[test]
fn the_mount_survives_an_engine_crash() {
    if !can_mount() {
        return;
    }
    let mut backing = EngineBacking::start();
    let w = WorkerProc::start(&backing, uncached());
    write_synced(&w.path("before"), &body(3)).unwrap();
    backing.volume.engine.crash_and_restart().unwrap();
    assert_eq!(std::fs::read(w.path("before")).unwrap(), body(3));
    write_synced(&w.path("after"), &body(5)).unwrap();
    assert_eq!(std::fs::read(w.path("after")).unwrap(), body(5));
    let names: Vec<_> = std::fs::read_dir(&w.mountpoint)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

/// `body(seed)` written to a new file `name` of the mount, not synced; the file stays open.
fn written(w: &WorkerProc, name: &str, seed: u8) -> std::fs::File {
    let mut f = std::fs::File::create(w.path(name)).unwrap();
    f.write_all(&body(seed)).unwrap();
    f
}

/// The engine answers writes before they are durable and a crash loses what no fsync covered:
/// the fsync after the restart must say so (EIO, once), never succeed over lost bytes.
#[test]
fn an_fsync_after_an_engine_crash_reports_the_writes_it_may_have_lost() {
    if !can_mount() {
        return;
    }
    let mut backing = EngineBacking::start();
    let w = WorkerProc::start(&backing, uncached());
    let unsynced = written(&w, "unsynced", 3);
    let mut synced = written(&w, "synced", 5);
    synced.sync_all().unwrap();
    backing.volume.engine.crash_and_restart().unwrap();
    let e = unsynced
        .sync_all()
        .expect_err("writes the crashed engine took, unsynced");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    unsynced.sync_all().expect("the loss is reported once");
    synced.sync_all().expect("nothing changed since its fsync");
    assert_eq!(std::fs::read(w.path("synced")).unwrap(), body(5));
    // Writes the new engine takes are its own to make durable.
    synced.write_all(b"more").unwrap();
    synced.sync_all().unwrap();
}

/// An orderly restart (SIGTERM) makes every change durable first and keeps the verifier: the
/// unsynced writes are there and their fsync succeeds.
#[test]
fn an_orderly_engine_restart_keeps_unsynced_writes_and_costs_no_error() {
    if !can_mount() {
        return;
    }
    let mut backing = EngineBacking::start();
    let w = WorkerProc::start(&backing, uncached());
    let unsynced = written(&w, "unsynced", 3);
    backing.volume.engine.stop_and_restart().unwrap();
    unsynced.sync_all().expect("an orderly stop lost nothing");
    assert_eq!(std::fs::read(w.path("unsynced")).unwrap(), body(3));
}

#[test]
fn a_renewed_capability_is_presented_at_reconnect_and_an_expired_one_is_refused() {
    if !can_mount() {
        return;
    }
    let mut backing = EngineBacking::start();
    let vol = &backing.volume;
    let short = || vol.capability_by(&vol.agent, Rights::READ_WRITE, Duration::from_secs(2));
    let renewed_file = vol.write_capability("renewed", &short());
    let expiring_file = vol.write_capability("expiring", &short());
    let renewed = WorkerProc::start(
        &common::EngineArgs(vol.worker_args(&renewed_file)),
        uncached(),
    );
    let expiring = WorkerProc::start(
        &common::EngineArgs(vol.worker_args(&expiring_file)),
        uncached(),
    );
    write_synced(&renewed.path("r"), b"renewed").unwrap();
    write_synced(&expiring.path("e"), b"expiring").unwrap();
    // The agent renews one of them; both short ones expire.
    vol.write_capability("renewed", &vol.capability());
    std::thread::sleep(Duration::from_secs(4));
    backing.volume.engine.crash_and_restart().unwrap();
    // Reconnecting presents the file's current capability.
    assert_eq!(std::fs::read(renewed.path("r")).unwrap(), b"renewed");
    write_synced(&renewed.path("r2"), b"more").unwrap();
    // The expired one is refused at the handshake: an error, not a hang.
    let err = std::fs::read(expiring.path("e")).unwrap_err();
    let errno = errno_of(&err);
    assert!(errno == "EACCES" || errno == "EIO", "{err}");
}

#[test]
fn a_capability_the_engine_does_not_trust_stops_the_worker_at_start() {
    if !can_mount() {
        return;
    }
    let backing = EngineBacking::start();
    let vol = &backing.volume;
    let stranger = AgentKey::generate().unwrap();
    let cap = vol.capability_by(&stranger, Rights::READ_WRITE, Duration::from_secs(600));
    let file = vol.write_capability("stranger", &cap);
    let mnt = tempdir("dpufs-mnt-");
    let state = tempdir("dpufs-state-");
    let out = Command::new(worker_bin())
        .arg("worker")
        .args(vol.worker_args(&file))
        .arg("--mountpoint")
        .arg(mnt.path())
        .arg("--state-dir")
        .arg(state.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(!common::is_fuse_mount(mnt.path()), "nothing stays mounted");
}

/// The provider is chosen at run time. A build without the `rdma` feature (this one) asked for
/// `verbs` says so and mounts nothing; the same worker on `soft` serves (the tests above).
#[test]
fn the_verbs_provider_is_chosen_at_run_time_and_says_when_it_is_not_built() {
    if !can_mount() {
        return;
    }
    let backing = EngineBacking::start();
    let vol = &backing.volume;
    let cap = vol.capability_by(&vol.agent, Rights::READ_WRITE, Duration::from_secs(600));
    let file = vol.write_capability("verbs", &cap);
    let mnt = tempdir("dpufs-mnt-");
    let state = tempdir("dpufs-state-");
    let out = Command::new(worker_bin())
        .arg("worker")
        .args(vol.worker_args(&file))
        .args(["--fabric-provider", "verbs", "--mountpoint"])
        .arg(mnt.path())
        .arg("--state-dir")
        .arg(state.path())
        .env("DPUFS_RDMA_DEVICE", "mlx5_7")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("verbs provider (device mlx5_7) is not in this build")
            && stderr.contains("--fabric-provider soft"),
        "{stderr}"
    );
    assert!(!common::is_fuse_mount(mnt.path()), "nothing stays mounted");
    let out = Command::new(worker_bin())
        .args([
            "worker",
            "--fabric-provider",
            "ucx",
            "--backend",
            "local:/tmp",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("expected soft or verbs"), "{stderr}");
}

/// How many times the worker served `op`.
fn served(w: &WorkerProc, op: &str) -> u64 {
    w.stats()["ops"][op]["count"].as_u64().unwrap_or(0)
}

#[test]
fn a_long_listing_needs_no_lookup_per_entry() {
    if !can_mount() {
        return;
    }
    let backing = EngineBacking::start();
    let w = WorkerProc::start(&backing, Opts::default());
    let dir = w.path("many");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..300u32 {
        std::fs::write(dir.join(format!("f{i}")), i.to_le_bytes()).unwrap();
    }
    // The kernel forgets the entries it cached while they were made.
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let lookups = served(&w, "lookup");
    // As `ls -l` does: list, then lstat every entry.
    let mut bytes = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        bytes += e.unwrap().metadata().unwrap().len();
    }
    assert_eq!(bytes, 300 * 4);
    assert!(served(&w, "readdirplus") > 0, "listed with attributes");
    let more = served(&w, "lookup") - lookups;
    assert!(more <= 2, "{more} lookups for 300 listed entries");
}

/// Two workers mounting one engine volume; None where nothing can be mounted.
fn two_mounts() -> Option<(EngineBacking, WorkerProc, WorkerProc)> {
    if !can_mount() {
        return None;
    }
    let backing = EngineBacking::start();
    let a = WorkerProc::start(&backing, Opts::default());
    let b = WorkerProc::start(&backing, Opts::default());
    Some((backing, a, b))
}

#[test]
fn two_mounts_of_a_multi_writer_volume_see_each_others_closed_files() {
    let Some((_backing, a, b)) = two_mounts() else {
        return;
    };
    for round in 0..5u32 {
        let body = format!("round {round} from A {}", "x".repeat(round as usize * 1000));
        // B holds fresh attributes (and pages) of the old file while A replaces it.
        let _ = std::fs::read(b.path("shared"));
        std::fs::write(a.path("shared"), &body).unwrap();
        // Close-to-open: B's open after A's close sees everything A wrote, at once.
        assert_eq!(std::fs::read_to_string(b.path("shared")).unwrap(), body);
        let reply = format!("round {round} from B, longer than A's first");
        let _ = std::fs::read(a.path("shared"));
        std::fs::write(b.path("shared"), &reply).unwrap();
        assert_eq!(std::fs::read_to_string(a.path("shared")).unwrap(), reply);
        std::fs::write(b.path(&format!("new-{round}")), b"made by B").unwrap();
        assert_eq!(
            std::fs::read(a.path(&format!("new-{round}"))).unwrap(),
            b"made by B"
        );
    }
}

#[test]
fn a_directory_opens_without_the_engine_and_one_another_mount_removed_fails_at_its_listing() {
    // A trusts its kernel's entries for an hour: the removal below cannot reach it by a lookup.
    let Some((_backing, a, b)) = two_mounts_trusting_a_for_an_hour() else {
        return;
    };
    std::fs::create_dir(a.path("d")).unwrap();
    std::fs::write(a.path("d/f"), b"x").unwrap();
    assert_eq!(std::fs::read_dir(a.path("d")).unwrap().count(), 1);
    std::fs::remove_file(b.path("d/f")).unwrap();
    std::fs::remove_dir(b.path("d")).unwrap();
    // The open is A's alone (open(2) only: opendir(3) would stat the directory as well); the
    // listing asks the engine, which no longer has the directory.
    let path = CString::new(a.path("d").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(
        fd >= 0,
        "opendir asks the engine nothing: {}",
        std::io::Error::last_os_error()
    );
    let mut buf = [0u8; 4096];
    // SAFETY: `fd` is open and `buf` is valid for its length.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    let e = std::io::Error::last_os_error();
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    assert_eq!(n, -1, "a listing of a directory that is gone");
    assert_eq!(
        errno_of(&e),
        "ESTALE",
        "the engine's answer for an object that is gone"
    );
}

fn changed_dir_answers(w: &WorkerProc) -> u64 {
    w.stats()["changed_dir_answers"].as_u64().unwrap_or(0)
}

/// Makes 20 files in and removes one from `dir` of `w`; returns how many of the kernel's
/// getattrs `w` answered from the directory attributes the changes' replies carried.
fn change_entries(w: &WorkerProc, dir: &Path) -> u64 {
    let before = changed_dir_answers(w);
    for i in 0..20u32 {
        std::fs::write(dir.join(format!("f{i}")), i.to_le_bytes()).unwrap();
    }
    std::fs::remove_file(dir.join("f0")).unwrap();
    // The kernel forgot the directory's attributes at the unlink: this asks for them.
    std::fs::metadata(dir).unwrap();
    changed_dir_answers(w) - before
}

/// What stat(2) says of `path` that the engine keeps: times and mode.
fn times_and_mode(path: &Path) -> (i64, i64, i64, i64, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    (
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        m.mode(),
    )
}

#[test]
fn the_directory_attributes_a_change_returns_answer_the_kernels_next_getattr() {
    let Some((backing, a, b)) = two_mounts() else {
        return;
    };
    std::fs::create_dir(a.path("d")).unwrap();
    let answered = change_entries(&a, &a.path("d"));
    // One per create (the next path walk checks the directory) and one after the unlink.
    assert!(answered >= 15, "{answered} getattrs answered from changes");
    // What they answered is what the engine holds: the other mount reads it afresh.
    assert_eq!(times_and_mode(&a.path("d")), times_and_mode(&b.path("d")));
    // A directory renamed after a change inside it: its new ctime, not the one that change
    // returned.
    std::fs::create_dir(a.path("d/sub")).unwrap();
    std::fs::write(a.path("d/sub/x"), b"x").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::rename(a.path("d/sub"), a.path("d/moved")).unwrap();
    assert_eq!(
        times_and_mode(&a.path("d/moved")),
        times_and_mode(&b.path("d/moved"))
    );
    // A mount that never caches attributes never answers from a change either.
    let strict = WorkerProc::start(
        &backing,
        Opts {
            args: vec!["--attr-ttl".into(), "0".into()],
            fuse_fd: None,
        },
    );
    std::fs::create_dir(strict.path("s")).unwrap();
    assert_eq!(change_entries(&strict, &strict.path("s")), 0);
}

/// A file opened for reading asks the engine nothing: one another mount removed after this
/// kernel looked it up opens, and its first read says it is gone (ESTALE). An open for
/// writing still asks, and fails at the open (ENOENT once the kernel has looked again).
#[test]
fn a_file_opens_for_reading_without_the_engine_and_one_another_mount_removed_fails_at_its_read() {
    let Some((_backing, a, b)) = two_mounts_trusting_a_for_an_hour() else {
        return;
    };
    std::fs::write(a.path("f"), b"data").unwrap();
    std::fs::write(a.path("g"), b"data").unwrap();
    assert_eq!(std::fs::read(a.path("f")).unwrap(), b"data");
    assert!(std::fs::metadata(a.path("g")).is_ok());
    std::fs::remove_file(b.path("f")).unwrap();
    std::fs::remove_file(b.path("g")).unwrap();
    let mut f = std::fs::File::open(a.path("f")).expect("a read open asks the engine nothing");
    let mut buf = Vec::new();
    let e = std::io::Read::read_to_end(&mut f, &mut buf).unwrap_err();
    assert_eq!(errno_of(&e), "ESTALE", "the engine's answer at the read");
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(a.path("g"))
        .unwrap_err();
    // The engine says ESTALE; the kernel then walks the path again, asking for the name.
    assert_eq!(errno_of(&e), "ENOENT", "an open for writing asks");
}

/// Two mounts of one engine volume, the first trusting its kernel's entries and attributes
/// for an hour (so a removal by the second cannot reach it by a lookup) and keeping no data
/// in its page cache; None where nothing can be mounted.
fn two_mounts_trusting_a_for_an_hour() -> Option<(EngineBacking, WorkerProc, WorkerProc)> {
    if !can_mount() {
        return None;
    }
    let backing = EngineBacking::start();
    let long_ttl = Opts {
        args: [
            "--entry-ttl",
            "3600",
            "--attr-ttl",
            "3600",
            "--data-cache",
            "off",
        ]
        .map(String::from)
        .to_vec(),
        fuse_fd: None,
    };
    let a = WorkerProc::start(&backing, long_ttl);
    let b = WorkerProc::start(&backing, Opts::default());
    Some((backing, a, b))
}

/// The container's free bytes, as statfs(2) through the mount reports them.
fn free_bytes(path: &Path) -> u64 {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

fn fallocate(f: &std::fs::File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// fallocate(2)'s PUNCH_HOLE through the mount gives the hole's space back to the container
/// and the hole reads as zeros with the size kept; ZERO_RANGE past the end zeros and extends.
/// Both cost what the hole's two ends hold, not its length: a punch over a 1 TiB sparse file
/// (which writing zeros would fill) returns.
#[test]
fn a_punched_hole_frees_its_space_and_reads_as_zeros() {
    if !can_mount() {
        return;
    }
    let backing = EngineBacking::start();
    let w = WorkerProc::start(&backing, uncached());
    let data = body(7);
    write_synced(&w.path("f"), &data).unwrap();
    let before = free_bytes(&w.mountpoint);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(w.path("f"))
        .unwrap();
    let (start, len) = (100_000u64, 2u64 << 20);
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&f, punch, start, len).unwrap();
    f.sync_all().unwrap();
    let freed = free_bytes(&w.mountpoint) - before;
    assert!(freed >= 1 << 20, "the punch freed {freed} bytes of {len}");
    let mut want = data.clone();
    want[start as usize..(start + len) as usize].fill(0);
    assert_eq!(std::fs::read(w.path("f")).unwrap(), want);

    let end = data.len() as u64;
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, end - 10, 4096).unwrap();
    want[end as usize - 10..].fill(0);
    want.resize(end as usize - 10 + 4096, 0);
    assert_eq!(std::fs::read(w.path("f")).unwrap(), want);

    f.set_len(1 << 40).unwrap();
    fallocate(&f, punch, 0, 1 << 40).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 40);
    f.set_len(4096).unwrap();
    assert_eq!(std::fs::read(w.path("f")).unwrap(), vec![0; 4096]);
}

/// What the worker answered "absent" by itself (docs/worker.md).
fn absent_answers(w: &WorkerProc) -> u64 {
    w.stats()["absent_answers"].as_u64().unwrap_or(0)
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// A worker's options for a single-writer volume.
fn single_writer() -> Opts {
    Opts {
        args: vec!["--access".into(), "single-writer".into()],
        fuse_fd: None,
    }
}

/// On a single-writer volume the lookups before creates in a directory the worker made are
/// answered by the worker; every name made, renamed and removed there is still found, or
/// not, as on any file system (the kernel's caches dropped before each check, so the
/// lookups reach the worker). A multi-writer volume asks the engine every time.
#[test]
fn a_single_writer_worker_answers_lookups_of_new_names_in_its_own_directories() {
    if !can_mount() {
        return;
    }
    let backing = EngineBacking::start();
    let w = WorkerProc::start(&backing, single_writer());
    let dir = w.path("made");
    std::fs::create_dir(&dir).unwrap();
    let (lookups, answered) = (served(&w, "lookup"), absent_answers(&w));
    for i in 0..100u32 {
        std::fs::write(dir.join(format!("f{i}")), i.to_le_bytes()).unwrap();
    }
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::os::unix::fs::symlink("f1", dir.join("link")).unwrap();
    assert_eq!(absent_answers(&w) - answered, 102, "one per new name");
    assert_eq!(
        served(&w, "lookup") - lookups,
        102,
        "counted as lookups too"
    );

    let drop_caches = || std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    drop_caches();
    assert_eq!(std::fs::read(dir.join("f7")).unwrap(), 7u32.to_le_bytes());
    assert_eq!(std::fs::read(dir.join("link")).unwrap(), 1u32.to_le_bytes());
    assert!(!exists(&dir.join("never")));
    std::fs::rename(dir.join("f7"), dir.join("seven")).unwrap();
    std::fs::rename(dir.join("f8"), dir.join("sub/eight")).unwrap();
    std::fs::rename(dir.join("f9"), dir.join("f9")).unwrap();
    std::fs::remove_file(dir.join("f10")).unwrap();
    drop_caches();
    assert!(!exists(&dir.join("f7")) && !exists(&dir.join("f8")));
    assert_eq!(
        std::fs::read(dir.join("seven")).unwrap(),
        7u32.to_le_bytes()
    );
    assert_eq!(
        std::fs::read(dir.join("sub/eight")).unwrap(),
        8u32.to_le_bytes()
    );
    assert!(exists(&dir.join("f9")), "renamed onto itself");
    assert!(!exists(&dir.join("f10")));
    std::fs::write(dir.join("f10"), b"again").unwrap();
    drop_caches();
    assert_eq!(std::fs::read(dir.join("f10")).unwrap(), b"again");
    let names = names_in(&dir);
    assert_eq!(names.len(), 101, "99 files, sub, link: {names:?}");

    // The volume's root was not made by this worker: its lookups go to the engine.
    let answered = absent_answers(&w);
    std::fs::write(w.path("at-root"), b"x").unwrap();
    assert_eq!(absent_answers(&w), answered);

    let multi = WorkerProc::start(&backing, Opts::default());
    std::fs::create_dir(multi.path("theirs")).unwrap();
    std::fs::write(multi.path("theirs/f"), b"x").unwrap();
    assert_eq!(absent_answers(&multi), 0);
}

fn cached_answers(w: &WorkerProc) -> u64 {
    w.stats()["cached_answers"].as_u64().unwrap_or(0)
}

/// What stat(2) says of `path`, all of it that the engine keeps.
fn stat_of(path: &Path) -> (u64, u64, u32, u32, u32, (i64, i64, i64, i64)) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    (
        m.ino(),
        m.size(),
        m.mode(),
        m.uid(),
        m.gid(),
        (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()),
    )
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// On a single-writer volume the worker keeps the names, attributes and listing ends the
/// engine gave, so once the kernel has dropped its caches the lookups, stats and the
/// listing's last read are answered without the engine; and what it answers is what the
/// engine holds, read afresh by another mount, after every kind of change the worker sends.
/// A multi-writer volume keeps nothing.
#[test]
fn a_single_writer_worker_answers_what_the_kernel_dropped_from_what_it_kept() {
    if !can_mount() {
        return;
    }
    let backing = EngineBacking::start();
    let w = WorkerProc::start(&backing, single_writer());
    let other = WorkerProc::start(&backing, Opts::default());
    let drop_caches = || std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let dir = w.path("d");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..50u32 {
        std::fs::write(dir.join(format!("f{i}")), vec![7u8; i as usize]).unwrap();
    }
    std::os::unix::fs::symlink("f1", dir.join("link")).unwrap();
    let same_as_the_engine = |name: &str| {
        assert_eq!(
            stat_of(&dir.join(name)),
            stat_of(&other.path("d").join(name)),
            "{name}: the worker's answer and the engine's"
        );
    };
    // The first lookups after the writes ask the engine (a write drops what was kept).
    drop_caches();
    for i in 0..50 {
        same_as_the_engine(&format!("f{i}"));
    }
    drop_caches();
    let (before, lookups) = (cached_answers(&w), served(&w, "lookup"));
    for i in 0..50 {
        same_as_the_engine(&format!("f{i}"));
    }
    same_as_the_engine("link");
    assert!(
        cached_answers(&w) - before >= 50,
        "{} of {} lookups answered from what was kept",
        cached_answers(&w) - before,
        served(&w, "lookup") - lookups
    );
    assert_eq!(std::fs::read(dir.join("f9")).unwrap(), vec![7u8; 9]);

    // Every kind of change, each seen afresh after the kernel dropped its caches.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("f3"))
        .unwrap()
        .write_all(b"more")
        .unwrap();
    std::fs::set_permissions(
        dir.join("f4"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    std::fs::File::options()
        .write(true)
        .open(dir.join("f5"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    std::fs::rename(dir.join("f6"), dir.join("six")).unwrap();
    std::fs::rename(dir.join("f7"), dir.join("f8")).unwrap();
    std::fs::remove_file(dir.join("f10")).unwrap();
    std::fs::File::options()
        .write(true)
        .truncate(true)
        .open(dir.join("f11"))
        .unwrap();
    let set_xattr = |p: &Path| {
        let p = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C strings and a 1-byte value.
        let r =
            unsafe { libc::setxattr(p.as_ptr(), c"user.k".as_ptr(), b"v".as_ptr().cast(), 1, 0) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    };
    set_xattr(&dir.join("f12"));
    drop_caches();
    for name in ["f3", "f4", "f5", "six", "f8", "f11", "f12", "f13"] {
        same_as_the_engine(name);
    }
    assert_eq!(std::fs::metadata(dir.join("f3")).unwrap().len(), 7);
    assert!(!exists(&dir.join("f6")) && !exists(&dir.join("f7")) && !exists(&dir.join("f10")));
    assert_eq!(std::fs::metadata(dir.join("f8")).unwrap().len(), 7, "f7's");
    assert_eq!(std::fs::metadata(&dir).unwrap().len(), 0);

    // A listing's end answered from what was kept, and dropped by a new name.
    drop_caches();
    let names = names_in(&dir);
    assert_eq!(names, names_in(&other.path("d")));
    drop_caches();
    let before = cached_answers(&w);
    assert_eq!(names_in(&dir), names);
    assert!(cached_answers(&w) > before, "the listing's end, at least");
    std::fs::write(dir.join("zz-new"), b"n").unwrap();
    std::fs::create_dir(dir.join("zz-dir")).unwrap();
    drop_caches();
    let after = names_in(&dir);
    assert_eq!(after.len(), names.len() + 2, "{after:?}");
    assert_eq!(after, names_in(&other.path("d")));
    same_as_the_engine(".");
    same_as_the_engine("zz-dir");

    // Several writers: nothing kept, every lookup asks.
    std::fs::write(other.path("o"), b"x").unwrap();
    drop_caches();
    std::fs::metadata(other.path("o")).unwrap();
    drop_caches();
    std::fs::metadata(other.path("o")).unwrap();
    assert_eq!(cached_answers(&other), 0);
}
