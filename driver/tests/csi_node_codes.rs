//! The codes of incomplete and misdirected Node requests, as CSI gives them — the answers the
//! conformance suite (`dpufs_e2e::csi_sanity`, `e2e/tests/csi_conformance.rs`) found wrong:
//!
//! - a NodeStageVolume or NodeUnstageVolume without a staging path (or a stage without a
//!   capability) is INVALID_ARGUMENT whatever its id names; it was NOT_FOUND for an id of no
//!   volume of this driver, because the id was looked at before the request was complete;
//! - a NodePublishVolume without a staging path is FAILED_PRECONDITION (CSI: "stage not
//!   performed", for plugins with STAGE_UNSTAGE_VOLUME); it was INVALID_ARGUMENT;
//! - NodeGetVolumeStats of a volume at a path it is not at is NOT_FOUND for any path, relative
//!   ones such as `some/path` included; those were INVALID_ARGUMENT.

mod common;

use common::can_mount;
use common::csi_bed::bed;
use dpufs_e2e::csi_bed::{cap, mounted};
use dpufs_proto::csi::v1::volume_capability::access_mode::Mode;
use dpufs_proto::csi::v1::{self as csi};
use tonic::Code;

#[tokio::test(flavor = "multi_thread")]
async fn missing_fields_and_paths_a_volume_is_not_at_get_the_codes_csi_gives() {
    if !can_mount() {
        return;
    }
    let bed = bed().await;
    let staging = bed.path("globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    let path = |p: &std::path::Path| p.display().to_string();
    let foreign = "another-driver/vol-1".to_string();
    let mut node = bed.node.clone();

    let err = node
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: foreign.clone(),
            volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::InvalidArgument,
        "stage, no staging path: {err:?}"
    );
    let err = node
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: foreign.clone(),
            staging_target_path: path(&staging),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::InvalidArgument,
        "stage, no capability: {err:?}"
    );
    let err = node
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: foreign.clone(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::InvalidArgument,
        "unstage, no staging path: {err:?}"
    );
    // Complete requests for an id of no volume of ours are still NOT_FOUND.
    let err = bed.stage(&foreign, &staging).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    let id = bed.create("pvc-codes", "ns-a").await.volume_id;
    bed.stage(&id, &staging).await.expect("NodeStage");
    let target = bed.path("pod/mount");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let publish = |staging: String, target: String| csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging,
        target_path: target,
        volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
        ..Default::default()
    };
    let err = node
        .node_publish_volume(publish(String::new(), path(&target)))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "publish, no staging path: {err:?}"
    );
    assert!(!target.exists(), "a refused publish creates no target");
    // A missing field of the request itself stays INVALID_ARGUMENT.
    let err = node
        .node_publish_volume(publish(String::new(), String::new()))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::InvalidArgument,
        "publish, no target: {err:?}"
    );

    let stats = |p: String| csi::NodeGetVolumeStatsRequest {
        volume_id: id.clone(),
        volume_path: p,
        staging_target_path: String::new(),
    };
    for p in ["some/path", "/tmp", "/proc/self/../../tmp"] {
        let err = node
            .node_get_volume_stats(stats(p.to_string()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "stats at {p}: {err:?}");
    }
    let err = node
        .node_get_volume_stats(stats(String::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "stats, no path: {err:?}");
    let usage = node
        .node_get_volume_stats(stats(path(&staging)))
        .await
        .expect("stats at the staging path")
        .into_inner()
        .usage;
    assert!(!usage.is_empty());

    bed.unstage(&id, &staging).await.expect("NodeUnstage");
    assert!(!mounted(&staging));
}
