// Over 600 lines: every verb of the binary end to end against one engine fixture.
//! The `dpufs` binary as a user runs it, against a real `dpufs-engine`
//! process over real TCP. Results are checked through `--json`; errors by
//! exit code and DAOS's own words on stderr.

use dpufs_e2e::{EngineOpts, EngineProcess, kill9};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

const DPUFS: &str = env!("CARGO_BIN_EXE_dpufs");

/// What one `dpufs` run did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The JSON on stdout of a successful run.
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "dpufs failed: {}", self.stderr);
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }

    /// Asserts success.
    fn succeeds(&self) {
        assert_eq!(self.code, 0, "dpufs failed: {}", self.stderr);
    }

    /// Asserts a DAOS (or input) error: exit code 1 and `text` on stderr.
    fn fails_with(&self, text: &str) {
        assert_eq!(
            self.code, 1,
            "expected exit 1; stdout {} stderr {}",
            self.stdout, self.stderr
        );
        assert!(self.stderr.starts_with("error: "), "{}", self.stderr);
        assert!(
            self.stderr.contains(text),
            "{text:?} not in {}",
            self.stderr
        );
    }
}

/// Runs `dpufs` in `cwd`, with no endpoint or system from the environment.
fn dpufs_in(cwd: &Path, args: &[&str]) -> Run {
    let out = Command::new(DPUFS)
        .args(args)
        .current_dir(cwd)
        .env_remove("DPUFS_ENDPOINT")
        .env_remove("DPUFS_SYSTEM")
        .output()
        .expect("running dpufs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// A `dpufs-engine` on a free loopback port with its data in a tempdir;
/// killed when dropped (the e2e harness's process).
struct Engine {
    _process: EngineProcess,
    addr: String,
    dir: tempfile::TempDir,
}

impl Engine {
    fn start(ranks: u32) -> Engine {
        let dir = tempfile::tempdir().unwrap();
        let opts = EngineOpts {
            ranks,
            ..Default::default()
        };
        let process = EngineProcess::start(&dir.path().join("engine"), opts).unwrap();
        Engine {
            addr: process.addr.clone(),
            _process: process,
            dir,
        }
    }

    fn dpufs(&self, args: &[&str]) -> Run {
        let mut all = vec!["--insecure", "--endpoint", &self.addr];
        all.extend_from_slice(args);
        dpufs_in(self.dir.path(), &all)
    }

    /// Runs with `--json` and returns the parsed output of a successful run.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        self.dpufs(&all).json()
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

fn labels(pools: &Value) -> Vec<&str> {
    pools
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["label"].as_str().unwrap())
        .collect()
}

fn entries(acl: &Value) -> Vec<&str> {
    acl["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect()
}

#[test]
fn pool_lifecycle() {
    let e = Engine::start(1);
    let created = e.json(&[
        "pool",
        "create",
        "tank",
        "--size",
        "1G",
        "--properties",
        "reclaim:time",
    ]);
    let uuid = created["uuid"].as_str().unwrap().to_string();
    assert_eq!(created["target_ranks"], json!([0]));
    let per_rank: u64 = created["tier_bytes_per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert!(((1 << 30) - 2..=1 << 30).contains(&per_rank), "{created}");

    assert_eq!(labels(&e.json(&["pool", "list"])), ["tank"]);
    let human = e.dpufs(&["pool", "list"]);
    assert!(
        human.stdout.starts_with("Pool ") && human.stdout.contains(&uuid),
        "{}",
        human.stdout
    );

    let info = e.json(&["pool", "query", &uuid]);
    assert_eq!(info["label"], "tank");
    assert_eq!(info["state"], "Ready");
    assert_eq!(info["disabled_targets"], 0);

    e.json(&["pool", "set-prop", "tank", "space_rb:10,self_heal:exclude"]);
    let props = e.json(&[
        "pool",
        "get-prop",
        "tank",
        "space_rb",
        "self_heal",
        "reclaim",
    ]);
    let values: Vec<(&str, &str)> = props
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["value"].as_str().unwrap()))
        .collect();
    assert_eq!(
        values,
        [
            ("space_rb", "10"),
            ("self_heal", "exclude"),
            ("reclaim", "time")
        ]
    );
    let all = e.json(&["pool", "get-prop", "tank"]);
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"label") && names.contains(&"svc_list"),
        "{names:?}"
    );
    assert!(!names.contains(&"global_version"), "{names:?}");
    e.dpufs(&["pool", "set-prop", "tank", "svc_rf:1"])
        .fails_with("can only be set at create");

    let acl = e.json(&["pool", "update-acl", "tank", "-e", "A::alice@:rw"]);
    assert!(entries(&acl).contains(&"A::alice@:rw"));
    assert!(entries(&e.json(&["pool", "get-acl", "tank"])).contains(&"A::alice@:rw"));
    let acl = e.json(&["pool", "delete-acl", "tank", "-p", "u:alice@"]);
    assert!(!entries(&acl).contains(&"A::alice@:rw"));
    let file = e.file("acl", "# replaced\nA::OWNER@:rw\nA::bob@:r\n");
    let acl = e.json(&["pool", "overwrite-acl", "tank", "--acl-file", &file]);
    assert_eq!(entries(&acl), ["A::OWNER@:rw", "A::bob@:r"]);

    assert_eq!(e.json(&["pool", "evict", "tank"])["handles_evicted"], 0);
    assert_eq!(e.json(&["pool", "destroy", "tank"])["destroyed"], true);
    assert_eq!(e.json(&["pool", "list"]), json!([]));
    let again = e.dpufs(&["pool", "destroy", "tank"]);
    again.fails_with("not found");
    assert!(again.stderr.contains("hint: "), "{}", again.stderr);
    assert_eq!(
        e.json(&["pool", "destroy", "tank", "--if-exists"])["destroyed"],
        false
    );
}

