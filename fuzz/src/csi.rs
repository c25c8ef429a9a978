//! CSI request fields as the driver reads them from kubelet and the sidecars: volume and
//! snapshot ids, StorageClass and VolumeAttributesClass parameters, the endpoint flag, and
//! whole CSI messages whose fields go through those parsers.
//!
//! Text inputs are lines: the first is an id (tried as a volume and as a snapshot id, and
//! as an endpoint), the others `key=value` parameters.

use dpufs_csi::csi::params;
use dpufs_csi::csi::server::parse_endpoint;
use dpufs_csi::csi::volume_id::{SnapshotId, VolumeId};
use dpufs_proto::csi::v1 as csi;
use prost::Message;
use std::collections::HashMap;

/// Whether a field parsed (an empty message decodes from nothing, so decoding alone says
/// little).
pub fn run(data: &[u8]) -> bool {
    let from_messages = messages(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return from_messages;
    };
    let mut lines = text.split('\n');
    let id = lines.next().unwrap_or_default();
    let map: HashMap<String, String> = lines
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    [
        from_messages,
        ids(id),
        parse_endpoint(id).is_ok(),
        parameters(&map),
    ]
    .contains(&true)
}

/// Whether `id` names a volume or a snapshot. A parsed id prints as itself: the sidecars
/// compare ids as strings.
fn ids(id: &str) -> bool {
    let volume = VolumeId::parse(id);
    if let Ok(v) = &volume {
        assert_eq!(v.to_string(), id);
    }
    let snapshot = SnapshotId::parse(id);
    if let Ok(s) = &snapshot {
        assert_eq!(s.to_string(), id);
    }
    volume.is_ok() || snapshot.is_ok()
}

/// Whether the parameters are a valid StorageClass's or VolumeAttributesClass's.
fn parameters(map: &HashMap<String, String>) -> bool {
    let create = params::parse(map).is_ok();
    let modify = params::parse_mutable(map).is_ok();
    create || modify
}

/// The messages whose fields the controller and node services parse.
fn messages(data: &[u8]) -> bool {
    let mut parsed = false;
    if let Ok(req) = csi::CreateVolumeRequest::decode(data) {
        parsed |= !req.parameters.is_empty() && parameters(&req.parameters);
        if let Some(src) = req.volume_content_source.and_then(|s| s.r#type) {
            parsed |= match src {
                csi::volume_content_source::Type::Snapshot(s) => ids(&s.snapshot_id),
                csi::volume_content_source::Type::Volume(v) => ids(&v.volume_id),
            };
        }
    }
    if let Ok(req) = csi::NodeStageVolumeRequest::decode(data) {
        parsed |= ids(&req.volume_id);
    }
    if let Ok(req) = csi::CreateSnapshotRequest::decode(data) {
        parsed |= ids(&req.source_volume_id);
    }
    if let Ok(req) = csi::ControllerModifyVolumeRequest::decode(data) {
        parsed |= ids(&req.volume_id);
        parsed |= !req.mutable_parameters.is_empty()
            && params::parse_mutable(&req.mutable_parameters).is_ok();
    }
    parsed
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let volume = VolumeId::new(
        "daos",
        uuid::Uuid::from_u128(0x0b7e_5c1e_6a8f_4d6e_9a55_3f2d_1c0b_9a87),
        uuid::Uuid::from_u128(0x5d0c_6b2a_1e4f_4a3b_8c7d_9e0f_1a2b_3c4d),
    );
    let snapshot = SnapshotId {
        volume: volume.clone(),
        epoch: 7,
    };
    let create = csi::CreateVolumeRequest {
        name: "pvc-1".into(),
        // One entry: a map's encoding follows its (random) iteration order.
        parameters: [("pool".to_string(), "tank".to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    vec![
        (
            "fields",
            format!("{volume}\npool=tank\nchunkSize=1Mi\nprovisioning=container\n").into_bytes(),
        ),
        ("snapshot-id", snapshot.to_string().into_bytes()),
        (
            "mutable",
            format!("{volume}\nmaxThroughputMiBps=100\nmaxIops=1000\n").into_bytes(),
        ),
        ("endpoint", b"unix:///csi/csi.sock".to_vec()),
        ("create-volume", create.encode_to_vec()),
        (
            "stage-volume",
            csi::NodeStageVolumeRequest {
                volume_id: volume.to_string(),
                staging_target_path: "/var/lib/kubelet/plugins/x/globalmount".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    ]
}
