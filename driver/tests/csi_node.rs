//! The CSI Node service end to end, as kubelet and the external-provisioner drive it: a real
//! engine process with its fabric data service, `dpufs-csi controller` and `dpufs-csi node`
//! processes on unix sockets, the node's mount keeper, real FUSE mounts and fio.
//!
//! CreateVolume → NodeStage → NodePublish for two pods (one read-only) → fio with crc32c
//! verify through both → NodeGetVolumeStats → unpublish both → NodeUnstage → DeleteVolume,
//! and afterwards no mount, no worker, no container and no stage record are left. A pod of
//! another tenant's namespace is refused at NodePublish and gets nothing mounted; a
//! container the driver did not provision is refused at NodeStage.

mod common;

use common::csi_bed::{bed, bed_with_node_args};
use common::{can_mount, fio_available, wait_until, write_and_verify};
use dpufs_csi::csi::VolumeId;
use dpufs_csi::csi::node::record::VolumeFiles;
use dpufs_daos::{ContainerAdmin, EngineContainers};
use dpufs_e2e::csi_bed::{MIB, cap, mounted};
use dpufs_node_api::qos::QosLimits;
use dpufs_proto::csi::v1::volume_capability::access_mode;
use dpufs_proto::csi::v1::{self as csi, volume_usage::Unit};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tonic::Code;

/// A 64 MiB file written in 1 MiB blocks and checked with crc32c.
const JOB: &[&str] = &[
    "--name=pod",
    "--rw=write",
    "--bs=1M",
    "--size=64M",
    "--ioengine=psync",
];