#[test]
fn container_lifecycle() {
    let e = Engine::start(1);
    e.json(&["pool", "create", "p", "--size", "1G"]);
    let c = e.json(&[
        "cont",
        "create",
        "p",
        "c1",
        "--type",
        "POSIX",
        "--properties",
        "max_snapshot:5",
        "--attr",
        "origin=test",
    ]);
    let uuid = c["uuid"].as_str().unwrap().to_string();
    assert_eq!(c["label"], "c1");
    assert_eq!(c["properties"]["4098"], 1, "layout_type POSIX: {c}");
    assert_eq!(c["properties"]["4105"], 5, "max_snapshot: {c}");
    assert_eq!(labels(&e.json(&["cont", "list", "p"])), ["c1"]);
    assert_eq!(e.json(&["cont", "query", "p", &uuid])["label"], "c1");
    let human = e.dpufs(&["cont", "query", "p", "c1"]);
    assert!(human.stdout.contains("POSIX"), "{}", human.stdout);

    let c = e.json(&["cont", "set-prop", "p", "c1", "max_snapshot:10"]);
    assert_eq!(c["properties"]["4105"], 10);
    e.dpufs(&["cont", "set-prop", "p", "c1", "layout_type:HDF5"])
        .fails_with("cannot be changed");
    e.dpufs(&["cont", "create", "p", "c1"])
        .fails_with("already exists");

    let acl = e.json(&["cont", "update-acl", "p", "c1", "-e", "A::alice@:rw"]);
    assert!(entries(&acl).contains(&"A::alice@:rw"));
    assert!(entries(&e.json(&["cont", "get-acl", "p", "c1"])).contains(&"A::alice@:rw"));
    let acl = e.json(&["cont", "delete-acl", "p", "c1", "-p", "u:alice@"]);
    assert!(!entries(&acl).contains(&"A::alice@:rw"));
    e.json(&[
        "cont",
        "set-owner",
        "p",
        "c1",
        "--user",
        "bob",
        "--group",
        "staff@",
    ]);
    let acl = e.json(&["cont", "get-acl", "p", "c1"]);
    assert_eq!(
        (&acl["owner_user"], &acl["owner_group"]),
        (&json!("bob@"), &json!("staff@"))
    );

    let snap = e.json(&["cont", "snapshot", "create", "p", "c1", "--name", "s1"]);
    assert_eq!(snap["name"], "s1");
    let epoch = snap["epoch"].as_u64().unwrap().to_string();
    let snaps = e.json(&["cont", "snapshot", "list", "p", "c1"]);
    assert_eq!(snaps.as_array().unwrap().len(), 1);
    assert_eq!(
        e.json(&["cont", "snapshot", "destroy", "p", "c1", "--epoch", &epoch]),
        json!([])
    );

    e.dpufs(&["pool", "destroy", "p"]).fails_with("container");
    assert_eq!(e.json(&["cont", "destroy", "p", "c1"])["destroyed"], true);
    assert_eq!(e.json(&["cont", "list", "p"]), json!([]));
    e.dpufs(&["cont", "query", "p", "c1"])
        .fails_with("not found");
    e.json(&["pool", "destroy", "p"]);
}

