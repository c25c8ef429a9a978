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
//! `query-chardev`), never remembered: a restarted agent, or a call repeated after
//! a failure half-way, finds the state as it is.

use super::qmp::{
    Chardev, ChardevBackend, Command, DeviceAdd, QmpClient, QomProperty, SocketAddress,
};
use super::{Attach, AttachError, DeviceSpec};
use dpufs_proto::dpu::v1::DeviceTransport;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The id prefix of the root ports the agent may plug into.
pub const PORT_PREFIX: &str = "dpufs-port-";

/// How long a detach waits for the guest to release a device.
const RELEASE_WITHIN: Duration = Duration::from_secs(30);

/// How long an attach waits for QEMU to connect to the worker's socket.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// Hot-plugs through the QMP socket at `socket`.
#[derive(Debug)]
pub struct QmpAttach {
    socket: PathBuf,
    release_within: Duration,
    connect_within: Duration,
    /// Held for each attach and detach, so the agent's calls on different volumes take the
    /// monitor one at a time: QEMU's monitor socket serves one client at a time (a second
    /// connection gets no greeting until the first closes, and a detach may wait 30 s), and two
    /// attaches reading the ports at once would pick the same free port.
    monitor: Mutex<()>,
}

impl QmpAttach {
    pub fn new(socket: PathBuf) -> QmpAttach {
        QmpAttach {
            socket,
            release_within: RELEASE_WITHIN,
            connect_within: CONNECT_WITHIN,
            monitor: Mutex::new(()),
        }
    }

