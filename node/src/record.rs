//! What the keeper persists per volume (`<state>/volumes/<V>/volume.json`): enough for a
//! keeper that starts after another one died to find the mounts it left and clean up the dead
//! ones, for a restarted launcher to see what the node serves, and for `dpufs down` to find
//! the workers a killed keeper left.

use crate::transport::Attachment;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// File name of a volume's record inside its directory.
pub const RECORD: &str = "volume.json";

/// One volume the keeper mounted or exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub volume: String,
    /// `"mountpoint"`, or `"transport"` and `"socket"` of an export (`crate::transport`).
    #[serde(flatten)]
    pub attachment: Attachment,
    /// The worker's own arguments and binary (empty until the volume is served).
    pub args: Vec<String>,
    pub binary: PathBuf,
    /// The worker serving it, when one was started, as a pid of `pid_namespace`.
    pub worker_pid: Option<u32>,
    /// The keeper's PID namespace (`pid:[inode]`): a pid means nothing in another one.
    pub pid_namespace: String,
    pub generation: u32,
}

/// This process's PID namespace, as `/proc/self/ns/pid` names it.
pub fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn context(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

impl VolumeRecord {
    /// The worker pid, if it names a process of this PID namespace.
    pub fn worker_pid_here(&self) -> Option<u32> {
        self.worker_pid
            .filter(|_| !self.pid_namespace.is_empty() && self.pid_namespace == pid_namespace())
    }

    /// Writes the record into `dir` (atomically: a crash leaves the old or the new one).
    pub fn save(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| context(e, "create", dir))?;
        let text = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        crate::file::write_atomic(&dir.join(RECORD), &text, 0o644)
    }

    /// The records under `volumes_dir` (a keeper's `<state>/volumes`), with the directory
    /// each came from. Directories without a readable record are returned with `None`
    /// (stale state); a missing `volumes_dir` has none.
    pub fn load_all(volumes_dir: &Path) -> io::Result<Vec<(PathBuf, Option<VolumeRecord>)>> {
        let entries = match std::fs::read_dir(volumes_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(context(e, "list", volumes_dir)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let dir = entry?.path();
            if !dir.is_dir() {
                continue;
            }
            let record = std::fs::read(dir.join(RECORD))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            out.push((dir, record));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> VolumeRecord {
        VolumeRecord {
            volume: "v".into(),
            attachment: Attachment::Mount("/mnt/v".into()),
            args: vec!["--backend".into(), "local:/d".into()],
            binary: "/bin/dpufs-csi".into(),
            worker_pid: Some(42),
            pid_namespace: "pid:[4026531836]".into(),
            generation: 3,
        }
    }

    #[test]
    fn records_round_trip_and_strays_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let rec = record();
        rec.save(&dir.path().join("v")).unwrap();
        std::fs::create_dir(dir.path().join("stray")).unwrap();
        let mut all = VolumeRecord::load_all(dir.path()).unwrap();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].0, dir.path().join("stray"));
        assert_eq!(all[0].1, None);
        assert_eq!(all[1].1.as_ref(), Some(&rec));
        assert!(
            VolumeRecord::load_all(&dir.path().join("none"))
                .unwrap()
                .is_empty()
        );
    }

    /// The file as keepers have always written it.
    #[test]
    fn the_file_keeps_its_layout() {
        let dir = tempfile::tempdir().unwrap();
        record().save(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(RECORD)).unwrap();
        assert_eq!(
            text,
            r#"{
  "volume": "v",
  "mountpoint": "/mnt/v",
  "args": [
    "--backend",
    "local:/d"
  ],
  "binary": "/bin/dpufs-csi",
  "worker_pid": 42,
  "pid_namespace": "pid:[4026531836]",
  "generation": 3
}"#
        );
    }

    #[test]
    fn a_pid_of_another_namespace_is_not_ours() {
        let mut rec = record();
        rec.pid_namespace = pid_namespace();
        assert_eq!(rec.worker_pid_here(), Some(42));
        rec.pid_namespace = "pid:[1]".into();
        assert_eq!(rec.worker_pid_here(), None);
    }
}
