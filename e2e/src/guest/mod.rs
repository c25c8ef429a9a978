//! A real Linux guest under QEMU for tests: Debian's kernel, a busybox initramfs built per
//! guest, virtio-fs devices served by vhost-user-fs backends on this machine, free PCIe root
//! ports and a QMP socket for hot-plugging more, network cards, and a script whose output the
//! test reads back. The guest stands in for the host of a BlueField DPU, which sees each volume
//! as a virtio-fs PCI function (docs/testing.md, "Guest tests").
//!
//! ```no_run
//! # use dpufs_e2e::guest::{Guest, GuestAssets};
//! # use std::time::Duration;
//! let Some(assets) = GuestAssets::get("my_test") else { return Ok(()) }; // SKIPPED, loudly
//! let run = Guest::builder(&assets)
//!     .virtiofs("vol", "/tmp/vol.sock") // the backend must be listening already
//!     .script("echo RESULT size=$(stat -c %s /mnt/vol/file)")
//!     .boot()?
//!     .wait(Duration::from_secs(90))?;
//! assert_eq!(run.rc, 0);
//! assert_eq!(run.result("size"), Some("42"));
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! QEMU runs with TCG (KVM does not work on these machines), one guest at a time across all
//! test processes (a lock file in the assets' cache): each takes a core for its whole life.

mod assets;
mod cpio;
mod init;
mod initramfs;
mod net;
mod qemu;

pub use assets::{GuestAssets, Kernel};
pub use initramfs::GuestFile;
pub use net::{Nic, TapDevice, USER_NET_HOST};

use anyhow::{Context, bail};
use assets::FileLock;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Kernel modules every guest loads (their dependencies come from `modules.dep`): virtio over
/// PCI, virtio-fs, and virtio-net.
const GUEST_MODULES: &[&str] = &["virtio_pci", "virtiofs", "virtio_net"];

/// Lines of the console log that errors show.
const LOG_TAIL_LINES: usize = 40;

/// What a guest is made of; [`GuestBuilder::boot`] starts it.
#[derive(Debug, Clone)]
pub struct GuestBuilder {
    assets: GuestAssets,
    memory_mib: u32,
    virtiofs: Vec<(String, PathBuf)>,
    hotplug_slots: usize,
    nics: Vec<Nic>,
    files: Vec<GuestFile>,
    script: String,
    netns: Option<PathBuf>,
}

impl Guest {
    /// A guest of 512 MiB with no device, no network, and an empty script.
    pub fn builder(assets: &GuestAssets) -> GuestBuilder {
        GuestBuilder {
            assets: assets.clone(),
            memory_mib: 512,
            virtiofs: Vec::new(),
            hotplug_slots: 0,
            nics: Vec::new(),
            files: Vec::new(),
            script: String::new(),
            netns: None,
        }
    }
}

impl GuestBuilder {
    /// Guest RAM (all of it shared with the vhost-user backends, which map it).
    pub fn memory_mib(mut self, mib: u32) -> Self {
        self.memory_mib = mib;
        self
    }

    /// A vhost-user-fs device with tag `tag` whose backend listens on `socket` (QEMU connects
    /// at start, so the backend must be listening by [`GuestBuilder::boot`]); `/init` mounts
    /// it at `/mnt/<tag>`. Tags: 1 to 36 of `A-Z a-z 0-9 . _ -`.
    pub fn virtiofs(mut self, tag: &str, socket: impl Into<PathBuf>) -> Self {
        self.virtiofs.push((tag.to_string(), socket.into()));
        self
    }

    /// Free `pcie-root-port`s `dpufs-port-0`… for devices hot-plugged later through QMP
    /// ([`Guest::qmp_socket`], [`Guest::hotplug_port`]); the DPU agent's QMP attachment
    /// plugs volumes into the free ports of that name.
    pub fn pcie_hotplug_slots(mut self, n: usize) -> Self {
        self.hotplug_slots = n;
        self
    }

    /// A virtio-net card; `/init` gives it its address ([`Nic`]).
    pub fn nic(mut self, nic: Nic) -> Self {
        self.nics.push(nic);
        self
    }

    /// A file in the guest ([`GuestFile`]).
    pub fn file(mut self, file: GuestFile) -> Self {
        self.files.push(file);
        self
    }

    /// `data` at `path` in the guest.
    pub fn bytes(self, path: &str, data: impl Into<Vec<u8>>) -> Self {
        self.file(GuestFile::Bytes {
            path: path.to_string(),
            data: data.into(),
        })
    }

    /// A host executable at `path` in the guest, with its shared libraries.
    pub fn binary(self, path: &str, host: impl Into<PathBuf>) -> Self {
        self.file(GuestFile::Binary {
            path: path.to_string(),
            host: host.into(),
        })
    }