#[tokio::test(flavor = "multi_thread")]
async fn stage_publish_two_pods_fio_stats_and_everything_goes_away() {
    if !can_mount() || !fio_available() {
        return;
    }
    let bed = bed().await;
    let probe = bed.ident.clone().probe(csi::ProbeRequest {}).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    let info = bed
        .node
        .clone()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-1");
    assert_eq!(info.max_volumes_per_node, 64);
    let segments = info.accessible_topology.unwrap().segments;
    assert_eq!(segments["dpufs.io/node"], "node-1");
    assert_eq!(segments["dpufs.io/daos-system"], "daos_server");

    let volume = bed.create("pvc-1", "ns-a").await;
    let id = volume.volume_id.as_str();
    let staging = bed.path("globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    bed.stage(id, &staging).await.expect("NodeStage");
    bed.stage(id, &staging).await.expect("NodeStage again");
    let workers = bed.keeper_volumes();
    assert_eq!(workers.len(), 1, "{workers:?}");
    let worker = workers[0].1.expect("a worker serves the volume");

    let (rw, ro) = (bed.path("pod-a/mount"), bed.path("pod-b/mount"));
    for t in [&rw, &ro] {
        std::fs::create_dir_all(t.parent().unwrap()).unwrap();
    }
    bed.publish(id, &staging, &rw, "ns-a", false)
        .await
        .expect("publish rw");
    bed.publish(id, &staging, &ro, "ns-a", true)
        .await
        .expect("publish ro");
    bed.publish(id, &staging, &rw, "ns-a", false)
        .await
        .expect("publish rw again");
    let again = bed
        .publish(id, &staging, &ro, "ns-a", false)
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");

    // Another tenant's pod gets PERMISSION_DENIED and nothing mounted.
    let stranger = bed.path("pod-c/mount");
    std::fs::create_dir_all(stranger.parent().unwrap()).unwrap();
    let denied = bed
        .publish(id, &staging, &stranger, "ns-b", false)
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("team-b"), "{}", denied.message());
    assert!(!mounted(&stranger));
    let nobody = bed
        .publish(id, &staging, &stranger, "ns-z", false)
        .await
        .unwrap_err();
    assert_eq!(nobody.code(), Code::PermissionDenied, "{nobody:?}");

    // fio through the pod's read-write target, then read back through the read-only one.
    let (rw2, ro2) = (rw.clone(), ro.clone());
    tokio::task::spawn_blocking(move || {
        write_and_verify(&rw2, JOB);
        let file = std::fs::read_dir(&rw2)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .file_name();
        assert_eq!(
            std::fs::read(rw2.join(&file)).unwrap(),
            std::fs::read(ro2.join(&file)).unwrap(),
            "both pods see the same bytes"
        );
        let err = std::fs::write(ro2.join("nope"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    })
    .await
    .unwrap();

    let stats = bed
        .node
        .clone()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: rw.display().to_string(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .expect("stats")
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .unwrap();
    assert_eq!(bytes.total, 512 * MIB, "the volume's quota is its size");
    assert!(bytes.used >= 64 * MIB, "{bytes:?}");
    assert!(
        stats
            .usage
            .iter()
            .any(|u| u.unit == Unit::Inodes as i32 && u.used >= 1)
    );
    let condition = stats.volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    assert_eq!(
        bed.keeper_volumes()[0].1,
        Some(worker),
        "still the first worker"
    );

    for t in [&rw, &ro] {
        bed.unpublish(id, t).await.expect("unpublish");
        bed.unpublish(id, t).await.expect("unpublish again");
        assert!(!t.exists(), "the target is removed");
    }
    bed.unstage(id, &staging).await.expect("unstage");
    bed.unstage(id, &staging).await.expect("unstage again");
    assert!(!mounted(&staging));
    assert!(bed.keeper_volumes().is_empty(), "no volume in the keeper");
    assert!(
        bed.records().is_empty(),
        "records left: {:?}",
        bed.records()
    );
    wait_until("the worker to exit", || {
        !Path::new(&format!("/proc/{worker}")).exists()
    });

    bed.delete(id).await;
    let admin = EngineContainers::new(&bed.vol.engine.client());
    let left = admin.list(&bed.vol.pool).await.unwrap();
    assert!(
        left.iter().all(|c| !c.label.starts_with("csi-")),
        "containers left: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_containers_bad_requests_and_missing_stages_get_their_codes() {
    if !can_mount() {
        return;
    }
    let bed = bed().await;
    let staging = bed.path("globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    // The engine volume's own container was not made by the driver: no request record.
    let system = "daos_server";
    let foreign = format!("v1/{system}/{}/{}", bed.vol.pool, bed.vol.container);
    let err = bed.stage(&foreign, &staging).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(!mounted(&staging));
    assert!(bed.keeper_volumes().is_empty());
    assert!(bed.records().is_empty(), "{:?}", bed.records());

    for (id, code) in [
        ("", Code::InvalidArgument),
        ("v1/x", Code::InvalidArgument),
        ("some-other-driver/vol", Code::NotFound),
    ] {
        let err = bed.stage(id, &staging).await.unwrap_err();
        assert_eq!(err.code(), code, "{id:?}: {err:?}");
    }
    let missing = format!("v1/{system}/{}/{}", bed.vol.pool, uuid::Uuid::new_v4());
    let err = bed.stage(&missing, &staging).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // Publish of a volume this node has not staged: NOT_FOUND; staged at another staging
    // path: FAILED_PRECONDITION. Nothing mounted either way.
    let volume = bed.create("pvc-2", "ns-b").await;
    let target = bed.path("pod/mount");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let err = bed
        .publish(&volume.volume_id, &staging, &target, "ns-b", false)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    bed.stage(&volume.volume_id, &staging).await.expect("stage");
    let elsewhere = bed.path("other-globalmount");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let err = bed
        .publish(&volume.volume_id, &elsewhere, &target, "ns-b", false)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let err = bed.stage(&volume.volume_id, &elsewhere).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(!mounted(&target) && !mounted(&elsewhere));
    // Paths outside the mount root, relative or with `..` are refused before anything.
    for path in ["/tmp", "relative/mount", "/var/lib/kubelet/../../tmp"] {
        let err = bed
            .publish(&volume.volume_id, &staging, Path::new(path), "ns-b", false)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{path}: {err:?}");
    }
    bed.unstage(&volume.volume_id, &staging)
        .await
        .expect("unstage");
    assert!(!mounted(&staging));
    // Unpublish and unstage of what was never there succeed.
    bed.unpublish(&volume.volume_id, &target).await.unwrap();
    bed.unstage(&volume.volume_id, &staging).await.unwrap();
    // A stage without a capability, or of a block volume, is refused before anything.
    let err = bed
        .node
        .clone()
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let caps = bed
        .node
        .clone()
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), 5, "{caps:?}");
    let mount_group = csi::node_service_capability::rpc::Type::VolumeMountGroup as i32;
    assert!(
        caps.iter().any(|c| matches!(
            &c.r#type,
            Some(csi::node_service_capability::Type::Rpc(r)) if r.r#type == mount_group
        )),
        "fsGroup is taken as VOLUME_MOUNT_GROUP: {caps:?}"
    );
}

/// Restarting the node plugin disturbs nothing: `kill -9` of the plugin while fio writes
/// through a pod's target, then a new plugin on the same state directory. fio ends without
/// an error, the mounts stay, and a repeated stage and publish succeed with the same worker.
#[tokio::test(flavor = "multi_thread")]
async fn kill9_of_the_node_plugin_under_fio_disturbs_nothing() {
    if !can_mount() || !fio_available() {
        return;
    }
    let mut bed = bed().await;
    let volume = bed.create("pvc-3", "ns-a").await;
    let id = volume.volume_id.clone();
    let (staging, target) = bed.mount(&id, "pod").await;
    let worker = bed.keeper_volumes()[0].1.expect("a worker");

    let dir = target.clone();
    let fio = tokio::task::spawn_blocking(move || {
        let job = [
            "--name=long",
            "--rw=write",
            "--bs=256k",
            "--size=384M",
            "--ioengine=psync",
        ];
        write_and_verify(&dir, &job);
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!fio.is_finished(), "fio still writes when the plugin dies");
    bed.kill9_and_restart_node_plugin().await;
    fio.await.expect("fio with verify through the pod's target");

    bed.stage(&id, &staging)
        .await
        .expect("NodeStage after the restart");
    bed.publish(&id, &staging, &target, "ns-a", false)
        .await
        .expect("publish after the restart");
    assert_eq!(
        bed.keeper_volumes(),
        vec![(bed.keeper_volumes()[0].0.clone(), Some(worker))],
        "the same worker, no second one"
    );
    assert!(mounted(&staging) && mounted(&target));
    bed.unpublish(&id, &target).await.unwrap();
    bed.unstage(&id, &staging).await.unwrap();
    assert!(bed.keeper_volumes().is_empty());
}

/// ControllerExpandVolume raises the quota of a mounted volume: `df` in the pod's target
/// shows the new size at once, and writes past the old size succeed.
#[tokio::test(flavor = "multi_thread")]
async fn expansion_shows_in_the_pods_target_and_writes_go_past_the_old_size() {
    if !can_mount() {
        return;
    }
    let bed = bed().await;
    let volume = bed.create_sized("pvc-4", "ns-a", 64 * MIB).await;
    let id = volume.volume_id.clone();
    let (staging, target) = bed.mount(&id, "pod").await;
    let total = |p: &Path| {
        let out = Command::new("df")
            .args(["--block-size=1", "--output=size"])
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse::<i64>()
            .unwrap()
    };
    assert_eq!(total(&target), 64 * MIB, "df shows the volume's size");
    let block = vec![0x5a; MIB as usize];
    let fill = |name: &str, mib: usize| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(target.join(name))?;
        for _ in 0..mib {
            f.write_all(&block)?;
        }
        f.sync_all()
    };
    fill("first", 40).expect("40 MiB of 64");
    let full = fill("second", 40).expect_err("the old quota refuses 80 MiB");
    assert_eq!(full.raw_os_error(), Some(libc::ENOSPC), "{full}");
    std::fs::remove_file(target.join("second")).unwrap();
    let expanded = bed
        .ctl
        .clone()
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 128 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
    assert_eq!(expanded.capacity_bytes, 128 * MIB);
    assert!(!expanded.node_expansion_required);
    assert_eq!(total(&target), 128 * MIB, "df shows the new size");
    fill("second", 40).expect("80 MiB of 128 after the expansion");
    bed.unpublish(&id, &target).await.unwrap();
    bed.unstage(&id, &staging).await.unwrap();
}

/// ControllerModifyVolume caps a mounted volume without a restage: the node plugin hands the
/// new limits to the volume's worker, and writes through the pod's target take at least as
/// long as the cap allows. Lifting the cap reaches the worker too.
#[tokio::test(flavor = "multi_thread")]
async fn modify_volume_caps_the_throughput_of_a_mounted_volume() {
    if !can_mount() {
        return;
    }
    let bed = bed_with_node_args(&["--qos-refresh-secs", "1"]).await;
    let volume = bed.create("pvc-qos", "ns-a").await;
    let id = volume.volume_id.clone();
    let (staging, target) = bed.mount(&id, "pod").await;
    let keeper_volume =
        VolumeFiles::of(&bed.state.join("csi"), &VolumeId::parse(&id).unwrap()).keeper_volume;
    assert_eq!(bed.worker_health(&keeper_volume).qos, QosLimits::UNLIMITED);
    let modify = |value: &str| {
        let req = csi::ControllerModifyVolumeRequest {
            volume_id: id.clone(),
            mutable_parameters: [("maxThroughputMiBps".to_string(), value.to_string())].into(),
            ..Default::default()
        };
        let mut ctl = bed.ctl.clone();
        async move {
            ctl.controller_modify_volume(req)
                .await
                .expect("ControllerModifyVolume")
        }
    };
    modify("2").await;
    wait_until("the worker has the cap", || {
        bed.worker_health(&keeper_volume).qos.max_throughput_mibps == Some(2)
    });
    // 8 MiB at 2 MiB/s: 4 s, less the 100 ms the pacer lets a volume run ahead. Only the
    // lower bound is asserted: a slow machine can only make it longer.
    let started = Instant::now();
    write_file(&target.join("capped"), 8);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(3500),
        "8 MiB at 2 MiB/s took {took:?}"
    );
    modify("unlimited").await;
    wait_until("the worker has no cap", || {
        bed.worker_health(&keeper_volume).qos == QosLimits::UNLIMITED
    });
    bed.unpublish(&id, &target).await.unwrap();
    bed.unstage(&id, &staging).await.unwrap();
    assert!(
        bed.records().is_empty(),
        "no record or QoS file left: {:?}",
        bed.records()
    );
}

/// `maxIops` holds metadata requests too: a tenant capped at 20 requests a second cannot
/// create files (or look them up, or list them) faster than that, and reads and writes are
/// not the only way through the cap.
#[tokio::test(flavor = "multi_thread")]
async fn modify_volume_caps_the_metadata_requests_of_a_mounted_volume() {
    if !can_mount() {
        return;
    }
    let bed = bed_with_node_args(&["--qos-refresh-secs", "1"]).await;
    let id = bed.create("pvc-meta", "ns-a").await.volume_id;
    let (staging, target) = bed.mount(&id, "pod").await;
    let keeper_volume =
        VolumeFiles::of(&bed.state.join("csi"), &VolumeId::parse(&id).unwrap()).keeper_volume;
    let req = csi::ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: [("maxIops".to_string(), "20".to_string())].into(),
        ..Default::default()
    };
    bed.ctl.clone().controller_modify_volume(req).await.unwrap();
    wait_until("the worker has the cap", || {
        bed.worker_health(&keeper_volume).qos.max_iops == Some(20)
    });
    // 40 creates (each a lookup of a new name and a create, 80 requests) at 20 a second:
    // 4 s, less the 100 ms the pacer lets a volume run ahead. Only the lower bound is
    // asserted: a slow machine can only make it longer.
    let started = Instant::now();
    for i in 0..40 {
        std::fs::File::create(target.join(format!("f{i}"))).unwrap();
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(3000),
        "80 metadata requests at maxIops 20 took {took:?}"
    );
    bed.unpublish(&id, &target).await.unwrap();
    bed.unstage(&id, &staging).await.unwrap();
}

/// Writes `mib` MiB to `path` in 1 MiB writes and syncs it.
fn write_file(path: &Path, mib: usize) {
    use std::io::Write;
    let block = vec![0xa5; MIB as usize];
    let mut f = std::fs::File::create(path).unwrap();
    for _ in 0..mib {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
}

/// Snapshot → write more → a volume from the snapshot has exactly the snapshot-time bytes.
/// Deleting the source volume first hides it (its container stays for the snapshot);
/// deleting the snapshot then takes the container.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_write_more_clone_and_delete_the_volume_before_its_snapshot() {
    if !can_mount() {
        return;
    }
    let bed = bed().await;
    let source = bed.create("pvc-src", "ns-a").await.volume_id;
    let mounted_src = bed.mount(&source, "src").await;
    let then: Vec<u8> = (0..(3 << 20) + 77).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(mounted_src.1.join("data"), &then).unwrap();
    std::fs::File::open(mounted_src.1.join("data"))
        .unwrap()
        .sync_all()
        .unwrap();

    let snap = bed.snapshot("snap-1", &source).await;
    assert!(snap.ready_to_use);
    assert_eq!(snap.source_volume_id, source);
    assert_eq!(snap.size_bytes, 512 * MIB);
    let again = bed.snapshot("snap-1", &source).await;
    assert_eq!(
        again.snapshot_id, snap.snapshot_id,
        "CreateSnapshot is idempotent"
    );

    // Write more after the snapshot: overwrite, add a file.
    std::fs::write(mounted_src.1.join("data"), b"changed after the snapshot").unwrap();
    std::fs::write(mounted_src.1.join("later"), b"new").unwrap();

    let clone = bed
        .ctl
        .clone()
        .create_volume(csi::CreateVolumeRequest {
            name: "pvc-clone".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 512 * MIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap(access_mode::Mode::MultiNodeMultiWriter)],
            parameters: [("pool".to_string(), "fast".to_string())].into(),
            volume_content_source: Some(csi::VolumeContentSource {
                r#type: Some(csi::volume_content_source::Type::Snapshot(
                    csi::volume_content_source::SnapshotSource {
                        snapshot_id: snap.snapshot_id.clone(),
                    },
                )),
            }),
            ..Default::default()
        })
        .await
        .expect("CreateVolume from the snapshot")
        .into_inner()
        .volume
        .unwrap();
    assert!(clone.content_source.is_some());
    let mounted_clone = bed.mount(&clone.volume_id, "clone").await;
    assert_eq!(
        std::fs::read(mounted_clone.1.join("data")).unwrap(),
        then,
        "the clone has the snapshot-time bytes"
    );
    assert!(!mounted_clone.1.join("later").exists());
    std::fs::write(mounted_clone.1.join("own"), b"clone only").unwrap();
    assert!(
        !mounted_src.1.join("own").exists(),
        "the clone is independent"
    );

    let listed = bed
        .ctl
        .clone()
        .list_snapshots(csi::ListSnapshotsRequest {
            source_volume_id: source.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    let all = bed
        .ctl
        .clone()
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.entries.len(), 1, "{all:?}");
    let bad = bed
        .ctl
        .clone()
        .list_snapshots(csi::ListSnapshotsRequest {
            starting_token: "99".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::Aborted);

    bed.unmount(&source, mounted_src).await;
    bed.unmount(&clone.volume_id, mounted_clone).await;
    let before = bed.containers().await;
    let delete = |id: String| {
        let mut ctl = bed.ctl.clone();
        async move {
            ctl.delete_volume(csi::DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            })
            .await
            .expect("DeleteVolume");
        }
    };
    delete(source.clone()).await;
    assert_eq!(bed.containers().await, before, "kept for its snapshot");
    let hidden = bed
        .ctl
        .clone()
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "snap-2".into(),
            source_volume_id: source.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        hidden.code(),
        Code::NotFound,
        "a deleted volume takes no new snapshot"
    );
    let drop_snapshot = || {
        let mut ctl = bed.ctl.clone();
        let id = snap.snapshot_id.clone();
        async move {
            ctl.delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: id,
                ..Default::default()
            })
            .await
            .expect("DeleteSnapshot");
        }
    };
    drop_snapshot().await;
    drop_snapshot().await;
    let source_container = VolumeId::parse(&source).unwrap().container.to_string();
    let after = bed.containers().await;
    assert!(
        !after.contains(&source_container),
        "gone with its last snapshot"
    );
    assert_eq!(after.len(), before.len() - 1);
    delete(clone.volume_id.clone()).await;
}

