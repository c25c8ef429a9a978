use super::*;
use dpufs_proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};

pub(crate) fn mount(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

#[test]
fn capacity_ranges() {
    let range = |required, limit| CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    };
    assert_eq!(Capacity::of(None).unwrap().bytes, DEFAULT_CAPACITY);
    assert_eq!(
        Capacity::of(Some(&range(0, 0))).unwrap().bytes,
        DEFAULT_CAPACITY
    );
    assert_eq!(Capacity::of(Some(&range(0, 4096))).unwrap().bytes, 4096);
    assert_eq!(
        Capacity::of(Some(&range(0, 8 << 30))).unwrap().bytes,
        DEFAULT_CAPACITY
    );
    assert_eq!(Capacity::of(Some(&range(5, 0))).unwrap().bytes, 5);
    assert_eq!(Capacity::of(Some(&range(5, 5))).unwrap().bytes, 5);
    assert_eq!(
        Capacity::of(Some(&range(6, 5))),
        Err(CapacityError::RequiredAboveLimit {
            required: 6,
            limit: 5
        })
    );
    assert!(matches!(
        Capacity::of(Some(&range(-1, 0))),
        Err(CapacityError::Negative { .. })
    ));
    assert!(matches!(
        Capacity::of(Some(&range(0, -1))),
        Err(CapacityError::Negative { .. })
    ));
    let c = Capacity::of(Some(&range(10, 20))).unwrap();
    assert!(c.fits(10) && c.fits(20) && !c.fits(9) && !c.fits(21));
    let c = Capacity::of(Some(&range(10, 0))).unwrap();
    assert!(c.fits(10) && c.fits(u64::MAX) && !c.fits(9));
    // The default shrinks to a smaller pool; a size the request names does not.
    let mut c = Capacity::of(None).unwrap();
    c.fit_default(Some(512 << 20));
    assert_eq!(c.bytes, 512 << 20);
    let mut c = Capacity::of(None).unwrap();
    c.fit_default(None);
    assert_eq!(c.bytes, DEFAULT_CAPACITY);
    let mut c = Capacity::of(Some(&range(2 << 30, 0))).unwrap();
    c.fit_default(Some(512 << 20));
    assert_eq!(c.bytes, 2 << 30);
}

#[test]
fn capabilities_of_a_shared_file_system() {
    for mode in [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ] {
        assert_eq!(check_capability(&mount(mode)), Ok(()), "{mode:?}");
    }
    assert_eq!(
        check_capability(&mount(Mode::Unknown)),
        Err(CapabilityError::AccessMode(
            Mode::Unknown.as_str_name().into()
        ))
    );
    let mut cap = mount(Mode::MultiNodeMultiWriter);
    cap.access_mode = Some(AccessMode { mode: 42 });
    assert_eq!(
        check_capability(&cap),
        Err(CapabilityError::AccessMode("42".into()))
    );
    cap.access_mode = None;
    assert_eq!(
        check_capability(&cap),
        Err(CapabilityError::MissingAccessMode)
    );
    let mut cap = mount(Mode::MultiNodeMultiWriter);
    cap.access_type = Some(AccessType::Block(BlockVolume {}));
    assert_eq!(check_capability(&cap), Err(CapabilityError::Block));
    cap.access_type = None;
    assert_eq!(
        check_capability(&cap),
        Err(CapabilityError::MissingAccessType)
    );
    let mut cap = mount(Mode::MultiNodeMultiWriter);
    for (fs, ok) in [("", true), ("dfs", true), ("ext4", false), ("xfs", false)] {
        cap.access_type = Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        }));
        assert_eq!(check_capability(&cap).is_ok(), ok, "{fs}");
    }
}

