//! What the shim remembers of a volume kubelet staged on this host, one JSON file per volume
//! in `<state-dir>/shim/`: the staging path and the access, so that a publish, an unstage and
//! the stats know the volume after a restart of the shim. Nothing in it is secret: the shim
//! holds no key, capability or tenant.

use crate::csi::node::record::{load_json, save_json};
use crate::csi::volume_id::VolumeId;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// A volume staged on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShimRecord {
    pub volume_id: String,
    pub staging_path: PathBuf,
    /// Staged for reading only (a reader-only access mode).
    pub read_only: bool,
}

/// The record file of `id` under `dir`, named by the digest host mode names its files by.
pub fn path_of(dir: &Path, id: &VolumeId) -> PathBuf {
    crate::csi::node::record::VolumeFiles::of(dir, id).record
}

impl ShimRecord {
    /// Reads a record; `None` when there is none.
    pub fn load(path: &Path) -> io::Result<Option<ShimRecord>> {
        load_json(path)
    }

    pub fn save(&self, path: &Path) -> io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        save_json(path, self)
    }

    /// How many volumes are staged under `dir`.
    pub fn count(dir: &Path) -> io::Result<usize> {
        match std::fs::read_dir(dir) {
            Ok(entries) => Ok(entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let id = VolumeId::parse(
            "v1/daos_server/6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f/0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b",
        )
        .unwrap();
        let path = path_of(&dir.path().join("shim"), &id);
        assert_eq!(ShimRecord::load(&path).unwrap(), None);
        assert_eq!(ShimRecord::count(&dir.path().join("shim")).unwrap(), 0);
        let r = ShimRecord {
            volume_id: id.to_string(),
            staging_path: "/var/lib/kubelet/x/globalmount".into(),
            read_only: true,
        };
        r.save(&path).unwrap();
        assert_eq!(ShimRecord::load(&path).unwrap(), Some(r));
        assert_eq!(ShimRecord::count(&dir.path().join("shim")).unwrap(), 1);
    }
}