/// The plugin renews the capabilities it signed: with a 3-second lifetime (renewed every
/// second), a volume whose worker must reconnect long after its first capability expired — the
/// engine crashed and came back — reconnects with a renewed one and serves; the engine
/// refuses expired capabilities (no clock skew allowed in this bed).
#[tokio::test(flavor = "multi_thread")]
async fn capabilities_are_renewed_so_a_reconnect_after_their_lifetime_succeeds() {
    if !can_mount() {
        return;
    }
    let mut bed = bed_with_node_args(&["--capability-ttl-secs", "3"]).await;
    let id = bed.create("pvc-6", "ns-a").await.volume_id;
    let (staging, target) = bed.mount(&id, "pod").await;
    std::fs::write(target.join("before"), b"written with the first capability").unwrap();
    // Durable before the engine crashes: unsynced data may go with it, as on DAOS.
    std::fs::File::open(target.join("before"))
        .and_then(|f| f.sync_all())
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(7)).await;
    tokio::task::block_in_place(|| bed.vol.engine.crash_and_restart()).expect("engine back");
    let back = tokio::task::spawn_blocking({
        let target = target.clone();
        move || {
            std::fs::write(target.join("after"), b"after the reconnect")?;
            std::fs::read(target.join("before"))
        }
    })
    .await
    .unwrap()
    .expect("I/O after a reconnect with a renewed capability");
    assert_eq!(back, b"written with the first capability");
    bed.unmount(&id, (staging, target)).await;
}

