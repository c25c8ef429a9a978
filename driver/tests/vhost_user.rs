//! The vhost-user-fs transport with real processes and real sockets: a worker on its own
//! socket, the keeper's exports (handover of the listener, replacement after a kill, no
//! upgrade, unmount, a keeper restarted), and a QEMU guest whose worker is killed with SIGKILL
//! during a write loop (docs/worker.md, "The vhost-user-fs transport").
//!
//! The frontend of the first tests is a bare unix socket connection: the worker accepts it as
//! a frontend, and takes the next one when it goes. The guest tests need QEMU and the guest
//! assets (`dpufs_e2e::guest`); without them they print SKIPPED (a failure with
//! `DPUFS_REQUIRE_GUEST=1`).

mod common;

use common::{tempdir, wait_until, worker_bin};
use dpufs_csi::ipc::{control, keeper as client};
use dpufs_csi::keeper::Keeper;
use dpufs_e2e::guest::{Guest, GuestAssets};
use dpufs_node_api::control::{Frontend, Health};
use dpufs_node_api::keeper::{Attached, List, RecoveryAction, Reply, Request, VolumeStatus};
use dpufs_node_api::transport::{Attachment, Transport};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A `dpufs-csi keeper` child on a state directory; killed on drop.
struct KeeperProc {
    child: Child,
    state: PathBuf,
}

impl KeeperProc {
    fn start(state: &Path) -> KeeperProc {
        let child = Command::new(worker_bin())
            .args(["keeper", "--state-dir"])
            .arg(state)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn the keeper");
        let k = KeeperProc {
            child,
            state: state.to_path_buf(),
        };
        wait_until("the keeper socket", || client::list(&k.socket()).is_ok());
        k
    }

    fn socket(&self) -> PathBuf {
        Keeper::socket(&self.state)
    }

    fn ask(&self, req: &Request) -> anyhow::Result<Reply> {
        Ok(client::request(&self.socket(), req)?.0)
    }

    fn list(&self) -> List {
        client::list(&self.socket()).expect("list")
    }

    fn volume(&self, name: &str) -> VolumeStatus {
        let list = self.list();
        let v = list.volumes.iter().find(|v| v.volume == name);
        v.cloned()
            .unwrap_or_else(|| panic!("no volume {name} in {list:?}"))
    }

    /// The state directory of the worker serving `name` now.
    fn worker_dir(&self, name: &str) -> PathBuf {
        let generation = self.volume(name).generation;
        let dir = self.state.join("volumes").join(name);
        dir.join(format!("worker-{generation}"))
    }

    /// The health of the worker serving `name` now.
    fn worker_health(&self, name: &str) -> Health {
        control::health(&self.worker_dir(name).join("control.sock")).expect("the worker's health")
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for KeeperProc {
    /// Workers outlive their keeper: they are drained first.
    fn drop(&mut self) {
        if let Ok(list) = client::list(&self.socket()) {
            for v in list.volumes {
                let _ = self.ask(&Request::Unmount { volume: v.volume });
            }
        }
        self.kill9();
    }
}

fn export(volume: &str, socket: &Path) -> Request {
    Request::Export {
        volume: volume.into(),
        socket: socket.into(),
    }
}

fn serve(volume: &str, backing: &Path) -> Request {
    Request::Serve {
        volume: volume.into(),
        args: vec!["--backend".into(), format!("local:{}", backing.display())],
        binary: None,
    }
}

fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, r)| !r.starts_with('Z'))
    })
}

fn kill9(pid: u32) {
    // SAFETY: a plain kill(2) of a process this test started (through the keeper).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_until("the process to die", || !is_alive(pid));
}

/// Connects as a frontend and waits until `health` says the worker has it.
fn connect_frontend(socket: &Path, health: impl Fn() -> Health, nth: u64) -> UnixStream {
    let conn = UnixStream::connect(socket).expect("connect to the vhost-user socket");
    wait_until("the worker to take the frontend", || {
        health().frontend
            == Some(Frontend {
                connected: true,
                connections: nth,
            })
    });
    conn
}

/// `dpufs-csi worker` with `args`, run to its end (for start-up refusals).
fn worker_output(args: &[&str]) -> Output {
    Command::new(worker_bin())
        .arg("worker")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run the worker")
}