#[test]
fn bad_pool_creates_fail_and_leave_nothing_behind() {
    let e = Engine::start(1);
    let missing_label = e.dpufs(&["pool", "create", "--size", "1G"]);
    assert_eq!(
        missing_label.code, 2,
        "a usage error: {}",
        missing_label.stderr
    );
    e.dpufs(&[
        "pool",
        "create",
        "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        "--size",
        "1G",
    ])
    .fails_with("must not be a UUID");
    e.dpufs(&[
        "pool",
        "create",
        "x",
        "--size",
        "1G",
        "--properties",
        "nonsense:1",
    ])
    .fails_with("unknown pool property \"nonsense\"");
    let acl = e.file("bad.acl", "A::OWNER@:rw\nA:X:alice@:rw\n");
    e.dpufs(&["pool", "create", "x", "--size", "1G", "--acl-file", &acl])
        .fails_with("invalid ACE");
    e.dpufs(&["pool", "create", "x", "--size", "0"])
        .fails_with("unexpected pool create params");
    e.dpufs(&["pool", "create", "x", "--size", "1T"])
        .fails_with("DER_NOSPACE");
    assert_eq!(e.json(&["pool", "list"]), json!([]));
}

#[test]
fn stopping_a_rank_excludes_its_targets() {
    let e = Engine::start(2);
    e.json(&["pool", "create", "wide", "--size", "1G"]);
    let query = e.json(&["system", "query"]);
    // The embedded engine is a DAOS 2.8 server; it accepted the 2.8 wire, so its patch
    // level was never named.
    assert_eq!(query["server_version"], "2.8", "{query:#}");
    assert_eq!(query["wire"], "2.8", "{query:#}");
    let members = &query["members"];
    let states: Vec<&str> = members
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["joined", "joined"]);

    assert_eq!(
        e.json(&["system", "stop", "--rank", "1"])["state"],
        "stopped"
    );
    let info = e.json(&["pool", "query", "wide"]);
    assert_eq!(info["state"], "TargetsExcluded");
    let total = info["total_targets"].as_u64().unwrap();
    assert_eq!(
        info["disabled_targets"].as_u64().unwrap() * 2,
        total,
        "{info}"
    );
    assert_eq!(info["disabled_ranks"], "[1]");
    assert_eq!(
        e.json(&["system", "query"])["members"][1]["state"],
        "stopped"
    );

    assert_eq!(
        e.json(&["system", "start", "--rank", "1"])["state"],
        "joined"
    );
    let info = e.json(&["pool", "query", "wide"]);
    assert_eq!(info["state"], "Ready");
    assert_eq!(info["disabled_targets"], 0);
}

#[test]
fn connection_errors_say_what_to_do() {
    let cwd = tempfile::tempdir().unwrap();
    let refused = dpufs_in(
        cwd.path(),
        &["--insecure", "--endpoint", "127.0.0.1:1", "pool", "list"],
    );
    refused.fails_with("no DAOS management endpoint reachable");
    assert!(
        refused.stderr.contains("hint: is `dpufs up`"),
        "{}",
        refused.stderr
    );
    dpufs_in(cwd.path(), &["--endpoint", "127.0.0.1:1", "pool", "list"]).fails_with("--insecure");
}

/// A `dpufs up` child; on drop it is killed and `dpufs down` stops its engine.
struct Up {
    child: Child,
    lines: Receiver<String>,
    cwd: PathBuf,
}

impl Up {
    fn start(cwd: &Path) -> Up {
        let mut child = Command::new(DPUFS)
            .args(["up", "--capacity", "4G"])
            .current_dir(cwd)
            .env_remove("DPUFS_ENDPOINT")
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting dpufs up");
        let (tx, lines) = channel();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Up {
            child,
            lines,
            cwd: cwd.to_path_buf(),
        }
    }

