//! The host: a QEMU guest whose QEMU runs in the `host` namespace, running
//! `e2e/guest/dpu_host.sh`: the CSI node shim (`dpufs-csi node --mode dpu-host`, with its
//! shared libraries) and the commands the test sends it. The test is kubelet: it calls the
//! shim's CSI Node service through QEMU's port forward in the host namespace and the guest's
//! `tcp-to-unix` relay to the shim's unix socket.

use super::{DpuBed, kubeconfig};
use dpufs_e2e::guest::{Guest, GuestAssets, Nic};
use dpufs_e2e::netns::connect_from;
use dpufs_proto::csi::v1::node_client::NodeClient;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

const SCRIPT: &str = include_str!("../../guest/dpu_host.sh");
/// The relay's port in the guest, forwarded from the same port on the host namespace's
/// loopback.
const CSI_PORT: u16 = 10_000;
/// The system's CA certificates (Debian's `ca-certificates`).
const CA_STORE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Boot to the script, with a 55 MB `dpufs-csi` in the initramfs.
const BOOT_WITHIN: Duration = Duration::from_secs(90);

/// What the guest's files hold: random bytes, made once per test.
#[derive(Debug)]
pub struct GuestData {
    /// 1 MiB + 4099 B per volume.
    pub blob_a: Vec<u8>,
    pub blob_b: Vec<u8>,
    /// The write loop's 64 KiB.
    pub chunk: Vec<u8>,
}

impl GuestData {
    pub fn random() -> GuestData {
        let mut urandom = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
        let mut bytes = |n: usize| {
            let mut b = vec![0; n];
            urandom.read_exact(&mut b).expect("reading /dev/urandom");
            b
        };
        GuestData {
            blob_a: bytes((1 << 20) + 4099),
            blob_b: bytes((1 << 20) + 4099),
            chunk: bytes(64 << 10),
        }
    }
}

/// The running host.
pub struct HostGuest {
    guest: Guest,
    /// Where the guest fetches its next command (on the DPU's host link).
    commands: TcpListener,
    /// The shim's CSI Node service.
    pub node: NodeClient<Channel>,
}

impl std::fmt::Debug for HostGuest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostGuest").finish_non_exhaustive()
    }
}

/// What one command printed: its `RESULT <label>.<key>=<value>` lines, and its manifest lines
/// (`M <label> ...`).
#[derive(Debug, Clone)]
pub struct Reply {
    pub label: String,
    pub results: BTreeMap<String, String>,
    pub manifest: Vec<String>,
}

impl Reply {
    /// The value of `<label>.<key>`; panics naming what the command printed when missing.
    pub fn get(&self, key: &str) -> &str {
        self.results
            .get(key)
            .unwrap_or_else(|| panic!("{} printed no {key}: {:?}", self.label, self.results))
    }
}

impl HostGuest {
    /// Boots the host: QEMU in the bed's `host` namespace with free PCIe root ports for the
    /// agent's hot-plugs, a user-mode network card (its connections leave from the host
    /// namespace), the shim, the relay, the host's client certificate of the control channel,
    /// a kubeconfig for the API server, and `data`. Returns once the shim serves.
    pub async fn boot(
        dpu: &DpuBed,
        assets: &GuestAssets,
        data: &GuestData,
    ) -> anyhow::Result<HostGuest> {
        let commands = TcpListener::bind((dpu.net.dpu_host_ip, 0))?;
        commands.set_nonblocking(true)?;
        let script = format!(
            "sh /guest/dpu_host.sh {} {} {}",
            dpu.net.dpu_host_ip,
            commands.local_addr()?.port(),
            dpu.agent_addr.port()
        );
        let cert = |name: &str| std::fs::read(dpu.certs.join(name));
        let mut guest = Guest::builder(assets)
            .memory_mib(768)
            .pcie_hotplug_slots(3)
            .nic(Nic::user().hostfwd(CSI_PORT, CSI_PORT))
            .netns(dpu.net.host.path())
            .binary(
                "/bin/dpufs-csi",
                dpufs_e2e::binary("dpufs-csi", "dpufs-csi"),
            )
            .binary(
                "/bin/tcp-to-unix",
                dpufs_e2e::binary("tcp-to-unix", "dpufs-e2e"),
            )
            .bytes("/etc/dpufs/ca.crt", cert("ca.crt")?)
            .bytes("/etc/dpufs/host.crt", cert("host.crt")?)
            .bytes("/etc/dpufs/host.key", cert("host.key")?)
            .bytes("/etc/dpufs/kubeconfig", kubeconfig(&dpu.api_url))
            // The machine's CA store, as every host has one: the shim's Kubernetes client
            // will not start without one, even for a plain-HTTP API server.
            .bytes(CA_STORE, std::fs::read(CA_STORE)?)
            .bytes("/data/blob-a", data.blob_a.clone())
            .bytes("/data/blob-b", data.blob_b.clone())
            .bytes("/data/chunk", data.chunk.clone())
            .bytes("/guest/dpu_host.sh", SCRIPT)
            .script(&script)
            .boot()?;
        guest.wait_for_result("booted", BOOT_WITHIN)?;
        let node = NodeClient::new(shim_channel(dpu.net.host.path()).await?);
        Ok(HostGuest {
            guest,
            commands,
            node,
        })
    }