/// A worker replaced after `kill -9` makes its predecessor's unsynced changes durable before it
/// serves: the table of those changes (docs/dfs.md, "Durability") died with the predecessor, so
/// without that an engine crash after the replacement would take them and the next fsync would
/// not say so. Here the file opened before the replacement keeps its bytes across the crash.
#[tokio::test(flavor = "multi_thread")]
async fn a_replacement_worker_makes_its_predecessors_unsynced_writes_durable() {
    use std::io::Write;
    if !can_mount() {
        return;
    }
    let mut bed = bed().await;
    let id = bed.create("pvc-r", "ns-a").await.volume_id;
    let (staging, target) = bed.mount(&id, "pod").await;
    let body: Vec<u8> = (0..(1 << 20) + 4321).map(|i| (i % 251) as u8).collect();
    let mut unsynced = std::fs::File::create(target.join("unsynced")).unwrap();
    unsynced.write_all(&body).unwrap();
    let (volume, pid) = bed.keeper_volumes()[0].clone();
    let old = pid.expect("a worker");
    dpufs_e2e::kill9(old);
    wait_until("a replacement worker serves", || {
        let now = bed.keeper_volumes()[0].1;
        now.is_some_and(|pid| pid != old)
            && std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bed.worker_health(&volume)))
                .is_ok()
    });
    tokio::task::block_in_place(|| bed.vol.engine.crash_and_restart()).expect("engine back");
    let back = tokio::task::spawn_blocking({
        let target = target.clone();
        move || {
            unsynced.sync_all()?;
            std::fs::read(target.join("unsynced"))
        }
    })
    .await
    .unwrap()
    .expect("fsync and read after the replacement and the crash");
    assert!(back == body, "{} bytes back of {}", back.len(), body.len());
    bed.unmount(&id, (staging, target)).await;
}

