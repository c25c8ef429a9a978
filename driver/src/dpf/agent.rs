//! The DPU agent as the storage plugin's backend: a device is a volume the agent staged, its
//! name the volume's virtio-fs tag.
//!
//! SNAP's node driver runs on the DPU, so the agent trusts it as it trusts the DPU's own
//! components ([`Caller::Dpu`]): no pod is named and none is checked (DPF attaches a volume to
//! a host, not to a pod; the host cluster bound the claim). The agent still reads the tenant
//! from the volume's container and signs a capability for exactly that container.
//!
//! What GetDevice reports (access modes, contexts, parameters) is DPF's request, which the
//! agent's stage record does not hold: the plugin keeps it in a record of its own,
//! `<state-dir>/dpf/<digest>.json`, written once the volume is staged. A device is shown when
//! the volume is staged *and* has that record; a volume staged without one (a create that
//! stopped between the two) shows no device, and the next CreateDevice or DeleteDevice
//! completes or undoes it.

use crate::csi::node::record::{VolumeFiles, load_json, save_json};
use crate::csi::volume_id::VolumeId;
use crate::dpf::backend::{BackendError, Device, DeviceBackend, DeviceSpec};
use crate::dpu::agent::{Agent, AgentError, Caller};
use dpufs_proto::nvidia::storage::plugins::v1::AccessMode;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::Code;

/// The agent behind the storage plugin.
#[derive(Debug)]
pub struct AgentDevices {
    agent: Arc<Agent>,
    /// Where the plugin's records are: `<state-dir>/dpf`.
    records: PathBuf,
}

/// DPF's request for a device, as the plugin records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceRecord {
    volume_id: String,
    /// The access modes' names in the API (`ACCESS_MODE_RWO`...).
    access_modes: Vec<String>,
    publish_context: HashMap<String, String>,
    volume_context: HashMap<String, String>,
    storage_parameters: HashMap<String, String>,
}

impl DeviceRecord {
    fn of(spec: &DeviceSpec) -> DeviceRecord {
        DeviceRecord {
            volume_id: spec.volume_id.clone(),
            access_modes: spec
                .access_modes
                .iter()
                .map(|m| m.as_str_name().to_string())
                .collect(),
            publish_context: spec.publish_context.clone(),
            volume_context: spec.volume_context.clone(),
            storage_parameters: spec.storage_parameters.clone(),
        }
    }

    fn spec(self) -> io::Result<DeviceSpec> {
        let access_modes = self
            .access_modes
            .iter()
            .map(|name| {
                AccessMode::from_str_name(name).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unknown access mode {name:?}"),
                    )
                })
            })
            .collect::<io::Result<_>>()?;
        Ok(DeviceSpec {
            volume_id: self.volume_id,
            access_modes,
            publish_context: self.publish_context,
            volume_context: self.volume_context,
            storage_parameters: self.storage_parameters,
        })
    }
}

impl AgentDevices {
    /// The plugin's backend over `agent`, whose state directory is `state_dir`.
    pub fn new(agent: Arc<Agent>, state_dir: &Path) -> AgentDevices {
        AgentDevices {
            agent,
            records: state_dir.join("dpf"),
        }
    }

    fn record_path(&self, id: &VolumeId) -> PathBuf {
        VolumeFiles::of(&self.records, id).record
    }

    fn save(&self, id: &VolumeId, spec: &DeviceSpec) -> Result<(), BackendError> {
        let path = self.record_path(id);
        std::fs::create_dir_all(&self.records)
            .and_then(|()| save_json(&path, &DeviceRecord::of(spec)))
            .map_err(|e| record_error("writing", &path, e))
    }

    fn load(&self, id: &VolumeId) -> Result<Option<DeviceSpec>, BackendError> {
        let path = self.record_path(id);
        load_json::<DeviceRecord>(&path)
            .and_then(|record| record.map(DeviceRecord::spec).transpose())
            .map_err(|e| record_error("reading", &path, e))
    }

    fn remove(&self, id: &VolumeId) -> Result<(), BackendError> {
        let path = self.record_path(id);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(record_error("removing", &path, e))
            }
            _ => Ok(()),
        }
    }

    /// The device of a volume the agent has staged: shown only with the plugin's record.
    fn shown(&self, id: &VolumeId, tag: String) -> Result<Option<Device>, BackendError> {
        Ok(self.load(id)?.map(|spec| Device { name: tag, spec }))
    }
}

#[tonic::async_trait]
impl DeviceBackend for AgentDevices {
    async fn ready(&self) -> bool {
        self.agent.probe().await.ready
    }

