//! A real one-node DAOS system for tests: `daos_server` (which runs one `daos_engine`),
//! optionally `daos_agent`, all from an installed DAOS prefix, with every config, socket,
//! log and the RAM-backed SCM under a scratch directory, stopped and cleaned up on drop.
//!
//! DAOS is not part of the repository: it is built by hand into a prefix with DAOS's
//! install layout (`bin/daos_server`, `bin/dmg`, `lib/...`; docs/testing.md, "Real DAOS").
//! [`prefixes`] is the one discovery rule (`.ci/run` mirrors it): the colon-separated
//! `$DPUFS_DAOS_PREFIXES`, else every `~/.cache/dpufs-daos/v*` holding `bin/daos_server`.
//! Without a prefix a test calls [`skip`], which prints a loud SKIPPED line, or fails when
//! `DPUFS_REQUIRE_DAOS` requires its version (`1`: all, or a list such as `2.6.5,2.8.0`).
//!
//! One system at a time: an engine takes ~1 GB and a tmpfs of [`SCM_GIB`], and the engine's
//! fabric ports are fixed, so [`DaosSystem::start`] first takes an exclusive `flock` on
//! [`LOCK_FILE`] (held until drop), which serializes tests across threads and processes.

use crate::process::{Detach, free_port, spawn_logged};
use anyhow::{Context, bail};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The lock every test that runs DAOS holds while its system lives.
pub const LOCK_FILE: &str = "/tmp/dpufs-daos-e2e.lock";
/// Size of the RAM-backed SCM tier (a tmpfs `daos_server` mounts), in GiB: the size the
/// hand-built setup was proven with; a 2 GiB pool fits with room for a second.
pub const SCM_GIB: u32 = 6;
/// The engine's fabric port (it also takes the next two). DAOS cannot pick a free one;
/// the lock keeps two test systems from meeting on it.
const FABRIC_PORT: u16 = 31416;
/// The DAOS system name, which is also the dpufs CLI's default `--system`.
pub const SYSTEM_NAME: &str = "daos_server";
/// Bound on the server's start (up to "format required") and on the engine joining after
/// the format; measured at 2 s and 8 s on an idle two-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one `dmg` command: dmg itself waits 5 minutes for a dead engine.
const DMG_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a stopping process gets after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// An installed DAOS: its prefix and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    pub path: PathBuf,
    /// `2.8.0`: from the directory name `v2.8.0`, else from `dmg version`.
    pub version: String,
}

impl Prefix {
    /// Reads the version of the DAOS installed at `path`, or `None` if it has no `daos_server`.
    pub fn at(path: &Path) -> Option<Prefix> {
        if !path.join("bin/daos_server").is_file() {
            return None;
        }
        let from_name = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix('v'))
            .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            .map(str::to_string);
        let version = from_name.or_else(|| dmg_version(path))?;
        Some(Prefix {
            path: path.to_path_buf(),
            version,
        })
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.path.join("bin").join(name)
    }

    /// The library path DAOS's programs need: `lib`, and `lib/daos_srv` where SPDK and
    /// DPDK live since 2.8 (the engine has no RUNPATH to them).
    fn library_path(&self) -> String {
        let mut dirs = vec![self.path.join("lib")];
        let srv = self.path.join("lib/daos_srv");
        if srv.is_dir() {
            dirs.push(srv);
        }
        std::env::join_paths(dirs)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Whether this DAOS names its management service replicas `mgmt_svc_replicas`
    /// (2.8 and later) rather than `access_points`.
    fn has_mgmt_svc_replicas(&self) -> bool {
        let mut parts = self
            .version
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (2, 8)
    }

    /// Whether this DAOS's agent takes a `client_user_map` (2.8 and later).
    fn has_client_user_map(&self) -> bool {
        self.has_mgmt_svc_replicas()
    }

    /// DAOS's client libraries (libdaos, libdfs), for `--daos-lib`.
    pub fn lib_dir(&self) -> PathBuf {
        self.path.join("lib")
    }

    /// A command for one of the prefix's programs, with its library path.
    pub(crate) fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin(program));
        cmd.env("LD_LIBRARY_PATH", self.library_path());
        cmd
    }
}

