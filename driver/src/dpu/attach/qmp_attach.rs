//! `--attach qmp:PATH`: the host is a QEMU guest, and each volume's device is hot-plugged
//! through QEMU's monitor as SNAP hot-plugs a PCIe function.
//!
//! Attach: a socket chardev that connects to the volume's vhost-user socket (`<tag>-chr`,
//! reconnecting every second if the worker behind it is replaced), then a `vhost-user-fs-pci`
//! device with the volume's tag as its id, in the first free `pcie-root-port` whose id starts
//! with `dpufs-port-` (QEMU must be started with such ports: a q35 machine cannot hot-plug
//! into its root bus). Detach: `device_del`, then wait for `DEVICE_DELETED` (the guest must
//! release the device), then `chardev-remove`.
//!
//! What is plugged is read from QEMU each time (`qom-list /machine/peripheral`,
//! `query-chardev`, `query-pci`), never remembered: a restarted agent, or a call repeated after
//! a failure half-way, finds the state as it is.

use super::qmp::{
    Chardev, ChardevBackend, Command, DeviceAdd, PciBus, PciDevice, QmpClient, QomProperty,
    SocketAddress,
};
use super::{Attach, AttachError, DeviceSpec};
use dpufs_proto::dpu::v1::DeviceTransport;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The id prefix of the root ports the agent may plug into.
pub const PORT_PREFIX: &str = "dpufs-port-";

/// How long a detach waits for the guest to release a device.
const RELEASE_WITHIN: Duration = Duration::from_secs(30);

/// How long an attach waits for QEMU to connect to the worker's socket.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// Hot-plugs through the QMP socket at `socket`.
#[derive(Debug, Clone)]
pub struct QmpAttach {
    socket: PathBuf,
    release_within: Duration,
    connect_within: Duration,
}

impl QmpAttach {
    pub fn new(socket: PathBuf) -> QmpAttach {
        QmpAttach {
            socket,
            release_within: RELEASE_WITHIN,
            connect_within: CONNECT_WITHIN,
        }
    }

    /// The same, waiting at most `within` for a guest to release a device.
    pub fn releasing_within(mut self, within: Duration) -> QmpAttach {
        self.release_within = within;
        self
    }
}

fn chardev_id(device: &DeviceSpec) -> String {
    format!("{}-chr", device.tag)
}

fn device_present(q: &mut QmpClient, id: &str) -> Result<bool, AttachError> {
    let devices: Vec<QomProperty> = q.execute(&Command::QomList {
        path: "/machine/peripheral",
    })?;
    Ok(devices.iter().any(|d| d.name == id))
}

fn chardev_present(q: &mut QmpClient, id: &str) -> Result<bool, AttachError> {
    let chardevs: Vec<Chardev> = q.execute(&Command::QueryChardev)?;
    Ok(chardevs.iter().any(|c| c.label == id))
}

/// Waits until the chardev `id` is connected to the worker's socket. A socket chardev with
/// `reconnect` connects in the background: until it has, `query-chardev` names it
/// `disconnected:…`, and a `device_add` on it fails ("vhost_backend_init failed: Protocol
/// error"; seen with QEMU 7.2 when the add came right after `chardev-add`).
fn wait_connected(
    q: &mut QmpClient,
    id: &str,
    device: &DeviceSpec,
    within: Duration,
) -> Result<(), AttachError> {
    let start = Instant::now();
    loop {
        let chardevs: Vec<Chardev> = q.execute(&Command::QueryChardev)?;
        let connected = chardevs
            .iter()
            .any(|c| c.label == id && !c.filename.starts_with("disconnected:"));
        if connected {
            return Ok(());
        }
        if start.elapsed() >= within {
            return Err(AttachError::NotConnected {
                socket: device.socket.clone(),
                waited: within,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The free port with the lowest number: a `dpufs-port-N` bridge with nothing behind it.
fn free_port(q: &mut QmpClient) -> Result<String, AttachError> {
    let buses: Vec<PciBus> = q.execute(&Command::QueryPci)?;
    let mut free: Vec<(u32, String)> = buses
        .iter()
        .flat_map(|b| b.devices.iter())
        .filter_map(|d: &PciDevice| {
            let n = d.qdev_id.strip_prefix(PORT_PREFIX)?.parse::<u32>().ok()?;
            let empty = d.pci_bridge.as_ref()?.devices.is_empty();
            empty.then(|| (n, d.qdev_id.clone()))
        })
        .collect();
    free.sort();
    free.into_iter()
        .next()
        .map(|(_, id)| id)
        .ok_or(AttachError::NoFreePort)
}

impl Attach for QmpAttach {
    fn transport(&self) -> DeviceTransport {
        DeviceTransport::VhostUserFs
    }

    fn attach(&self, device: &DeviceSpec) -> Result<(), AttachError> {
        let mut q = QmpClient::connect(&self.socket)?;
        if device_present(&mut q, &device.tag)? {
            return Ok(());
        }
        let chardev = chardev_id(device);
        if !chardev_present(&mut q, &chardev)? {
            q.execute::<serde_json::Value>(&Command::ChardevAdd {
                id: &chardev,
                backend: ChardevBackend::Socket {
                    addr: SocketAddress::Unix {
                        path: &device.socket,
                    },
                    server: false,
                    reconnect: 1,
                },
            })?;
        }
        wait_connected(&mut q, &chardev, device, self.connect_within)?;
        let port = free_port(&mut q)?;
        q.execute::<serde_json::Value>(&Command::DeviceAdd(DeviceAdd {
            driver: "vhost-user-fs-pci",
            id: &device.tag,
            chardev: &chardev,
            tag: &device.tag,
            bus: &port,
            queue_size: 1024,
        }))?;
        tracing::info!(tag = %device.tag, %port, "virtio-fs device hot-plugged");
        Ok(())
    }

    fn detach(&self, device: &DeviceSpec) -> Result<(), AttachError> {
        let mut q = QmpClient::connect(&self.socket)?;
        let id = device.tag.as_str();
        if device_present(&mut q, id)? {
            // A second device_del of a device being unplugged fails; the wait below is the
            // same either way.
            if let Err(e) = q.execute::<serde_json::Value>(&Command::DeviceDel { id }) {
                tracing::info!(tag = %id, "device_del: {e}; waiting for the unplug in progress");
            }
            let start = Instant::now();
            loop {
                let deleted = q.wait_event(Duration::from_secs(1), |e| {
                    e.event == "DEVICE_DELETED"
                        && e.data.get("device").and_then(|d| d.as_str()) == Some(id)
                })?;
                // The event may have gone to an earlier connection (a detach that timed out
                // and is repeated): the device being gone is enough.
                if deleted.is_some() || !device_present(&mut q, id)? {
                    break;
                }
                if start.elapsed() >= self.release_within {
                    return Err(AttachError::NotReleased {
                        tag: id.to_string(),
                        waited: self.release_within,
                    });
                }
            }
            tracing::info!(tag = %id, "virtio-fs device unplugged");
        }
        let chardev = chardev_id(device);
        if chardev_present(&mut q, &chardev)? {
            q.execute::<serde_json::Value>(&Command::ChardevRemove { id: &chardev })?;
        }
        Ok(())
    }
}