#[test]
fn a_worker_listens_takes_one_frontend_after_another_and_unlinks_its_socket_at_stop() {
    let dir = tempdir("dpufs-vhost-");
    let (data, state, socket) = (
        dir.path().join("data"),
        dir.path().join("state"),
        dir.path().join("vol.sock"),
    );
    std::fs::create_dir(&data).unwrap();
    // A stale socket file: bound, then its listener closed.
    drop(UnixListener::bind(&socket).unwrap());
    let backend = format!("local:{}", data.display());
    let mut worker = Command::new(worker_bin())
        .args([
            "worker",
            "--backend",
            &backend,
            "--transport",
            "vhost-user-fs",
        ])
        .arg("--vhost-user-socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(&state)
        .args(["--threads", "3"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the worker");
    let control_socket = state.join("control.sock");
    let health = || control::health(&control_socket).expect("health");
    wait_until("the worker to serve", || {
        control::health(&control_socket).is_ok()
    });
    let h = health();
    assert_eq!(h.info.transport, Transport::VhostUserFs);
    assert_eq!(h.info.socket.as_deref(), Some(socket.as_path()));
    assert_eq!((h.info.mountpoint, h.info.owns_mount), (None, false));
    assert_eq!((h.info.threads, h.threads_alive), (3, 3));
    assert_eq!(
        h.frontend,
        Some(Frontend {
            connected: false,
            connections: 0
        })
    );
    assert!(!h.initialized, "no guest has sent INIT");

    // A second worker on the same socket is refused: someone answers there.
    let second = worker_output(&[
        "--backend",
        &backend,
        "--transport",
        "vhost-user-fs",
        "--vhost-user-socket",
        socket.to_str().unwrap(),
        "--state-dir",
        dir.path().join("state-2").to_str().unwrap(),
    ]);
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("another process answers"), "{stderr}");

    // Its probe (does anyone answer?) was a frontend that came and went.
    let gone = |n| {
        move || {
            health().frontend
                == Some(Frontend {
                    connected: false,
                    connections: n,
                })
        }
    };
    wait_until("the probe's connection to end", gone(1));
    // One frontend, then the next once it has gone.
    let first = connect_frontend(&socket, health, 2);
    drop(first);
    wait_until("the worker to see the frontend go", gone(2));
    let _next = connect_frontend(&socket, health, 3);

    control::stop(&control_socket).expect("stop");
    let status = worker.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        !socket.exists(),
        "the worker's own socket is unlinked at stop"
    );
}

#[test]
fn transports_and_sources_must_agree() {
    let dir = tempdir("dpufs-vhost-");
    let state = dir.path().join("state");
    let backend = format!("local:{}", dir.path().display());
    let socket = dir.path().join("s.sock");
    for (args, says) in [
        (
            vec!["--vhost-user-socket", socket.to_str().unwrap()],
            "--transport fuse cannot serve what was given: that needs --transport vhost-user-fs",
        ),
        (
            vec!["--transport", "vhost-user-fs", "--mountpoint", "/mnt"],
            "--transport vhost-user-fs cannot serve what was given: that needs --transport fuse",
        ),
    ] {
        let mut all = vec![
            "--backend",
            &backend,
            "--state-dir",
            state.to_str().unwrap(),
        ];
        all.extend(args);
        let out = worker_output(&all);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{all:?}: {stderr}");
    }
    assert!(!socket.exists());
}

#[test]
fn the_keeper_exports_a_socket_its_workers_listen_on_and_replaces_a_killed_one() {
    let dir = tempdir("dpufs-vhost-keeper-");
    let (data, socket) = (dir.path().join("data"), dir.path().join("vol.sock"));
    std::fs::create_dir(&data).unwrap();
    let k = KeeperProc::start(&dir.path().join("keeper"));

    // Export: idempotent for the same path, refused for another, and a mount of the same
    // volume is refused too.
    assert_eq!(
        k.ask(&export("vol", &socket)).unwrap(),
        Reply::Exported(Attached::Now)
    );
    assert_eq!(
        k.ask(&export("vol", &socket)).unwrap(),
        Reply::Exported(Attached::Already)
    );
    let other = k
        .ask(&export("vol", &dir.path().join("other.sock")))
        .unwrap_err();
    assert!(
        other.to_string().contains(&format!(
            "volume vol is exported on vhost-user socket {}",
            socket.display()
        )),
        "{other:#}"
    );
    let mount = Request::Mount {
        volume: "vol".into(),
        mountpoint: dir.path().into(),
        fsname: None,
        read_only: None,
        allow_other: None,
    };
    assert!(k.ask(&mount).is_err());
    assert!(!dir.path().join("other.sock").exists());

    // The keeper listens (a frontend could connect before any worker serves).
    UnixStream::connect(&socket).expect("the keeper's listener takes a connection");

    // Serve: the worker takes the listener by handover.
    let Reply::Served { pid } = k.ask(&serve("vol", &data)).unwrap() else {
        panic!("serve")
    };
    let v = k.volume("vol");
    assert_eq!(
        v.attachment,
        Attachment::VhostUser {
            socket: socket.clone()
        }
    );
    assert_eq!((v.pid, v.generation), (Some(pid), 1));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.contains("--transport vhost-user-fs --keeper"),
        "{cmdline}"
    );
    let h = k.worker_health("vol");
    assert_eq!(h.info.transport, Transport::VhostUserFs);
    assert_eq!(h.info.socket.as_deref(), Some(socket.as_path()));
    // The connection made before the worker started waited in the listener's queue.
    wait_until("the worker to take the early frontend", || {
        k.worker_health("vol")
            .frontend
            .is_some_and(|f| f.connections == 1)
    });

    // Killed: the next worker listens on the same path, from the same listener.
    kill9(pid);
    wait_until("a replacement worker", || k.volume("vol").restarts == 1);
    let v = k.volume("vol");
    let next = v.pid.expect("a worker serves");
    assert_ne!(next, pid);
    assert_eq!(v.generation, 2);
    let _frontend = connect_frontend(&socket, || k.worker_health("vol"), 1);

    // No upgrade: the frontend would not set up the next worker.
    let e = k
        .ask(&Request::Upgrade {
            volume: "vol".into(),
            binary: None,
        })
        .unwrap_err();
    assert!(
        e.to_string().contains("exported over vhost-user-fs"),
        "{e:#}"
    );
    assert_eq!(k.volume("vol").pid, Some(next));

    // Unmount: the worker drains and exits, the socket goes, the volume is forgotten.
    assert_eq!(
        k.ask(&Request::Unmount {
            volume: "vol".into()
        })
        .unwrap(),
        Reply::Unmounted
    );
    assert!(!is_alive(next), "the worker was drained");
    assert!(!socket.exists(), "the export's socket is unlinked");
    assert!(k.list().volumes.is_empty());
    assert!(UnixStream::connect(&socket).is_err());
}