    /// The script `/init` runs (busybox `sh`, after the mounts and the network), stdout to
    /// the test ([`GuestRun::output`]), stderr to the console log.
    pub fn script(mut self, script: &str) -> Self {
        self.script = script.to_string();
        self
    }

    /// Runs QEMU inside the network namespace whose file is `netns`
    /// ([`crate::netns::Netns::path`]): the user-mode network's connections are then made
    /// from there, and `hostfwd` ports listen there.
    pub fn netns(mut self, netns: impl Into<PathBuf>) -> Self {
        self.netns = Some(netns.into());
        self
    }

    /// Waits for the machine's guest lock, builds the initramfs and starts QEMU.
    pub fn boot(self) -> anyhow::Result<Guest> {
        for (tag, _) in &self.virtiofs {
            check_tag(tag)?;
        }
        if self
            .nics
            .iter()
            .filter(|n| matches!(n, Nic::User { .. }))
            .count()
            > 1
        {
            bail!("a guest has at most one user-mode network card (each would be 10.0.2.15)");
        }
        let lock = FileLock::exclusive(&self.assets.dir.join("qemu.lock"))?;
        let dir = tempfile::Builder::new().prefix("dpufs-guest-").tempdir()?;
        let files = qemu::RunFiles::in_dir(dir.path());

        let modules = self.assets.kernel.load_order(GUEST_MODULES)?;
        let tags: Vec<String> = self.virtiofs.iter().map(|(t, _)| t.clone()).collect();
        let init = init::InitPlan {
            modules: &initramfs::module_paths(&modules),
            nics: &self.nics,
            virtiofs_tags: &tags,
        }
        .render();
        let mut guest_files = self.files.clone();
        guest_files.push(GuestFile::Bytes {
            path: init::SCRIPT.to_string(),
            data: self.script.clone().into_bytes(),
        });
        initramfs::build(
            &files.initramfs,
            &self.assets,
            &modules,
            &init,
            &guest_files,
        )?;

        let args = qemu::QemuArgs {
            kernel: &self.assets.kernel,
            files: &files,
            memory_mib: self.memory_mib,
            virtiofs: &self.virtiofs,
            hotplug_slots: self.hotplug_slots,
            nics: &self.nics,
        };
        let mut cmd = std::process::Command::new(&self.assets.qemu);
        cmd.args(args.to_args());
        if let Some(netns) = &self.netns {
            crate::netns::enter_on_exec(netns, &mut cmd)?;
        }
        let child = crate::process::spawn_logged(
            &mut cmd,
            &files.qemu_log,
            crate::process::Detach::DieWithParent,
        )?;
        Ok(Guest {
            child,
            files,
            hotplug_slots: self.hotplug_slots,
            started: Instant::now(),
            _dir: dir,
            _lock: lock,
        })
    }
}

