//! Shared test support: a volume worker run as a real child process, its control socket, and
//! clean-up that never leaves a mount behind (a killed worker's mount is aborted through
//! /sys/fs/fuse/connections and lazily unmounted in Drop).
#![allow(dead_code)]

pub mod csi_bed;
pub mod load;

use dpufs_csi::fuse as fusedev;
use dpufs_csi::ipc::{fdpass, line};
/// The waits and temporary directories of every real-process test (the CSI bed's).
pub use dpufs_e2e::csi_bed::{DEADLINE, tempdir, wait_until};
use dpufs_e2e::daos_system::{self, DaosSystem};
use dpufs_e2e::volume::EngineVolume;
use serde_json::{Value, json};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Whether FUSE mounts can be made here (root and /dev/fuse). Tests skip otherwise.
pub fn can_mount() -> bool {
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    dpufs_e2e::skip::host_has(
        root && Path::new("/dev/fuse").exists(),
        "needs root and /dev/fuse",
    )
}

/// The fio program.
pub const FIO: &str = "fio";

/// Whether fio can be run here. Tests that need it skip otherwise.
pub fn fio_available() -> bool {
    dpufs_e2e::skip::host_has(
        Command::new(FIO).arg("--version").output().is_ok(),
        "fio is not installed (apt-get install fio)",
    )
}

/// Runs fio on `dir` and checks that it succeeded with no job error.
pub fn fio(dir: &Path, args: &[&str]) -> Value {
    let out = Command::new(FIO)
        .arg(format!("--directory={}", dir.display()))
        // No verify state files in the working directory.
        .args([
            "--output-format=json",
            "--group_reporting=0",
            "--verify_state_save=0",
        ])
        .args(args)
        .output()
        .expect("run fio");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fio {args:?} failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    let v = fio_report(&stdout).expect("fio JSON");
    for job in v["jobs"].as_array().expect("jobs") {
        assert_eq!(job["error"], 0, "fio job failed: {job}");
    }
    v
}

/// fio's JSON report in its standard output (fio may print notes before it); None if there is
/// none.
pub fn fio_report(stdout: &str) -> Option<Value> {
    let json = &stdout[stdout.find('{')?..];
    Some(serde_json::from_str(json).expect("fio JSON"))
}

/// Writes with `job` (plus fio's own verify), then reads everything back with direct reads
/// that check each block's checksum. (A read job with `verify` set checks every block it
/// reads; `--verify_only` would not do: fio unlinks a write job's file before it starts.)
pub fn write_and_verify(dir: &Path, job: &[&str]) {
    let mut write = job.to_vec();
    write.extend(["--verify=crc32c", "--do_verify=1", "--end_fsync=1"]);
    fio(dir, &write);
    let mut verify: Vec<String> = job
        .iter()
        .map(|a| match a.strip_prefix("--rw=") {
            Some(rw) => format!("--rw={}", rw.replace("write", "read")),
            None => a.to_string(),
        })
        .collect();
    verify.extend(["--verify=crc32c".into(), "--direct=1".into()]);
    let verify: Vec<&str> = verify.iter().map(String::as_str).collect();
    let v = fio(dir, &verify);
    let read: u64 = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["read"]["io_bytes"].as_u64().unwrap())
        .sum();
    assert!(read > 0, "the verify pass read the data back");
}

/// Gives the child `fd` as its descriptor 3, with `--fuse-fd 3`.
pub fn pass_fuse_fd(cmd: &mut Command, fd: i32) {
    cmd.arg("--fuse-fd").arg("3");
    // SAFETY: dup2 is async-signal-safe; it runs in the child between fork and exec. The
    // parent's descriptor is close-on-exec, so no other child inherits it.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The worker binary built for these tests.
pub fn worker_bin() -> &'static str {
    env!("CARGO_BIN_EXE_dpufs-csi")
}

/// Whether `mountpoint` is a FUSE mount right now.
pub fn is_fuse_mount(mountpoint: &Path) -> bool {
    fusedev::find_mount(mountpoint)
        .ok()
        .flatten()
        .is_some_and(|m| m.fstype.starts_with("fuse"))
}

/// Removes whatever FUSE mount is at `mountpoint`: aborts its connection (so nothing blocks
/// on a dead server), then detaches it.
pub fn force_unmount(mountpoint: &Path) {
    for _ in 0..8 {
        let Some(m) = fusedev::find_mount(mountpoint).ok().flatten() else {
            return;
        };
        if !m.fstype.starts_with("fuse") {
            return;
        }
        let _ = fusedev::abort_connection(m.connection());
        let _ = fusedev::unmount(mountpoint, true);
    }
}

