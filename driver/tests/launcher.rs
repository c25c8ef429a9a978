//! Mounts that outlive the node plugin: the launcher runs the way a container does — in a
//! cgroup of its own and, for the plugin's restarts, as PID 1 of its own PID namespace
//! (`unshare --pid --fork`) — and is killed the way a container restart kills: its PID 1
//! gets SIGKILL (the kernel then kills the whole namespace) and every process left in its
//! cgroup is killed. fio on the mount must not notice; the next launcher re-adopts the worker.
//! Without the escape, the same kill takes the mount with it, and the next keeper cleans up.

mod common;

use common::load::under_load;
use common::{
    can_mount, errno_of, fio_available, force_unmount, keeper_request as request, tempdir,
    wait_until, worker_bin,
};
use dpufs_csi::keeper::{Keeper, placement};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

/// A cgroup standing in for a container's: what runs in it is killed together.
struct ContainerCgroup {
    dir: PathBuf,
}

impl ContainerCgroup {
    /// A fresh cgroup in the first hierarchy that takes one (None without cgroups).
    fn new() -> Option<ContainerCgroup> {
        let name = format!("dpufs-test-{}-{}", std::process::id(), rand_suffix());
        let made = placement::cgroup_roots()
            .unwrap()
            .into_iter()
            .map(|root| root.join(&name))
            .find(|dir| std::fs::create_dir(dir).is_ok())
            .map(|dir| ContainerCgroup { dir });
        dpufs_e2e::skip::host_has(made.is_some(), "no cgroup hierarchy to run the launcher in");
        made
    }

    /// Makes `cmd` start inside the cgroup.
    fn run_inside(&self, cmd: &mut Command) {
        let procs = self.dir.join("cgroup.procs");
        // SAFETY: only open/write/close (async-signal-safe) between fork and exec.
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, "0"));
        }
    }

    fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    }

    /// What a container runtime does on restart: SIGKILL everything in the cgroup until
    /// nothing is left.
    fn kill_all(&self) {
        wait_until("the container's cgroup to empty", || {
            let procs = self.procs();
            for pid in &procs {
                // SAFETY: plain kill(2).
                unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
            }
            procs.is_empty()
        });
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        self.kill_all();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}

fn unshare_available() -> bool {
    let ok = Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success());
    dpufs_e2e::skip::host_has(ok, "`unshare --pid --fork` does not work here")
}

/// A running `dpufs-csi launcher` and what it printed up to "launcher ready".
struct LauncherProc {
    child: Child,
    lines: Vec<String>,
    /// Its pid as seen from here.
    pid: u32,
}

impl LauncherProc {
    fn line_with(&self, text: &str) -> &str {
        self.lines
            .iter()
            .find(|l| l.contains(text))
            .unwrap_or_else(|| panic!("no line with {text:?} in {:?}", self.lines))
    }

    /// The number after `prefix` in its line.
    fn number_after(&self, prefix: &str) -> u32 {
        let line = self.line_with(prefix);
        let rest = &line[line.find(prefix).unwrap() + prefix.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    }
}

/// The launcher's command: in its own PID namespace when `own_pid_ns`.
fn launcher_cmd(own_pid_ns: bool, state: &Path, start: &str, volume: Option<&Volume>) -> Command {
    let mut cmd = if own_pid_ns {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--"]).arg(worker_bin());
        c
    } else {
        Command::new(worker_bin())
    };
    cmd.arg("launcher")
        .arg("--state-dir")
        .arg(state)
        .args(["--keeper-start", start])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if let Some(v) = volume {
        cmd.arg("--volume")
            .arg(format!("vol={}", v.mountpoint.display()))
            .arg("--")
            .args(["--backend", &format!("local:{}", v.data.display())])
            .args(["--data-cache", "off"]);
    }
    cmd
}

/// Starts the launcher in `cgroup` and reads its output until it is ready.
fn launch(cgroup: &ContainerCgroup, mut cmd: Command) -> LauncherProc {
    cgroup.run_inside(&mut cmd);
    let mut child = cmd.spawn().expect("start the launcher");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while lines.last().is_none_or(|l: &String| l != "launcher ready") {
        match rx.recv_timeout(common::DEADLINE) {
            Ok(line) => lines.push(line),
            Err(_) => panic!(
                "the launcher did not get ready ({:?}); it said {lines:?}",
                child.try_wait()
            ),
        }
    }
    let mut l = LauncherProc {
        child,
        lines,
        pid: 0,
    };
    l.pid = l.number_after("launcher pid ");
    l
}

/// A volume on a local directory.
struct Volume {
    mountpoint: PathBuf,
    data: PathBuf,
    _dirs: [tempfile::TempDir; 2],
}

impl Volume {
    fn new() -> Volume {
        let mnt = tempdir("dpufs-lmnt-");
        let data = tempdir("dpufs-ldata-");
        Volume {
            mountpoint: mnt.path().to_path_buf(),
            data: data.path().to_path_buf(),
            _dirs: [mnt, data],
        }
    }
}

/// One test's node: the keeper's state directory, a volume and the container's cgroup.
/// When the test ends, however it ends, the keeper unmounts the volume and is killed.
struct Node {
    state: tempfile::TempDir,
    vol: Volume,
    container: ContainerCgroup,
}

impl Node {
    fn new() -> Option<Node> {
        Some(Node {
            state: tempdir("dpufs-lstate-"),
            vol: Volume::new(),
            container: ContainerCgroup::new()?,
        })
    }

