//! The node plugin as the node agent: it holds the key the engines trust and signs each
//! staged volume's worker a short-lived capability for exactly that volume's container, its
//! tenant and its rights, rewriting the worker's capability file well before it expires
//! (the worker presents the new one at its next reconnect). Volumes served through DAOS's
//! own libdfs have none: DAOS knows their workers by uid (`super::uids`).

use super::record::{StagedVolume, VolumeFiles, write_private};
use crate::csi::volume_id::VolumeId;
use dpufs_daos::capability::{AgentKey, Capability, Rights};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Signs and renews capabilities.
#[derive(Clone)]
pub struct NodeAgent {
    key: Arc<AgentKey>,
    /// How long a capability lives; renewed at a third of it.
    pub ttl: Duration,
}

impl std::fmt::Debug for NodeAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAgent")
            .field("key_id", &self.key.key_id())
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl NodeAgent {
    /// The agent with the key in `path` (PEM, made on first use).
    pub fn load(path: &Path, ttl: Duration) -> Result<NodeAgent, String> {
        let key = AgentKey::load_or_generate(path)
            .map_err(|e| format!("node agent key {}: {e}", path.display()))?;
        Ok(NodeAgent {
            key: Arc::new(key),
            ttl,
        })
    }

    /// Writes a fresh capability for `volume` to `path`.
    pub fn issue(&self, volume: &StagedVolume, path: &Path) -> Result<(), String> {
        let rights = if volume.read_only {
            Rights::READ_ONLY
        } else {
            Rights::READ_WRITE
        };
        let claims = Capability::new(
            volume.principal.clone(),
            volume.volume_id.clone(),
            volume.pool.clone(),
            volume.container.clone(),
            rights,
            self.ttl,
        );
        let token = self.key.sign(&claims).map_err(|e| e.to_string())?;
        write_private(path, token.to_hex().as_bytes())
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Renews the capability of every volume staged under `dir`, every third of the TTL,
    /// until the task is dropped.
    pub async fn renew_forever(self, dir: PathBuf) {
        let every = self.ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            let agent = self.clone();
            let dir = dir.clone();
            let renewed = tokio::task::spawn_blocking(move || agent.renew_all(&dir)).await;
            if let Ok(Err(e)) = renewed {
                tracing::warn!("renewing capabilities: {e}");
            }
        }
    }

    fn renew_all(&self, dir: &Path) -> Result<(), String> {
        let staged = StagedVolume::all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // A volume served through libdfs has no capability: DAOS knows its worker by uid.
        for volume in staged.into_iter().filter(|v| v.daos_uid.is_none()) {
            let Ok(id) = VolumeId::parse(&volume.volume_id) else {
                continue;
            };
            let files = VolumeFiles::of(dir, &id);
            self.issue(&volume, &files.capability)?;
            tracing::debug!(volume_id = %volume.volume_id, "capability renewed");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(container: &str, daos_uid: Option<u32>) -> (VolumeId, StagedVolume) {
        let pool = "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f";
        let id = VolumeId::parse(&format!("v1/daos_server/{pool}/{container}")).unwrap();
        let volume = StagedVolume {
            volume_id: id.to_string(),
            served_at: "/var/lib/kubelet/x/globalmount".into(),
            tenant: "team-a".into(),
            principal: "team-a@".into(),
            pool: pool.into(),
            container: container.into(),
            read_only: false,
            single_writer: false,
            daos_uid,
        };
        (id, volume)
    }

    #[test]
    fn renewal_signs_engine_volumes_only() {
        let dir = tempfile::tempdir().unwrap();
        let agent =
            NodeAgent::load(&dir.path().join("agent.key"), Duration::from_secs(60)).unwrap();
        let records = dir.path().join("csi");
        std::fs::create_dir(&records).unwrap();
        let (engine_id, engine) = staged("0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b", None);
        let (daos_id, daos) = staged("1c9b0d66-2e3f-4a71-8b8c-9d0e1f2a3b4c", Some(20001));
        for (id, v) in [(&engine_id, &engine), (&daos_id, &daos)] {
            v.save(&VolumeFiles::of(&records, id).record).unwrap();
        }
        agent.renew_all(&records).unwrap();
        assert!(VolumeFiles::of(&records, &engine_id).capability.is_file());
        assert!(
            !VolumeFiles::of(&records, &daos_id).capability.exists(),
            "a libdfs worker gets no capability"
        );
    }
}
