//! The volume worker's control socket (`<state-dir>/control.sock`): one JSON object per
//! line in, one per line out.
//!
//! | request | answer |
//! |---|---|
//! | [`Request::Health`] | [`Reply::Health`] |
//! | [`Request::Stats`] | [`Reply::Stats`] |
//! | [`Request::Statfs`] | [`Reply::Statfs`]: the usage the kernel's statfs(2) of the volume sees |
//! | [`Request::Stop`] | [`Reply::Stopping`], sent before the stop begins |
//! | anything else | [`Reply::Refused`] |

use crate::qos::QosLimits;
use crate::transport::Transport;
use crate::wire::{self, DecodeError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A request to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// How the worker is and what it serves.
    Health,
    /// Its counters.
    Stats,
    /// The volume's usage, as statfs(2) of a mount of it reports it: what the DPU agent
    /// answers GetVolumeStats with, having no mount of its own to ask.
    Statfs,
    /// Stop: unmount (when it mounted) or drain (when it serves a handed descriptor).
    Stop,
}

impl Request {
    /// Reads a request line as the worker does; the error is what the worker answers.
    pub fn decode(text: &str) -> Result<Request, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        match v.get("op").and_then(Value::as_str) {
            Some("health") => Ok(Request::Health),
            Some("stats") => Ok(Request::Stats),
            Some("statfs") => Ok(Request::Statfs),
            Some("stop") => Ok(Request::Stop),
            Some(other) => Err(format!("unknown op {other:?}")),
            None => Err("missing \"op\"".to_string()),
        }
    }

    /// The request as its line (without the newline).
    pub fn encode(&self) -> String {
        wire::encode(self)
    }

    /// Reads the worker's answer to this request.
    pub fn decode_reply(&self, text: &str) -> Result<Reply, DecodeError> {
        let v = wire::parse(text)?;
        if let Some(error) = wire::refusal(&v) {
            return Ok(Reply::Refused(error));
        }
        Ok(match self {
            Request::Health => Reply::Health(wire::payload("health", v)?),
            Request::Stats => Reply::Stats(wire::payload::<StatsBody>("stats", v)?.stats),
            Request::Statfs => Reply::Statfs(wire::payload::<StatfsBody>("statfs", v)?.statfs),
            Request::Stop => {
                let b: StoppingBody = wire::payload("stop", v)?;
                if b.state != WorkerState::Stopping {
                    return Err(DecodeError::Unexpected {
                        request: "stop",
                        detail: format!("state {:?}", b.state),
                    });
                }
                Reply::Stopping
            }
        })
    }
}

/// A worker's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `{"ok":true,"state":…,"initialized":…,…}`.
    Health(Health),
    /// `{"ok":true,"stats":{…}}`.
    Stats(WorkerStats),
    /// `{"ok":true,"statfs":{…}}`.
    Statfs(FsUsage),
    /// `{"ok":true,"state":"stopping"}`.
    Stopping,
    /// `{"ok":false,"error":"…"}`.
    Refused(String),
}

impl Reply {
    /// The answer as its line (without the newline).
    pub fn encode(&self) -> String {
        self.to_value().to_string()
    }

    fn to_value(&self) -> Value {
        match self {
            Reply::Health(h) => wire::ok(h),
            Reply::Stats(s) => wire::ok(&StatsBody { stats: s.clone() }),
            Reply::Statfs(u) => wire::ok(&StatfsBody { statfs: *u }),
            Reply::Stopping => wire::ok(&StoppingBody {
                state: WorkerState::Stopping,
            }),
            Reply::Refused(e) => wire::refused(e),
        }
    }
}

/// The answer as it goes on the wire (what `dpufs status --json` shows of a worker).
impl Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

#[derive(Serialize, Deserialize)]
struct StatsBody {
    stats: WorkerStats,
}

#[derive(Serialize, Deserialize)]
struct StatfsBody {
    statfs: FsUsage,
}

/// A volume's usage in statvfs(3)'s terms: blocks of `block_size` bytes and files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FsUsage {
    pub block_size: u64,
    pub blocks: u64,
    pub blocks_free: u64,
    /// Free to unprivileged users.
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
}

#[derive(Serialize, Deserialize)]
struct StoppingBody {
    state: WorkerState,
}

/// Whether a worker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    Serving,
    Stopping,
}

/// The answer to `health`: what the worker is (also its `worker.json`) and how it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub state: WorkerState,
    /// This process answered INIT, or took over a connection that had.
    pub initialized: bool,
    pub threads_alive: u64,
    pub in_flight: u64,
    pub uptime_secs: f64,
    /// The QoS limits in force (read from the worker's `--qos` file).
    #[serde(default)]
    pub qos: QosLimits,
    /// With the vhost-user-fs transport: the frontend (VMM) connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend: Option<Frontend>,
    #[serde(flatten)]
    pub info: WorkerInfo,
}

