//! The worker process: control socket (health, stats, stop), graceful stop, SIGTERM, kill -9
//! clean-up, serving an inherited /dev/fuse descriptor as an unprivileged user and handing
//! it to a successor, and where write errors surface with and without the writeback cache.

mod common;

use common::{KeeperMount, Opts, WorkerProc, can_mount, errno_of, is_fuse_mount, tempdir};
use dpufs_csi::fuse as fusedev;
use serde_json::json;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

fn opts(args: &[&str]) -> Opts {
    Opts {
        args: args.iter().map(|s| s.to_string()).collect(),
        fuse_fd: None,
    }
}

#[test]
fn stats_reflect_the_io_done() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-w-backing-");
    // No data cache: every read and write reaches the worker, so the byte counts are exact.
    let w = WorkerProc::start(backing.path(), opts(&["--data-cache", "off"]));
    let data: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(w.path("f"), &data).unwrap();
    assert_eq!(std::fs::read(w.path("f")).unwrap(), data);
    let e = std::fs::metadata(w.path("missing")).unwrap_err();
    assert_eq!(errno_of(&e), "ENOENT");

    let s = w.stats();
    assert_eq!(s["bytes_written"], 3 << 20, "{s}");
    assert_eq!(s["bytes_read"], 3 << 20, "{s}");
    assert_eq!(s["ops"]["create"]["count"], 1, "{s}");
    let writes = s["ops"]["write"]["count"].as_u64().unwrap();
    assert!(writes >= 3, "1 MiB requests at most: {s}");
    let in_histogram: u64 = s["ops"]["write"]["histogram_us"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[1].as_u64().unwrap())
        .sum();
    assert_eq!(
        in_histogram, writes,
        "every write is in the latency histogram"
    );
    let (p50, p99) = (
        s["ops"]["write"]["p50_us"].as_u64().unwrap(),
        s["ops"]["write"]["p99_us"].as_u64().unwrap(),
    );
    assert!(p50 <= p99);
    assert!(s["ops"]["read"]["count"].as_u64().unwrap() >= 3, "{s}");
    assert!(s["ops"]["lookup"]["errors"].as_u64().unwrap() >= 1, "{s}");
    assert!(s["errors"]["ENOENT"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["transport_errors"], 0, "{s}");

    let h = w.control("health");
    assert_eq!(h["ok"], true);
    assert_eq!(h["state"], "serving");
    assert_eq!(h["initialized"], true);
    assert_eq!(h["owns_mount"], true);
    assert_eq!(h["pid"], w.pid());
    assert_eq!(h["data_cache"], false);

    // Bad requests get an answer, not a hang-up.
    let sock = w.state_dir.join("control.sock");
    let v = common::control_raw(&sock, &json!({"op": "dance"})).unwrap();
    assert_eq!(v["ok"], false);
    let v = common::control_raw(&sock, &json!({"no": "op"})).unwrap();
    assert_eq!(v["ok"], false);

    // The negotiated session is on record for a successor.
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.state_dir.join("session.json")).unwrap()).unwrap();
    assert!(rec["enabled_names"].as_str().unwrap().contains("ASYNC_DIO"));
    assert!(
        rec["enabled_names"]
            .as_str()
            .unwrap()
            .contains("PARALLEL_DIROPS")
    );
}

#[test]
fn graceful_stop_unmounts_and_exits_zero() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-w-backing-");
    let mut w = WorkerProc::start(backing.path(), Default::default());
    std::fs::write(w.path("kept"), b"still there").unwrap();
    assert!(is_fuse_mount(&w.mountpoint));
    let v = w.control("stop");
    assert_eq!(v, json!({"ok": true, "state": "stopping"}));
    let st = w.wait_exit();
    assert!(st.success(), "exit status {st}");
    assert!(!is_fuse_mount(&w.mountpoint), "the mount is gone");
    assert!(!w.state_dir.join("control.sock").exists());
    assert!(!w.state_dir.join("worker.json").exists());
    assert_eq!(
        std::fs::read(backing.path().join("kept")).unwrap(),
        b"still there"
    );
}

#[test]
fn stop_while_busy_detaches_and_serves_open_files_until_closed() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-w-backing-");
    let mut w = WorkerProc::start(backing.path(), Default::default());
    std::fs::write(w.path("open"), b"0123456789").unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(w.path("open"))
        .unwrap();
    w.control("stop");
    common::wait_until("the busy mount to be detached", || {
        !is_fuse_mount(&w.mountpoint)
    });
    // Detached from the namespace, but the open file is still served.
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 4];
    f.read_exact_at(&mut buf, 2).unwrap();
    assert_eq!(&buf, b"2345");
    f.write_all_at(b"AB", 0).unwrap();
    f.sync_all().unwrap();
    assert!(w.child.try_wait().unwrap().is_none(), "still serving");
    drop(f);
    let st = w.wait_exit();
    assert!(st.success(), "exit status {st}");
    assert_eq!(
        std::fs::read(backing.path().join("open")).unwrap(),
        b"AB23456789"
    );
}