/// A node over `max_volumes_per_node` refuses the next stage with RESOURCE_EXHAUSTED and a
/// message that names the limit, mounts nothing for it, and keeps serving the volumes it has;
/// once one is unstaged, the refused volume stages.
#[tokio::test(flavor = "multi_thread")]
async fn a_stage_over_max_volumes_per_node_is_refused_and_the_others_serve_on() {
    if !can_mount() {
        return;
    }
    let bed = bed_with_node_args(&["--max-volumes", "2"]).await;
    let mut mounts = Vec::new();
    for name in ["pvc-m1", "pvc-m2"] {
        let id = bed.create(name, "ns-a").await.volume_id;
        let paths = bed.mount(&id, name).await;
        std::fs::write(paths.1.join("kept"), name).unwrap();
        mounts.push((id, paths));
    }
    let third = bed.create("pvc-m3", "ns-a").await.volume_id;
    let staging = bed.path("pvc-m3-globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    let refused = bed.stage(&third, &staging).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("max_volumes_per_node"),
        "{}",
        refused.message()
    );
    assert!(!mounted(&staging), "nothing mounted for the refused volume");
    assert_eq!(bed.keeper_volumes().len(), 2, "no worker for it");
    for (i, (_, (_, target))) in mounts.iter().enumerate() {
        let name = format!("pvc-m{}", i + 1);
        assert_eq!(std::fs::read_to_string(target.join("kept")).unwrap(), name);
    }
    let (id, paths) = mounts.pop().unwrap();
    bed.unmount(&id, paths).await;
    bed.stage(&third, &staging)
        .await
        .expect("a place is free again");
    assert!(mounted(&staging));
    bed.unstage(&third, &staging).await.unwrap();
    for (id, paths) in mounts {
        bed.unmount(&id, paths).await;
    }
}

