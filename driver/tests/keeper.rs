//! The mount keeper with real processes and real mounts: a worker killed with SIGKILL under
//! fio is replaced and the mount never answers ENOTCONN (and without the keeper it does); a
//! hot upgrade under fio fails no request; the saved version-1 handover is accepted by this
//! worker binary.

mod common;

use common::load::{kill9, under_load};
use common::{
    Backing, EngineBacking, KeeperMount, Opts, WorkerProc, can_mount, errno_of, fio_available,
    force_unmount, tempdir, wait_until, worker_bin,
};
use dpufs_csi::keeper::{Keeper, fdpass, request};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A `dpufs-csi keeper` child with one volume mounted; Drop unmounts and kills it.
struct KeeperProc {
    child: Child,
    socket: PathBuf,
    mountpoint: PathBuf,
    _dirs: Vec<tempfile::TempDir>,
}

impl KeeperProc {
    /// A keeper serving volume `vol-1` on `backing`, workers without a data cache (every
    /// request reaches them).
    fn start(backing: &impl Backing) -> KeeperProc {
        let state = tempdir("dpufs-keeper-");
        let mnt = tempdir("dpufs-kmnt-");
        let child = Command::new(worker_bin())
            .args(["keeper", "--state-dir"])
            .arg(state.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn the keeper");
        let socket = Keeper::socket(state.path());
        wait_until("the keeper socket", || {
            request(&socket, &json!({"op": "list"})).is_ok()
        });
        let k = KeeperProc {
            child,
            socket,
            mountpoint: mnt.path().to_path_buf(),
            _dirs: vec![state, mnt],
        };
        k.ask(json!({"op": "mount", "volume": "vol-1", "mountpoint": k.mountpoint}));
        let mut args = backing.worker_args();
        args.extend(["--data-cache".into(), "off".into()]);
        k.ask(json!({"op": "serve", "volume": "vol-1", "args": args}));
        k
    }

    fn ask(&self, req: Value) -> Value {
        request(&self.socket, &req)
            .unwrap_or_else(|e| panic!("keeper {req}: {e:#}"))
            .0
    }

    fn volume(&self) -> Value {
        self.ask(json!({"op": "list"}))["volumes"][0].clone()
    }
}

impl Drop for KeeperProc {
    fn drop(&mut self) {
        let _ = request(&self.socket, &json!({"op": "unmount", "volume": "vol-1"}));
        let _ = self.child.kill();
        let _ = self.child.wait();
        force_unmount(&self.mountpoint);
    }
}

#[test]
fn a_worker_killed_under_fio_is_replaced_and_the_mount_never_says_enotconn() {
    if !can_mount() || !fio_available() {
        return;
    }
    let backing = EngineBacking::start();
    let k = KeeperProc::start(&backing);
    let probe = k.mountpoint.join("probe");
    std::fs::write(&probe, vec![7u8; 256 << 10]).unwrap();
    let ((ok, fio_errors, report), watcher) = under_load(&k.mountpoint, &probe, 5, true, || {
        kill9(k.volume()["pid"].as_u64().unwrap());
        wait_until("a replacement worker", || k.volume()["restarts"] == 1);
    });
    let v = k.volume();
    eprintln!(
        "failover: the replacement served {} ms after the keeper saw the worker dead; \
         fio errors {fio_errors}, watcher errors {:?}",
        v["last_failover_ms"],
        watcher.errors()
    );
    assert!(ok, "fio failed: {report}");
    let errors = watcher.errors();
    assert!(!errors.contains_key("ENOTCONN"), "{errors:?}");
    // Only requests in flight at the instant of the kill may fail: one per fio job and
    // one of the watcher's, each aborted (ECONNABORTED).
    assert!(fio_errors <= 2, "fio errors {fio_errors}: {report}");
    assert!(
        errors.iter().all(|(e, n)| e == "ECONNABORTED" && *n <= 1),
        "{errors:?}"
    );
    assert_eq!(std::fs::read(&probe).unwrap(), vec![7u8; 256 << 10]);
    assert!(v["last_failover_ms"].as_f64().unwrap() > 0.0);
}

/// The same kill without the keeper: the worker owned the only descriptor, so the mount is
/// dead (what the keeper exists to prevent).
#[test]
fn without_the_keeper_a_killed_worker_leaves_enotconn() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-nokeeper-");
    let mut w = WorkerProc::start(backing.path(), Opts::default());
    std::fs::write(w.path("f"), b"x").unwrap();
    w.kill9();
    let e = std::fs::read(w.path("f")).unwrap_err();
    assert_eq!(errno_of(&e), "ENOTCONN");
}