#[test]
fn a_worker_of_the_wrong_transport_refuses_the_handover() {
    let dir = tempdir("dpufs-vhost-keeper-");
    let socket = dir.path().join("vol.sock");
    let k = KeeperProc::start(&dir.path().join("keeper"));
    k.ask(&export("vol", &socket)).unwrap();
    let out = worker_output(&[
        "--backend",
        &format!("local:{}", dir.path().display()),
        "--keeper",
        k.socket().to_str().unwrap(),
        "--volume",
        "vol",
        "--state-dir",
        dir.path().join("w").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the keeper has volume vol exported on vhost-user socket {}: that needs \
             --transport vhost-user-fs",
            socket.display()
        )),
        "{stderr}"
    );
}

#[test]
fn a_restarted_keeper_leaves_a_served_export_alone_and_unlinks_a_dead_one() {
    let dir = tempdir("dpufs-vhost-keeper-");
    let (data, socket, state) = (
        dir.path().join("data"),
        dir.path().join("vol.sock"),
        dir.path().join("keeper"),
    );
    std::fs::create_dir(&data).unwrap();
    let mut first = KeeperProc::start(&state);
    first.ask(&export("vol", &socket)).unwrap();
    let Reply::Served { pid } = first.ask(&serve("vol", &data)).unwrap() else {
        panic!("serve")
    };
    first.kill9();
    assert!(is_alive(pid), "the worker outlives its keeper");

    let mut second = KeeperProc::start(&state);
    let notes = second.list().recovered;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].action, RecoveryAction::LeftServing);
    assert_eq!(notes[0].pid, Some(pid));
    assert!(socket.exists(), "the worker still listens there");
    second.kill9();
    kill9(pid);

    let third = KeeperProc::start(&state);
    let notes = third.list().recovered;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].action, RecoveryAction::RemovedDeadExport);
    assert_eq!(notes[0].socket.as_deref(), Some(socket.as_path()));
    assert!(!socket.exists(), "nobody listened on it: unlinked");
    assert!(third.list().volumes.is_empty());
    // And the volume can be exported and served again.
    third.ask(&export("vol", &socket)).unwrap();
    third.ask(&serve("vol", &data)).unwrap();
    let _frontend = connect_frontend(&socket, || third.worker_health("vol"), 1);
}