/// `dmg version` → `2.8.0` ("DAOS Admin Tool version 2.8.0").
fn dmg_version(prefix: &Path) -> Option<String> {
    let out = Command::new(prefix.join("bin/dmg"))
        .arg("version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().last().map(str::to_string)
}

/// Every DAOS prefix of this machine: `$DPUFS_DAOS_PREFIXES` (colon-separated) when set,
/// else each `$HOME/.cache/dpufs-daos/v*` with `bin/daos_server`, in name order.
pub fn prefixes() -> Vec<Prefix> {
    let candidates: Vec<PathBuf> = match std::env::var_os("DPUFS_DAOS_PREFIXES") {
        Some(list) => std::env::split_paths(&list).collect(),
        None => cached_prefixes(),
    };
    candidates.iter().filter_map(|p| Prefix::at(p)).collect()
}

fn cached_prefixes() -> Vec<PathBuf> {
    let Some(home) = std::env::var_os("HOME") else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(PathBuf::from(home).join(".cache/dpufs-daos")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('v'))
        })
        .collect();
    dirs.sort();
    dirs
}

/// The prefix of DAOS `version` (e.g. `2.8.0`), if there is one.
pub fn prefix_of(version: &str) -> Option<Prefix> {
    prefixes().into_iter().find(|p| p.version == version)
}

/// Says loudly that `test` did not run for want of DAOS `version`, or fails it when
/// `DPUFS_REQUIRE_DAOS` requires that version (see [`required`]).
pub fn skip(test: &str, version: &str) {
    let why = format!(
        "no DAOS {version} prefix (bin/daos_server) in $DPUFS_DAOS_PREFIXES or \
         ~/.cache/dpufs-daos/v* (docs/testing.md, \"Real DAOS\")"
    );
    let required_by = std::env::var(REQUIRE)
        .ok()
        .filter(|v| required(v, version))
        .map(|v| format!("{REQUIRE}={v}"));
    crate::skip::skip_unless(required_by, test, &why);
}

/// The variable naming the DAOS versions whose tests must run.
const REQUIRE: &str = "DPUFS_REQUIRE_DAOS";

/// Whether `DPUFS_REQUIRE_DAOS=value` requires `version`: `1` every version, else a
/// comma-separated list of versions (what `.ci/run` found prefixes for).
fn required(value: &str, version: &str) -> bool {
    value == "1" || value.split(',').any(|v| v.trim() == version)
}

/// A running system of DAOS `version` with its agent (knowing `users`, see
/// [`DaosSystem::start_agent_mapping`]) and a pool `tank` of `size` (`1GiB`), for `test`;
/// `None` after [`skip`] when this machine has no such DAOS. Panics if any step fails.
pub fn with_pool(
    test: &str,
    version: &str,
    size: &str,
    users: &[(u32, &str)],
) -> Option<DaosSystem> {
    let Some(prefix) = prefix_of(version) else {
        skip(test, version);
        return None;
    };
    let mut daos = DaosSystem::start(&prefix).expect("starting DAOS");
    daos.start_agent_mapping(users)
        .expect("starting daos_agent");
    daos.dmg_json(&["pool", "create", "--size", size, "tank"])
        .expect("dmg pool create");
    Some(daos)
}

/// Where a system is in its life; drop undoes what the state says was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// `daos_server` runs; its SCM is not formatted yet.
    Starting,
    /// `dmg storage format` succeeded: the tmpfs is mounted, an engine is starting.
    Formatted,
    /// Rank 0 joined: the system serves requests.
    Running,
    /// Everything stopped and cleaned up.
    Stopped,
}

/// A running one-node DAOS system; stopped and cleaned up on drop, panics included.
#[derive(Debug)]
pub struct DaosSystem {
    pub prefix: Prefix,
    /// The control plane's port (the yaml's `port`), free when the system started.
    pub port: u16,
    state: State,
    server: Child,
    agent: Option<Child>,
    dir: tempfile::TempDir,
    _lock: File,
}

