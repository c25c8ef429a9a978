//! A small typed client of QEMU's machine protocol (QMP) on a unix socket: JSON objects, one
//! per line. After the greeting the client negotiates (`qmp_capabilities`), then sends
//! commands; each answer is `{"return": …}` or `{"error": {"class", "desc"}}`, and
//! asynchronous events (`{"event": …}`) may come between them: they are kept for
//! [`QmpClient::wait_event`].
//!
//! Only the commands the agent needs are spelled ([`Command`]); their answers are typed where
//! the agent reads them.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long one command may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// What went wrong talking to QEMU.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("connecting to {0}: {1}")]
    Connect(PathBuf, std::io::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("QEMU closed the monitor connection")]
    Closed,
    #[error("QEMU sent something that is not QMP: {0}")]
    Protocol(String),
    #[error("{command} failed: {class}: {desc}")]
    Failed {
        command: &'static str,
        class: String,
        desc: String,
    },
}

/// The commands the agent sends.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "execute", content = "arguments", rename_all = "kebab-case")]
pub enum Command<'a> {
    #[serde(rename = "qmp_capabilities")]
    QmpCapabilities,
    QomList {
        path: &'a str,
    },
    QueryChardev,
    ChardevAdd {
        id: &'a str,
        backend: ChardevBackend<'a>,
    },
    ChardevRemove {
        id: &'a str,
    },
    // QEMU spells these two with underscores.
    #[serde(rename = "device_add")]
    DeviceAdd(DeviceAdd<'a>),
    #[serde(rename = "device_del")]
    DeviceDel {
        id: &'a str,
    },
}

impl Command<'_> {
    fn name(&self) -> &'static str {
        match self {
            Command::QmpCapabilities => "qmp_capabilities",
            Command::QomList { .. } => "qom-list",
            Command::QueryChardev => "query-chardev",
            Command::ChardevAdd { .. } => "chardev-add",
            Command::ChardevRemove { .. } => "chardev-remove",
            Command::DeviceAdd(_) => "device_add",
            Command::DeviceDel { .. } => "device_del",
        }
    }
}

/// `chardev-add`'s backend: a socket client to a unix path (QAPI `ChardevBackend` of type
/// `socket`, `SocketAddressLegacy` of type `unix`).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "lowercase")]
pub enum ChardevBackend<'a> {
    Socket {
        addr: SocketAddress<'a>,
        server: bool,
        /// Seconds between reconnection attempts when the connection drops (0: never).
        reconnect: u64,
    },
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "lowercase")]
pub enum SocketAddress<'a> {
    Unix { path: &'a Path },
}

/// `device_add` of a `vhost-user-fs-pci` device.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceAdd<'a> {
    pub driver: &'static str,
    pub id: &'a str,
    pub chardev: &'a str,
    pub tag: &'a str,
    pub bus: &'a str,
    #[serde(rename = "queue-size")]
    pub queue_size: u32,
}

/// One entry of `qom-list`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct QomProperty {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
}

/// One entry of `query-chardev`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Chardev {
    pub label: String,
    pub filename: String,
}

/// An asynchronous event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Event {
    pub event: String,
    #[serde(default)]
    pub data: Value,
}

/// A negotiated QMP connection.
#[derive(Debug)]
pub struct QmpClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    events: VecDeque<Event>,
}

