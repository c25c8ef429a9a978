//! What the node plugin (or the DPU agent) remembers of a staged volume, one JSON file per
//! volume in `<state-dir>/csi/`: written before the mount (or export) and removed after the
//! keeper let the volume go, so a plugin that restarts (or crashed half-way) knows every
//! volume it staged, whose it is, and which keeper volume and capability file belong to it.

use crate::csi::volume_id::VolumeId;
use dpufs_node_api::handover::AccessMode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// A staged volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StagedVolume {
    pub volume_id: String,
    /// Where this node serves the volume: the staging path it is mounted at (host mode), or
    /// the vhost-user socket it is exported on (the DPU agent). Kept under its first name.
    #[serde(rename = "stagingPath")]
    pub served_at: PathBuf,
    /// The DaosTenant the volume belongs to (from the container, not from the request).
    pub tenant: String,
    /// Its DAOS principal, which the capability asserts.
    pub principal: String,
    pub pool: String,
    pub container: String,
    /// Staged for reading only (a reader-only access mode): the capability grants no writes.
    pub read_only: bool,
    /// Staged for one writing pod (SINGLE_NODE_SINGLE_WRITER, a ReadWriteOncePod claim): the
    /// only writer of the volume anywhere, so its worker lets the kernel cache hard
    /// (`--access single-writer`). Never set with `read_only`; absent from records of
    /// plugins before it, which staged every writable volume multi-writer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub single_writer: bool,
    /// Served through DAOS's own libdfs by a worker running as this uid (its tenant's on
    /// this node), which needs no capability; `None`: through the engine, with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daos_uid: Option<u32>,
}

impl StagedVolume {
    /// Who writes the volume, as its worker is told.
    pub fn access(&self) -> AccessMode {
        match (self.read_only, self.single_writer) {
            (true, _) => AccessMode::ReadOnly,
            (false, true) => AccessMode::SingleWriter,
            (false, false) => AccessMode::MultiWriter,
        }
    }

    /// The access fields of a record staged for `access`.
    pub fn set_access(&mut self, access: AccessMode) {
        self.read_only = access == AccessMode::ReadOnly;
        self.single_writer = access == AccessMode::SingleWriter;
    }
}

/// The files of one volume under the state directory, named by a digest of its id (ids may
/// hold any character a file name cannot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFiles {
    /// The digest of the volume id the names are made of (24 hex digits).
    pub key: String,
    /// The keeper's name for the volume.
    pub keeper_volume: String,
    pub record: PathBuf,
    pub capability: PathBuf,
    /// The QoS limits the worker reads (`dpufs_node_api::qos`).
    pub qos: PathBuf,
}

/// The 24 hex digits of the SHA-256 of `id` that name its files (and, on a DPU, its
/// vhost-user socket and the start of its virtio-fs tag).
pub fn key_of(id: &VolumeId) -> String {
    let digest = openssl::sha::sha256(id.to_string().as_bytes());
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `name` is a [`key_of`] (24 lowercase hex digits).
fn is_key(name: &str) -> bool {
    name.len() == 24 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl VolumeFiles {
    /// The files of `id` under `dir` (`<state-dir>/csi`).
    pub fn of(dir: &Path, id: &VolumeId) -> VolumeFiles {
        let key = key_of(id);
        VolumeFiles {
            keeper_volume: format!("csi-{key}"),
            record: dir.join(format!("{key}.json")),
            capability: dir.join(format!("{key}.cap")),
            qos: dir.join(format!("{key}.qos")),
            key,
        }
    }
}

/// Writes `data` to `path` atomically, mode 0600 (`dpufs_node_api::file::write_atomic`).
pub fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    dpufs_node_api::file::write_atomic(path, data, 0o600)
}

/// Reads the JSON record at `path`; `None` when there is none. The stage records here, the
/// DPU shim's and the DPF plugin's are all read this way.
pub fn load_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `record` as JSON to `path` atomically, mode 0600 (its directory must exist).
pub fn save_json<T: Serialize>(path: &Path, record: &T) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    write_private(path, &json)
}

impl StagedVolume {
    /// Reads a record; `None` when there is none.
    pub fn load(path: &Path) -> io::Result<Option<StagedVolume>> {
        load_json(path)
    }

    pub fn save(&self, path: &Path) -> io::Result<()> {
        save_json(path, self)
    }

    /// Every record in `dir`: the files named `<key>.json` (other files live there too, such
    /// as the tenant uid record).
    pub fn all(dir: &Path) -> io::Result<Vec<StagedVolume>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        let mut out = vec![];
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_some_and(|x| x == "json")
                && path
                    .file_stem()
                    .and_then(|stem| stem.to_str())
                    .is_some_and(is_key)
                && let Some(v) = StagedVolume::load(&path)?
            {
                out.push(v);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_files_are_named_by_digest() {
        let dir = tempfile::tempdir().unwrap();
        let id: VolumeId = VolumeId::parse(
            "v1/daos_server/6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f/0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b",
        )
        .unwrap();
        let files = VolumeFiles::of(dir.path(), &id);
        assert!(files.keeper_volume.starts_with("csi-") && files.keeper_volume.len() == 28);
        assert_eq!(files.keeper_volume, format!("csi-{}", files.key));
        assert_eq!(StagedVolume::load(&files.record).unwrap(), None);
        let v = StagedVolume {
            volume_id: id.to_string(),
            served_at: "/var/lib/kubelet/x/globalmount".into(),
            tenant: "team-a".into(),
            principal: "team-a@".into(),
            pool: id.pool.to_string(),
            container: id.container.to_string(),
            read_only: false,
            single_writer: false,
            daos_uid: None,
        };
        v.save(&files.record).unwrap();
        // The field's name on disk is the one records had before the DPU agent.
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&files.record).unwrap()).unwrap();
        assert_eq!(json["stagingPath"], "/var/lib/kubelet/x/globalmount");
        assert_eq!(StagedVolume::load(&files.record).unwrap(), Some(v.clone()));
        assert_eq!(json.get("daosUid"), None, "engine records read as before");
        assert_eq!(
            json.get("singleWriter"),
            None,
            "records before it read the same"
        );
        assert_eq!(v.access(), AccessMode::MultiWriter);
        // Other JSON files beside the records are not records.
        std::fs::write(dir.path().join("tenant-uids.json"), "{\"uids\": {}}").unwrap();
        assert_eq!(StagedVolume::all(dir.path()).unwrap(), vec![v.clone()]);
        let daos = StagedVolume {
            daos_uid: Some(20001),
            ..v
        };
        daos.save(&files.record).unwrap();
        assert_eq!(
            StagedVolume::load(&files.record).unwrap(),
            Some(daos.clone())
        );
        // Each access mode survives the record, and a reader-only one is what the capability
        // of a read-only stage grants.
        for access in AccessMode::ALL {
            let mut w = daos.clone();
            w.set_access(access);
            assert_eq!(w.read_only, access == AccessMode::ReadOnly);
            w.save(&files.record).unwrap();
            assert_eq!(
                StagedVolume::load(&files.record).unwrap().unwrap().access(),
                access
            );
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&files.record)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