    /// QEMU's monitor, for the agent's `--attach qmp:`.
    pub fn qmp_socket(&self) -> &Path {
        self.guest.qmp_socket()
    }

    /// Has the guest run `command` (`name label args...`) and returns what it printed, once
    /// it printed `<label>.end` (within `within`).
    pub fn run(&mut self, command: &str, within: Duration) -> anyhow::Result<Reply> {
        self.send(command, within)?;
        self.reply(command, within)
    }

    /// Hands `command` to the guest when it asks for its next one (within `within`).
    pub fn send(&mut self, command: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            match self.commands.accept() {
                Ok((mut conn, _)) => {
                    conn.set_nonblocking(false)?;
                    conn.write_all(format!("{command}\n").as_bytes())?;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        anyhow::bail!(
                            "the guest did not ask for a command in {within:?} (busy or stuck)\n{}",
                            self.report()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits until `command` (sent earlier) printed `<label>.end`, and returns its reply.
    pub fn reply(&mut self, command: &str, within: Duration) -> anyhow::Result<Reply> {
        let label = label_of(command);
        self.guest
            .wait_for_result(&format!("{label}.end"), within)?;
        Ok(self.reply_so_far(command))
    }

    /// What `command` printed so far.
    pub fn reply_so_far(&self, command: &str) -> Reply {
        let label = label_of(command);
        let output = self.guest.output();
        let prefix = format!("{label}.");
        let results = output
            .lines()
            .filter_map(|l| l.strip_prefix("RESULT "))
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_string(), v.to_string())))
            .collect();
        let manifest = output
            .lines()
            .filter(|l| l.starts_with(&format!("M {label} ")))
            .map(str::to_string)
            .collect();
        Reply {
            label,
            results,
            manifest,
        }
    }

    /// Waits for `<label>.<key>` of a command still running.
    pub fn wait_for(&mut self, label: &str, key: &str, within: Duration) -> anyhow::Result<String> {
        self.guest
            .wait_for_result(&format!("{label}.{key}"), within)
    }

    /// The guest's output and console, for failure messages.
    pub fn report(&self) -> String {
        let console = self.guest.console();
        let lines: Vec<&str> = console.lines().collect();
        format!(
            "--- guest console (last 60 lines)\n{}\n--- guest output\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n"),
            self.guest.output()
        )
    }

    /// Pulls the plug: QEMU is killed, whatever the guest is doing (a reset).
    pub fn reset(self) {
        drop(self.guest);
    }

    /// Ends the command loop and waits for the guest to power off.
    pub fn quit(mut self, within: Duration) -> anyhow::Result<()> {
        self.send("quit", within)?;
        let run = self.guest.wait(within)?;
        anyhow::ensure!(run.rc == 0, "the guest's script failed\n{}", run.report());
        Ok(())
    }
}

/// The second word of a command.
fn label_of(command: &str) -> String {
    command
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("a command has a label: {command:?}"))
        .to_string()
}

/// A channel to the shim: TCP connections made in the host namespace to QEMU's forwarded
/// port, which the guest's relay joins to the shim's socket. Made again after a failure (the
/// shim restarted).
async fn shim_channel(host_netns: PathBuf) -> anyhow::Result<Channel> {
    let addr = SocketAddr::from(([127, 0, 0, 1], CSI_PORT));
    let connector = tower::service_fn(move |_| {
        let netns = host_netns.clone();
        async move {
            let stream = tokio::task::spawn_blocking(move || {
                connect_from(&netns, addr, Duration::from_secs(5)).map_err(std::io::Error::other)
            })
            .await
            .map_err(std::io::Error::other)??;
            stream.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::TcpStream::from_std(stream)?,
            ))
        }
    });
    Ok(Endpoint::from_static("http://dpu-host.invalid")
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(connector)
        .await?)
}