/// Sends one control request.
pub fn control(state_dir: &Path, op: &str) -> Value {
    control_raw(&state_dir.join("control.sock"), &json!({ "op": op }))
        .unwrap_or_else(|e| panic!("control {op}: {e}"))
}

/// One request to a worker's control socket as JSON, the way its clients write it; the
/// answer as JSON.
pub fn control_raw(socket: &Path, req: &Value) -> std::io::Result<Value> {
    let answer = line::exchange(socket, &req.to_string())?;
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}

/// One request to the keeper at `socket` as JSON, the way its clients write it: the answer
/// and the descriptor that came with it, or the keeper's error (`"ok": false`).
pub fn keeper_request(socket: &Path, req: &Value) -> Result<(Value, Option<OwnedFd>), String> {
    let conn = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    fdpass::send(&conn, &req.to_string(), None).map_err(|e| format!("send: {e}"))?;
    let (line, fd) = fdpass::recv(&conn).map_err(|e| format!("receive: {e}"))?;
    let v: Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
    if v["ok"] == false {
        return Err(format!("keeper: {}", v["error"].as_str().unwrap_or("?")));
    }
    Ok((v, fd))
}

/// What a worker serves: its `--backend` and related arguments.
pub trait Backing {
    fn worker_args(&self) -> Vec<String>;
    /// Environment the worker needs besides its arguments.
    fn worker_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// A local directory (`--backend local:<dir>`).
impl Backing for Path {
    fn worker_args(&self) -> Vec<String> {
        vec!["--backend".into(), format!("local:{}", self.display())]
    }
}

/// A container of a real engine process, reached over the software fabric with a
/// capability file.
pub struct EngineBacking {
    pub volume: EngineVolume,
    pub capability_file: PathBuf,
}

impl EngineBacking {
    /// An engine with a 4 GiB pool and one container.
    pub fn start() -> EngineBacking {
        let volume = EngineVolume::start(1, 4 << 30);
        let capability_file = volume.write_capability("capability", &volume.capability());
        EngineBacking {
            volume,
            capability_file,
        }
    }
}

impl Backing for EngineBacking {
    fn worker_args(&self) -> Vec<String> {
        self.volume.worker_args(&self.capability_file)
    }
}

/// A POSIX container `vol` in pool `tank` of a real one-node DAOS system, served through
/// libdfs (`--backend daos:tank/vol`).
pub struct DaosBacking {
    pub daos: DaosSystem,
}

impl DaosBacking {
    /// A DAOS `version` system with the pool and container, or `None` (said loudly, see
    /// `daos_system::skip`) when this machine has no such DAOS.
    pub fn start(test: &str, version: &str) -> Option<DaosBacking> {
        let daos = daos_system::with_pool(test, version, "4GiB", &[])?;
        daos.daos(&["cont", "create", "tank", "vol", "--type=POSIX"])
            .expect("daos cont create");
        Some(DaosBacking { daos })
    }
}

impl Backing for DaosBacking {
    fn worker_args(&self) -> Vec<String> {
        vec![
            "--backend".into(),
            "daos:tank/vol".into(),
            "--daos-lib".into(),
            self.daos.prefix.lib_dir().display().to_string(),
        ]
    }

    fn worker_env(&self) -> Vec<(String, String)> {
        let log = self.daos.log_dir().join("worker-libdaos.log");
        vec![
            (
                "DAOS_AGENT_DRPC_DIR".into(),
                self.daos.agent_dir().display().to_string(),
            ),
            ("D_LOG_FILE".into(), log.display().to_string()),
        ]
    }
}

/// Ready-made worker arguments (e.g. an engine volume with another capability file).
pub struct EngineArgs(pub Vec<String>);

impl Backing for EngineArgs {
    fn worker_args(&self) -> Vec<String> {
        self.0.clone()
    }
}

/// Options of a worker started by a test.
#[derive(Clone, Debug, Default)]
pub struct Opts {
    /// Extra command-line arguments.
    pub args: Vec<String>,
    /// Serve this descriptor (passed to the child as descriptor 3) instead of mounting.
    pub fuse_fd: Option<i32>,
}

/// A worker child process with its directories. Drop kills it and removes its mount.
pub struct WorkerProc {
    pub child: Child,
    pub mountpoint: PathBuf,
    pub state_dir: PathBuf,
    /// Whether Drop should clean up the mount (false when the test owns the mount).
    pub owns_mount: bool,
    _dirs: Vec<tempfile::TempDir>,
}

impl WorkerProc {
    /// Starts `dpufs-csi worker` on `backing` mounting at a fresh directory (or serving
    /// `opts.fuse_fd`), and waits until its control socket answers.
    pub fn start(backing: &(impl Backing + ?Sized), opts: Opts) -> WorkerProc {
        let mnt = tempdir("dpufs-mnt-");
        let state = tempdir("dpufs-state-");
        let mountpoint = mnt.path().to_path_buf();
        let state_dir = state.path().to_path_buf();
        Self::start_at(backing, &mountpoint, &state_dir, opts, vec![mnt, state])
    }

