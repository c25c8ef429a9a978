//! A volume's quality-of-service limits: what ControllerModifyVolume sets, what the volume's
//! container keeps in its `dpufs.csi/qos` attribute, and what the node plugin writes to each
//! worker's QoS file (`--qos <file>`), which the worker re-reads when it changes.
//!
//! One JSON object with sorted keys; a limit that is absent is no limit:
//! `{"maxIops":2000,"maxThroughputMiBps":500}`.

use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;

/// Caps on a volume's data path, enforced by its worker on each node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QosLimits {
    /// Bytes read plus bytes written per second, in MiB (2^20 bytes).
    #[serde(
        default,
        rename = "maxThroughputMiBps",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_throughput_mibps: Option<u64>,
    /// Requests per second, as the worker receives them from the kernel: reads and writes (a
    /// request is at most the mount's `max_read`/`max_write`, 1 MiB) and metadata requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iops: Option<u64>,
}

impl QosLimits {
    /// No limit at all.
    pub const UNLIMITED: QosLimits = QosLimits {
        max_throughput_mibps: None,
        max_iops: None,
    };

    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        *self != QosLimits::UNLIMITED
    }

    /// The limits as their JSON text.
    pub fn encode(&self) -> String {
        crate::wire::encode(self)
    }

    /// Reads limits from their JSON text.
    pub fn decode(text: &[u8]) -> Result<QosLimits, String> {
        serde_json::from_slice(text).map_err(|e| format!("QoS limits: {e}"))
    }

    /// Reads a QoS file; a file that does not exist is no limit.
    pub fn load(path: &Path) -> io::Result<QosLimits> {
        match std::fs::read(path) {
            Ok(bytes) => {
                QosLimits::decode(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(QosLimits::UNLIMITED),
            Err(e) => Err(e),
        }
    }

    /// Replaces a QoS file whole ([`crate::file::write_atomic`], mode 0644: nothing in it
    /// is secret).
    pub fn store(&self, path: &Path) -> io::Result<()> {
        crate::file::write_atomic(path, self.encode().as_bytes(), 0o644)
    }
}

impl std::fmt::Display for QosLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: Option<u64>| v.map_or("unlimited".to_string(), |n| n.to_string());
        write!(
            f,
            "throughput {} MiB/s, {} IOPS",
            show(self.max_throughput_mibps),
            show(self.max_iops)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_match_their_json() {
        let both = QosLimits {
            max_throughput_mibps: Some(500),
            max_iops: Some(2000),
        };
        for (limits, text) in [
            (both, r#"{"maxIops":2000,"maxThroughputMiBps":500}"#),
            (QosLimits::UNLIMITED, "{}"),
        ] {
            assert_eq!(limits.encode(), text);
            assert_eq!(QosLimits::decode(text.as_bytes()), Ok(limits));
        }
        assert!(both.is_limited() && !QosLimits::UNLIMITED.is_limited());
        let e = QosLimits::decode(br#"{"maxIOPS":1}"#).unwrap_err();
        assert!(e.contains("unknown field `maxIOPS`"), "{e}");
        assert_eq!(
            both.to_string(),
            "throughput 500 MiB/s, 2000 IOPS",
            "what logs and events say"
        );
    }

    #[test]
    fn files_round_trip_and_a_missing_file_is_no_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.qos");
        assert_eq!(QosLimits::load(&path).unwrap(), QosLimits::UNLIMITED);
        let limits = QosLimits {
            max_throughput_mibps: Some(4),
            max_iops: None,
        };
        limits.store(&path).unwrap();
        assert_eq!(QosLimits::load(&path).unwrap(), limits);
        std::fs::write(&path, b"{").unwrap();
        let e = QosLimits::load(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