/// Stages of different volumes run at once; when they race for the node's last places, no
/// more than `max_volumes_per_node` of them win, and the others are refused, not served.
#[tokio::test(flavor = "multi_thread")]
async fn stages_racing_for_the_last_places_stage_no_more_than_max_volumes_per_node() {
    if !can_mount() {
        return;
    }
    let bed = bed_with_node_args(&["--max-volumes", "2"]).await;
    let mut volumes = Vec::new();
    for i in 0..5 {
        let name = format!("pvc-race{i}");
        let id = bed.create(&name, "ns-a").await.volume_id;
        let staging = bed.path(&format!("{name}-globalmount"));
        std::fs::create_dir_all(&staging).unwrap();
        volumes.push((id, staging));
    }
    let stages = volumes.iter().map(|(id, staging)| bed.stage(id, staging));
    let outcomes = futures::future::join_all(stages).await;
    let staged: Vec<_> = volumes
        .iter()
        .zip(&outcomes)
        .filter(|(_, outcome)| outcome.is_ok())
        .map(|(volume, _)| volume)
        .collect();
    for refused in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    }
    assert_eq!(staged.len(), 2, "{outcomes:?}");
    assert_eq!(
        bed.keeper_volumes().len(),
        2,
        "a worker for each staged volume only"
    );
    for (id, staging) in staged {
        bed.unstage(id, staging).await.unwrap();
    }
}