    /// Like [`WorkerProc::start`] with given directories.
    pub fn start_at(
        backing: &(impl Backing + ?Sized),
        mountpoint: &Path,
        state_dir: &Path,
        opts: Opts,
        dirs: Vec<tempfile::TempDir>,
    ) -> WorkerProc {
        let mut cmd = Command::new(worker_bin());
        cmd.arg("worker")
            .args(backing.worker_args())
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--mountpoint")
            .arg(mountpoint)
            .args(&opts.args)
            .envs(backing.worker_env())
            .stdin(Stdio::null())
            .env("RUST_LOG", "warn");
        if let Some(fd) = opts.fuse_fd {
            pass_fuse_fd(&mut cmd, fd);
        }
        let child = cmd.spawn().expect("spawn dpufs-csi worker");
        let mut w = WorkerProc {
            child,
            mountpoint: mountpoint.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            owns_mount: opts.fuse_fd.is_none(),
            _dirs: dirs,
        };
        let sock = w.state_dir.join("control.sock");
        wait_until("the worker's control socket", || {
            if let Some(st) = w.child.try_wait().expect("try_wait") {
                panic!("the worker exited during start-up: {st}");
            }
            control_raw(&sock, &json!({"op": "health"})).is_ok_and(|v| v["state"] == "serving")
        });
        w
    }

    /// The worker's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mountpoint.join(rel)
    }

    /// Sends one control request.
    pub fn control(&self, op: &str) -> Value {
        control(&self.state_dir, op)
    }

    /// The `stats` object.
    pub fn stats(&self) -> Value {
        let v = self.control("stats");
        assert_eq!(v["ok"], true, "{v}");
        v["stats"].clone()
    }

    /// Waits for the process to exit (up to [`DEADLINE`]).
    pub fn wait_exit(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            assert!(start.elapsed() < DEADLINE, "the worker did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILLs the worker and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if self.owns_mount {
            force_unmount(&self.mountpoint);
        }
    }
}

/// A FUSE mount made by the test itself (playing the mount keeper): it holds the master
/// descriptor and never reads from it. Drop aborts and detaches the mount.
pub struct KeeperMount {
    pub fd: OwnedFd,
    pub mountpoint: PathBuf,
    _dir: tempfile::TempDir,
}

impl KeeperMount {
    pub fn new() -> KeeperMount {
        let dir = tempdir("dpufs-kmnt-");
        let mountpoint = dir.path().to_path_buf();
        let fd = fusedev::mount(
            &mountpoint,
            &fusedev::MountOptions {
                fsname: "dpufs".into(),
                read_only: false,
                allow_other: true,
            },
        )
        .expect("mount /dev/fuse");
        KeeperMount {
            fd,
            mountpoint,
            _dir: dir,
        }
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

impl Drop for KeeperMount {
    fn drop(&mut self) {
        force_unmount(&self.mountpoint);
    }
}

/// The errno of an I/O error, as a name.
pub fn errno_of(e: &std::io::Error) -> String {
    dpufs_daos::dfs::Errno(e.raw_os_error().unwrap_or(-1)).name()
}

/// A tmpfs of the given size (`"1m"`), unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn new(size: &str) -> Tmpfs {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let dir = tempdir("dpufs-tmpfs-");
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let opts = CString::new(format!("size={size}")).unwrap();
        // SAFETY: valid NUL-terminated strings.
        let r = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        assert_eq!(r, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        Tmpfs {
            path: dir.path().to_path_buf(),
            _dir: dir,
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = fusedev::unmount(&self.path, true);
    }
}