/// A vhost-user-fs worker's frontends: it serves one connection at a time, and takes the
/// next one when that one ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frontend {
    /// A frontend is connected now.
    pub connected: bool,
    /// Connections accepted since the worker started.
    pub connections: u64,
}

/// What a worker is, fixed at start: `health` reports it and `worker.json` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Of this record (1).
    pub version: u32,
    pub pid: u32,
    /// The `--backend` served.
    pub backend: String,
    /// How the volume is served (`fuse` in records older than the field).
    #[serde(default)]
    pub transport: Transport,
    /// Where the connection is mounted, if known (FUSE).
    pub mountpoint: Option<PathBuf>,
    /// The vhost-user socket the worker listens on (vhost-user-fs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// Whether the worker mounted (and unmounts when it stops).
    pub owns_mount: bool,
    pub fsname: String,
    /// Reader threads.
    pub threads: u64,
    pub uid: u32,
    pub gid: u32,
    /// The access mode, as Rust names it (`MultiWriter`, `SingleWriter`, `ReadOnly`).
    pub access: String,
    pub data_cache: bool,
    pub writeback_cache: bool,
}

/// The answer to `stats`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WorkerStats {
    pub uptime_secs: f64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub in_flight: u64,
    /// Requests the transport could not decode or answer (the kernel gave up on them).
    pub transport_errors: u64,
    /// Getattrs of a directory answered from the attributes the reply to this worker's own
    /// change there carried, without asking the backend (docs/worker.md).
    #[serde(default)]
    pub changed_dir_answers: u64,
    /// Lookups answered "absent" without asking the backend: names a directory this worker
    /// made does not hold, on a single-writer volume (docs/worker.md).
    #[serde(default)]
    pub absent_answers: u64,
    /// Lookups, getattrs and listing ends answered from what the worker kept of the
    /// backend's earlier answers, on a single-writer volume after the kernel dropped its own
    /// (docs/worker.md).
    #[serde(default)]
    pub cached_answers: u64,
    /// Error replies by errno name (`ENOENT`, …, `other`).
    pub errors: BTreeMap<String, u64>,
    /// Per FUSE operation (`write`, `lookup`, …); operations never seen are left out.
    pub ops: BTreeMap<String, OpStats>,
}

