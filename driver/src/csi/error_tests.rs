use super::*;
use crate::csi::node::uids::UidError;
use dpufs_proto::daos::der::Der;
use std::time::Duration;

fn daos_invalid() -> DaosError {
    DaosError::Invalid {
        message: "DER_INVAL(-1003): rd_fac 2 needs more than the pool's 1 fault domains".into(),
        der: Some(Der::Inval),
    }
}

fn daos_unreachable() -> DaosError {
    DaosError::Unreachable {
        endpoints: "127.0.0.1:1".into(),
        cause: "connection refused".into(),
    }
}

fn step(source: DaosError) -> (String, DaosError) {
    ("creating container".into(), source)
}

/// (error, code, a fragment the message must contain)
fn table() -> Vec<(CsiError, Code, &'static str)> {
    use CreateVolumeError as C;
    use DeleteVolumeError as D;
    use ExpandVolumeError as E;
    use ModifyVolumeError as M;
    use ValidateVolumeError as V;
    let malformed = || VolumeIdError::Malformed {
        id: "v1/x".into(),
        reason: "expected 3 parts after v1/, found 1".into(),
    };
    let foreign = || VolumeIdError::Foreign("some-id".into());
    let (s, d) = step(daos_invalid());
    let (s2, d2) = step(daos_unreachable());
    let mut rows = vec![
        // CreateVolume
        (
            C::MissingName.into(),
            Code::InvalidArgument,
            "needs a volume name",
        ),
        (
            C::InvalidName {
                name: "a\u{7}".into(),
                source: NameError::ControlCharacter(7),
            }
            .into(),
            Code::InvalidArgument,
            "U+0007",
        ),
        (
            C::MissingCapabilities.into(),
            Code::InvalidArgument,
            "capability",
        ),
        (
            C::Capability(CapabilityError::Block).into(),
            Code::InvalidArgument,
            "block",
        ),
        (
            C::ContentSource.into(),
            Code::InvalidArgument,
            "create a VolumeSnapshot of it",
        ),
        (
            C::Params(ParamError::UnknownMutable(vec!["qos".into()])).into(),
            Code::InvalidArgument,
            "VolumeAttributesClass parameter \"qos\"",
        ),
        (
            C::Params(ParamError::Unknown(vec!["volumeMode".into()])).into(),
            Code::InvalidArgument,
            "\"volumeMode\"",
        ),
        (
            C::Params(ParamError::Invalid {
                key: "chunkSize".into(),
                value: "1".into(),
                reason: "out of range".into(),
            })
            .into(),
            Code::InvalidArgument,
            "chunkSize",
        ),
        (
            C::SourceForOwnPool.into(),
            Code::InvalidArgument,
            "provisioning=container",
        ),
        (
            C::Capacity(CapacityError::Negative {
                required: -1,
                limit: 0,
            })
            .into(),
            Code::OutOfRange,
            "negative",
        ),
        (
            C::Capacity(CapacityError::RequiredAboveLimit {
                required: 2,
                limit: 1,
            })
            .into(),
            Code::OutOfRange,
            "at most 1",
        ),
        (
            C::Capacity(CapacityError::ExceedsPool {
                pool: "fast".into(),
                requested: 10,
                pool_bytes: 5,
            })
            .into(),
            Code::OutOfRange,
            "pool \"fast\"",
        ),
        (
            C::Directory(DirectoryError::NoTenant("team-z".into())).into(),
            Code::FailedPrecondition,
            "namespace \"team-z\"",
        ),
        (
            C::Directory(DirectoryError::NoDefaultTenant).into(),
            Code::FailedPrecondition,
            "--extra-create-metadata",
        ),
        (
            C::Directory(DirectoryError::NoSystem).into(),
            Code::FailedPrecondition,
            "no DAOS system",
        ),
        (
            C::Directory(DirectoryError::SeveralSystems(vec!["a".into(), "b".into()])).into(),
            Code::InvalidArgument,
            "parameter system",
        ),
        (
            C::Directory(DirectoryError::UnknownSystem("x".into())).into(),
            Code::FailedPrecondition,
            "\"x\"",
        ),
        (
            C::Directory(DirectoryError::UnknownPool {
                system: "s".into(),
                pool: "p".into(),
            })
            .into(),
            Code::FailedPrecondition,
            "pool \"p\"",
        ),
        (
            C::Directory(DirectoryError::Unavailable("API down".into())).into(),
            Code::Unavailable,
            "API down",
        ),
        (
            C::PoolRequired {
                tenant: "t".into(),
                allowed: vec!["a".into(), "b".into()],
            }
            .into(),
            Code::InvalidArgument,
            "a, b",
        ),
        (
            C::PoolNotAllowed {
                tenant: "t".into(),
                pool: "p".into(),
                allowed: vec!["a".into()],
            }
            .into(),
            Code::PermissionDenied,
            "may not use pool \"p\"",
        ),
        (
            C::PoolMissing {
                system: "s".into(),
                pool: "p".into(),
                uuid: "u".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "does not exist",
        ),
        (
            C::Topology {
                system: "s".into(),
                requisite: "dpufs.io/daos-system=t".into(),
            }
            .into(),
            Code::ResourceExhausted,
            "requisite",
        ),
        (
            C::Incompatible {
                name: "pvc-1".into(),
                differences: vec!["capacity 1 bytes, asked at least 2".into()],
            }
            .into(),
            Code::AlreadyExists,
            "capacity 1 bytes",
        ),
        (
            C::InOtherPool {
                name: "pvc-1".into(),
                pool: "a".into(),
                requested: "b".into(),
            }
            .into(),
            Code::AlreadyExists,
            "pool \"a\"",
        ),
        (
            C::LabelTaken {
                label: "csi-x".into(),
                other: "pvc-2".into(),
            }
            .into(),
            Code::Internal,
            "pvc-2",
        ),
        (
            C::Busy(Busy("volume name \"pvc-1\"".into())).into(),
            Code::Aborted,
            "already in progress",
        ),
        (
            C::Daos { step: s, source: d }.into(),
            Code::InvalidArgument,
            "rd_fac 2",
        ),
        (
            C::Daos {
                step: s2,
                source: d2,
            }
            .into(),
            Code::Unavailable,
            "connection refused",
        ),
        // DeleteVolume
        (
            D::MissingId.into(),
            Code::InvalidArgument,
            "needs a volume id",
        ),
        (
            D::MalformedId(malformed()).into(),
            Code::InvalidArgument,
            "malformed",
        ),
        (
            D::Directory(DirectoryError::UnknownSystem("x".into())).into(),
            Code::FailedPrecondition,
            "not configured",
        ),
        (
            D::NotOurs {
                id: "v1/s/p/c".into(),
                container: "c".into(),
                label: "shared".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "not provisioned by dfs.dpufs.io",
        ),
        (
            D::InUse {
                id: "v1/s/p/c".into(),
                message: "open handles".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "in use",
        ),
        (
            D::Busy(Busy("volume v1/s/p/c".into())).into(),
            Code::Aborted,
            "v1/s/p/c",
        ),
        (
            D::Daos {
                step: "destroying".into(),
                source: daos_unreachable(),
            }
            .into(),
            Code::Unavailable,
            "destroying",
        ),
        (
            D::Daos {
                step: "destroying".into(),
                source: daos_invalid(),
            }
            .into(),
            Code::Internal,
            "DER_INVAL",
        ),
        // ValidateVolumeCapabilities
        (V::MissingId.into(), Code::InvalidArgument, "volume id"),
        (
            V::MissingCapabilities.into(),
            Code::InvalidArgument,
            "capability",
        ),
        (
            V::MalformedId(malformed()).into(),
            Code::InvalidArgument,
            "malformed",
        ),
        (
            V::MalformedId(foreign()).into(),
            Code::NotFound,
            "not issued",
        ),
        (
            V::NotFound("v1/s/p/c".into()).into(),
            Code::NotFound,
            "does not exist",
        ),
        (
            V::Directory(DirectoryError::UnknownSystem("x".into())).into(),
            Code::FailedPrecondition,
            "not configured",
        ),
        (
            V::Daos {
                step: "querying".into(),
                source: DaosError::Timeout(Duration::from_secs(1), Box::new(daos_unreachable())),
            }
            .into(),
            Code::Unavailable,
            "querying",
        ),
        // ControllerModifyVolume
        (M::MissingId.into(), Code::InvalidArgument, "volume id"),
        (
            M::MalformedId(malformed()).into(),
            Code::InvalidArgument,
            "malformed",
        ),
        (
            M::MalformedId(foreign()).into(),
            Code::NotFound,
            "not issued",
        ),
        (
            M::Params(ParamError::InvalidMutable {
                key: "maxIops".into(),
                value: "0".into(),
                reason: "use a whole number".into(),
            })
            .into(),
            Code::InvalidArgument,
            "maxIops=\"0\"",
        ),
        (
            M::NotFound("v1/s/p/c".into()).into(),
            Code::NotFound,
            "does not exist",
        ),
        (
            M::NotOurs {
                id: "v1/s/p/c".into(),
                container: "c".into(),
                label: "mine".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "not provisioned by dfs.dpufs.io",
        ),
        (
            M::Daos {
                step: "setting the QoS attribute".into(),
                source: daos_unreachable(),
            }
            .into(),
            Code::Unavailable,
            "ControllerModifyVolume: setting the QoS attribute",
        ),
        // ControllerExpandVolume
        (E::MissingId.into(), Code::InvalidArgument, "volume id"),
        (
            E::MissingCapacity.into(),
            Code::InvalidArgument,
            "required_bytes",
        ),
        (
            E::MalformedId(malformed()).into(),
            Code::InvalidArgument,
            "malformed",
        ),
        (
            E::MalformedId(foreign()).into(),
            Code::NotFound,
            "not issued",
        ),
        (
            E::NotFound("v1/s/p/c".into()).into(),
            Code::NotFound,
            "does not exist",
        ),
        (
            E::Capability(CapabilityError::FsType("ext4".into())).into(),
            Code::InvalidArgument,
            "ext4",
        ),
        (
            E::Capacity(CapacityError::ExceedsPool {
                pool: "p".into(),
                requested: 2,
                pool_bytes: 1,
            })
            .into(),
            Code::OutOfRange,
            "more than pool",
        ),
        (
            E::NotOurs {
                id: "v1/s/p/c".into(),
                container: "c".into(),
                label: "l".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "not changed",
        ),
        (
            E::Directory(DirectoryError::Unavailable("x".into())).into(),
            Code::Unavailable,
            "cannot be read",
        ),
        (
            E::Busy(Busy("volume v".into())).into(),
            Code::Aborted,
            "in progress",
        ),
        (
            E::Daos {
                step: "setting quota".into(),
                source: DaosError::NoSpace {
                    message: "full".into(),
                    der: None,
                },
            }
            .into(),
            Code::ResourceExhausted,
            "setting quota",
        ),
        (
            CsiError::Unimplemented("ListVolumes"),
            Code::Unimplemented,
            "ListVolumes",
        ),
    ];
    rows.extend(node_table());
    rows
}

/// The Node service's rows (docs/csi.md, "Node errors").
fn node_table() -> Vec<(CsiError, Code, &'static str)> {
    use PublishError as P;
    use StageError as S;
    let id = || "v1/daos_server/p/c".to_string();
    let node = |step: &str| S::Node {
        step: step.into(),
        detail: "EIO".into(),
    };
    vec![
        (
            CreateVolumeError::SnapshotNotFound("v1/x".into()).into(),
            Code::NotFound,
            "does not exist",
        ),
        (
            CreateVolumeError::SnapshotElsewhere {
                snapshot: "v1/s".into(),
                snapshot_pool: "p1".into(),
                pool: "fast".into(),
            }
            .into(),
            Code::InvalidArgument,
            "same pool",
        ),
        (
            CreateVolumeError::MissingSnapshotId.into(),
            Code::InvalidArgument,
            "no snapshot id",
        ),
        (
            InventoryError::NotFound("v1/x".into()).into(),
            Code::NotFound,
            "does not exist",
        ),
        (
            InventoryError::MissingId.into(),
            Code::InvalidArgument,
            "needs a volume id",
        ),
        (
            InventoryError::BadToken("9".into()).into(),
            Code::Aborted,
            "\"9\"",
        ),
        (
            InventoryError::Params(ParamError::Unknown(vec!["tier".into()])).into(),
            Code::InvalidArgument,
            "tier",
        ),
        (
            SnapshotError::MissingName("CreateSnapshot").into(),
            Code::InvalidArgument,
            "snapshot name",
        ),
        (
            SnapshotError::UnknownParameters(vec!["tier".into()]).into(),
            Code::InvalidArgument,
            "tier",
        ),
        (
            SnapshotError::SourceNotFound("v1/x".into()).into(),
            Code::NotFound,
            "does not exist",
        ),
        (
            SnapshotError::NameTaken {
                name: "snap-1".into(),
                volume: "v1/x".into(),
            }
            .into(),
            Code::AlreadyExists,
            "another volume, v1/x",
        ),
        (
            SnapshotError::MalformedId(VolumeIdError::Malformed {
                id: "v1/x".into(),
                reason: "r".into(),
            })
            .into(),
            Code::InvalidArgument,
            "v1/x",
        ),
        (
            SnapshotError::BadToken("7".into()).into(),
            Code::Aborted,
            "\"7\"",
        ),
        (
            SnapshotError::Daos {
                step: "snapshotting".into(),
                source: DaosError::NoSpace {
                    message: "full".into(),
                    der: None,
                },
            }
            .into(),
            Code::ResourceExhausted,
            "snapshotting",
        ),
        (
            S::MissingId("NodeStageVolume").into(),
            Code::InvalidArgument,
            "needs a volume id",
        ),
        (
            S::MissingStagingPath("NodeUnstageVolume").into(),
            Code::InvalidArgument,
            "staging",
        ),
        (
            S::MissingCapability.into(),
            Code::InvalidArgument,
            "capability",
        ),
        (
            S::Capability(CapabilityError::Block).into(),
            Code::InvalidArgument,
            "block",
        ),
        (
            S::MalformedId(VolumeIdError::Foreign("x".into())).into(),
            Code::NotFound,
            "x",
        ),
        (S::NotFound(id()).into(), Code::NotFound, "does not exist"),
        (
            S::NotOurs {
                id: id(),
                container: "c".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "not provisioned",
        ),
        (
            S::StagedElsewhere {
                id: id(),
                at: "/a".into(),
                asked: "/b".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "staged at /a",
        ),
        (
            S::OtherAccess {
                id: id(),
                staged: "reading only",
                asked: "reading and writing",
            }
            .into(),
            Code::AlreadyExists,
            "unstaged first",
        ),
        (
            S::TooManyVolumes { max: 2 }.into(),
            Code::ResourceExhausted,
            "2 volumes",
        ),
        (
            S::NoDataEndpoint("s".into()).into(),
            Code::FailedPrecondition,
            "data endpoint",
        ),
        (
            S::TenantUid(UidError::NoRange).into(),
            Code::FailedPrecondition,
            "--tenant-uids",
        ),
        (
            S::TenantUid(UidError::Taken {
                uid: 30001,
                principal: "team-b@".into(),
                holder: "team-a@".into(),
            })
            .into(),
            Code::FailedPrecondition,
            "another uid",
        ),
        (
            S::TenantUid(UidError::NotAUser("@".into())).into(),
            Code::FailedPrecondition,
            "names no DAOS user",
        ),
        (
            S::TenantUid(UidError::Exhausted {
                range: "20000-20001".parse().unwrap(),
                taken: 2,
            })
            .into(),
            Code::ResourceExhausted,
            "widen",
        ),
        (
            S::TenantUid(UidError::Record {
                path: "/s/tenant-uids.json".into(),
                detail: "invalid".into(),
            })
            .into(),
            Code::Internal,
            "tenant-uids.json",
        ),
        (
            S::Daos {
                step: "reading the attributes".into(),
                source: DaosError::NotFound {
                    message: "gone".into(),
                    der: None,
                },
            }
            .into(),
            Code::NotFound,
            "gone",
        ),
        (node("mounting").into(), Code::Internal, "mounting"),
        (
            P::MissingTargetPath("NodePublishVolume").into(),
            Code::InvalidArgument,
            "target",
        ),
        (
            P::NotStaged {
                id: id(),
                staging: "/s".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "NodeStageVolume first",
        ),
        (
            P::Tenant(TenantError::OtherTenant {
                id: id(),
                namespace: "ns-b".into(),
                tenant: "team-b".into(),
                owner: "team-a".into(),
            })
            .into(),
            Code::PermissionDenied,
            "belongs to tenant \"team-a\"",
        ),
        (
            P::Tenant(TenantError::NoTenant {
                id: id(),
                source: DirectoryError::NoTenant("ns-z".into()),
            })
            .into(),
            Code::PermissionDenied,
            "ns-z",
        ),
        (
            P::Tenant(TenantError::Directory(DirectoryError::Unavailable(
                "not synced".into(),
            )))
            .into(),
            Code::Unavailable,
            "not synced",
        ),
        (
            P::Incompatible {
                id: id(),
                target: "/t".into(),
                read_only: true,
            }
            .into(),
            Code::AlreadyExists,
            "read-only",
        ),
        (
            P::TargetInUse {
                target: "/t".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "/t",
        ),
        (
            P::MissingStagingPath.into(),
            Code::FailedPrecondition,
            "NodeStageVolume",
        ),
        (
            P::SingleWriterInUse {
                id: id(),
                other: "/pods/a/mount".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "/pods/a/mount",
        ),
        (
            P::MountGroup("staff".into()).into(),
            Code::InvalidArgument,
            "fsGroup",
        ),
        (
            P::Path(PathError {
                what: "target path",
                path: "/tmp".into(),
                reason: "is not under the node plugin's --mount-root",
            })
            .into(),
            Code::InvalidArgument,
            "--mount-root",
        ),
        (
            P::NotFound(id()).into(),
            Code::NotFound,
            "not staged on this node",
        ),
        (
            P::MalformedId(VolumeIdError::Foreign("x".into())).into(),
            Code::NotFound,
            "x",
        ),
        (
            P::NotOurMount {
                target: "/t".into(),
            }
            .into(),
            Code::FailedPrecondition,
            "not unmounting",
        ),
        (
            StatsError::MissingPath.into(),
            Code::InvalidArgument,
            "volume path",
        ),
        (
            StatsError::NotFound {
                id: id(),
                path: "/t".into(),
            }
            .into(),
            Code::NotFound,
            "not a staged or published path",
        ),
    ]
}

#[test]
fn every_error_has_its_code_an_empty_details_and_a_message() {
    for (err, code, fragment) in table() {
        let text = err.to_string();
        let status = Status::from(err);
        assert_eq!(status.code(), code, "{text}");
        assert!(status.details().is_empty(), "{text}");
        assert!(
            status.message().contains(fragment),
            "{:?} lacks {fragment:?}",
            status.message()
        );
    }
}

#[test]
fn per_operation_errors_convert_directly() {
    let s = Status::from(CreateVolumeError::MissingName);
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().starts_with("CreateVolume: "), "{}", s.message());
    let s = Status::from(DeleteVolumeError::MissingId);
    assert!(s.message().starts_with("DeleteVolume: "));
    let s = Status::from(ValidateVolumeError::MissingId);
    assert!(s.message().starts_with("ValidateVolumeCapabilities: "));
    let s = Status::from(ExpandVolumeError::MissingId);
    assert!(s.message().starts_with("ControllerExpandVolume: "));
}

#[test]
fn daos_errors() {
    for (e, code) in [
        (
            DaosError::NotFound {
                message: "x".into(),
                der: None,
            },
            Code::NotFound,
        ),
        (
            DaosError::Exists {
                message: "x".into(),
                der: None,
            },
            Code::Aborted,
        ),
        (
            DaosError::NoSpace {
                message: "x".into(),
                der: None,
            },
            Code::ResourceExhausted,
        ),
        (
            DaosError::PermissionDenied {
                message: "x".into(),
                der: None,
            },
            Code::PermissionDenied,
        ),
        (
            DaosError::Busy {
                message: "x".into(),
                der: None,
            },
            Code::Unavailable,
        ),
        (daos_unreachable(), Code::Unavailable),
        (
            DaosError::NotLeader {
                leader_hint: String::new(),
                replicas: vec![],
            },
            Code::Unavailable,
        ),
        (
            DaosError::NotReplica { replicas: vec![] },
            Code::Unavailable,
        ),
        (
            DaosError::Incompatible {
                message: "x".into(),
            },
            Code::FailedPrecondition,
        ),
        (DaosError::Config("x".into()), Code::FailedPrecondition),
        (
            DaosError::Rpc {
                code: Code::DeadlineExceeded,
                message: "x".into(),
            },
            Code::Unavailable,
        ),
        (
            DaosError::Rpc {
                code: Code::DataLoss,
                message: "x".into(),
            },
            Code::Internal,
        ),
        // DER_AGAIN: DAOS's own clients retry it.
        (DaosError::from_der(-1013, "x"), Code::Unavailable),
        (DaosError::from_der(-1003, "x"), Code::Internal),
        (
            DaosError::Der {
                code: -1999,
                message: "x".into(),
            },
            Code::Internal,
        ),
    ] {
        assert_eq!(daos_code(&e), code, "{e:?}");
    }
}