    async fn create(&self, spec: &DeviceSpec) -> Result<String, BackendError> {
        let device = self
            .agent
            .stage(&spec.volume_id, spec.read_only(), &Caller::Dpu, None)
            .await
            .map_err(backend_error)?;
        // The agent parsed the id to stage it.
        let id =
            VolumeId::parse(&spec.volume_id).map_err(|e| BackendError::Invalid(e.to_string()))?;
        self.save(&id, spec)?;
        Ok(device.tag)
    }

    async fn delete(&self, volume_id: &str) -> Result<(), BackendError> {
        // An id that is not one of dpufs's was never staged (staging parses it first).
        let Ok(id) = VolumeId::parse(volume_id) else {
            return Ok(());
        };
        self.agent
            .unstage(volume_id, &Caller::Dpu)
            .await
            .map_err(backend_error)?;
        self.remove(&id)
    }

    async fn get(&self, volume_id: &str) -> Result<Option<Device>, BackendError> {
        let Ok(id) = VolumeId::parse(volume_id) else {
            return Ok(None);
        };
        match self.agent.staged(volume_id) {
            Ok((_, device)) => self.shown(&id, device.tag),
            Err(AgentError::NotStaged(_)) => Ok(None),
            Err(e) => Err(backend_error(e)),
        }
    }

    async fn list(&self) -> Result<Vec<Device>, BackendError> {
        let page = self.agent.list(0, "").map_err(backend_error)?;
        let mut devices = Vec::new();
        for (volume_id, device) in page.entries {
            let Ok(id) = VolumeId::parse(&volume_id) else {
                continue;
            };
            devices.extend(self.shown(&id, device.tag)?);
        }
        Ok(devices)
    }
}

fn record_error(doing: &str, path: &Path, e: io::Error) -> BackendError {
    BackendError::Failed(format!(
        "{doing} the plugin's record {}: {e}",
        path.display()
    ))
}

/// The agent's error, of the kind its code says: the agent's one code table decides what the
/// plugin answers too, so a volume refused on the control channel is refused the same way here.
fn backend_error(e: AgentError) -> BackendError {
    let message = e.to_string();
    match e.code() {
        Code::NotFound => BackendError::NotFound(message),
        Code::InvalidArgument => BackendError::Invalid(message),
        Code::PermissionDenied => BackendError::Refused(message),
        Code::FailedPrecondition => BackendError::Precondition(message),
        Code::AlreadyExists => BackendError::Conflict(message),
        Code::ResourceExhausted => BackendError::Exhausted(message),
        Code::Aborted => BackendError::Busy(message),
        Code::Unavailable => BackendError::Unavailable(message),
        _ => BackendError::Failed(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::locks::Busy;
    use crate::dpf::error::PluginError;

    #[test]
    fn the_agents_codes_carry_through_to_the_plugins() {
        for (error, code) in [
            (AgentError::NotStaged("v1/a".into()), Code::NotFound),
            (AgentError::MissingId("StageVolume"), Code::InvalidArgument),
            (
                AgentError::OtherHost {
                    asked: "h2".into(),
                    paired: "h1".into(),
                },
                Code::PermissionDenied,
            ),
            (AgentError::Busy(Busy("volume v1/a".into())), Code::Aborted),
            (
                AgentError::HostUnknown("no label".into()),
                Code::Unavailable,
            ),
        ] {
            assert_eq!(error.code(), code, "{error}");
            let message = error.to_string();
            let plugin = PluginError::Backend {
                rpc: "CreateDevice",
                source: backend_error(error),
            };
            assert_eq!(plugin.code(), code);
            assert_eq!(plugin.to_string(), format!("CreateDevice: {message}"));
        }
    }

    #[test]
    fn a_record_keeps_the_request_and_refuses_what_it_does_not_know() {
        let spec = DeviceSpec {
            volume_id: "v1/sys/pool/cont".into(),
            access_modes: vec![AccessMode::Rwo, AccessMode::Rwx],
            publish_context: HashMap::new(),
            volume_context: [("k".to_string(), "v".to_string())].into(),
            storage_parameters: [("pool".to_string(), "fast".to_string())].into(),
        };
        let json = serde_json::to_string(&DeviceRecord::of(&spec)).unwrap();
        assert!(json.contains("\"ACCESS_MODE_RWX\""), "{json}");
        let back: DeviceRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.spec().unwrap(), spec);
        let mut odd = DeviceRecord::of(&spec);
        odd.access_modes.push("ACCESS_MODE_SOMETIMES".into());
        assert!(odd.spec().unwrap_err().to_string().contains("SOMETIMES"));
    }
}
