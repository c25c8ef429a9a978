//! Checks of CreateDevice requests, and what makes a repeated CreateDevice the same request.

use crate::dpf::backend::DeviceSpec;
use crate::dpf::error::PluginError;
use dpufs_proto::nvidia::storage::plugins::v1::{AccessMode, CreateDeviceRequest};
use std::collections::HashMap;

/// The one volume mode dpufs serves (and what GetDevice reports).
pub const FILESYSTEM: &str = "Filesystem";
const BLOCK: &str = "Block";

/// CSI's size limits for strings and for maps (keys and values together). The volume ids
/// and contexts of a CSI driver's volumes keep them, and errors that quote them stay within
/// what gRPC carries in a header.
const MAX_STRING_BYTES: usize = 128;
const MAX_MAP_BYTES: usize = 4096;

/// A CreateDevice, checked: a file-system volume with valid access modes.
pub fn device_spec(req: CreateDeviceRequest) -> Result<DeviceSpec, PluginError> {
    const RPC: &str = "CreateDevice";
    volume_id(RPC, &req.volume_id)?;
    for (field, map) in [
        ("publish_context", &req.publish_context),
        ("volume_context", &req.volume_context),
        ("storage_parameters", &req.storage_parameters),
    ] {
        let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
        within(RPC, field, bytes, MAX_MAP_BYTES)?;
    }
    match req.volume_mode.as_str() {
        // The API's default is Filesystem.
        "" | FILESYSTEM => {}
        BLOCK => return Err(PluginError::BlockVolume),
        other => return Err(PluginError::UnknownVolumeMode(other.to_string())),
    }
    Ok(DeviceSpec {
        access_modes: access_modes(&req.access_modes)?,
        volume_id: req.volume_id,
        publish_context: req.publish_context,
        volume_context: req.volume_context,
        storage_parameters: req.storage_parameters,
    })
}

/// A volume id a request names: present, and no longer than CSI allows.
pub fn volume_id(rpc: &'static str, id: &str) -> Result<(), PluginError> {
    if id.is_empty() {
        return Err(PluginError::MissingVolumeId { rpc });
    }
    within(rpc, "volume_id", id.len(), MAX_STRING_BYTES)
}

/// A device name a request names (empty: any), no longer than CSI allows for a string.
pub fn device_name(rpc: &'static str, name: &str) -> Result<(), PluginError> {
    within(rpc, "device_name", name.len(), MAX_STRING_BYTES)
}

fn within(
    rpc: &'static str,
    field: &'static str,
    bytes: usize,
    max: usize,
) -> Result<(), PluginError> {
    if bytes > max {
        return Err(PluginError::TooLong {
            rpc,
            field,
            bytes,
            max,
        });
    }
    Ok(())
}

/// The access modes of a request, sorted and without repeats: at least one, each known, and
/// ReadWriteOncePod alone (Kubernetes refuses a claim that combines it with others).
fn access_modes(raw: &[i32]) -> Result<Vec<AccessMode>, PluginError> {
    let mut modes = raw
        .iter()
        .map(|&m| match AccessMode::try_from(m) {
            Ok(AccessMode::Unspecified) | Err(_) => Err(PluginError::UnknownAccessMode(m)),
            Ok(mode) => Ok(mode),
        })
        .collect::<Result<Vec<_>, _>>()?;
    modes.sort();
    modes.dedup();
    match modes.as_slice() {
        [] => Err(PluginError::MissingAccessModes),
        [_, _, ..] if modes.contains(&AccessMode::Rwop) => Err(PluginError::PodModeCombined),
        _ => Ok(modes),
    }
}

/// How a repeated CreateDevice differs from the request the device was made for; empty when
/// it is the same request. The publish context is left out: it belongs to one attachment and
/// dpufs's controller publishes nothing, so a difference there does not make another device.
pub fn differences(made: &DeviceSpec, asked: &DeviceSpec) -> Vec<String> {
    let mut out = Vec::new();
    if made.access_modes != asked.access_modes {
        out.push(format!(
            "access modes {} (asked {})",
            mode_names(&made.access_modes),
            mode_names(&asked.access_modes)
        ));
    }
    for (what, a, b) in [
        (
            "volume_context",
            &made.volume_context,
            &asked.volume_context,
        ),
        (
            "storage_parameters",
            &made.storage_parameters,
            &asked.storage_parameters,
        ),
    ] {
        let keys = differing_keys(a, b);
        if !keys.is_empty() {
            out.push(format!("{what} differs in {}", keys.join(", ")));
        }
    }
    out
}

