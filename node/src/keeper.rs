//! The mount keeper's socket protocol (`<state-dir>/keeper.sock`): one request per
//! connection, one answer line; a handover's answer carries the connection's descriptor.
//!
//! | request | answer |
//! |---|---|
//! | [`Request::Mount`] | [`Reply::Mounted`] |
//! | [`Request::Export`] | [`Reply::Exported`] |
//! | [`Request::Serve`] | [`Reply::Served`] |
//! | [`Request::Handover`] | [`Reply::Handover`] (no `ok` field, the descriptor attached) |
//! | [`Request::Upgrade`] | [`Reply::Upgraded`] |
//! | [`Request::Unmount`] | [`Reply::Unmounted`] |
//! | [`Request::List`] | [`Reply::List`] |
//!
//! Any of them may be answered [`Reply::Refused`] (`{"ok":false,"error":"…"}`).

use crate::handover::{Handover, HandoverError};
use crate::transport::Attachment;
use crate::wire::{self, DecodeError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

/// A request to the keeper.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// Mount the volume (idempotent for the same mountpoint).
    Mount {
        #[serde(default)]
        volume: String,
        mountpoint: PathBuf,
        /// Mount source in /proc/mounts (default `dpufs`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fsname: Option<String>,
        /// Default false.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        read_only: Option<bool>,
        /// Default true.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allow_other: Option<bool>,
    },
    /// Bind and hold the volume's vhost-user-fs listening socket at `socket` (idempotent for
    /// the same path), the way `Mount` holds a FUSE connection: its workers take the listener
    /// by handover and serve the frontend (a VMM) that connects there.
    Export {
        #[serde(default)]
        volume: String,
        socket: PathBuf,
    },
    /// Start the volume's worker with these arguments (backend, caching), of `binary` if
    /// given; answered once it serves.
    Serve {
        #[serde(default)]
        volume: String,
        args: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        binary: Option<PathBuf>,
    },
    /// The volume's connection: what a worker asks for at start.
    Handover {
        #[serde(default)]
        volume: String,
    },
    /// Replace the volume's worker by one of `binary` (default: the same) without failing
    /// a request.
    Upgrade {
        #[serde(default)]
        volume: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        binary: Option<PathBuf>,
    },
    /// Drain the worker, unmount (or close and unlink an export's socket), forget the volume.
    Unmount {
        #[serde(default)]
        volume: String,
    },
    /// Every volume and what the keeper found at start.
    List,
}

/// A request the keeper cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// Not JSON at all: the keeper hangs up without an answer.
    NotJson(String),
    /// Answered with this error.
    Invalid(String),
}

/// The ops, for the unknown-op check.
const OPS: [&str; 7] = [
    "mount", "export", "serve", "handover", "upgrade", "unmount", "list",
];

impl Request {
    /// Reads a request line as the keeper does.
    pub fn decode(text: &str) -> Result<Request, RequestError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| RequestError::NotJson(e.to_string()))?;
        let op = v.get("op").and_then(Value::as_str);
        match op.and_then(|op| OPS.iter().find(|known| **known == op)) {
            Some(op) => serde_json::from_value(v)
                .map_err(|e| RequestError::Invalid(format!("malformed {op} request: {e}"))),
            None => Err(RequestError::Invalid(format!("unknown op {op:?}"))),
        }
    }

    /// The request as its line (without the newline).
    pub fn encode(&self) -> String {
        wire::encode(self)
    }

    /// The op's name.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Mount { .. } => "mount",
            Request::Export { .. } => "export",
            Request::Serve { .. } => "serve",
            Request::Handover { .. } => "handover",
            Request::Upgrade { .. } => "upgrade",
            Request::Unmount { .. } => "unmount",
            Request::List => "list",
        }
    }

    /// The volume the request is about (none for [`Request::List`]).
    pub fn volume(&self) -> Option<&str> {
        match self {
            Request::Mount { volume, .. }
            | Request::Export { volume, .. }
            | Request::Serve { volume, .. }
            | Request::Handover { volume }
            | Request::Upgrade { volume, .. }
            | Request::Unmount { volume } => Some(volume),
            Request::List => None,
        }
    }

    /// Reads the keeper's answer to this request.
    pub fn decode_reply(&self, text: &str) -> Result<Reply, DecodeError> {
        let v = wire::parse(text)?;
        if let Some(error) = wire::refusal(&v) {
            return Ok(Reply::Refused(error));
        }
        let op = self.op();
        Ok(match self {
            Request::Mount { .. } => Reply::Mounted(wire::payload::<MountedBody>(op, v)?.mounted),
            Request::Export { .. } => {
                Reply::Exported(wire::payload::<ExportedBody>(op, v)?.exported)
            }
            Request::Serve { .. } => Reply::Served {
                pid: wire::payload::<ServedBody>(op, v)?.pid,
            },
            Request::Handover { .. } => {
                Reply::Handover(Handover::decode(text).map_err(DecodeError::from)?)
            }
            Request::Upgrade { .. } => {
                let b: UpgradedBody = wire::payload(op, v)?;
                Reply::Upgraded {
                    pid: b.pid,
                    previous: b.previous,
                }
            }
            Request::Unmount { .. } => {
                let b: UnmountedBody = wire::payload(op, v)?;
                if b.mounted {
                    return Err(DecodeError::Unexpected {
                        request: op,
                        detail: "mounted: true".into(),
                    });
                }
                Reply::Unmounted
            }
            Request::List => Reply::List(wire::payload(op, v)?),
        })
    }
}