/// The guest's write loop: 64 KiB of random data per file, its checksum printed once written,
/// until a write fails. The device is hot-plugged after boot, so the script mounts it itself.
const WRITE_LOOP: &str = "mkdir -p /mnt/vol
until mount -t virtiofs vol /mnt/vol 2>/dev/null; do sleep 0.1; done
echo RESULT mounted=1
i=0
while true; do
  i=$((i+1))
  dd if=/dev/urandom of=/mnt/vol/f$i bs=4k count=16 2>/dev/null || { echo RESULT failed=$i; exit 1; }
  echo RESULT wrote.$i=$(sha256sum /mnt/vol/f$i | cut -c1-64)
done
";

/// How long the guest is watched after the replacement worker serves: under TCG the loop
/// writes some 20 files a second.
const WATCH: Duration = Duration::from_secs(5);

/// A few QMP commands on QEMU's monitor socket (after its greeting and `qmp_capabilities`);
/// each must answer `{"return": …}`.
fn qmp(socket: &Path, commands: &[Value]) {
    // QEMU creates the socket a moment after it starts.
    let mut conn = None;
    wait_until("QEMU's QMP socket", || {
        conn = UnixStream::connect(socket).ok();
        conn.is_some()
    });
    let conn = conn.expect("connected");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut lines = BufReader::new(conn.try_clone().unwrap()).lines();
    let mut next = || -> Value {
        let line = lines.next().expect("QMP closed").expect("QMP read");
        serde_json::from_str(&line).expect("QMP sends JSON")
    };
    assert!(next().get("QMP").is_some(), "QMP's greeting");
    let mut writer = &conn;
    for command in std::iter::once(&json!({"execute": "qmp_capabilities"})).chain(commands) {
        writeln!(writer, "{command}").unwrap();
        let answer = loop {
            let v = next();
            if v.get("event").is_none() {
                break v;
            }
        };
        assert!(
            answer.get("return").is_some(),
            "{command} answered {answer}"
        );
    }
}