    /// A connection to the monitor, for this call alone.
    fn connect(&self) -> Result<(MutexGuard<'_, ()>, QmpClient), AttachError> {
        // A call that panicked held nothing QEMU keeps: the lock is still good.
        let held = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
        Ok((held, QmpClient::connect(&self.socket)?))
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

/// The free port with the lowest number: a `dpufs-port-N` root port whose bus holds no
/// device. Read from QOM, where a bus links each device plugged into it (`child[N]`) from the
/// `device_add` on. (`query-pci` lists what sits behind a root port only once the guest's
/// firmware has numbered the port's bus: early in a boot every port looked free, and a second
/// attach picked a taken one.)
fn free_port(q: &mut QmpClient) -> Result<String, AttachError> {
    let peripherals: Vec<QomProperty> = q.execute(&Command::QomList {
        path: "/machine/peripheral",
    })?;
    let mut ports: Vec<(u32, &str)> = peripherals
        .iter()
        .filter_map(|p| {
            let n = p.name.strip_prefix(PORT_PREFIX)?.parse::<u32>().ok()?;
            Some((n, p.name.as_str()))
        })
        .collect();
    ports.sort();
    for (_, port) in ports {
        // A root port's bus is its child named as the port.
        let bus: Vec<QomProperty> = q.execute(&Command::QomList {
            path: &format!("/machine/peripheral/{port}/{port}"),
        })?;
        if !bus.iter().any(|p| p.name.starts_with("child[")) {
            return Ok(port.to_string());
        }
    }
    Err(AttachError::NoFreePort)
}

impl Attach for QmpAttach {
    fn transport(&self) -> DeviceTransport {
        DeviceTransport::VhostUserFs
    }

    fn attach(&self, device: &DeviceSpec) -> Result<(), AttachError> {
        let (_held, mut q) = self.connect()?;
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
        let (_held, mut q) = self.connect()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::Arc;

    /// What the fake monitor holds: chardevs, and which device sits in each root port.
    #[derive(Default)]
    struct Machine {
        chardevs: Vec<String>,
        ports: BTreeMap<String, Option<String>>,
        /// The connection (in the order they were taken) of each command answered.
        commands: Vec<usize>,
    }

    /// Answers one command as QEMU would, slowly enough that calls on two connections
    /// would interleave.
    fn answer(machine: &Mutex<Machine>, connection: usize, command: &Value) -> Value {
        std::thread::sleep(Duration::from_millis(20));
        let mut m = machine.lock().unwrap();
        m.commands.push(connection);
        let args = &command["arguments"];
        let ok = json!({"return": {}});
        match command["execute"].as_str().unwrap() {
            "qom-list" => json!({"return": qom_list(&m, args["path"].as_str().unwrap())}),
            "query-chardev" => json!({"return": m.chardevs.iter()
                .map(|c| json!({"label": c, "filename": "unix:/s"})).collect::<Vec<_>>()}),
            "chardev-add" => {
                m.chardevs.push(args["id"].as_str().unwrap().to_string());
                ok
            }
            "device_add" => {
                let port = m.ports.get_mut(args["bus"].as_str().unwrap()).unwrap();
                if port.is_some() {
                    return json!({"error": {"class": "GenericError", "desc": "slot 0 is in use"}});
                }
                *port = Some(args["id"].as_str().unwrap().to_string());
                ok
            }
            _ => ok,
        }
    }

    /// `qom-list` of `/machine/peripheral` (the root ports and the devices in them) or of a
    /// root port's bus (a link per device plugged into it), as QEMU answers.
    fn qom_list(m: &Machine, path: &str) -> Vec<Value> {
        if path == "/machine/peripheral" {
            let ports = m.ports.keys().map(|p| (p, "pcie-root-port"));
            let devices = m.ports.values().flatten().map(|d| (d, "vhost-user-fs-pci"));
            return ports
                .chain(devices)
                .map(|(name, kind)| json!({"name": name, "type": format!("child<{kind}>")}))
                .collect();
        }
        let port = path.rsplit('/').next().unwrap();
        let mut bus = vec![json!({"name": "type", "type": "string"})];
        if let Some(Some(_)) = m.ports.get(port) {
            bus.push(json!({"name": "child[0]", "type": "link<vhost-user-fs-pci>"}));
        }
        bus
    }

    /// A monitor with `ports` empty root ports that takes every connection at once (as QEMU
    /// started with several `-qmp`), on `socket`, for `connections` connections.
    fn fake_monitor(
        socket: &std::path::Path,
        connections: usize,
        ports: usize,
    ) -> Arc<Mutex<Machine>> {
        let machine = Arc::new(Mutex::new(Machine {
            ports: (0..ports)
                .map(|i| (format!("{PORT_PREFIX}{i}"), None))
                .collect(),
            ..Machine::default()
        }));
        let listener = UnixListener::bind(socket).unwrap();
        let shared = machine.clone();
        std::thread::spawn(move || {
            for (connection, stream) in listener.incoming().take(connections).enumerate() {
                let (machine, mut stream) = (shared.clone(), stream.unwrap());
                std::thread::spawn(move || {
                    writeln!(
                        stream,
                        "{}",
                        json!({"QMP": {"version": {}, "capabilities": []}})
                    )
                    .unwrap();
                    let reader = BufReader::new(stream.try_clone().unwrap());
                    for line in reader.lines().map_while(Result::ok) {
                        let reply =
                            answer(&machine, connection, &serde_json::from_str(&line).unwrap());
                        if writeln!(stream, "{reply}").is_err() {
                            break;
                        }
                    }
                });
            }
        });
        machine
    }

    #[test]
    fn the_agents_calls_take_the_monitor_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("qmp.sock");
        let machine = fake_monitor(&socket, 2, 2);
        let attach = Arc::new(QmpAttach::new(socket));
        let calls: Vec<_> = ["dpufs-000000000000a", "dpufs-000000000000b"]
            .into_iter()
            .map(|tag| {
                let attach = attach.clone();
                let device = DeviceSpec {
                    tag: tag.to_string(),
                    socket: dir.path().join(format!("{tag}.sock")),
                };
                std::thread::spawn(move || attach.attach(&device))
            })
            .collect();
        for call in calls {
            call.join()
                .unwrap()
                .expect("each attach finds its own free port");
        }
        // Each attach is one connection; the commands of the two must not interleave. (Counting
        // open connections raced: the fake notices a closed connection only after the next
        // one may already have been taken.)
        let m = machine.lock().unwrap();
        let switches = m.commands.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(
            switches, 1,
            "one attach at a time on the monitor: {:?}",
            m.commands
        );
        let plugged: Vec<_> = m.ports.values().flatten().cloned().collect();
        assert_eq!(plugged.len(), 2, "{:?}", m.ports);
    }

    #[test]
    fn a_port_with_a_device_is_taken_however_far_the_guest_has_booted() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("qmp.sock");
        let machine = fake_monitor(&socket, 3, 1);
        let attach = QmpAttach::new(socket);
        let device = |tag: &str| DeviceSpec {
            tag: tag.to_string(),
            socket: dir.path().join(format!("{tag}.sock")),
        };
        attach.attach(&device("dpufs-000000000000a")).unwrap();
        let second = attach.attach(&device("dpufs-000000000000b"));
        assert!(
            matches!(second, Err(AttachError::NoFreePort)),
            "the only port is taken: {second:?}"
        );
        let m = machine.lock().unwrap();
        assert_eq!(m.ports.values().flatten().count(), 1, "{:?}", m.ports);
    }
}