impl DaosSystem {
    /// Starts `daos_server` from `prefix` with configs written into a fresh scratch
    /// directory, formats its SCM and waits until rank 0 has joined.
    pub fn start(prefix: &Prefix) -> anyhow::Result<DaosSystem> {
        let lock = lock()?;
        refuse_running_daos()?;
        let dir = tempfile::Builder::new().prefix("dpufs-daos-").tempdir()?;
        let port = free_port()?;
        let layout = Layout::new(dir.path());
        layout.create()?;
        layout.write_configs(prefix, port)?;
        let server = spawn_logged(
            prefix
                .command("daos_server")
                .arg("start")
                .arg("-o")
                .arg(&layout.server_yml),
            &layout.server_stdout(),
            Detach::NewSession,
        )?;
        let mut system = DaosSystem {
            prefix: prefix.clone(),
            port,
            state: State::Starting,
            server,
            agent: None,
            dir,
            _lock: lock,
        };
        system.bring_up()?;
        Ok(system)
    }

    fn bring_up(&mut self) -> anyhow::Result<()> {
        self.wait_for_server_line("format required")?;
        checked(self.dmg(&["storage", "format"])?, "dmg storage format")?;
        self.state = State::Formatted;
        self.wait_for_server_line("started on rank 0")?;
        self.wait_joined()?;
        self.state = State::Running;
        Ok(())
    }

    /// Where the system is in its life.
    pub fn state(&self) -> State {
        self.state
    }

    /// Where the system's and its clients' logs go.
    pub fn log_dir(&self) -> PathBuf {
        self.layout().log
    }

    fn layout(&self) -> Layout {
        Layout::new(self.dir.path())
    }

    /// The control endpoint for dpufs: `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// This system's `dmg`.
    pub fn admin_tool(&self) -> Dmg {
        Dmg {
            prefix: self.prefix.clone(),
            control_yml: self.layout().control_yml,
            _dir: None,
        }
    }

    /// Runs `dmg -o <control yaml> ARGS` (bounded by [`DMG_TIMEOUT`]).
    pub fn dmg(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.admin_tool().run(args)
    }

    /// Runs `dmg -j ARGS` and returns its `response` ([`Dmg::json`]).
    pub fn dmg_json(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        self.admin_tool().json(args)
    }

    /// Starts `daos_agent` (for clients of the data plane) and waits until it listens.
    pub fn start_agent(&mut self) -> anyhow::Result<()> {
        self.start_agent_mapping(&[])
    }