/// The checksums the guest printed (`RESULT wrote.N=sha`), by file number.
fn written(output: &str) -> Vec<(u32, String)> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT wrote."))
        .filter_map(|kv| kv.split_once('='))
        .map(|(n, sha)| (n.parse().expect("a file number"), sha.to_string()))
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    openssl::sha::sha256(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the guest sees when the worker behind its virtio-fs device is killed with SIGKILL
/// during a write loop, the keeper replacing it (docs/worker.md, "Failover"), with QEMU 7.2
/// and a guest kernel 6.1: the device is hot-plugged through QMP with a chardev that does
/// not reconnect, then with one that reconnects every second (`reconnect` on the command
/// line fails: QEMU sets the device up before such a socket is connected).
///
/// Either way the guest's requests stop being answered: the write in flight and every one
/// after it wait, without an error. The replacement worker listens on the same socket; with
/// `reconnect: 0` QEMU never connects to it, with `reconnect: 1` it does within a second but
/// sends nothing (vhost-user-fs in QEMU sets a backend up only when the device starts), so
/// the replacement answers no request. What the guest wrote before the kill is all there.
#[test]
fn a_killed_worker_leaves_the_guests_requests_unanswered_with_or_without_reconnect() {
    let test = "a_killed_worker_leaves_the_guests_requests_unanswered_with_or_without_reconnect";
    let Some(assets) = GuestAssets::get(test) else {
        return;
    };
    for reconnect in [0, 1] {
        kill_under_a_guest(&assets, reconnect);
    }
}

fn kill_under_a_guest(assets: &GuestAssets, reconnect: u64) {
    let dir = tempdir("dpufs-vhost-guest-");
    let (data, socket) = (dir.path().join("data"), dir.path().join("vol.sock"));
    std::fs::create_dir(&data).unwrap();
    let k = KeeperProc::start(&dir.path().join("keeper"));
    k.ask(&export("vol", &socket)).unwrap();
    k.ask(&serve("vol", &data)).unwrap();
    let mut guest = Guest::builder(assets)
        .pcie_hotplug_slots(1)
        .script(WRITE_LOOP)
        .boot()
        .unwrap_or_else(|e| panic!("{e:#}"));
    qmp(
        guest.qmp_socket(),
        &[
            json!({"execute": "chardev-add", "arguments": {"id": "vfs", "backend": {
            "type": "socket", "data": {
                "addr": {"type": "unix", "data": {"path": socket}},
                "server": false, "reconnect": reconnect}}}}),
        ],
    );
    // A chardev that reconnects connects in the background, and the device must not be
    // added before it has (QEMU then fails to set the device up).
    wait_until("QEMU's chardev to connect to the worker", || {
        k.worker_health("vol").frontend.is_some_and(|f| f.connected)
    });
    qmp(
        guest.qmp_socket(),
        &[json!({"execute": "device_add", "arguments": {
            "driver": "vhost-user-fs-pci", "id": "vfsdev", "chardev": "vfs", "tag": "vol",
            "bus": guest.hotplug_port(0), "queue-size": 1024}})],
    );
    guest
        .wait_for_result("wrote.5", Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("reconnect {reconnect}: {e:#}"));

    let first = k.volume("vol").pid.expect("a worker serves");
    let before = written(&guest.output()).len();
    // The guest's requests went through the worker's counters, as a FUSE mount's do.
    let counted = control::stats(&k.worker_dir("vol").join("control.sock")).expect("stats");
    assert!(
        counted.bytes_written >= 5 * 65536 && counted.ops["write"].count >= 5,
        "{counted:?}"
    );
    assert!(
        k.worker_health("vol").initialized,
        "the guest's INIT was answered"
    );
    kill9(first);
    wait_until("the keeper to replace the worker", || {
        k.volume("vol").restarts == 1
    });
    let replaced = Instant::now();
    let next = k.volume("vol").pid.expect("the replacement serves");
    if reconnect > 0 {
        wait_until("QEMU to connect to the replacement", || {
            k.worker_health("vol").frontend.is_some_and(|f| f.connected)
        });
        eprintln!(
            "reconnect {reconnect}: QEMU connected to the replacement {:.1} s after it served",
            replaced.elapsed().as_secs_f64()
        );
    }
    std::thread::sleep(WATCH);

    let output = guest.output();
    let after = written(&output);
    let report = || {
        format!(
            "--- guest output\n{output}\n--- console\n{}",
            guest.console()
        )
    };
    // The write in flight at the kill may have been answered before it; none after it.
    assert!(
        after.len() <= before + 1,
        "reconnect {reconnect}: the guest went on writing ({before} files before the kill, {} \
         after)\n{}",
        after.len(),
        report()
    );
    assert!(
        !output.contains("RESULT failed="),
        "reconnect {reconnect}: a write failed instead of waiting\n{}",
        report()
    );
    let health = k.worker_health("vol");
    assert_eq!(health.info.pid, next);
    let expected = Frontend {
        connected: reconnect > 0,
        connections: u64::from(reconnect > 0),
    };
    assert_eq!(health.frontend, Some(expected), "reconnect {reconnect}");
    let stats =
        control::stats(&k.worker_dir("vol").join("control.sock")).expect("the replacement's stats");
    assert!(
        stats.ops.values().all(|op| op.count == 0),
        "reconnect {reconnect}: the replacement was sent requests: {:?}",
        stats.ops
    );
    for (n, sha) in &after {
        let on_disk = std::fs::read(data.join(format!("f{n}"))).expect("a file the guest wrote");
        assert_eq!(&sha256(&on_disk), sha, "reconnect {reconnect}: f{n}");
    }
    eprintln!(
        "reconnect {reconnect}: {before} files written when the worker was killed, {} after \
         {WATCH:?} more; the replacement (pid {next}) answered no request",
        after.len()
    );
    drop(guest);
}