impl QmpClient {
    /// Connects to the monitor at `socket`, reads the greeting and negotiates.
    pub fn connect(socket: &Path) -> Result<QmpClient, QmpError> {
        let stream =
            UnixStream::connect(socket).map_err(|e| QmpError::Connect(socket.into(), e))?;
        stream.set_read_timeout(Some(ANSWER_WITHIN))?;
        let mut client = QmpClient {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            events: VecDeque::new(),
        };
        let greeting = client.read()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!("greeting {greeting}")));
        }
        client.execute::<Value>(&Command::QmpCapabilities)?;
        Ok(client)
    }

    fn read(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(QmpError::Closed);
        }
        serde_json::from_str(&line).map_err(|e| QmpError::Protocol(format!("{e}: {line}")))
    }

    /// Sends `command` and returns its answer, keeping the events that come before it.
    pub fn execute<T: DeserializeOwned>(&mut self, command: &Command<'_>) -> Result<T, QmpError> {
        let mut line =
            serde_json::to_vec(command).map_err(|e| QmpError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        loop {
            let mut v = self.read()?;
            if let Some(ret) = v.get_mut("return") {
                return serde_json::from_value(ret.take())
                    .map_err(|e| QmpError::Protocol(format!("{}: {e}", command.name())));
            }
            if let Some(err) = v.get("error") {
                let text = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                return Err(QmpError::Failed {
                    command: command.name(),
                    class: text("class"),
                    desc: text("desc"),
                });
            }
            self.keep_event(v)?;
        }
    }

    fn keep_event(&mut self, v: Value) -> Result<(), QmpError> {
        let event: Event =
            serde_json::from_value(v.clone()).map_err(|_| QmpError::Protocol(v.to_string()))?;
        self.events.push_back(event);
        Ok(())
    }

    /// Waits up to `within` for an event that `wanted` accepts (among those kept, then as they
    /// come); `None` when none came.
    pub fn wait_event(
        &mut self,
        within: Duration,
        wanted: impl Fn(&Event) -> bool,
    ) -> Result<Option<Event>, QmpError> {
        if let Some(i) = self.events.iter().position(&wanted) {
            return Ok(self.events.remove(i));
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.writer.set_read_timeout(Some(left))?;
            let read = self.read();
            self.writer.set_read_timeout(Some(ANSWER_WITHIN))?;
            match read {
                Ok(v) => {
                    self.keep_event(v)?;
                    if let Some(e) = self.events.back().filter(|e| wanted(e)) {
                        let e = e.clone();
                        self.events.pop_back();
                        return Ok(Some(e));
                    }
                }
                Err(QmpError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn commands_are_spelled_as_qemu_reads_them() {
        let add = Command::ChardevAdd {
            id: "dpufs-0123-chr",
            backend: ChardevBackend::Socket {
                addr: SocketAddress::Unix {
                    path: Path::new("/var/lib/dpufs/vhost-user/x.sock"),
                },
                server: false,
                reconnect: 1,
            },
        };
        assert_eq!(
            serde_json::to_value(&add).unwrap(),
            json!({"execute": "chardev-add", "arguments": {"id": "dpufs-0123-chr", "backend":
                {"type": "socket", "data": {"addr": {"type": "unix", "data":
                    {"path": "/var/lib/dpufs/vhost-user/x.sock"}}, "server": false, "reconnect": 1}}}})
        );
        assert_eq!(
            serde_json::to_value(Command::QmpCapabilities).unwrap(),
            json!({"execute": "qmp_capabilities"})
        );
        assert_eq!(
            serde_json::to_value(Command::QomList {
                path: "/machine/peripheral/dpufs-port-0/dpufs-port-0"
            })
            .unwrap(),
            json!({"execute": "qom-list", "arguments":
                {"path": "/machine/peripheral/dpufs-port-0/dpufs-port-0"}})
        );
        let dev = Command::DeviceAdd(DeviceAdd {
            driver: "vhost-user-fs-pci",
            id: "dpufs-0123",
            chardev: "dpufs-0123-chr",
            tag: "dpufs-0123",
            bus: "dpufs-port-0",
            queue_size: 1024,
        });
        assert_eq!(
            serde_json::to_value(dev).unwrap(),
            json!({"execute": "device_add", "arguments": {"driver": "vhost-user-fs-pci",
                "id": "dpufs-0123", "chardev": "dpufs-0123-chr", "tag": "dpufs-0123",
                "bus": "dpufs-port-0", "queue-size": 1024}})
        );
        assert_eq!(
            serde_json::to_value(Command::DeviceDel { id: "dpufs-0123" }).unwrap(),
            json!({"execute": "device_del", "arguments": {"id": "dpufs-0123"}})
        );
    }
}