#[test]
fn a_hot_upgrade_under_fio_fails_no_request() {
    if !can_mount() || !fio_available() {
        return;
    }
    let backing = EngineBacking::start();
    let k = KeeperProc::start(&backing);
    let probe = k.mountpoint.join("probe");
    std::fs::write(&probe, vec![9u8; 256 << 10]).unwrap();
    let before = k.volume()["pid"].as_u64().unwrap();
    let ((ok, fio_errors, report), watcher) = under_load(&k.mountpoint, &probe, 4, false, || {
        let up = k.ask(json!({"op": "upgrade", "volume": "vol-1"}));
        assert_eq!(up["previous"].as_u64(), Some(before), "{up}");
    });
    assert!(ok && fio_errors == 0, "fio errors {fio_errors}: {report}");
    assert_eq!(watcher.errors(), BTreeMap::new());
    let v = k.volume();
    assert_ne!(v["pid"].as_u64(), Some(before));
    assert_eq!(v["restarts"], 0, "{v}");
    assert_eq!(v["generation"], 2, "{v}");
}

/// This worker binary accepts the handover message a version-1 keeper sent (the saved
/// fixture): it takes a live, initialised connection and serves it without INIT.
#[test]
fn the_version_1_handover_fixture_is_accepted_by_this_worker() {
    if !can_mount() {
        return;
    }
    let backing = tempdir("dpufs-fixture-");
    let mount = KeeperMount::new();
    let state = tempdir("dpufs-fixture-state-");
    // A first worker answers INIT, then drains.
    let mut first = WorkerProc::start_at(
        backing.path(),
        &mount.mountpoint,
        &state.path().join("first"),
        Opts {
            args: vec![],
            fuse_fd: Some(mount.raw_fd()),
        },
        vec![],
    );
    std::fs::write(mount.mountpoint.join("f"), b"before").unwrap();
    first.control("stop");
    assert!(first.wait_exit().success());

    // A keeper of version 1, as far as this worker can tell: the fixture and the descriptor.
    let fixture = include_str!("fixtures/handover-v1.json");
    let socket = state.path().join("keeper.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let fd = mount.fd.as_raw_fd();
    let server = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        let (req, _) = fdpass::recv(&conn).unwrap();
        let compact: Value = serde_json::from_str(fixture).unwrap();
        fdpass::send(&conn, &compact.to_string(), Some(fd)).unwrap();
        req
    });
    let mut cmd = Command::new(worker_bin());
    cmd.arg("worker")
        .args(backing.path().worker_args())
        .arg("--keeper")
        .arg(&socket)
        .args(["--volume", "vol-1", "--state-dir"])
        .arg(state.path().join("second"))
        .env("RUST_LOG", "warn");
    let mut second = cmd.spawn().unwrap();
    let req: Value = serde_json::from_str(&server.join().unwrap()).unwrap();
    assert_eq!(req, json!({"op": "handover", "volume": "vol-1"}));
    let sock = state.path().join("second/control.sock");
    wait_until("the successor", || {
        dpufs_csi::worker::control::request(&sock, &json!({"op": "health"}))
            .is_ok_and(|h| h["state"] == "serving")
    });
    assert_eq!(
        std::fs::read(mount.mountpoint.join("f")).unwrap(),
        b"before"
    );
    let health = dpufs_csi::worker::control::request(&sock, &json!({"op": "health"})).unwrap();
    assert_eq!(
        health["initialized"], true,
        "restored from the handover: {health}"
    );
    let stats = dpufs_csi::worker::control::request(&sock, &json!({"op": "stats"})).unwrap();
    assert!(
        stats["stats"]["ops"]["init"].is_null() || stats["stats"]["ops"]["init"]["count"] == 0,
        "the successor saw no INIT: {stats}"
    );
    let _ = second.kill();
    let _ = second.wait();
}