    /// Stdout lines up to and including one containing `marker`.
    fn until(&self, marker: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            match self.lines.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    let done = line.contains(marker);
                    seen.push(line);
                    if done {
                        return seen;
                    }
                }
                Err(e) => panic!("no {marker:?} from dpufs up ({e}); saw {seen:#?}"),
            }
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        dpufs_in(&self.cwd, &["down"]);
    }
}

fn is_root() -> bool {
    dpufs_e2e::skip::host_has(
        rustix::process::geteuid().is_root() && Path::new("/dev/fuse").exists(),
        "needs root and /dev/fuse",
    )
}

fn mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(want))
}

fn pid_in(file: &Path) -> u32 {
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn alive(pid: u32) -> bool {
    // A zombie has no command line.
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

#[test]
fn up_runs_the_stack_until_stopped() {
    dpufs_e2e::binary("dpufs-engine", "dpufs-engine");
    dpufs_e2e::binary("dpufs-csi", "dpufs-csi");
    let cwd = tempfile::tempdir().unwrap();
    let state = cwd.path().join(".dpufs");
    let mnt = cwd.path().join("mnt");
    let staging = state.join("csi/staging");
    let mounts = is_root();

    let mut up = Up::start(cwd.path());
    let progress = up.until("Ctrl-C stops the stack");
    let pool_line = progress
        .iter()
        .find(|l| l.starts_with("✓ pool default"))
        .expect("pool step");
    assert!(pool_line.ends_with("created"), "{progress:#?}");
    // The volume comes from the CSI controller: CreateVolume of a container in the pool.
    let volume_line = progress
        .iter()
        .find(|l| l.starts_with("✓ volume v1/daos_server/"))
        .unwrap_or_else(|| panic!("volume step in {progress:#?}"));
    let volume_id = volume_line.split(' ').nth(2).unwrap().to_string();

    // Commands run here find the engine through .dpufs/endpoint, and need
    // no --insecure for it.
    let pools = dpufs_in(cwd.path(), &["pool", "list", "--json"]).json();
    assert_eq!(labels(&pools), ["default"]);
    let uuid = pools[0]["uuid"].as_str().unwrap().to_string();
    let conts = dpufs_in(cwd.path(), &["cont", "list", "default", "--json"]).json();
    let labels = labels(&conts);
    assert!(
        labels.len() == 1 && labels[0].starts_with("csi-"),
        "one CSI volume: {labels:?}"
    );
    assert!(volume_id.ends_with(conts[0]["uuid"].as_str().unwrap()));
    assert_eq!(conts[0]["properties"]["4098"], 1, "POSIX layout");

    // Both CSI services are up, on their sockets in the state directory.
    let status = dpufs_in(cwd.path(), &["status", "--json"]).json();
    for (part, socket) in [
        ("csi_controller", "controller.sock"),
        ("csi_node", "node.sock"),
    ] {
        assert_eq!(
            status[part]["endpoint"],
            format!("unix://.dpufs/csi/{socket}"),
            "{status}"
        );
        assert!(state.join("csi").join(socket).exists());
    }
    let plugins: Vec<u32> = ["csi_controller", "csi_node"]
        .iter()
        .map(|p| pid_of(&status, p))
        .collect();
    let mut serving = plugins;
    if mounts {
        assert!(
            progress.iter().any(|l| l.starts_with("✓ staged at")),
            "{progress:#?}"
        );
        // The container is mounted: 64 MiB round-trip byte-exact through it.
        let data: Vec<u8> = (0..64u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(mnt.join("blob"), &data).unwrap();
        assert!(
            std::fs::read(mnt.join("blob")).unwrap() == data,
            "64 MiB differ"
        );
        let status = dpufs_in(cwd.path(), &["status", "--json"]).json();
        assert_eq!(status["mount"]["fstype"], "fuse.dpufs", "{status}");
        assert_eq!(status["worker_health"]["state"], "serving", "{status}");
        assert!(status["worker_stats"]["bytes_written"].as_u64().unwrap() >= 64 << 20);
        for part in ["keeper", "worker"] {
            serving.push(status[part]["pid"].as_u64().expect(part) as u32);
        }
    } else {
        assert!(progress.iter().any(|l| l.contains("no FUSE mount")));
    }
    let engine_pid = pid_in(&state.join("engine.pid"));

    up.signal(rustix::process::Signal::INT);
    up.until("stopped");
    assert!(up.child.wait().unwrap().success());
    assert!(!state.join("endpoint").exists() && !state.join("engine.pid").exists());
    // Nothing left behind: no mount, no process.
    assert!(!mounted(&mnt), "Ctrl-C leaves no mount");
    assert!(!mounted(&staging), "Ctrl-C leaves no staged mount");
    assert!(!alive(engine_pid), "Ctrl-C leaves no engine");
    assert!(
        !serving.iter().any(|&p| alive(p)),
        "Ctrl-C leaves no CSI plugin, keeper or worker"
    );
    dpufs_in(cwd.path(), &["status"]).fails_with("nothing of `dpufs up` runs");

    // A second run reuses the pool and the volume (CreateVolume is idempotent) and finds
    // the data; killed hard, it leaves its engine, plugins, keeper, worker and mounts for
    // `down`.
    let mut up = Up::start(cwd.path());
    let progress = up.until("Ctrl-C stops the stack");
    assert!(
        progress
            .iter()
            .any(|l| l.contains(&uuid) && l.ends_with("reused")),
        "{progress:#?}"
    );
    assert!(
        progress.iter().any(|l| l.contains(&volume_id)),
        "the same volume: {progress:#?}"
    );
    if mounts {
        assert_eq!(std::fs::metadata(mnt.join("blob")).unwrap().len(), 64 << 20);
    }
    let engine_pid = pid_in(&state.join("engine.pid"));
    up.signal(rustix::process::Signal::KILL);
    up.child.wait().unwrap();
    assert!(alive(engine_pid), "engine outlives a killed up");
    let down = dpufs_in(cwd.path(), &["down"]);
    assert_eq!(down.code, 0, "{}", down.stderr);
    assert!(
        down.stdout
            .contains(&format!("stopped dpufs-engine (pid {engine_pid})")),
        "{}",
        down.stdout
    );
    for part in ["stopped the CSI node plugin", "stopped the CSI controller"] {
        assert!(down.stdout.contains(part), "{}", down.stdout);
    }
    if mounts {
        assert!(
            down.stdout.contains("stopped the mount keeper"),
            "{}",
            down.stdout
        );
    }
    assert!(!mounted(&mnt), "down leaves no mount");
    assert!(!mounted(&staging), "down leaves no staged mount");
    assert!(!alive(engine_pid));
    assert!(!state.join("endpoint").exists() && !state.join("engine.pid").exists());
}

/// A worker killed with -9 is replaced by the mount keeper and the mount keeps working.
/// With `up` and the keeper killed too, the orphaned worker still serves; `down` stops it
/// and detaches the mount it leaves.
#[test]
fn a_killed_worker_is_replaced_and_down_cleans_up_after_killed_parents() {
    if !is_root() {
        return;
    }
    dpufs_e2e::binary("dpufs-engine", "dpufs-engine");
    dpufs_e2e::binary("dpufs-csi", "dpufs-csi");
    let cwd = tempfile::tempdir().unwrap();
    let mnt = cwd.path().join("mnt");
    let mut up = Up::start(cwd.path());
    up.until("Ctrl-C stops the stack");
    std::fs::write(mnt.join("before"), b"kept").unwrap();
    let status = dpufs_in(cwd.path(), &["status", "--json"]).json();
    let (keeper, worker) = (pid_of(&status, "keeper"), pid_of(&status, "worker"));
    kill9(worker);
    // Served again by a replacement: the mount never went away.
    let mut replaced = status;
    while replaced["worker_restarts"] != 1 {
        std::thread::sleep(Duration::from_millis(20));
        replaced = dpufs_in(cwd.path(), &["status", "--json"]).json();
    }
    assert_eq!(std::fs::read(mnt.join("before")).unwrap(), b"kept");
    std::fs::write(mnt.join("after"), b"new worker").unwrap();
    let successor = pid_of(&replaced, "worker");
    assert_ne!(successor, worker);

    up.signal(rustix::process::Signal::KILL);
    up.child.wait().unwrap();
    kill9(keeper);
    assert!(alive(successor), "an orphaned worker goes on serving");
    assert_eq!(std::fs::read(mnt.join("after")).unwrap(), b"new worker");
    // `up` refuses to start over what runs.
    let again = dpufs_in(cwd.path(), &["up"]);
    again.fails_with("dpufs down");
    let down = dpufs_in(cwd.path(), &["down"]);
    assert_eq!(down.code, 0, "{}", down.stderr);
    assert!(
        down.stdout
            .contains(&format!("stopped the volume worker (pid {successor})")),
        "{}",
        down.stdout
    );
    assert!(!mounted(&mnt), "{}", down.stdout);
    assert!(
        !mounted(&cwd.path().join(".dpufs/csi/staging")),
        "{}",
        down.stdout
    );
    assert!(!alive(successor));
}

/// Any CSI client can use the stack's sockets: our csi-sanity-style suite
/// (`dpufs_e2e::csi_sanity`) passes against `up`'s controller and node plugins, as a client
/// that sends no Kubernetes metadata (the default tenant, StorageClass parameter
/// `pool: default`).
#[test]
fn the_conformance_suite_passes_against_the_stacks_csi_sockets() {
    if !is_root() {
        eprintln!(
            "!!!!! the_conformance_suite_passes_against_the_stacks_csi_sockets SKIPPED: needs root and /dev/fuse"
        );
        return;
    }
    dpufs_e2e::binary("dpufs-engine", "dpufs-engine");
    dpufs_e2e::binary("dpufs-csi", "dpufs-csi");
    let cwd = tempfile::tempdir().unwrap();
    let up = Up::start(cwd.path());
    up.until("Ctrl-C stops the stack");
    let csi = cwd.path().join(".dpufs/csi");
    let mut config = dpufs_e2e::csi_sanity::Config::new(
        format!("unix://{}", csi.join("controller.sock").display()),
        Some(format!("unix://{}", csi.join("node.sock").display())),
        cwd.path().join("sanity/mount"),
        cwd.path().join("sanity/staging"),
    );
    config.volume_parameters = [("pool".to_string(), "default".to_string())].into();
    config.volume_size = 64 << 20;
    config.expand_size = 128 << 20;
    let report = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(dpufs_e2e::csi_sanity::run(config));
    eprintln!("{report}");
    let failed: Vec<_> = report.failed().map(|c| c.name.clone()).collect();
    assert!(failed.is_empty(), "{}: {failed:#?}", report.summary());
    assert!(report.passed().count() >= 80, "{}", report.summary());
}

fn pid_of(status: &serde_json::Value, part: &str) -> u32 {
    status[part]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {part} pid in {status}")) as u32
}

#[test]
fn up_reports_an_engine_that_fails_to_start() {
    dpufs_e2e::binary("dpufs-engine", "dpufs-engine");
    let cwd = tempfile::tempdir().unwrap();
    let failed = dpufs_in(cwd.path(), &["up", "--ranks", "0"]);
    failed.fails_with("exited");
    assert!(
        failed
            .stderr
            .contains("--ranks and --targets must be at least 1"),
        "shows the engine's log: {}",
        failed.stderr
    );
    assert!(!cwd.path().join(".dpufs/engine.pid").exists());
}

#[test]
fn mutual_tls_with_generated_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let certs_arg = certs.display().to_string();
    dpufs_in(dir.path(), &["certs", "generate", &certs_arg]).succeeds();
    let opts = EngineOpts {
        tls_dir: Some(certs.clone()),
        ..Default::default()
    };
    let engine = EngineProcess::start(&dir.path().join("engine"), opts).unwrap();
    let secure = |args: &[&str]| {
        let mut all = vec!["--tls-dir", &certs_arg, "--endpoint", &engine.addr];
        all.extend_from_slice(args);
        dpufs_in(dir.path(), &all)
    };
    secure(&["pool", "create", "safe", "--size", "1G"]).succeeds();
    assert_eq!(
        labels(&secure(&["pool", "list", "--json"]).json()),
        ["safe"]
    );
    // Plaintext is refused by a secure engine.
    let plain = dpufs_in(
        dir.path(),
        &["--insecure", "--endpoint", &engine.addr, "pool", "list"],
    );
    assert_eq!(plain.code, 1, "{}", plain.stderr);
    // Without certificates the CLI says how to get them.
    let empty = dir.path().join("none").display().to_string();
    dpufs_in(
        dir.path(),
        &[
            "--tls-dir",
            &empty,
            "--endpoint",
            &engine.addr,
            "pool",
            "list",
        ],
    )
    .fails_with("dpufs certs generate");
}