/// Waits until a unix socket listens at `path`, without connecting to it: a vhost-user backend
/// serves the first connection only (the C virtiofsd then exits), and QEMU needs it listening
/// when it starts. Reads `/proc/net/unix`, where a listening socket has flag `__SO_ACCEPTCON`;
/// it lists the sockets of the caller's network namespace only.
pub fn wait_for_listener(path: &Path, timeout: Duration) -> anyhow::Result<()> {
    const SO_ACCEPTCON: u32 = 1 << 16;
    let deadline = Instant::now() + timeout;
    let wanted = path.to_string_lossy();
    loop {
        let table = std::fs::read_to_string("/proc/net/unix")?;
        // Num RefCount Protocol Flags Type St Inode Path
        let listening = table.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() == 8
                && fields[7] == wanted
                && u32::from_str_radix(fields[3], 16).is_ok_and(|f| f & SO_ACCEPTCON != 0)
        });
        if listening {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("nothing listens on {} after {timeout:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A virtio-fs tag the kernel takes and /init can put into a shell line as it is.
fn check_tag(tag: &str) -> anyhow::Result<()> {
    let ok = (1..=36).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    anyhow::ensure!(ok, "virtio-fs tag {tag:?}: 1 to 36 of A-Z a-z 0-9 . _ -");
    Ok(())
}

/// A running guest; QEMU is killed on drop.
#[derive(Debug)]
pub struct Guest {
    child: Child,
    files: qemu::RunFiles,
    hotplug_slots: usize,
    started: Instant,
    _dir: tempfile::TempDir,
    _lock: FileLock,
}

impl Guest {
    /// QEMU's QMP socket (a server; QMP's greeting, then `qmp_capabilities`).
    pub fn qmp_socket(&self) -> &Path {
        &self.files.qmp_socket
    }

    /// The id of free root port `i` (a `device_add`'s `bus`).
    pub fn hotplug_port(&self, i: usize) -> String {
        assert!(
            i < self.hotplug_slots,
            "the guest has {} hot-plug slots",
            self.hotplug_slots
        );
        qemu::hotplug_port(i)
    }

    /// The console log so far: the kernel's messages, /init's and the script's stderr.
    pub fn console(&self) -> String {
        read_lossy(&self.files.console_log)
    }

    /// The script's output so far.
    pub fn output(&self) -> String {
        read_lossy(&self.files.output_log).replace('\r', "")
    }

    /// Waits until the script prints `RESULT key=value` and returns the value: how a test
    /// meets the guest halfway (the guest says it is listening, or waits for a hot-plug).
    pub fn wait_for_result(&mut self, key: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = parse_results(&self.output())
                .into_iter()
                .find_map(|(k, v)| (k == key).then(|| v.to_string()))
            {
                return Ok(value);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "QEMU exited ({status}) before the guest printed RESULT {key}=\n{}",
                    self.report()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "no RESULT {key}= from the guest in {timeout:?}\n{}",
                    self.report()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the guest to power off (QEMU is killed after `timeout`) and returns what its
    /// script printed. An error when QEMU failed or timed out, or the guest did not get to the
    /// end of its script (set-up failed, kernel panic); each says why, with the logs' tails.
    pub fn wait(mut self, timeout: Duration) -> anyhow::Result<GuestRun> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!(
                    "the guest did not power off in {timeout:?}; QEMU killed\n{}",
                    self.report()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let elapsed = self.started.elapsed();
        if !status.success() {
            bail!("QEMU failed ({status})\n{}", self.report());
        }
        let transcript = self.output();
        if let Some(why) = transcript
            .lines()
            .find_map(|l| l.strip_prefix(init::SETUP_FAILED))
        {
            bail!("the guest could not set up: {why}\n{}", self.report());
        }
        let Some((output, rc)) = transcript.rsplit_once(init::DONE) else {
            bail!(
                "the guest powered off without finishing its script\n{}",
                self.report()
            );
        };
        let rc = rc
            .trim()
            .parse()
            .with_context(|| format!("{}{rc}", init::DONE))?;
        Ok(GuestRun {
            output: output.to_string(),
            rc,
            console: self.console(),
            elapsed,
        })
    }

    /// The tails of the console log and of QEMU's own output, and the script's output.
    pub fn report(&self) -> String {
        format!(
            "--- console log (last {LOG_TAIL_LINES} lines)\n{}\n--- QEMU\n{}\n--- script output\n{}",
            tail(&self.console(), LOG_TAIL_LINES),
            read_lossy(&self.files.qemu_log).trim(),
            self.output().trim(),
        )
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a guest's script did.
#[derive(Debug, Clone)]
pub struct GuestRun {
    /// Its stdout, up to the `GUEST-DONE` line.
    pub output: String,
    /// Its exit status.
    pub rc: i32,
    /// The whole console log.
    pub console: String,
    /// From QEMU's start to its exit.
    pub elapsed: Duration,
}

impl GuestRun {
    /// The value of the first `RESULT key=value` line for `key`.
    pub fn result(&self, key: &str) -> Option<&str> {
        parse_results(&self.output)
            .into_iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// Every `RESULT key=value` line, in order.
    pub fn results(&self) -> Vec<(&str, &str)> {
        parse_results(&self.output)
    }

    /// The output and the console's tail, for assertion messages.
    pub fn report(&self) -> String {
        format!(
            "--- script output (rc {})\n{}\n--- console log (last {LOG_TAIL_LINES} lines)\n{}",
            self.rc,
            self.output.trim(),
            tail(&self.console, LOG_TAIL_LINES)
        )
    }
}

fn parse_results(output: &str) -> Vec<(&str, &str)> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_key_value_lines() {
        let out = "== step\nRESULT a=1\nRESULT b=x=y\nRESULTc=2\nRESULT a=3\n";
        assert_eq!(parse_results(out), [("a", "1"), ("b", "x=y"), ("a", "3")]);
    }

    #[test]
    fn a_listening_socket_is_found_without_a_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backend.sock");
        let err = wait_for_listener(&path, Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("nothing listens"), "{err}");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        wait_for_listener(&path, Duration::from_secs(5)).unwrap();
        // Nobody connected: accept has nothing.
        assert!(listener.accept().is_err());
    }

    #[test]
    fn tags_are_checked() {
        assert!(check_tag("vol-1.a_b").is_ok());
        for bad in ["", "a b", "a;reboot", &"x".repeat(37)] {
            assert!(check_tag(bad).is_err(), "{bad:?}");
        }
    }
}