impl From<HandoverError> for DecodeError {
    fn from(e: HandoverError) -> DecodeError {
        DecodeError::Unexpected {
            request: "handover",
            detail: e.to_string(),
        }
    }
}

/// The keeper's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `{"ok":true,"mounted":"now"|"already"}`.
    Mounted(Attached),
    /// `{"ok":true,"exported":"now"|"already"}`.
    Exported(Attached),
    /// `{"ok":true,"pid":…}`: the worker serves.
    Served { pid: u32 },
    /// `{"ok":true,"pid":new,"previous":old}`: the new worker serves, the old one drained.
    Upgraded { pid: u32, previous: u32 },
    /// `{"ok":true,"mounted":false}`.
    Unmounted,
    /// `{"ok":true,"pid":…,"volumes":[…],"recovered":[…]}`.
    List(List),
    /// The handover itself (no `ok` field); the descriptor rides with it.
    Handover(Handover),
    /// `{"ok":false,"error":"…"}`.
    Refused(String),
}

/// Whether a mount or export request attached the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attached {
    /// Mounted or exported by this request.
    Now,
    /// Already attached there.
    Already,
}

#[derive(Serialize, Deserialize)]
struct MountedBody {
    mounted: Attached,
}

#[derive(Serialize, Deserialize)]
struct ExportedBody {
    exported: Attached,
}

#[derive(Serialize, Deserialize)]
struct ServedBody {
    pid: u32,
}

#[derive(Serialize, Deserialize)]
struct UpgradedBody {
    pid: u32,
    previous: u32,
}

#[derive(Serialize, Deserialize)]
struct UnmountedBody {
    mounted: bool,
}

/// The answer to `list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct List {
    /// The keeper's pid.
    pub pid: u32,
    pub volumes: Vec<VolumeStatus>,
    /// What the keeper did at start with what a previous one left.
    pub recovered: Vec<Recovered>,
}

/// One volume in `list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeStatus {
    pub volume: String,
    /// Its mountpoint, or its transport and socket (`crate::transport`).
    #[serde(flatten)]
    pub attachment: Attachment,
    /// The worker serving it, if one does.
    pub pid: Option<u32>,
    /// Workers started so far; the current one's state directory is `worker-<generation>`.
    pub generation: u32,
    /// Workers replaced after they died.
    pub restarts: u32,
    /// Milliseconds from seeing the last dead worker to its replacement serving.
    pub last_failover_ms: Option<f64>,
    /// Whether the connection's INIT was answered (a session is on record).
    pub initialized: bool,
}

/// What the keeper did at start with one directory a previous keeper left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recovered {
    pub action: RecoveryAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mountpoint: Option<PathBuf>,
    /// The socket of an export.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// The worker left serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// A state directory without a record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PathBuf>,
}

/// What was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecoveryAction {
    /// A directory without a record, or a record whose mount was gone already.
    #[serde(rename = "removed stale state")]
    RemovedStaleState,
    /// A volume whose worker outlived the previous keeper.
    #[serde(rename = "left serving")]
    LeftServing,
    /// A mount nobody held any more.
    #[serde(rename = "detached the dead mount")]
    DetachedDeadMount,
    /// An export nobody listened on any more: its socket file was unlinked.
    #[serde(rename = "removed the dead export")]
    RemovedDeadExport,
}

impl Reply {
    /// The answer as its line (without the newline).
    pub fn encode(&self) -> String {
        self.to_value().to_string()
    }

    fn to_value(&self) -> Value {
        match self {
            Reply::Mounted(m) => wire::ok(&MountedBody { mounted: *m }),
            Reply::Exported(e) => wire::ok(&ExportedBody { exported: *e }),
            Reply::Served { pid } => wire::ok(&ServedBody { pid: *pid }),
            Reply::Upgraded { pid, previous } => wire::ok(&UpgradedBody {
                pid: *pid,
                previous: *previous,
            }),
            Reply::Unmounted => wire::ok(&UnmountedBody { mounted: false }),
            Reply::List(l) => wire::ok(l),
            Reply::Handover(h) => wire::to_value(h),
            Reply::Refused(e) => wire::refused(e),
        }
    }
}