/// A ReadWriteOncePod claim (SINGLE_NODE_SINGLE_WRITER) makes its pod the volume's only writer
/// anywhere, so the node plugin stages it single-writer and the kernel may remember names,
/// attributes and absent names for a minute (docs/worker.md, "Caching by access mode"): a name
/// looked up three times that does not exist costs one request, and a file then created
/// under it is found. Staged for several writers, each look asks the engine. A stage of the
/// volume with the other access is refused while it is staged.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_write_once_pod_stage_lets_the_kernel_remember_absent_names() {
    use access_mode::Mode;
    if !can_mount() {
        return;
    }
    let bed = bed().await;
    let id = bed.create("pvc-rwop", "ns-a").await.volume_id;
    let staging = bed.path("rwop-globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    for (mode, access, lookups) in [
        (Mode::SingleNodeSingleWriter, "SingleWriter", 1),
        (Mode::MultiNodeMultiWriter, "MultiWriter", 3),
    ] {
        bed.stage_as(&id, &staging, mode).await.expect("NodeStage");
        let other = match mode {
            Mode::SingleNodeSingleWriter => Mode::SingleNodeWriter,
            _ => Mode::SingleNodeSingleWriter,
        };
        let refused = bed.stage_as(&id, &staging, other).await.unwrap_err();
        assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
        let (volume, _) = bed.keeper_volumes()[0].clone();
        assert_eq!(bed.worker_health(&volume).info.access, access);
        let count = || {
            let stats = bed.worker_stats(&volume);
            stats.ops.get("lookup").map_or(0, |o| o.count)
        };
        let (before, absent) = (count(), staging.join(format!("absent-{access}")));
        for _ in 0..3 {
            let err = std::fs::metadata(&absent).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
        }
        assert_eq!(
            count() - before,
            lookups,
            "{access}: lookups of an absent name"
        );
        std::fs::write(&absent, b"created after its absence was cached").unwrap();
        assert_eq!(
            std::fs::read(&absent).unwrap(),
            b"created after its absence was cached"
        );
        bed.unstage(&id, &staging).await.expect("unstage");
    }
}