/// One operation's counters.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OpStats {
    pub count: u64,
    pub errors: u64,
    /// Mean latency in µs, to a tenth.
    pub mean_us: f64,
    pub max_us: u64,
    /// Percentiles as the upper bound of their power-of-two bucket (none before a timing).
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    /// `[upper bound in µs (exclusive), count]` of the non-empty buckets.
    pub histogram_us: Vec<(u64, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_match_their_json() {
        for (text, req) in [
            (r#"{"op":"health"}"#, Request::Health),
            (r#"{"op":"stats"}"#, Request::Stats),
            (r#"{"op":"statfs"}"#, Request::Statfs),
            (r#"{"op":"stop"}"#, Request::Stop),
        ] {
            assert_eq!(req.encode(), text);
            assert_eq!(Request::decode(text), Ok(req));
        }
        assert_eq!(
            Request::decode(r#"{"op":"health","extra":1}"#),
            Ok(Request::Health)
        );
    }

    /// The worker's answers to bad requests, word for word.
    #[test]
    fn bad_requests_get_the_same_errors() {
        assert_eq!(
            Request::decode(r#"{"op":"dance"}"#),
            Err(r#"unknown op "dance""#.to_string())
        );
        assert_eq!(
            Request::decode(r#"{"no":"op"}"#),
            Err(r#"missing "op""#.to_string())
        );
        assert_eq!(
            Request::decode(r#"{"op":5}"#),
            Err(r#"missing "op""#.to_string())
        );
        let e = Request::decode("{").unwrap_err();
        assert!(e.starts_with("not JSON: "), "{e}");
        assert_eq!(
            Reply::Refused(r#"unknown op "dance""#.into()).encode(),
            r#"{"error":"unknown op \"dance\"","ok":false}"#
        );
    }

    fn health() -> Health {
        Health {
            state: WorkerState::Serving,
            initialized: true,
            threads_alive: 4,
            in_flight: 0,
            uptime_secs: 1.5,
            qos: QosLimits {
                max_throughput_mibps: Some(100),
                max_iops: None,
            },
            frontend: None,
            info: WorkerInfo {
                version: 1,
                pid: 42,
                backend: "local:/srv".into(),
                transport: Transport::Fuse,
                mountpoint: Some("/mnt/v".into()),
                socket: None,
                owns_mount: false,
                fsname: "dpufs".into(),
                threads: 4,
                uid: 0,
                gid: 0,
                access: "MultiWriter".into(),
                data_cache: true,
                writeback_cache: false,
            },
        }
    }

    fn vhost_user_health() -> Health {
        let mut h = health();
        h.frontend = Some(Frontend {
            connected: true,
            connections: 2,
        });
        h.info.transport = Transport::VhostUserFs;
        h.info.mountpoint = None;
        h.info.socket = Some("/run/v.sock".into());
        h
    }

    fn stats() -> WorkerStats {
        WorkerStats {
            uptime_secs: 1.5,
            bytes_read: 0,
            bytes_written: 4096,
            in_flight: 0,
            transport_errors: 0,
            changed_dir_answers: 3,
            absent_answers: 5,
            cached_answers: 7,
            errors: [("ENOENT".to_string(), 2)].into(),
            ops: [(
                "write".to_string(),
                OpStats {
                    count: 1,
                    errors: 0,
                    mean_us: 31.0,
                    max_us: 31,
                    p50_us: Some(32),
                    p99_us: Some(32),
                    histogram_us: vec![(32, 1)],
                },
            )]
            .into(),
        }
    }

    /// Answers as the worker sends them.
    #[test]
    fn replies_match_their_json() {
        let cases = [
            (
                Request::Health,
                concat!(
                    r#"{"access":"MultiWriter","backend":"local:/srv","data_cache":true,"#,
                    r#""fsname":"dpufs","gid":0,"in_flight":0,"initialized":true,"#,
                    r#""mountpoint":"/mnt/v","ok":true,"owns_mount":false,"pid":42,"#,
                    r#""qos":{"maxThroughputMiBps":100},"#,
                    r#""state":"serving","threads":4,"threads_alive":4,"transport":"fuse","#,
                    r#""uid":0,"uptime_secs":1.5,"version":1,"writeback_cache":false}"#
                ),
                Reply::Health(health()),
            ),
            (
                Request::Health,
                concat!(
                    r#"{"access":"MultiWriter","backend":"local:/srv","data_cache":true,"#,
                    r#""frontend":{"connected":true,"connections":2},"#,
                    r#""fsname":"dpufs","gid":0,"in_flight":0,"initialized":true,"#,
                    r#""mountpoint":null,"ok":true,"owns_mount":false,"pid":42,"#,
                    r#""qos":{"maxThroughputMiBps":100},"socket":"/run/v.sock","#,
                    r#""state":"serving","threads":4,"threads_alive":4,"#,
                    r#""transport":"vhost-user-fs","#,
                    r#""uid":0,"uptime_secs":1.5,"version":1,"writeback_cache":false}"#
                ),
                Reply::Health(vhost_user_health()),
            ),
            (
                Request::Stats,
                concat!(
                    r#"{"ok":true,"stats":{"absent_answers":5,"bytes_read":0,"bytes_written":4096,"#,
                    r#""cached_answers":7,"changed_dir_answers":3,"errors":{"ENOENT":2},"in_flight":0,"ops":{"write":{"count":1,"#,
                    r#""errors":0,"histogram_us":[[32,1]],"max_us":31,"mean_us":31.0,"#,
                    r#""p50_us":32,"p99_us":32}},"transport_errors":0,"uptime_secs":1.5}}"#
                ),
                Reply::Stats(stats()),
            ),
            (
                Request::Statfs,
                concat!(
                    r#"{"ok":true,"statfs":{"block_size":4096,"blocks":262144,"#,
                    r#""blocks_available":262000,"blocks_free":262000,"files":4294967299,"#,
                    r#""files_free":4294967296}}"#
                ),
                Reply::Statfs(FsUsage {
                    block_size: 4096,
                    blocks: 262144,
                    blocks_free: 262000,
                    blocks_available: 262000,
                    files: (1 << 32) + 3,
                    files_free: 1 << 32,
                }),
            ),
            (
                Request::Stop,
                r#"{"ok":true,"state":"stopping"}"#,
                Reply::Stopping,
            ),
            (
                Request::Stats,
                r#"{"error":"missing \"op\"","ok":false}"#,
                Reply::Refused(r#"missing "op""#.into()),
            ),
        ];
        for (req, text, reply) in cases {
            assert_eq!(reply.encode(), text);
            assert_eq!(serde_json::to_string(&reply).unwrap(), text);
            assert_eq!(req.decode_reply(text), Ok(reply));
        }
    }

    #[test]
    fn worker_json_is_the_static_part_of_health() {
        let info = health().info;
        assert_eq!(
            wire::encode(&info),
            concat!(
                r#"{"access":"MultiWriter","backend":"local:/srv","data_cache":true,"#,
                r#""fsname":"dpufs","gid":0,"mountpoint":"/mnt/v","owns_mount":false,"#,
                r#""pid":42,"threads":4,"transport":"fuse","uid":0,"version":1,"#,
                r#""writeback_cache":false}"#
            )
        );
        let mut none = info.clone();
        none.mountpoint = None;
        assert!(wire::encode(&none).contains(r#""mountpoint":null"#));
        // A worker.json written before the transport existed is a FUSE worker's.
        let old = wire::encode(&info).replace(r#""transport":"fuse","#, "");
        let read: WorkerInfo = serde_json::from_str(&old).unwrap();
        assert_eq!(read, info);
    }
}
