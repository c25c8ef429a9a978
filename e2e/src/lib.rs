//! Harness for end-to-end scenarios on real processes: locating the workspace's
//! binaries and running a `dpufs-engine` that is killed when dropped.

pub mod csi_bed;
pub mod csi_sanity;
pub mod daos_system;
pub mod dfuse;
pub mod files;
pub mod guest;
pub mod in_process;
pub mod kube_api;
pub mod manifests;
pub mod netns;
pub mod percentile;
mod process;
pub mod skip;
pub mod volume;

use anyhow::{Context, bail};
use dpufs_daos::{ClientConfig, MgmtClient};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The directory holding the workspace's binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/<test> → target/debug
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// Path of a workspace binary, brought up to date once per test process:
/// `cargo test -p dpufs-e2e` alone does not rebuild other packages' binaries.
pub fn binary(name: &str, package: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if !built.iter().any(|b| b == name) {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--profile", &profile(), "-p", package])
            .args(["--bin", name])
            .status()
            .expect("running cargo build");
        assert!(status.success(), "cargo build -p {package} failed");
        built.push(name.to_string());
    }
    bin_dir().join(name)
}

/// The cargo profile this executable was built with, from the directory it sits in: a
/// benchmark (`target/release`) must drive release binaries, not stale or debug ones.
fn profile() -> String {
    match bin_dir().file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(dir) => dir.to_string(),
    }
}