    /// Starts `daos_agent` knowing `users`: uids unknown to this machine, each named (user
    /// and group) as a tenant's worker uid would be. DAOS 2.8's agent takes them in its
    /// `client_user_map`; DAOS 2.6's has none and asks the name service, so it gets them as
    /// passwd and group entries that it alone sees over /etc's (a mount namespace of its own).
    /// The agent's socket directory is made reachable for every uid.
    pub fn start_agent_mapping(&mut self, users: &[(u32, &str)]) -> anyhow::Result<()> {
        let layout = self.layout();
        let mut cmd = self.prefix.command("daos_agent");
        cmd.arg("-o").arg(&layout.agent_yml).arg("start");
        if !users.is_empty() {
            if self.prefix.has_client_user_map() {
                let mut yml = std::fs::read_to_string(&layout.agent_yml)?;
                yml += "credential_config:\n  client_user_map:\n";
                for (uid, name) in users {
                    yml += &format!("    {uid}:\n      user: {name}\n      group: {name}\n");
                }
                std::fs::write(&layout.agent_yml, yml)?;
            } else {
                name_service_with(&mut cmd, self.dir.path(), users)?;
            }
            use std::os::unix::fs::PermissionsExt;
            for dir in [self.dir.path(), layout.agent.as_path()] {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
            }
        }
        let agent = spawn_logged(&mut cmd, &layout.agent_stdout(), Detach::NewSession)?;
        self.agent = Some(agent);
        let log = layout.agent_stdout();
        wait_for_line(&log, "listening on", START_TIMEOUT, || {
            self.agent.as_mut().is_some_and(exited)
        })
        .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())
    }

    /// Runs DAOS's client tool, `daos ARGS`, through this system's agent (started
    /// with [`DaosSystem::start_agent`]), bounded by [`DMG_TIMEOUT`]; fails with its
    /// output when it fails.
    pub fn daos(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.prefix.command("daos");
        cmd.env("DAOS_AGENT_DRPC_DIR", self.agent_dir()).args(args);
        let out = run_bounded(&mut cmd, DMG_TIMEOUT)?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "daos {args:?} failed ({}): {text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(text)
    }

    /// The agent's socket directory, for clients' `DAOS_AGENT_DRPC_DIR`.
    pub fn agent_dir(&self) -> PathBuf {
        self.layout().agent
    }

    fn wait_for_server_line(&mut self, needle: &str) -> anyhow::Result<()> {
        let log = self.layout().server_stdout();
        let server = &mut self.server;
        wait_for_line(&log, needle, START_TIMEOUT, || exited(server))
            .with_context(|| self.log_tail())
    }

    /// Waits until `dmg system query` reports rank 0 joined.
    fn wait_joined(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let query = self.dmg_json(&["system", "query"]);
            if let Ok(members) = &query
                && rank0_joined(members)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "rank 0 did not join within {START_TIMEOUT:?}; last query: {query:?}\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The last lines of the server's output and of the engine's log, for error messages.
    pub fn log_tail(&self) -> String {
        let layout = self.layout();
        let mut tail = String::new();
        for log in [layout.server_stdout(), layout.log.join("daos_engine.0.log")] {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(30);
            tail += &format!("--- {}:\n{}\n", log.display(), lines[from..].join("\n"));
        }
        tail
    }

    /// Stops the agent, the system and the server, unmounts the SCM tmpfs and removes the
    /// engines' shared-memory segments. Best effort: it reports and goes on.
    fn stop(&mut self) {
        if let Some(agent) = &mut self.agent {
            terminate(agent, "daos_agent");
        }
        if matches!(self.state, State::Formatted | State::Running)
            && let Err(e) = self.dmg(&["system", "stop"])
        {
            eprintln!("daos_system: dmg system stop: {e:#}");
        }
        let engines = self.engine_pids();
        terminate(&mut self.server, "daos_server");
        for pid in &engines {
            // The engine is the server's child but may outlive a killed server.
            kill_and_wait(*pid);
        }
        unmount(&self.layout().scm);
        remove_shm_created_by(&engines);
        self.state = State::Stopped;
    }

    /// SIGKILLs the engine, as a crash would, and waits until it is gone; its SCM (the
    /// tmpfs the server mounted) stays, as persistent memory would. Returns its pid.
    pub fn kill_engine(&mut self) -> anyhow::Result<u32> {
        let pid = *self.engine_pids().last().context("no engine has started")?;
        kill_and_wait(pid);
        Ok(pid)
    }

    /// Starts the ranks again after [`DaosSystem::kill_engine`] killed engine `killed`
    /// (`dmg system start`, unless the server restarted it itself) and waits until a new
    /// engine runs and rank 0 has joined.
    pub fn restart_engine(&mut self, killed: u32) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let query = self.dmg_json(&["system", "query"]);
            let restarted = self.engine_pids().last() != Some(&killed);
            if restarted && query.as_ref().is_ok_and(rank0_joined) {
                return Ok(());
            }
            if !restarted {
                // Refused while the server still sees the old engine: asked again.
                let _ = self.dmg(&["system", "start"]);
            }
            if Instant::now() > deadline {
                bail!(
                    "rank 0 did not rejoin within {START_TIMEOUT:?}; last query: {query:?}\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// The pids of the engines this server ran: "... process N started on rank 0".
    fn engine_pids(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(self.layout().server_stdout()).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("started on rank"))
            .filter_map(|l| {
                let after = l.split(" process ").nth(1)?;
                after.split_whitespace().next()?.parse().ok()
            })
            .collect()
    }
}

impl Drop for DaosSystem {
    fn drop(&mut self) {
        if self.state != State::Stopped {
            self.stop();
        }
    }
}

/// Makes `cmd` run in a mount namespace of its own whose /etc/passwd and /etc/group are
/// this machine's plus an entry (user and group) for each of `users`, written into `dir`.
fn name_service_with(cmd: &mut Command, dir: &Path, users: &[(u32, &str)]) -> anyhow::Result<()> {
    use std::ffi::CString;
    use std::os::unix::process::CommandExt;
    let mut files = Vec::new();
    for (name, line) in [
        (
            "passwd",
            "{name}:x:{uid}:{uid}::/nonexistent:/usr/sbin/nologin",
        ),
        ("group", "{name}:x:{uid}:"),
    ] {
        let mut text = std::fs::read_to_string(Path::new("/etc").join(name))?;
        for (uid, user) in users {
            text += &line
                .replace("{name}", user)
                .replace("{uid}", &uid.to_string());
            text.push('\n');
        }
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        let c = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes());
        files.push((c(&path)?, c(&Path::new("/etc").join(name))?));
    }
    // SAFETY: between fork and exec the child only makes syscalls (unshare, mount) on
    // strings prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return fail();
            }
            let none = c"none".as_ptr();
            let root = c"/".as_ptr();
            let private = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(none, root, std::ptr::null(), private, std::ptr::null()) != 0 {
                return fail();
            }
            for (from, to) in &files {
                let bind = libc::MS_BIND;
                if libc::mount(
                    from.as_ptr(),
                    to.as_ptr(),
                    std::ptr::null(),
                    bind,
                    std::ptr::null(),
                ) != 0
                {
                    return fail();
                }
            }
            Ok(())
        });
    }
    Ok(())
}

