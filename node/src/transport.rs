//! How a volume reaches its user: a FUSE mount on this kernel, or a vhost-user-fs socket that
//! a virtual machine monitor (QEMU's `vhost-user-fs-pci`, or DOCA SNAP virtio-fs on a DPU)
//! connects to, so that the FUSE requests arrive over virtqueues from another kernel.
//!
//! On the wire an [`Attachment`] is fields of the message it is part of (the keeper's `list`,
//! its volume record, the handover): `{"mountpoint":P}` for a FUSE mount, exactly as before
//! the vhost-user-fs transport existed, and `{"transport":"vhost-user-fs","socket":S}` for an
//! export. A message without `transport` is about a FUSE mount.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The transport a worker serves a volume through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// `/dev/fuse`: a mount on this node's kernel.
    #[default]
    Fuse,
    /// A vhost-user-fs backend on a unix socket (virtio-fs to a guest or a host behind a DPU).
    VhostUserFs,
}

impl Transport {
    /// The name flags and messages use (`fuse`, `vhost-user-fs`).
    pub fn name(self) -> &'static str {
        match self {
            Transport::Fuse => "fuse",
            Transport::VhostUserFs => "vhost-user-fs",
        }
    }

    fn is_fuse(&self) -> bool {
        *self == Transport::Fuse
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Transport, String> {
        match s {
            "fuse" => Ok(Transport::Fuse),
            "vhost-user-fs" => Ok(Transport::VhostUserFs),
            _ => Err(format!("unknown transport {s:?} (fuse, vhost-user-fs)")),
        }
    }
}

/// Where a volume is attached on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "AttachmentFields", into = "AttachmentFields")]
pub enum Attachment {
    /// A FUSE mount at this path.
    Mount(PathBuf),
    /// A vhost-user-fs backend listening on this unix socket.
    VhostUser { socket: PathBuf },
}

impl Attachment {
    /// The transport that serves it.
    pub fn transport(&self) -> Transport {
        match self {
            Attachment::Mount(_) => Transport::Fuse,
            Attachment::VhostUser { .. } => Transport::VhostUserFs,
        }
    }

    /// The mountpoint or the socket.
    pub fn path(&self) -> &Path {
        match self {
            Attachment::Mount(p) | Attachment::VhostUser { socket: p } => p,
        }
    }

    /// The mountpoint, for a FUSE mount.
    pub fn mountpoint(&self) -> Option<&Path> {
        match self {
            Attachment::Mount(p) => Some(p),
            Attachment::VhostUser { .. } => None,
        }
    }
}

impl std::fmt::Display for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attachment::Mount(p) => write!(f, "mounted at {}", p.display()),
            Attachment::VhostUser { socket } => {
                write!(f, "exported on vhost-user socket {}", socket.display())
            }
        }
    }
}

/// The wire form of [`Attachment`] (see the module's documentation).
#[derive(Clone, Serialize, Deserialize)]
struct AttachmentFields {
    #[serde(default, skip_serializing_if = "Transport::is_fuse")]
    transport: Transport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mountpoint: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    socket: Option<PathBuf>,
}

impl TryFrom<AttachmentFields> for Attachment {
    type Error = String;
    fn try_from(f: AttachmentFields) -> Result<Attachment, String> {
        match (f.transport, f.mountpoint, f.socket) {
            (Transport::Fuse, Some(mp), None) => Ok(Attachment::Mount(mp)),
            (Transport::VhostUserFs, None, Some(socket)) => Ok(Attachment::VhostUser { socket }),
            (Transport::Fuse, _, _) => Err("a FUSE volume has a mountpoint and no socket".into()),
            (Transport::VhostUserFs, _, _) => {
                Err("a vhost-user-fs volume has a socket and no mountpoint".into())
            }
        }
    }
}

impl From<Attachment> for AttachmentFields {
    fn from(a: Attachment) -> AttachmentFields {
        let transport = a.transport();
        match a {
            Attachment::Mount(mp) => AttachmentFields {
                transport,
                mountpoint: Some(mp),
                socket: None,
            },
            Attachment::VhostUser { socket } => AttachmentFields {
                transport,
                mountpoint: None,
                socket: Some(socket),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Carrier {
        volume: String,
        #[serde(flatten)]
        attachment: Attachment,
    }

    #[test]
    fn attachments_are_fields_of_their_message() {
        let cases = [
            (
                r#"{"mountpoint":"/mnt/v","volume":"v"}"#,
                Attachment::Mount("/mnt/v".into()),
            ),
            (
                r#"{"socket":"/run/v.sock","transport":"vhost-user-fs","volume":"v"}"#,
                Attachment::VhostUser {
                    socket: "/run/v.sock".into(),
                },
            ),
        ];
        for (text, attachment) in cases {
            let c = Carrier {
                volume: "v".into(),
                attachment,
            };
            assert_eq!(crate::wire::encode(&c), text);
            assert_eq!(serde_json::from_str::<Carrier>(text).unwrap(), c);
        }
        // Written out, `fuse` is the same as no transport.
        let explicit: Carrier =
            serde_json::from_str(r#"{"mountpoint":"/m","transport":"fuse","volume":"v"}"#).unwrap();
        assert_eq!(explicit.attachment, Attachment::Mount("/m".into()));
    }

    #[test]
    fn contradictions_are_refused() {
        for text in [
            r#"{"volume":"v"}"#,
            r#"{"socket":"/s","volume":"v"}"#,
            r#"{"mountpoint":"/m","transport":"vhost-user-fs","volume":"v"}"#,
            r#"{"mountpoint":"/m","socket":"/s","transport":"vhost-user-fs","volume":"v"}"#,
            r#"{"mountpoint":"/m","transport":"nfs","volume":"v"}"#,
        ] {
            assert!(serde_json::from_str::<Carrier>(text).is_err(), "{text}");
        }
    }

    #[test]
    fn transports_parse_from_their_names() {
        for t in [Transport::Fuse, Transport::VhostUserFs] {
            assert_eq!(t.name().parse(), Ok(t));
            assert_eq!(crate::wire::encode(&t), format!("\"{t}\""));
        }
        assert!("virtiofs".parse::<Transport>().is_err());
    }
}