impl Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests as the launcher, `dpufs up`, the workers and the tests send them.
    #[test]
    fn requests_match_their_json() {
        let cases = [
            (
                r#"{"mountpoint":"/mnt/v","op":"mount","volume":"vol"}"#,
                Request::Mount {
                    volume: "vol".into(),
                    mountpoint: "/mnt/v".into(),
                    fsname: None,
                    read_only: None,
                    allow_other: None,
                },
            ),
            (
                r#"{"fsname":"dpufs:default","mountpoint":"/x/mnt","op":"mount","volume":"default"}"#,
                Request::Mount {
                    volume: "default".into(),
                    mountpoint: "/x/mnt".into(),
                    fsname: Some("dpufs:default".into()),
                    read_only: None,
                    allow_other: None,
                },
            ),
            (
                r#"{"allow_other":false,"fsname":"f","mountpoint":"/m","op":"mount","read_only":true,"volume":"v"}"#,
                Request::Mount {
                    volume: "v".into(),
                    mountpoint: "/m".into(),
                    fsname: Some("f".into()),
                    read_only: Some(true),
                    allow_other: Some(false),
                },
            ),
            (
                r#"{"op":"export","socket":"/run/vol.sock","volume":"vol"}"#,
                Request::Export {
                    volume: "vol".into(),
                    socket: "/run/vol.sock".into(),
                },
            ),
            (
                r#"{"args":["--backend","local:/d"],"op":"serve","volume":"vol"}"#,
                Request::Serve {
                    volume: "vol".into(),
                    args: vec!["--backend".into(), "local:/d".into()],
                    binary: None,
                },
            ),
            (
                r#"{"args":[],"binary":"/bin/w","op":"serve","volume":"vol"}"#,
                Request::Serve {
                    volume: "vol".into(),
                    args: vec![],
                    binary: Some("/bin/w".into()),
                },
            ),
            (
                r#"{"op":"handover","volume":"vol-1"}"#,
                Request::Handover {
                    volume: "vol-1".into(),
                },
            ),
            (
                r#"{"op":"upgrade","volume":"vol-1"}"#,
                Request::Upgrade {
                    volume: "vol-1".into(),
                    binary: None,
                },
            ),
            (
                r#"{"binary":"/opt/new","op":"upgrade","volume":"vol-1"}"#,
                Request::Upgrade {
                    volume: "vol-1".into(),
                    binary: Some("/opt/new".into()),
                },
            ),
            (
                r#"{"op":"unmount","volume":"default"}"#,
                Request::Unmount {
                    volume: "default".into(),
                },
            ),
            (r#"{"op":"list"}"#, Request::List),
        ];
        for (text, req) in cases {
            assert_eq!(req.encode(), text);
            assert_eq!(Request::decode(text), Ok(req));
        }
    }

    #[test]
    fn bad_requests_are_told_apart() {
        assert!(matches!(
            Request::decode("{"),
            Err(RequestError::NotJson(_))
        ));
        assert_eq!(
            Request::decode(r#"{"op":"dance"}"#),
            Err(RequestError::Invalid(r#"unknown op Some("dance")"#.into()))
        );
        assert_eq!(
            Request::decode(r#"{"volume":"v"}"#),
            Err(RequestError::Invalid("unknown op None".into()))
        );
        assert!(matches!(
            Request::decode(r#"{"op":"serve","volume":"v"}"#),
            Err(RequestError::Invalid(e)) if e.contains("args")
        ));
        // A missing volume is the empty name, which the keeper refuses by its own rule.
        assert_eq!(
            Request::decode(r#"{"op":"unmount"}"#),
            Ok(Request::Unmount {
                volume: String::new()
            })
        );
        // Extra fields are ignored, as they always were.
        assert_eq!(
            Request::decode(r#"{"op":"list","volume":"x"}"#),
            Ok(Request::List)
        );
    }

    fn list() -> (&'static str, List) {
        (
            concat!(
                r#"{"ok":true,"pid":7,"recovered":["#,
                r#"{"action":"removed stale state","state":"/s/volumes/x"},"#,
                r#"{"action":"left serving","pid":9,"volume":"a"},"#,
                r#"{"action":"detached the dead mount","mountpoint":"/m","volume":"b"},"#,
                r#"{"action":"removed the dead export","socket":"/s","volume":"c"}],"#,
                r#""volumes":[{"generation":2,"initialized":true,"last_failover_ms":16.5,"#,
                r#""mountpoint":"/mnt/v","pid":42,"restarts":1,"volume":"vol-1"},"#,
                r#"{"generation":0,"initialized":false,"last_failover_ms":null,"#,
                r#""pid":null,"restarts":0,"socket":"/run/w.sock","transport":"vhost-user-fs","#,
                r#""volume":"w"}]}"#
            ),
            List {
                pid: 7,
                volumes: vec![
                    VolumeStatus {
                        volume: "vol-1".into(),
                        attachment: Attachment::Mount("/mnt/v".into()),
                        pid: Some(42),
                        generation: 2,
                        restarts: 1,
                        last_failover_ms: Some(16.5),
                        initialized: true,
                    },
                    VolumeStatus {
                        volume: "w".into(),
                        attachment: Attachment::VhostUser {
                            socket: "/run/w.sock".into(),
                        },
                        pid: None,
                        generation: 0,
                        restarts: 0,
                        last_failover_ms: None,
                        initialized: false,
                    },
                ],
                recovered: vec![
                    Recovered {
                        action: RecoveryAction::RemovedStaleState,
                        volume: None,
                        mountpoint: None,
                        socket: None,
                        pid: None,
                        state: Some("/s/volumes/x".into()),
                    },
                    Recovered {
                        action: RecoveryAction::LeftServing,
                        volume: Some("a".into()),
                        mountpoint: None,
                        socket: None,
                        pid: Some(9),
                        state: None,
                    },
                    Recovered {
                        action: RecoveryAction::DetachedDeadMount,
                        volume: Some("b".into()),
                        mountpoint: Some("/m".into()),
                        socket: None,
                        pid: None,
                        state: None,
                    },
                    Recovered {
                        action: RecoveryAction::RemovedDeadExport,
                        volume: Some("c".into()),
                        mountpoint: None,
                        socket: Some("/s".into()),
                        pid: None,
                        state: None,
                    },
                ],
            },
        )
    }

    /// Answers as the keeper sends them.
    #[test]
    fn replies_match_their_json() {
        let vol = || "v".to_string();
        let mount = || Request::Mount {
            volume: vol(),
            mountpoint: "/m".into(),
            fsname: None,
            read_only: None,
            allow_other: None,
        };
        let (list_text, list) = list();
        let handover_text = r#"{"mountpoint":"/mnt/v","session":null,"version":1,"volume":"v"}"#;
        let cases = [
            (
                mount(),
                r#"{"mounted":"now","ok":true}"#,
                Reply::Mounted(Attached::Now),
            ),
            (
                mount(),
                r#"{"mounted":"already","ok":true}"#,
                Reply::Mounted(Attached::Already),
            ),
            (
                Request::Export {
                    volume: vol(),
                    socket: "/s".into(),
                },
                r#"{"exported":"already","ok":true}"#,
                Reply::Exported(Attached::Already),
            ),
            (
                Request::Serve {
                    volume: vol(),
                    args: vec![],
                    binary: None,
                },
                r#"{"ok":true,"pid":42}"#,
                Reply::Served { pid: 42 },
            ),
            (
                Request::Upgrade {
                    volume: vol(),
                    binary: None,
                },
                r#"{"ok":true,"pid":43,"previous":42}"#,
                Reply::Upgraded {
                    pid: 43,
                    previous: 42,
                },
            ),
            (
                Request::Unmount { volume: vol() },
                r#"{"mounted":false,"ok":true}"#,
                Reply::Unmounted,
            ),
            (Request::List, list_text, Reply::List(list)),
            (
                Request::Handover { volume: vol() },
                handover_text,
                Reply::Handover(Handover::new(
                    &vol(),
                    Attachment::Mount("/mnt/v".into()),
                    None,
                )),
            ),
            (
                Request::Serve {
                    volume: vol(),
                    args: vec![],
                    binary: None,
                },
                r#"{"error":"volume v already has a worker","ok":false}"#,
                Reply::Refused("volume v already has a worker".into()),
            ),
        ];
        for (req, text, reply) in cases {
            assert_eq!(reply.encode(), text);
            assert_eq!(req.decode_reply(text), Ok(reply));
        }
    }

    #[test]
    fn a_handover_from_a_newer_keeper_is_refused_with_the_reason() {
        let e = Request::Handover { volume: "v".into() }
            .decode_reply(r#"{"mountpoint":"/m","session":null,"version":9,"volume":"v"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("upgrade the worker binary"), "{e}");
    }

    #[test]
    fn an_answer_of_the_wrong_shape_is_an_error() {
        let serve = Request::Serve {
            volume: "v".into(),
            args: vec![],
            binary: None,
        };
        assert!(serve.decode_reply(r#"{"ok":true}"#).is_err());
        assert!(serve.decode_reply("nope").is_err());
        assert!(
            Request::Unmount { volume: "v".into() }
                .decode_reply(r#"{"mounted":true,"ok":true}"#)
                .is_err()
        );
    }
}