#[test]
fn topology_requirements() {
    let topo = |pairs: &[(&str, &str)]| Topology {
        segments: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let req = |requisite: Vec<Topology>| TopologyRequirement {
        requisite,
        preferred: vec![],
    };
    assert!(check_topology(None, "s").is_ok());
    assert!(check_topology(Some(&req(vec![])), "s").is_ok());
    let node = topo(&[(TOPOLOGY_SYSTEM_KEY, "s"), ("dpufs.io/node", "n1")]);
    assert!(check_topology(Some(&req(vec![node.clone()])), "s").is_ok());
    assert!(check_topology(Some(&req(vec![topo(&[("dpufs.io/node", "n1")])])), "s").is_ok());
    let other = topo(&[(TOPOLOGY_SYSTEM_KEY, "t")]);
    let err = check_topology(Some(&req(vec![other.clone()])), "s").unwrap_err();
    assert!(err.to_string().contains("dpufs.io/daos-system=t"), "{err}");
    assert!(check_topology(Some(&req(vec![other, node])), "s").is_ok());
}

#[test]
fn controller_capabilities_are_what_is_built() {
    use controller_service_capability::{Type, rpc};
    let types: Vec<i32> = ControllerService::capabilities()
        .into_iter()
        .filter_map(|c| c.r#type.map(|Type::Rpc(r)| r.r#type))
        .collect();
    assert_eq!(
        types,
        vec![
            rpc::Type::CreateDeleteVolume as i32,
            rpc::Type::ExpandVolume as i32,
            rpc::Type::CreateDeleteSnapshot as i32,
            rpc::Type::ListSnapshots as i32,
            rpc::Type::ListVolumes as i32,
            rpc::Type::GetCapacity as i32,
            rpc::Type::GetVolume as i32,
            rpc::Type::VolumeCondition as i32,
            rpc::Type::SingleNodeMultiWriter as i32,
            rpc::Type::ModifyVolume as i32,
        ]
    );
}

#[test]
fn acl_of_a_volume() {
    assert_eq!(
        volume_acl("team-a@"),
        vec![
            "A::OWNER@:rwdtTaAo".to_string(),
            "A::team-a@:rwt".to_string()
        ]
    );
    assert!(same_acl(
        &volume_acl("x@"),
        &["A::x@:rwt".into(), "A::OWNER@:rwdtTaAo".into()]
    ));
    assert!(!same_acl(
        &volume_acl("x@"),
        &[
            "A::x@:rwt".into(),
            "A::OWNER@:rwdtTaAo".into(),
            "A:G:GROUP@:rwtT".into()
        ]
    ));
}

#[tokio::test]
async fn unimplemented_rpcs_say_so() {
    use crate::csi::directory::{StaticConfig, StaticDirectory};
    let config: StaticConfig = serde_json::from_value(serde_json::json!({
        "system": {"endpoints": ["127.0.0.1:1"]},
    }))
    .unwrap();
    let c = ControllerService::new(Arc::new(StaticDirectory::new(config).unwrap()));
    for s in [
        c.controller_publish_volume(Request::new(Default::default()))
            .await
            .unwrap_err(),
        c.controller_unpublish_volume(Request::new(Default::default()))
            .await
            .unwrap_err(),
        c.get_snapshot(Request::new(Default::default()))
            .await
            .unwrap_err(),
    ] {
        assert_eq!(s.code(), tonic::Code::Unimplemented, "{}", s.message());
    }
}

/// Requests rejected before any DAOS call (the directory points at a dead endpoint, so
/// reaching DAOS would fail with UNAVAILABLE instead of the expected code).
#[tokio::test]
async fn bad_requests_are_refused_before_daos() {
    use crate::csi::directory::{StaticConfig, StaticDirectory};
    use tonic::Code;
    let config: StaticConfig = serde_json::from_value(serde_json::json!({
        "system": {"endpoints": ["127.0.0.1:1"], "requestTimeoutSeconds": 1},
        "pools": {"fast": "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f", "bulk": "0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b"},
        "tenants": [
            {"name": "a", "principal": "a@", "namespaces": ["ns-a"], "allowedPools": ["fast", "bulk"]},
            {"name": "b", "principal": "b@", "namespaces": ["ns-b"], "allowedPools": ["bulk"]}
        ],
        "defaultTenant": "b"
    }))
    .unwrap();
    let c = ControllerService::new(Arc::new(StaticDirectory::new(config).unwrap()));
    let good = || CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![mount(Mode::MultiNodeMultiWriter)],
        ..Default::default()
    };
    let code = |r: CreateVolumeRequest| {
        let c = &c;
        async move { Status::from(c.create(r).await.unwrap_err()) }
    };
    let mut r = good();
    r.name.clear();
    assert_eq!(code(r).await.code(), Code::InvalidArgument);
    let mut r = good();
    r.volume_capabilities.clear();
    assert_eq!(code(r).await.code(), Code::InvalidArgument);
    // A snapshot id of another driver names no snapshot of ours; a volume source is refused.
    let mut r = good();
    r.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: "s".into(),
            },
        )),
    });
    assert_eq!(code(r).await.code(), Code::NotFound);
    let mut r = good();
    r.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: "v1/daos_server/6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f/0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b".into(),
            },
        )),
    });
    assert_eq!(code(r).await.code(), Code::InvalidArgument);
    let mut r = good();
    r.mutable_parameters.insert("qos".into(), "gold".into());
    let s = code(r).await;
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(
        s.message().contains("maxThroughputMiBps, maxIops"),
        "{}",
        s.message()
    );
    let mut r = good();
    r.mutable_parameters.insert("maxIops".into(), "0".into());
    assert_eq!(code(r).await.code(), Code::InvalidArgument);
    let mut r = good();
    r.parameters.insert("provisioning".into(), "pool".into());
    r.parameters.insert("pool".into(), "fast".into());
    let s = code(r).await;
    assert_eq!(
        s.code(),
        Code::InvalidArgument,
        "pool and provisioning=pool"
    );
    assert!(
        s.message().contains("remove the parameter pool"),
        "{}",
        s.message()
    );
    let mut r = good();
    r.capacity_range = Some(CapacityRange {
        required_bytes: 2,
        limit_bytes: 1,
    });
    assert_eq!(code(r).await.code(), Code::OutOfRange);
    let mut r = good();
    r.parameters
        .insert(params::PVC_NAMESPACE.into(), "nobody".into());
    let s = code(r).await;
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert!(s.message().contains("\"nobody\""), "{}", s.message());
    let mut r = good();
    r.parameters
        .insert(params::PVC_NAMESPACE.into(), "ns-a".into());
    let s = code(r).await;
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    assert!(s.message().contains("fast, bulk"), "{}", s.message());
    let mut r = good();
    r.parameters.insert(params::POOL.into(), "fast".into());
    assert_eq!(code(r).await.code(), Code::PermissionDenied);
    let mut r = good();
    r.parameters.insert(params::SYSTEM.into(), "other".into());
    assert_eq!(code(r).await.code(), Code::FailedPrecondition);
    let mut r = good();
    r.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![Topology {
            segments: [(TOPOLOGY_SYSTEM_KEY.to_string(), "elsewhere".to_string())].into(),
        }],
        preferred: vec![],
    });
    assert_eq!(code(r).await.code(), Code::ResourceExhausted);
    // And a good request does reach DAOS, which is down here.
    assert_eq!(code(good()).await.code(), Code::Unavailable);
    // Ids: foreign deletes are OK, malformed ones are refused.
    let del = |id: &str| {
        c.delete(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
    };
    assert!(del("some-driver-id").await.is_ok());
    assert_eq!(
        Status::from(del("").await.unwrap_err()).code(),
        Code::InvalidArgument
    );
    assert_eq!(
        Status::from(del("v1/daos_server/x").await.unwrap_err()).code(),
        Code::InvalidArgument
    );
}