/// `out` if its command succeeded, else an error with both its streams.
fn checked(out: Output, what: &str) -> anyhow::Result<Output> {
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// DAOS's admin tool from one prefix, pointed at one insecure management endpoint: a
/// system's own, or any other server that claims to be DAOS (the embedded engine).
#[derive(Debug)]
pub struct Dmg {
    prefix: Prefix,
    control_yml: PathBuf,
    /// The scratch directory holding `control_yml`, when this value made it.
    _dir: Option<tempfile::TempDir>,
}

impl Dmg {
    /// `dmg` of `prefix` for the server at `host:port` (system `daos_server`, insecure).
    pub fn at(prefix: &Prefix, host: &str, port: u16) -> anyhow::Result<Dmg> {
        let dir = tempfile::Builder::new().prefix("dpufs-dmg-").tempdir()?;
        let control_yml = dir.path().join("daos_control.yml");
        std::fs::write(&control_yml, control_config(host, port))?;
        Ok(Dmg {
            prefix: prefix.clone(),
            control_yml,
            _dir: Some(dir),
        })
    }

    /// Runs `dmg -o <control yaml> ARGS` (bounded by [`DMG_TIMEOUT`]).
    pub fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = self.prefix.command("dmg");
        cmd.arg("-o").arg(&self.control_yml).args(args);
        run_bounded(&mut cmd, DMG_TIMEOUT)
    }

    /// Runs `dmg -j ARGS` and returns its `response`, failing on a non-zero status or an
    /// `error` (with dmg's whole output in the message).
    pub fn json(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        let mut all = vec!["-j"];
        all.extend_from_slice(args);
        let out = self.run(&all)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut doc: serde_json::Value = serde_json::from_str(&text).with_context(|| {
            format!(
                "dmg {args:?}: not JSON: {text}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        if !out.status.success() || !doc["error"].is_null() {
            bail!("dmg {args:?} failed ({}): {doc}", out.status);
        }
        Ok(doc["response"].take())
    }
}

/// Whether `dmg -j system query`'s response lists rank 0 as joined.
fn rank0_joined(response: &serde_json::Value) -> bool {
    response["members"].as_array().is_some_and(|members| {
        members
            .iter()
            .any(|m| m["rank"] == 0 && m["state"].as_str() == Some("joined"))
    })
}

/// The scratch directory's layout: configs at the top, one directory per purpose.
struct Layout {
    server_yml: PathBuf,
    agent_yml: PathBuf,
    control_yml: PathBuf,
    control: PathBuf,
    agent: PathBuf,
    log: PathBuf,
    scm: PathBuf,
}

impl Layout {
    fn new(dir: &Path) -> Layout {
        Layout {
            server_yml: dir.join("daos_server.yml"),
            agent_yml: dir.join("daos_agent.yml"),
            control_yml: dir.join("daos_control.yml"),
            control: dir.join("control"),
            agent: dir.join("agent"),
            log: dir.join("log"),
            scm: dir.join("scm"),
        }
    }

    fn create(&self) -> std::io::Result<()> {
        for d in [&self.control, &self.agent, &self.log, &self.scm] {
            std::fs::create_dir(d)?;
        }
        Ok(())
    }

    fn server_stdout(&self) -> PathBuf {
        self.log.join("daos_server.stdout")
    }

    fn agent_stdout(&self) -> PathBuf {
        self.log.join("daos_agent.stdout")
    }

    fn write_configs(&self, prefix: &Prefix, port: u16) -> std::io::Result<()> {
        std::fs::write(&self.server_yml, self.server_config(prefix, port))?;
        std::fs::write(&self.agent_yml, self.agent_config(port))?;
        std::fs::write(&self.control_yml, control_config("localhost", port))
    }

    /// One engine with one target and no helper streams (two cores), SCM in RAM and no
    /// bdev (no NVMe), no hugepages, TCP on loopback. No `pinned_numa_node`: on two cores
    /// the NUMA allocator runs out of cores and the engine dies with DER_INVAL.
    fn server_config(&self, prefix: &Prefix, port: u16) -> String {
        let replicas = if prefix.has_mgmt_svc_replicas() {
            "mgmt_svc_replicas"
        } else {
            "access_points"
        };
        format!(
            "name: {SYSTEM_NAME}
{replicas}: ['localhost:{port}']
port: {port}
provider: ofi+tcp
socket_dir: {control}
control_log_file: {log}/daos_server.log
control_log_mask: INFO
disable_hugepages: true
system_ram_reserved: 1
transport_config:
  allow_insecure: true
engines:
  - targets: 1
    nr_xs_helpers: 0
    fabric_iface: lo
    fabric_iface_port: {FABRIC_PORT}
    log_file: {log}/daos_engine.0.log
    log_mask: INFO
    # daos_server scrubs the engine's environment, and the engine has no RUNPATH to SPDK.
    env_vars:
      - DAOS_TARGET_OVERSUBSCRIBE=1
      - FI_TCP_IFACE=lo
      - LD_LIBRARY_PATH={libs}
    storage:
      - class: ram
        scm_size: {SCM_GIB}
        scm_mount: {scm}
",
            control = self.control.display(),
            log = self.log.display(),
            libs = prefix.library_path(),
            scm = self.scm.display(),
        )
    }

    /// The agent says `access_points` in 2.8 too.
    fn agent_config(&self, port: u16) -> String {
        format!(
            "name: {SYSTEM_NAME}
access_points: ['localhost:{port}']
port: {port}
runtime_dir: {agent}
log_file: {log}/daos_agent.log
transport_config:
  allow_insecure: true
",
            agent = self.agent.display(),
            log = self.log.display(),
        )
    }
}

fn control_config(host: &str, port: u16) -> String {
    format!(
        "name: {SYSTEM_NAME}
port: {port}
hostlist: ['{host}:{port}']
transport_config:
  allow_insecure: true
"
    )
}

/// Takes the exclusive lock on [`LOCK_FILE`], waiting for another test's system to stop.
fn lock() -> anyhow::Result<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_FILE)
        .with_context(|| format!("opening {LOCK_FILE}"))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).context("flock");
    }
    Ok(file)
}