fn mode_names(modes: &[AccessMode]) -> String {
    let names: Vec<&str> = modes.iter().map(|m| m.as_str_name()).collect();
    format!("[{}]", names.join(", "))
}

/// The keys whose values differ (or that only one map has), sorted. Values are not shown: a
/// context may carry things that do not belong in events.
fn differing_keys(a: &HashMap<String, String>, b: &HashMap<String, String>) -> Vec<String> {
    let mut keys: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(modes: &[AccessMode], volume_mode: &str) -> CreateDeviceRequest {
        CreateDeviceRequest {
            volume_id: "v1/sys/pool/cont".into(),
            access_modes: modes.iter().map(|&m| m as i32).collect(),
            volume_mode: volume_mode.into(),
            ..Default::default()
        }
    }

    #[test]
    fn file_systems_with_known_modes_are_accepted_sorted_and_without_repeats() {
        use AccessMode::*;
        for mode in ["", "Filesystem"] {
            let spec = device_spec(request(&[Rwx, Rwo, Rwx], mode)).unwrap();
            assert_eq!(spec.access_modes, vec![Rwo, Rwx]);
            assert!(!spec.read_only());
        }
        assert!(device_spec(request(&[Rox], "")).unwrap().read_only());
        assert_eq!(
            device_spec(request(&[Rwop, Rwop], ""))
                .unwrap()
                .access_modes,
            vec![Rwop]
        );
    }

    #[test]
    fn malformed_requests_are_refused() {
        use AccessMode::*;
        let err = |req| device_spec(req).unwrap_err();
        assert!(matches!(
            err(request(&[Rwo], "Block")),
            PluginError::BlockVolume
        ));
        assert!(matches!(
            err(request(&[Rwo], "filesystem")),
            PluginError::UnknownVolumeMode(m) if m == "filesystem"
        ));
        assert!(matches!(
            err(request(&[], "")),
            PluginError::MissingAccessModes
        ));
        assert!(matches!(
            err(request(&[Unspecified], "")),
            PluginError::UnknownAccessMode(0)
        ));
        let mut unknown = request(&[Rwo], "");
        unknown.access_modes.push(17);
        assert!(matches!(err(unknown), PluginError::UnknownAccessMode(17)));
        assert!(matches!(
            err(request(&[Rwop, Rwo], "")),
            PluginError::PodModeCombined
        ));
        let mut long_id = request(&[Rwo], "");
        long_id.volume_id = "v".repeat(129);
        assert!(matches!(
            err(long_id),
            PluginError::TooLong {
                field: "volume_id",
                bytes: 129,
                max: 128,
                ..
            }
        ));
        let mut big_context = request(&[Rwo], "");
        big_context
            .volume_context
            .insert("k".repeat(2048), "v".repeat(2049));
        assert!(matches!(
            err(big_context),
            PluginError::TooLong {
                field: "volume_context",
                bytes: 4097,
                ..
            }
        ));
        assert!(device_name("GetDevice", &"d".repeat(128)).is_ok());
        assert!(device_name("GetDevice", &"d".repeat(129)).is_err());
        let mut no_id = request(&[Rwo], "");
        no_id.volume_id.clear();
        assert!(matches!(
            err(no_id),
            PluginError::MissingVolumeId {
                rpc: "CreateDevice"
            }
        ));
    }

    #[test]
    fn differences_name_modes_and_keys_but_not_values_nor_the_publish_context() {
        use AccessMode::*;
        let mut made = device_spec(request(&[Rwo], "")).unwrap();
        made.volume_context.insert("tenant".into(), "a".into());
        made.storage_parameters.insert("pool".into(), "fast".into());
        let mut asked = made.clone();
        asked
            .publish_context
            .insert("attachment".into(), "2".into());
        assert!(differences(&made, &asked).is_empty());
        asked.access_modes = vec![Rwx];
        asked
            .volume_context
            .insert("tenant".into(), "secret-b".into());
        asked
            .storage_parameters
            .insert("chunkSize".into(), "1".into());
        let diff = differences(&made, &asked);
        assert_eq!(
            diff,
            vec![
                "access modes [ACCESS_MODE_RWO] (asked [ACCESS_MODE_RWX])".to_string(),
                "volume_context differs in tenant".to_string(),
                "storage_parameters differs in chunkSize".to_string(),
            ]
        );
        assert!(!diff.join(" ").contains("secret-b"));
    }
}