/// Sends SIGKILL to `pid` (a crash, as the OOM killer or a node failure makes one) and
/// waits until it is gone from the process table (reaped, or a zombie of another parent).
pub fn kill9(pid: u32) {
    // SAFETY: plain kill(2).
    assert_eq!(
        unsafe { libc::kill(pid as i32, libc::SIGKILL) },
        0,
        "kill -9 {pid}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !dead(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} survived SIGKILL"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether `pid` no longer runs: gone, or a zombie.
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// Writes a file atomically (temporary file, then rename), as an agent renewing it would.
pub fn write_file_atomic(path: &Path, data: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Options of an engine under test.
#[derive(Debug, Clone)]
pub struct EngineOpts {
    pub ranks: u32,
    pub capacity: u64,
    /// Serve mutual TLS with the certificates in this directory.
    pub tls_dir: Option<PathBuf>,
    /// Run as a replica that follows this leader.
    pub follow: Option<String>,
    /// Serve DFS over the fabric for capabilities signed by these agents' keys (PEM files).
    pub agent_keys: Vec<PathBuf>,
    /// The software fabric's device directory (`DPUFS_FABRIC_DIR`) for the engine's device.
    pub fabric_dir: Option<PathBuf>,
    /// Clock skew the data service tolerates on capability expiry (engine default: 30 s).
    pub capability_skew_secs: Option<u64>,
    /// Bound on a management client's TLS handshake and HTTP/2 preface (engine default:
    /// 10 s).
    pub setup_timeout_ms: Option<u64>,
    /// Where the engine runs on the network; `None`: this machine's loopback.
    pub network: Option<EngineNetwork>,
}

/// An engine on a network of its own: started inside the network namespace whose file is
/// `netns` ([`netns::Netns::path`]), its management, data-service and fabric device listeners
/// all on `ip`, an address of that namespace.
#[derive(Debug, Clone)]
pub struct EngineNetwork {
    pub netns: PathBuf,
    pub ip: std::net::IpAddr,
}

impl Default for EngineOpts {
    fn default() -> Self {
        EngineOpts {
            ranks: 1,
            capacity: 8 << 30,
            tls_dir: None,
            follow: None,
            agent_keys: Vec::new(),
            fabric_dir: None,
            capability_skew_secs: None,
            setup_timeout_ms: None,
            network: None,
        }
    }
}

/// A running `dpufs-engine` process; killed on drop.
#[derive(Debug)]
pub struct EngineProcess {
    child: Child,
    pub data_dir: PathBuf,
    pub addr: String,
    /// The fabric data service's handshake address, when it serves one.
    pub fabric_addr: Option<std::net::SocketAddr>,
    pub opts: EngineOpts,
}

impl EngineProcess {
    /// The engine's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts an engine on a free port of loopback (or of its [`EngineOpts::network`]) with
    /// its data in `data_dir`.
    pub fn start(data_dir: &Path, opts: EngineOpts) -> anyhow::Result<EngineProcess> {
        match opts.network.clone() {
            None => Self::start_on(data_dir, opts, "127.0.0.1:0", None),
            Some(net) => {
                let any_port = std::net::SocketAddr::new(net.ip, 0);
                Self::start_on(data_dir, opts, &any_port.to_string(), Some(any_port))
            }
        }
    }

    fn start_on(
        data_dir: &Path,
        opts: EngineOpts,
        listen: &str,
        fabric_listen: Option<std::net::SocketAddr>,
    ) -> anyhow::Result<EngineProcess> {
        let mut cmd = Command::new(binary("dpufs-engine", "dpufs-engine"));
        match &opts.tls_dir {
            Some(dir) => cmd.arg("--tls-dir").arg(dir),
            None => cmd.arg("--insecure"),
        };
        if let Some(leader) = &opts.follow {
            cmd.args(["--follow", leader]);
        }
        for key in &opts.agent_keys {
            cmd.arg("--agent-key").arg(key);
        }
        if let Some(secs) = opts.capability_skew_secs {
            cmd.arg("--capability-skew-secs").arg(secs.to_string());
        }
        if let Some(ms) = opts.setup_timeout_ms {
            cmd.arg("--setup-timeout-ms").arg(ms.to_string());
        }
        if let Some(addr) = fabric_listen {
            cmd.arg("--fabric-listen").arg(addr.to_string());
        }
        if let Some(dir) = &opts.fabric_dir {
            cmd.env("DPUFS_FABRIC_DIR", dir);
        }
        if let Some(net) = &opts.network {
            netns::enter_on_exec(&net.netns, &mut cmd)?;
        }
        let mut child = cmd
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", listen])
            .args(["--ranks", &opts.ranks.to_string()])
            .args(["--capacity", &opts.capacity.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning dpufs-engine")?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let mut fabric_addr = None;
        if let Some(addr) = line.strip_prefix("dpufs-engine data service on fabric ") {
            fabric_addr = addr.trim().parse().ok();
            line.clear();
            stdout.read_line(&mut line)?;
        }
        let Some(addr) = line
            .strip_prefix("dpufs-engine listening on ")
            .and_then(|rest| rest.split_whitespace().next())
        else {
            let _ = child.kill();
            bail!("engine did not announce itself; first line was {line:?}");
        };
        Ok(EngineProcess {
            addr: addr.to_string(),
            fabric_addr,
            child,
            data_dir: data_dir.to_path_buf(),
            opts,
        })
    }

    /// Kills the engine with SIGKILL (a crash) and starts it again on the same
    /// address and data directory.
    pub fn crash_and_restart(&mut self) -> anyhow::Result<()> {
        let opts = self.opts.clone();
        self.restart_with(opts)
    }

    /// Stops the engine in order (SIGTERM: it makes every open volume durable) and starts it
    /// again on the same addresses and data directory.
    pub fn stop_and_restart(&mut self) -> anyhow::Result<()> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let status = self.child.wait()?;
        anyhow::ensure!(status.success(), "the engine stopped with {status}");
        self.start_again(self.opts.clone())
    }

    /// Kills the engine and starts it again on the same addresses (management and fabric)
    /// and data directory with other options.
    pub fn restart_with(&mut self, opts: EngineOpts) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        self.start_again(opts)
    }

    /// Starts the engine again, once the old process is gone, on its addresses.
    fn start_again(&mut self, opts: EngineOpts) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::start_on(&self.data_dir, opts.clone(), &self.addr, self.fabric_addr) {
                Ok(new) => {
                    *self = new;
                    return Ok(());
                }
                // The port may linger briefly after the kill.
                Err(e) if Instant::now() < deadline => {
                    eprintln!("restart attempt failed: {e:#}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Stops the engine for good (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A management client for this engine.
    pub fn client(&self) -> MgmtClient {
        let mut cfg = ClientConfig::new(vec![self.addr.clone()]);
        // Keep retried failures short in tests.
        cfg.request_timeout = Duration::from_secs(20);
        MgmtClient::new(cfg).expect("valid client config")
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