#[test]
fn sigterm_stops_gracefully() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-w-backing-");
    let mut w = WorkerProc::start(backing.path(), Default::default());
    std::fs::write(w.path("f"), b"x").unwrap();
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(w.pid() as i32, libc::SIGTERM) }, 0);
    let st = w.wait_exit();
    assert!(st.success(), "exit status {st}");
    assert!(!is_fuse_mount(&w.mountpoint));
}

#[test]
fn a_killed_worker_leaves_a_dead_mount_that_cleanup_removes() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-w-backing-");
    let mut w = WorkerProc::start(backing.path(), Default::default());
    std::fs::write(w.path("f"), b"x").unwrap();
    w.kill9();
    // The worker held the only descriptors of the connection: the kernel ended it, so calls
    // fail at once instead of hanging.
    // (A new name, so nothing can come from the kernel's caches.)
    let e = std::fs::File::create(w.path("new")).unwrap_err();
    assert_eq!(errno_of(&e), "ENOTCONN");
    assert!(is_fuse_mount(&w.mountpoint), "a dead mount is left behind");
    common::force_unmount(&w.mountpoint);
    assert!(!is_fuse_mount(&w.mountpoint));
}

fn proc_status(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap()
}

fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("{name} in /proc status"))
        .trim()
}

fn read_ahead_kb(mountpoint: &Path) -> u32 {
    let m = fusedev::find_mount(mountpoint).unwrap().unwrap();
    std::fs::read_to_string(format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        m.dev.0, m.dev.1
    ))
    .unwrap()
    .trim()
    .parse()
    .unwrap()
}

