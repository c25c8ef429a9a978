//! DPU mode's control requests as the agent on the DPU reads them from the host, and NVIDIA
//! DPF's storage-plugin requests as the plugin reads them from DPF: the messages, and the
//! checks and parsers the services run on their fields before anything is staged.

use dpufs_csi::csi::node::prepare::parse_id;
use dpufs_csi::dpf::backend::{Device, DeviceSpec};
use dpufs_csi::dpf::{page, request};
use dpufs_csi::dpu::tag;
use dpufs_proto::dpu::v1 as agent;
use dpufs_proto::nvidia::storage::plugins::v1 as dpf;
use prost::Message;

/// Whether a request got past the checks of its fields.
pub fn run(data: &[u8]) -> bool {
    let mut accepted = false;
    if let Ok(req) = agent::StageVolumeRequest::decode(data)
        && let Ok(id) = parse_id(&req.volume_id, "StageVolume")
    {
        assert!(tag::is_dpufs_tag(&tag::tag_of(&id)), "a volume's own tag");
        accepted = true;
    }
    if let Ok(req) = agent::UnstageVolumeRequest::decode(data) {
        accepted |= parse_id(&req.volume_id, "UnstageVolume").is_ok();
    }
    if let Ok(req) = dpf::CreateDeviceRequest::decode(data)
        && let Ok(spec) = request::device_spec(req)
    {
        assert!(request::differences(&spec, &spec).is_empty());
        listing(spec);
        accepted = true;
    }
    for (id, name) in [
        dpf::DeleteDeviceRequest::decode(data).map(|r| (r.volume_id, r.device_name)),
        dpf::GetDeviceRequest::decode(data).map(|r| (r.volume_id, r.device_name)),
    ]
    .into_iter()
    .flatten()
    {
        let id_ok = request::volume_id("GetDevice", &id).is_ok();
        accepted |= id_ok && request::device_name("GetDevice", &name).is_ok();
    }
    if let Ok(req) = dpf::ListDevicesRequest::decode(data) {
        let token = !req.starting_token.is_empty();
        accepted |= token && page::page(Vec::new(), req.max_entries, &req.starting_token).is_ok();
    }
    accepted
}

/// Pages one at a time through the device and one whose id sorts after it: each comes back
/// exactly once, in order, and the last page ends the listing.
fn listing(spec: DeviceSpec) {
    let mut later = spec.clone();
    later.volume_id.push('~');
    let devices = vec![
        Device {
            name: "b".into(),
            spec: later,
        },
        Device {
            name: "a".into(),
            spec,
        },
    ];
    let (first, next) = page::page(devices.clone(), 1, "").expect("a first page");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].name, "a");
    assert!(!next.is_empty(), "a listing ended a page early");
    let (second, end) = page::page(devices, 1, &next).expect("the token of a page");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].name, "b");
    assert!(end.is_empty());
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let volume =
        "v1/daos/0b7e5c1e-6a8f-4d6e-9a55-3f2d1c0b9a87/5d0c6b2a-1e4f-4a3b-8c7d-9e0f1a2b3c4d";
    vec![
        (
            "stage",
            agent::StageVolumeRequest {
                volume_id: volume.into(),
                host_node: "host-1".into(),
                pod: Some(agent::PodRef {
                    namespace: "team-a".into(),
                    name: "trainer-0".into(),
                    uid: "8d1c".into(),
                }),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "create-device",
            dpf::CreateDeviceRequest {
                volume_id: volume.into(),
                access_modes: vec![dpf::AccessMode::Rwo as i32],
                volume_mode: "Filesystem".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "list-devices",
            dpf::ListDevicesRequest {
                max_entries: 2,
                starting_token: "7631".into(),
            }
            .encode_to_vec(),
        ),
    ]
}
