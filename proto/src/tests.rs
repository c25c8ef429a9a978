//! One round trip through bytes per package, plus checks that the generated
//! descriptor set carries every service reflection must advertise.

use prost::Message;

fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(msg: M) {
    let bytes = msg.encode_to_vec();
    assert!(!bytes.is_empty(), "a populated message encodes to bytes");
    assert_eq!(M::decode(bytes.as_slice()).expect("decodes"), msg);
}

#[test]
fn csi_round_trip() {
    use crate::csi::v1::*;
    let cap = VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "fuse.dpufs".into(),
                mount_flags: vec!["ro".into()],
                volume_mount_group: "1000".into(),
            },
        )),
    };
    round_trip(CreateVolumeRequest {
        name: "pvc-1".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        parameters: [("pool".to_string(), "tank".to_string())].into(),
        secrets: [("key".to_string(), "secret".to_string())].into(),
        ..Default::default()
    });
}

#[test]
fn mgmt_round_trip() {
    use crate::mgmt::*;
    round_trip(PoolCreateReq {
        uuid: "0b0e9f41-4bd4-4c4b-a0fe-4a8d0b4d2f5e".into(),
        sys: "daos_server".into(),
        user: "alice@".into(),
        properties: vec![PoolProperty {
            number: 1,
            value: Some(pool_property::Value::Strval("tank".into())),
        }],
        total_bytes: 1 << 34,
        tier_ratio: vec![0.06, 0.94],
        mem_ratio: 0.5,
        ..Default::default()
    });
    round_trip(PoolQueryResp {
        state: PoolServiceState::TargetsExcluded as i32,
        mem_file_bytes: 7,
        dead_ranks: "[1]".into(),
        rebuild: Some(PoolRebuildStatus {
            state: pool_rebuild_status::State::Done as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
}

#[test]
fn google_rpc_round_trip() {
    use crate::google::rpc::*;
    let info = ErrorInfo {
        reason: crate::daos::errinfo::REASON_DAOS_STATUS.into(),
        domain: crate::daos::errinfo::DOMAIN.into(),
        metadata: [("Status".to_string(), "-1005".to_string())].into(),
    };
    round_trip(Status {
        code: 13,
        message: "DER_NONEXIST(-1005)".into(),
        details: vec![prost_types::Any::from_msg(&info).expect("packs")],
    });
}

#[test]
fn engine_round_trip() {
    use crate::engine::v1::*;
    round_trip(ContCreateReq {
        pool: "tank".into(),
        label: "vol-1".into(),
        properties: vec![ContProperty {
            number: crate::daos::props::CONT_LAYOUT_TYPE,
            value: Some(cont_property::Value::Numval(
                crate::daos::props::LAYOUT_POSIX,
            )),
        }],
        attributes: [("csi.name".to_string(), b"pvc-1".to_vec())].into(),
        ..Default::default()
    });
}

#[test]
fn dpu_round_trip() {
    use crate::dpu::v1::*;
    round_trip(StageVolumeRequest {
        volume_id: "v1/daos_server/6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f/0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b".into(),
        access: Some(VolumeAccess {
            mode: AccessMode::MultiNodeMultiWriter as i32,
            read_only: true,
        }),
        volume_context: [("csi.storage.k8s.io/pod.name".to_string(), "p".to_string())].into(),
        pod: Some(PodRef {
            namespace: "ns-a".into(),
            name: "p".into(),
            uid: "5d3c8f7e-0000-4000-8000-000000000001".into(),
        }),
        host_node: "gpu-1".into(),
    });
    // The access modes keep CSI's numbers.
    use crate::csi::v1::volume_capability::access_mode::Mode;
    assert_eq!(
        AccessMode::SingleNodeMultiWriter as i32,
        Mode::SingleNodeMultiWriter as i32
    );
    assert_eq!(
        AccessMode::MultiNodeReaderOnly as i32,
        Mode::MultiNodeReaderOnly as i32
    );
}

#[test]
fn descriptor_set_lists_every_service() {
    let fds = prost_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET).expect("decodes");
    let services: Vec<String> = fds
        .file
        .iter()
        .flat_map(|f| {
            f.service
                .iter()
                .map(move |s| format!("{}.{}", f.package(), s.name()))
        })
        .collect();
    for want in [
        "csi.v1.Identity",
        "csi.v1.Controller",
        "csi.v1.GroupController",
        "csi.v1.SnapshotMetadata",
        "csi.v1.Node",
        "mgmt.MgmtSvc",
        "dpufs.engine.v1.ContainerSvc",
        "dpufs.engine.v1.RankControl",
        "dpufs.dpu.v1.DpuAgent",
    ] {
        assert!(
            services.iter().any(|s| s == want),
            "{want} missing from {services:?}"
        );
    }
}

#[test]
fn der_codes_round_trip_through_wire_values() {
    use crate::daos::der::Der;
    for &der in Der::ALL {
        assert!(der.wire() < 0);
        assert_eq!(Der::from_code(der.wire()), Some(der));
    }
    assert_eq!(
        Der::Nonexist.to_string(),
        "DER_NONEXIST(-1005): The specified entity does not exist"
    );
    assert_eq!(Der::from_code(4242), None);
}

#[test]
fn set_id_bits_go_as_linux_drops_them() {
    use crate::dfs::without_set_id;
    // set-user-ID always goes; set-group-ID with group execute, or for a caller outside the group.
    assert_eq!(without_set_id(0o6755, true), 0o0755);
    assert_eq!(without_set_id(0o2755, true), 0o0755);
    assert_eq!(without_set_id(0o2645, true), 0o2645);
    assert_eq!(without_set_id(0o2645, false), 0o0645);
    assert_eq!(without_set_id(0o100_644, false), 0o100_644);
}