    fn launcher(&self, own_pid_ns: bool, start: &str, with_volume: bool) -> Command {
        launcher_cmd(
            own_pid_ns,
            self.state.path(),
            start,
            with_volume.then_some(&self.vol),
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let socket = Keeper::socket(self.state.path());
        let _ = request(&socket, &json!({"op": "unmount", "volume": "vol"}));
        if let Ok((list, _)) = request(&socket, &json!({"op": "list"}))
            && let Some(pid) = list["pid"].as_i64()
        {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        force_unmount(&self.vol.mountpoint);
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, r)| !r.starts_with('Z'))
    })
}

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(") ").unwrap().1;
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Kills the container: SIGKILL to its PID namespace's init (the kernel kills the rest of
/// the namespace), then whatever its cgroup still holds.
fn kill_container(launcher: &mut LauncherProc, cgroup: &ContainerCgroup) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(launcher.pid as i32, libc::SIGKILL) };
    cgroup.kill_all();
    let _ = launcher.child.wait();
}

#[test]
fn a_killed_plugin_namespace_and_cgroup_leave_the_mount_serving_and_the_next_launcher_adopts_it() {
    if !can_mount() || !fio_available() || !unshare_available() {
        return;
    }
    let Some(node) = Node::new() else {
        return;
    };
    let (vol, container) = (&node.vol, &node.container);

    // A plugin with hostPID starts the node's keeper: detached, in its own cgroups.
    let mut first = launch(container, node.launcher(false, "detach", false));
    let keeper = first.number_after("keeper pid ");
    first.line_with("started (Detach)");
    assert!(
        !container.procs().contains(&keeper),
        "the keeper left the container's cgroup"
    );
    assert_ne!(parent_of(keeper), first.pid, "the keeper is nobody's child");
    kill_container(&mut first, container);
    assert!(alive(keeper), "the keeper outlived its launcher's cgroup");

    // The plugin restarted as PID 1 of its own PID namespace: it adopts the keeper, which
    // mounts the volume and starts its worker — outside the namespace and the cgroup.
    let mut second = launch(container, node.launcher(true, "never", true));
    second.line_with("(1 in its PID namespace)");
    assert_eq!(second.number_after("keeper pid "), keeper);
    let worker = second.number_after("worker pid ");
    second.line_with(&format!("worker pid {worker} started"));
    assert!(!container.procs().contains(&worker));
    assert_eq!(
        placement::ns_pids(&worker.to_string()).unwrap().len(),
        1,
        "worker in the host PID namespace"
    );

    let probe = vol.mountpoint.join("probe");
    std::fs::write(&probe, vec![5u8; 128 << 10]).unwrap();
    let ((ok, fio_errors, report), watcher) = under_load(&vol.mountpoint, &probe, 5, false, || {
        kill_container(&mut second, container);
        assert!(!alive(second.pid), "the namespace's init is dead");
    });
    assert!(ok && fio_errors == 0, "fio errors {fio_errors}: {report}");
    assert_eq!(watcher.errors(), BTreeMap::new());
    assert!(alive(worker) && alive(keeper));

    // The next plugin finds the same worker serving and adopts it.
    let mut third = launch(container, node.launcher(true, "never", true));
    assert_eq!(third.number_after("keeper pid "), keeper);
    third.line_with(&format!("worker pid {worker} adopted (generation 1)"));
    assert_eq!(std::fs::read(&probe).unwrap(), vec![5u8; 128 << 10]);
    kill_container(&mut third, container);
}

#[test]
fn without_the_escape_the_namespace_takes_the_mount_and_the_next_keeper_cleans_up() {
    if !can_mount() || !unshare_available() {
        return;
    }
    let Some(node) = Node::new() else {
        return;
    };
    let (vol, container) = (&node.vol, &node.container);

    // In a PID namespace of its own, a launcher refuses to start a keeper that would die
    // with it...
    let refusing = node
        .launcher(true, "auto", true)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = refusing.id();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(common::DEADLINE);
        // SAFETY: plain kill(2); a launcher that did not refuse would wait forever.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let refused = refusing.wait_with_output().unwrap();
    drop(watchdog);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("PID namespace") && stderr.contains("hostPID"),
        "{stderr}"
    );

    // ... unless told to: then the keeper and the worker are inside, and die with it.
    let mut inside = launch(container, node.launcher(true, "child", true));
    inside.line_with("started (Child)");
    std::fs::write(vol.mountpoint.join("kept"), b"on the backing store").unwrap();
    kill_container(&mut inside, container);
    assert!(
        request(&Keeper::socket(node.state.path()), &json!({"op": "list"})).is_err(),
        "the keeper died with the namespace"
    );
    let dead = std::fs::read(vol.mountpoint.join("kept")).unwrap_err();
    assert_eq!(errno_of(&dead), "ENOTCONN");

    // The next keeper detaches the dead mount, drops its stale state, and serves again.
    let mut next = launch(container, node.launcher(false, "detach", true));
    next.line_with("detached the dead mount");
    assert!(
        next.line_with(": worker pid").ends_with("started"),
        "{:?}",
        next.lines
    );
    wait_until("the volume served again", || {
        std::fs::read(vol.mountpoint.join("kept")).is_ok()
    });
    assert_eq!(
        std::fs::read(vol.mountpoint.join("kept")).unwrap(),
        b"on the backing store"
    );
    kill_container(&mut next, container);
}