fn sh_as(uid: u32, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn serves_a_handed_fd_unprivileged_and_hands_it_to_a_successor() {
    if !can_mount() {
        return;
    }
    const NOBODY: u32 = 65534;
    let backing = tempdir("dpufs-w-backing-");
    std::os::unix::fs::chown(backing.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    // The test is the mount keeper: it mounts, holds the master descriptor, never reads it.
    let keeper = KeeperMount::new();
    let state = tempdir("dpufs-w-state-");
    let start = |args: &[&str]| {
        WorkerProc::start_at(
            backing.path(),
            &keeper.mountpoint,
            state.path(),
            Opts {
                args: args.iter().map(|s| s.to_string()).collect(),
                fuse_fd: Some(keeper.raw_fd()),
            },
            vec![],
        )
    };
    let mut a = start(&["--uid", "65534", "--gid", "65534"]);

    // It runs as nobody with no capabilities and cannot gain any.
    let st = proc_status(a.pid());
    assert_eq!(status_field(&st, "Uid:"), "65534\t65534\t65534\t65534");
    assert_eq!(status_field(&st, "Gid:"), "65534\t65534\t65534\t65534");
    assert_eq!(status_field(&st, "CapEff:"), "0000000000000000");
    assert_eq!(status_field(&st, "CapPrm:"), "0000000000000000");
    assert_eq!(status_field(&st, "NoNewPrivs:"), "1");
    assert_eq!(status_field(&st, "Groups:"), "");

    let mp = keeper.mountpoint.display().to_string();
    assert_eq!(
        sh_as(NOBODY, &format!("echo hello > {mp}/f && cat {mp}/f")),
        "hello\n"
    );
    assert_eq!(
        std::fs::metadata(backing.path().join("f")).unwrap().uid(),
        NOBODY
    );
    // Root reads through the unprivileged worker too.
    assert_eq!(
        std::fs::read(keeper.mountpoint.join("f")).unwrap(),
        b"hello\n"
    );
    // The readahead was raised after INIT, through the attribute opened before the drop.
    assert_eq!(read_ahead_kb(&keeper.mountpoint), 1024);
    let h = a.control("health");
    assert_eq!(h["uid"], NOBODY);
    assert_eq!(h["owns_mount"], false);
    assert_eq!(h["initialized"], true);

    // Stop: drain and exit; the mount stays, held by the keeper.
    a.control("stop");
    assert!(a.wait_exit().success());
    assert!(
        is_fuse_mount(&keeper.mountpoint),
        "the keeper keeps the mount"
    );
    assert!(
        state.path().join("session.json").exists(),
        "the session record outlives the worker"
    );

    // A successor serves the same, already initialised connection: no new INIT.
    let mut b = start(&[]);
    assert_eq!(b.control("health")["initialized"], false);
    assert_eq!(
        std::fs::read(keeper.mountpoint.join("f")).unwrap(),
        b"hello\n"
    );
    std::fs::write(keeper.mountpoint.join("g"), b"from b").unwrap();
    assert_eq!(std::fs::read(backing.path().join("g")).unwrap(), b"from b");
    b.control("stop");
    assert!(b.wait_exit().success());
    assert!(is_fuse_mount(&keeper.mountpoint));
    drop(keeper);
}

#[test]
fn refuses_unsafe_combinations() {
    let backing = tempdir("dpufs-w-backing-");
    let state = tempdir("dpufs-w-state-");
    let run = |args: &[&str]| {
        let out = Command::new(common::worker_bin())
            .arg("worker")
            .arg(format!("--backend=local:{}", backing.path().display()))
            .arg(format!("--state-dir={}", state.path().display()))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--mountpoint=/nonexistent", "--uid=1", "--gid=1"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--fuse-fd"), "{err}");
    let (code, err) = run(&["--mountpoint=/nonexistent", "--writeback-cache"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("single-writer"), "{err}");
    let (code, err) = run(&["--fuse-fd=0", "--threads=1"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not /dev/fuse"), "{err}");
}

fn write_4m(path: &Path) -> (std::fs::File, std::io::Result<()>) {
    let mut f = std::fs::File::create(path).unwrap();
    let r = f.write_all(&vec![7u8; 4 << 20]);
    (f, r)
}

fn close(f: std::fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    // SAFETY: we own the descriptor.
    if unsafe { libc::close(f.into_raw_fd()) } < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[test]
fn write_errors_surface_at_write_without_and_at_fsync_or_close_with_writeback_cache() {
    if !can_mount() {
        return;
    }
    // Without the writeback cache, write(2) itself reports ENOSPC.
    {
        let space = common::Tmpfs::new("1m");
        let w = WorkerProc::start(space.path.as_path(), Default::default());
        let (_f, r) = write_4m(&w.path("f"));
        assert_eq!(errno_of(&r.unwrap_err()), "ENOSPC");
    }
    // With it (single-writer volumes only), writes land in the page cache and succeed; the
    // error comes back at fsync ...
    {
        let space = common::Tmpfs::new("1m");
        let args = opts(&["--access", "single-writer", "--writeback-cache"]);
        let w = WorkerProc::start(space.path.as_path(), args);
        let (f, r) = write_4m(&w.path("f"));
        r.expect("a cached write succeeds");
        assert_eq!(errno_of(&f.sync_all().unwrap_err()), "ENOSPC");
        let enabled = serde_json::from_slice::<serde_json::Value>(
            &std::fs::read(w.state_dir.join("session.json")).unwrap(),
        )
        .unwrap()["enabled_names"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(enabled.contains("WRITEBACK_CACHE"), "{enabled}");
        // ... or at close.
        std::fs::remove_file(w.path("f")).unwrap();
        let (f, r) = write_4m(&w.path("g"));
        r.expect("a cached write succeeds");
        assert_eq!(errno_of(&close(f).unwrap_err()), "ENOSPC");
    }
}

#[test]
fn a_stopped_worker_drains_and_a_successor_serves_queued_requests_without_errors() {
    if !can_mount() {
        return;
    }
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let backing = tempdir("dpufs-w-backing-");
    let keeper = KeeperMount::new();
    let state = tempdir("dpufs-w-state-");
    let start = || {
        WorkerProc::start_at(
            backing.path(),
            &keeper.mountpoint,
            state.path(),
            Opts {
                args: vec!["--data-cache".into(), "off".into()],
                fuse_fd: Some(keeper.raw_fd()),
            },
            vec![],
        )
    };
    let mut a = start();
    let (r, w) = (keeper.mountpoint.join("r"), keeper.mountpoint.join("w"));
    std::fs::write(&r, vec![5u8; 64 << 10]).unwrap();
    std::fs::write(&w, b"").unwrap();
    xattr::set(&r, "user.k", b"v").unwrap();
    let done = AtomicBool::new(false);
    let (reads, appends, errors) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let last = AtomicU64::new(0);
    // The successor outlives the load threads: a request nobody serves would block forever.
    let mut successor = None;
    std::thread::scope(|s| {
        // If anything below panics, stop the load and abort the connection, or the scope
        // would wait forever for threads blocked on a mount nobody serves.
        struct OnPanic<'a>(&'a AtomicBool, &'a Path);
        impl Drop for OnPanic<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(true, Ordering::Release);
                    common::force_unmount(self.1);
                }
            }
        }
        let _guard = OnPanic(&done, &keeper.mountpoint);
        // The load is made of path-based calls, each one system call, so no request depends
        // on the worker that answered an earlier one. (A descriptor opened under one worker
        // and used under the next needs object ids the successor's backend still knows:
        // the engine's are; LocalDfs's are not, see docs/worker.md.)
        s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                let ok = std::fs::metadata(&r).map(|m| m.len() == 64 << 10);
                let x = xattr::get(&r, "user.k");
                match (ok, x) {
                    (Ok(true), Ok(v)) if v == b"v" => reads.fetch_add(1, Ordering::Relaxed),
                    other => {
                        eprintln!("read: {other:?}");
                        errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        });
        s.spawn(|| {
            let mut i = 0u64;
            while !done.load(Ordering::Acquire) {
                i += 1;
                let r = truncate(&w, i).and_then(|()| xattr::set(&w, "user.n", &i.to_le_bytes()));
                match r {
                    Ok(()) => {
                        last.store(i, Ordering::Relaxed);
                        appends.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(e) => {
                        eprintln!("write: {e}");
                        errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        });
        common::wait_until("load on the first worker", || {
            reads.load(Ordering::Relaxed) > 20 && appends.load(Ordering::Relaxed) > 20
        });
        a.control("stop");
        assert!(a.wait_exit().success());
        let before = reads.load(Ordering::Relaxed) + appends.load(Ordering::Relaxed);
        successor = Some(start());
        common::wait_until("load on the successor", || {
            reads.load(Ordering::Relaxed) + appends.load(Ordering::Relaxed) > before + 40
        });
        done.store(true, Ordering::Release);
    });
    let served = successor.as_ref().unwrap().stats();
    assert!(
        served["ops"]["setxattr"]["count"].as_u64().unwrap() > 0,
        "{served}"
    );
    assert_eq!(served["transport_errors"], 0, "{served}");
    drop(successor);
    assert_eq!(errors.load(Ordering::Relaxed), 0, "no request failed");
    let last = last.load(Ordering::Relaxed);
    let back = backing.path().join("w");
    assert_eq!(
        std::fs::metadata(&back).unwrap().len(),
        last,
        "the last write is there"
    );
    assert_eq!(xattr::get(&back, "user.n").unwrap(), last.to_le_bytes());
}

fn truncate(p: &Path, len: u64) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::truncate(c.as_ptr(), len as i64) } < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Path-based extended attributes.
mod xattr {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn c(s: &[u8]) -> CString {
        CString::new(s).unwrap()
    }

    pub fn set(p: &Path, name: &str, v: &[u8]) -> std::io::Result<()> {
        let (p, n) = (c(p.as_os_str().as_bytes()), c(name.as_bytes()));
        // SAFETY: valid strings and buffer.
        let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    pub fn get(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
        let (p, n) = (c(p.as_os_str().as_bytes()), c(name.as_bytes()));
        let mut buf = vec![0u8; 256];
        // SAFETY: valid strings and buffer.
        let r =
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        buf.truncate(r as usize);
        Ok(buf)
    }
}

/// File capabilities are not supported: the kernel's per-write check for them is answered by
/// the worker, and setting one fails clearly.
#[test]
fn file_capabilities_are_refused_and_answered_without_the_backend() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-w-backing-");
    let w = WorkerProc::start(backing.path(), Default::default());
    std::fs::write(w.path("f"), b"x").unwrap();
    let path = CString::new(w.path("f").as_os_str().as_bytes()).unwrap();
    // A version-2 capability set with no capabilities: well formed.
    let value = [0u8, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"security.capability".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(errno_of(&std::io::Error::last_os_error()), "EOPNOTSUPP");
    let mut buf = [0u8; 64];
    // SAFETY: as above.
    let r = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"security.capability".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(r, -1);
    assert_eq!(errno_of(&std::io::Error::last_os_error()), "ENODATA");
    // Other attributes still reach the backend.
    xattr_roundtrip(&path, c"user.kept");
}

fn xattr_roundtrip(path: &CString, name: &std::ffi::CStr) {
    // SAFETY: valid NUL-terminated strings and buffers of the given lengths.
    unsafe {
        assert_eq!(
            libc::setxattr(path.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0),
            0
        );
        let mut buf = [0u8; 8];
        assert_eq!(
            libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 8),
            1
        );
    }
}