/// Fails when a DAOS process not ours runs: it holds the fabric ports and the RAM.
fn refuse_running_daos() -> anyhow::Result<()> {
    let running: Vec<String> = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim();
            ["daos_server", "daos_engine", "daos_agent"]
                .contains(&comm)
                .then(|| format!("{comm} (pid {})", e.file_name().to_string_lossy()))
        })
        .collect();
    if !running.is_empty() {
        bail!("DAOS is already running here: {}", running.join(", "));
    }
    Ok(())
}

/// Runs `cmd` to completion, killing it after `timeout`.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> anyhow::Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {cmd:?}"))?;
    // Read both pipes on threads so a chatty child cannot block on a full pipe.
    let stdout = read_on_thread(child.stdout.take());
    let stderr = read_on_thread(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} still running after {timeout:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

fn read_on_thread<R: std::io::Read + Send + 'static>(
    pipe: Option<R>,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// Waits until `log` holds a line containing `needle`; fails early once `gone()` says the
/// writer exited, and after `timeout`.
fn wait_for_line(
    log: &Path,
    needle: &str,
    timeout: Duration,
    mut gone: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if std::fs::read_to_string(log).is_ok_and(|t| t.contains(needle)) {
            return Ok(());
        }
        if gone() {
            bail!(
                "the process writing {} exited before {needle:?}",
                log.display()
            );
        }
        if Instant::now() > deadline {
            bail!("no {needle:?} in {} within {timeout:?}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn exited(child: &mut Child) -> bool {
    !matches!(child.try_wait(), Ok(None))
}

/// SIGTERM to the child's process group, SIGKILL after [`STOP_TIMEOUT`], then reaps it.
pub(crate) fn terminate(child: &mut Child, name: &str) {
    let group = child.id() as i32;
    // SAFETY: plain kill(2) on the session leader's process group.
    unsafe { libc::kill(-group, libc::SIGTERM) };
    let deadline = Instant::now() + STOP_TIMEOUT;
    while !exited(child) {
        if Instant::now() > deadline {
            eprintln!("daos_system: {name} ignored SIGTERM for {STOP_TIMEOUT:?}; SIGKILL");
            // SAFETY: as above.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs `pid` if it still runs and waits until it is gone.
fn kill_and_wait(pid: u32) {
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    if !alive(pid) {
        return;
    }
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let deadline = Instant::now() + STOP_TIMEOUT;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Unmounts what is mounted at `scm` (the SCM tmpfs `daos_server` mounted stays after the
/// server exits; a dfuse mount), lazily if something still holds it.
pub fn unmount(scm: &Path) {
    let Ok(path) = std::ffi::CString::new(scm.as_os_str().as_encoded_bytes()) else {
        return;
    };
    if !is_mount_point(scm) {
        return;
    }
    // SAFETY: umount2(2) with a valid C string.
    if unsafe { libc::umount2(path.as_ptr(), 0) } != 0
        && unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0
    {
        eprintln!(
            "daos_system: umount {}: {}",
            scm.display(),
            std::io::Error::last_os_error()
        );
    }
}

pub fn is_mount_point(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let path = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*path))
}

/// Removes the SysV shared-memory segments (engine telemetry) created by `pids`.
fn remove_shm_created_by(pids: &[u32]) {
    let table = std::fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
    // Columns: key shmid perms size cpid lpid ...
    for line in table.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (Some(shmid), Some(cpid)) = (
            cols.get(1).and_then(|s| s.parse::<i32>().ok()),
            cols.get(4).and_then(|s| s.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if pids.contains(&cpid) {
            // SAFETY: shmctl(2) IPC_RMID takes no buffer.
            unsafe { libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::required;

    #[test]
    fn the_require_variable_names_every_version_or_a_list() {
        assert!(required("1", "2.8.0"));
        assert!(required("2.6.5", "2.6.5"));
        assert!(!required("2.6.5", "2.8.0"), "only the versions found");
        assert!(required("2.6.5, 2.8.0", "2.8.0"));
        assert!(!required("0", "2.6.5"));
        assert!(!required("", "2.6.5"));
    }
}