/// fsGroup (VOLUME_MOUNT_GROUP): kubelet sends the pod's fsGroup instead of walking the volume
/// to chown it, and the node plugin gives the volume's root to that group (g+rwxs). A user
/// who is not the owner but in the group then creates files there, which take the group; a
/// user outside it may not. A group that is no number is INVALID_ARGUMENT, with nothing mounted.
#[tokio::test(flavor = "multi_thread")]
async fn the_pods_fs_group_writes_the_volume_and_owns_what_it_creates() {
    use dpufs_proto::csi::v1::volume_capability::AccessType;
    use std::os::unix::fs::MetadataExt;
    if !can_mount() {
        return;
    }
    let bed = bed().await;
    let id = bed.create("pvc-g", "ns-a").await.volume_id;
    let staging = bed.path("group-globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    bed.stage(&id, &staging).await.expect("NodeStage");
    let target = bed.path("group-pod/mount");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let with_group = |group: &str| {
        let mut c = cap(access_mode::Mode::MultiNodeMultiWriter);
        if let Some(AccessType::Mount(m)) = c.access_type.as_mut() {
            m.volume_mount_group = group.into();
        }
        c
    };
    let paths = (staging.as_path(), target.as_path());
    let bad = bed
        .publish_as(&id, paths, "ns-a", false, with_group("staff"))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(!mounted(&target));
    bed.publish_as(&id, paths, "ns-a", false, with_group("3000"))
        .await
        .expect("publish with an fsGroup");
    let root = std::fs::metadata(&target).unwrap();
    assert_eq!(root.gid(), 3000);
    assert_eq!(root.mode() & 0o2070, 0o2070, "{:o}", root.mode());
    let as_user = |uid: &str, groups: &str, script: &str| {
        Command::new("setpriv")
            .args([
                "--reuid", uid, "--regid", uid, "--groups", groups, "sh", "-c", script,
            ])
            .arg("sh")
            .arg(&target)
            .output()
            .unwrap()
    };
    let member = as_user(
        "4000",
        "3000",
        r#"echo x > "$1/by-group" && stat -c %g "$1/by-group""#,
    );
    assert!(member.status.success(), "{member:?}");
    assert_eq!(String::from_utf8_lossy(&member.stdout).trim(), "3000");
    let stranger = as_user("4001", "4001", r#"echo x > "$1/stranger""#);
    assert!(!stranger.status.success(), "{stranger:?}");
    assert!(
        String::from_utf8_lossy(&stranger.stderr).contains("Permission denied"),
        "{stranger:?}"
    );
    bed.unpublish(&id, &target).await.expect("unpublish");
    bed.unstage(&id, &staging).await.expect("unstage");
}
