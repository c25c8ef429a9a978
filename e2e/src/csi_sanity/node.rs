//! The Node service: capabilities, NodeGetInfo, the argument checks of every RPC, target
//! removal, NodeGetVolumeStats and NodeExpandVolume. The lifecycles are in `lifecycle`.

use super::Runner;
use super::support::{Answer, Check, Ctx, Mode, Verdict, ensure, fail, mount_cap, unknown_id};
use dpufs_proto::csi::v1::controller_service_capability::rpc::Type as CtlCap;
use dpufs_proto::csi::v1::node_service_capability::{self, rpc::Type as NodeCap};
use dpufs_proto::csi::v1::{self as csi, volume_usage::Unit};
use std::path::{Path, PathBuf};
use tonic::Code;

pub(super) async fn cases(r: &mut Runner) {
    r.case(
        "NodeGetCapabilities: lists known capabilities only",
        capabilities,
    )
    .await;
    r.case(
        "NodeGetInfo: a node id, max_volumes_per_node >= 0, a topology when the plugin has topology",
        info,
    )
    .await;
    let publish_args: [(&str, Missing); 3] = [
        ("no volume id", Missing::VolumeId),
        ("no target path", Missing::Target),
        ("no volume capability", Missing::Capability),
    ];
    for (what, missing) in publish_args {
        r.case(
            &format!("NodePublishVolume: {what} is INVALID_ARGUMENT"),
            move |cx| publish_missing(cx, missing),
        )
        .await;
    }
    r.case(
        "NodePublishVolume: no staging path on a node that stages is FAILED_PRECONDITION",
        publish_unstaged,
    )
    .await;
    r.case(
        "NodePublishVolume: an unknown volume is NOT_FOUND",
        publish_unknown,
    )
    .await;
    r.case(
        "NodeUnpublishVolume: no volume id is INVALID_ARGUMENT",
        unpublish_no_id,
    )
    .await;
    r.case(
        "NodeUnpublishVolume: no target path is INVALID_ARGUMENT",
        unpublish_no_target,
    )
    .await;
    r.case(
        "NodeUnpublishVolume: removes the target path, and is OK once it is gone",
        unpublish_removes_target,
    )
    .await;
    let stage_args: [(&str, Missing); 3] = [
        ("no volume id", Missing::VolumeId),
        ("no staging path", Missing::Staging),
        ("no volume capability", Missing::Capability),
    ];
    for (what, missing) in stage_args {
        r.case(
            &format!("NodeStageVolume: {what} is INVALID_ARGUMENT"),
            move |cx| stage_missing(cx, missing),
        )
        .await;
    }
    r.case(
        "NodeStageVolume: an unknown volume is NOT_FOUND",
        stage_unknown,
    )
    .await;
    r.case(
        "NodeUnstageVolume: no volume id is INVALID_ARGUMENT",
        |cx| unstage_missing(cx, Missing::VolumeId),
    )
    .await;
    r.case(
        "NodeUnstageVolume: no staging path is INVALID_ARGUMENT",
        |cx| unstage_missing(cx, Missing::Staging),
    )
    .await;
    r.case(
        "NodeGetVolumeStats: no volume id is INVALID_ARGUMENT",
        |cx| stats_missing(cx, Missing::VolumeId),
    )
    .await;
    r.case(
        "NodeGetVolumeStats: no volume path is INVALID_ARGUMENT",
        |cx| stats_missing(cx, Missing::Target),
    )
    .await;
    r.case(
        "NodeGetVolumeStats: an unknown volume is NOT_FOUND",
        stats_unknown,
    )
    .await;
    r.case(
        "NodeGetVolumeStats: a published volume asked at path \"some/path\" is NOT_FOUND",
        stats_wrong_path,
    )
    .await;
    r.case("NodeExpandVolume: no volume id is INVALID_ARGUMENT", |cx| {
        expand_missing(cx, Missing::VolumeId)
    })
    .await;
    r.case(
        "NodeExpandVolume: no volume path is INVALID_ARGUMENT",
        |cx| expand_missing(cx, Missing::Target),
    )
    .await;
    r.case(
        "NodeExpandVolume: an unknown volume is NOT_FOUND",
        expand_unknown,
    )
    .await;
    r.case(
        "NodeExpandVolume: after ControllerExpandVolume, on a published volume",
        expand_published,
    )
    .await;
    super::lifecycle::cases(r).await;
}

/// The field a request lacks.
#[derive(Clone, Copy, Debug)]
enum Missing {
    VolumeId,
    Staging,
    /// The target path, or NodeGetVolumeStats' and NodeExpandVolume's volume path.
    Target,
    Capability,
}

async fn capabilities(cx: Ctx) -> Check {
    let caps = cx
        .need_node()?
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect_ok("NodeGetCapabilities")?
        .capabilities;
    for cap in &caps {
        let Some(node_service_capability::Type::Rpc(rpc)) = &cap.r#type else {
            fail!("a capability without an rpc: {cap:?}");
        };
        match NodeCap::try_from(rpc.r#type) {
            Ok(NodeCap::Unknown) | Err(_) => fail!("unknown capability type {}", rpc.r#type),
            Ok(_) => {}
        }
    }
    Ok(())
}

async fn info(cx: Ctx) -> Check {
    let info = cx
        .need_node()?
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect_ok("NodeGetInfo")?;
    ensure!(!info.node_id.is_empty(), "an empty node_id");
    ensure!(
        info.node_id.len() <= 256,
        "node_id of {} bytes (CSI: at most 256)",
        info.node_id.len()
    );
    ensure!(
        info.max_volumes_per_node >= 0,
        "max_volumes_per_node {} is negative",
        info.max_volumes_per_node
    );
    if cx.caps.node_topology {
        ensure!(
            info.accessible_topology
                .as_ref()
                .is_some_and(|t| !t.segments.is_empty()),
            "the plugin has VOLUME_ACCESSIBILITY_CONSTRAINTS, but NodeGetInfo has no topology"
        );
    }
    Ok(())
}

/// A created volume, staged when the node stages, and published at a new target.
pub(super) struct Published {
    pub volume: csi::Volume,
    pub staging: Option<PathBuf>,
    pub target: PathBuf,
}

pub(super) async fn published(cx: &Ctx, what: &str, mode: Mode) -> Result<Published, Verdict> {
    cx.need_node()?;
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let volume = cx
        .create_volume(cx.volume_request(&cx.name(what), mode))
        .await?;
    let staging = cx.stage_if_needed(&volume, mode).await?;
    let target = cx.target_path()?;
    cx.publish(&volume, staging.as_deref(), &target, mode, false)
        .await
        .expect_ok("NodePublishVolume")?;
    Ok(Published {
        volume,
        staging,
        target,
    })
}

fn publish_request(volume: &str, staging: &Path, target: &Path) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume.to_string(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

async fn publish_missing(cx: Ctx, missing: Missing) -> Check {
    let node = cx.need_node()?;
    let (staging, target) = (cx.staging_path()?, cx.target_path()?);
    let mut req = publish_request(&unknown_id(&cx, "volume"), &staging, &target);
    match missing {
        Missing::VolumeId => req.volume_id.clear(),
        Missing::Target => req.target_path.clear(),
        Missing::Capability => req.volume_capability = None,
        Missing::Staging => req.staging_target_path.clear(),
    }
    node.clone()
        .node_publish_volume(req)
        .await
        .expect_code(Code::InvalidArgument, "NodePublishVolume")
}

/// CSI: a plugin with STAGE_UNSTAGE_VOLUME that gets no staging_target_path answers
/// FAILED_PRECONDITION ("stage not performed"); csi-sanity has no such case.
async fn publish_unstaged(cx: Ctx) -> Check {
    cx.need_node_cap(NodeCap::StageUnstageVolume)?;
    let volume = cx.new_volume("publish-nostaging").await?;
    let staging = cx.staging_path()?;
    cx.stage(&volume, &staging, Mode::SingleNodeWriter)
        .await
        .expect_ok("NodeStageVolume")?;
    let target = cx.target_path()?;
    cx.publish(&volume, None, &target, Mode::SingleNodeWriter, false)
        .await
        .expect_code(
            Code::FailedPrecondition,
            "NodePublishVolume of a staged volume without its staging path",
        )?;
    ensure!(
        !target.exists(),
        "a refused NodePublishVolume left {} behind",
        target.display()
    );
    Ok(())
}

/// CSI: a volume that does not exist is NOT_FOUND (csi-sanity has no such case).
async fn publish_unknown(cx: Ctx) -> Check {
    let node = cx.need_node()?;
    let (staging, target) = (cx.staging_path()?, cx.target_path()?);
    node.clone()
        .node_publish_volume(publish_request(
            &unknown_id(&cx, "volume"),
            &staging,
            &target,
        ))
        .await
        .expect_code(Code::NotFound, "NodePublishVolume of an unknown volume")
}

async fn unpublish_no_id(cx: Ctx) -> Check {
    let target = cx.target_path()?;
    cx.need_node()?
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: String::new(),
            target_path: target.display().to_string(),
        })
        .await
        .expect_code(Code::InvalidArgument, "NodeUnpublishVolume without an id")
}

async fn unpublish_no_target(cx: Ctx) -> Check {
    cx.need_node()?
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: unknown_id(&cx, "volume"),
            target_path: String::new(),
        })
        .await
        .expect_code(
            Code::InvalidArgument,
            "NodeUnpublishVolume without a target path",
        )
}

pub(super) async fn unpublish(cx: &Ctx, volume: &str, target: &Path) -> Check {
    cx.need_node()?
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: volume.to_string(),
            target_path: target.display().to_string(),
        })
        .await
        .expect_ok("NodeUnpublishVolume")?;
    Ok(())
}

async fn unpublish_removes_target(cx: Ctx) -> Check {
    let p = published(&cx, "unpublish", Mode::SingleNodeWriter).await?;
    ensure!(
        p.target.is_dir(),
        "NodePublishVolume did not create the target {}",
        p.target.display()
    );
    unpublish(&cx, &p.volume.volume_id, &p.target).await?;
    ensure!(
        !p.target.exists(),
        "NodeUnpublishVolume left the target {} (CSI: the SP MUST delete what it created)",
        p.target.display()
    );
    unpublish(&cx, &p.volume.volume_id, &p.target).await
}

async fn stage_missing(cx: Ctx, missing: Missing) -> Check {
    cx.need_node_cap(NodeCap::StageUnstageVolume)?;
    let node = cx.need_node()?;
    let staging = cx.staging_path()?;
    // Without a capability, the volume is a real one, so only the capability is wrong.
    let volume = match missing {
        Missing::Capability => cx.new_volume("stage-nocap").await?.volume_id,
        _ => unknown_id(&cx, "volume"),
    };
    let mut req = csi::NodeStageVolumeRequest {
        volume_id: volume,
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    };
    match missing {
        Missing::VolumeId => req.volume_id.clear(),
        Missing::Staging | Missing::Target => req.staging_target_path.clear(),
        Missing::Capability => req.volume_capability = None,
    }
    node.clone()
        .node_stage_volume(req)
        .await
        .expect_code(Code::InvalidArgument, "NodeStageVolume")
}

/// CSI: a volume that does not exist is NOT_FOUND (csi-sanity has no such case).
async fn stage_unknown(cx: Ctx) -> Check {
    cx.need_node_cap(NodeCap::StageUnstageVolume)?;
    let staging = cx.staging_path()?;
    cx.need_node()?
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: unknown_id(&cx, "volume"),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .expect_code(Code::NotFound, "NodeStageVolume of an unknown volume")
}

async fn unstage_missing(cx: Ctx, missing: Missing) -> Check {
    cx.need_node_cap(NodeCap::StageUnstageVolume)?;
    let staging = cx.staging_path()?;
    let mut req = csi::NodeUnstageVolumeRequest {
        volume_id: unknown_id(&cx, "volume"),
        staging_target_path: staging.display().to_string(),
    };
    match missing {
        Missing::VolumeId => req.volume_id.clear(),
        _ => req.staging_target_path.clear(),
    }
    cx.need_node()?
        .node_unstage_volume(req)
        .await
        .expect_code(Code::InvalidArgument, "NodeUnstageVolume")
}

async fn stats(
    cx: &Ctx,
    volume: &str,
    path: &str,
) -> Result<tonic::Response<csi::NodeGetVolumeStatsResponse>, tonic::Status> {
    cx.node_or_status()?
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: volume.to_string(),
            volume_path: path.to_string(),
            staging_target_path: String::new(),
        })
        .await
}

async fn stats_missing(cx: Ctx, missing: Missing) -> Check {
    cx.need_node_cap(NodeCap::GetVolumeStats)?;
    let (volume, path) = match missing {
        Missing::VolumeId => (String::new(), "some/path".to_string()),
        _ => (unknown_id(&cx, "volume"), String::new()),
    };
    stats(&cx, &volume, &path)
        .await
        .expect_code(Code::InvalidArgument, "NodeGetVolumeStats")
}

async fn stats_unknown(cx: Ctx) -> Check {
    cx.need_node_cap(NodeCap::GetVolumeStats)?;
    stats(&cx, &unknown_id(&cx, "volume"), "some/path")
        .await
        .expect_code(Code::NotFound, "NodeGetVolumeStats of an unknown volume")
}

async fn stats_wrong_path(cx: Ctx) -> Check {
    cx.need_node_cap(NodeCap::GetVolumeStats)?;
    let p = published(&cx, "stats-path", Mode::SingleNodeWriter).await?;
    stats(&cx, &p.volume.volume_id, "some/path")
        .await
        .expect_code(
            Code::NotFound,
            "NodeGetVolumeStats of a published volume at \"some/path\"",
        )
}

/// NodeGetVolumeStats of a published volume: usage with bytes, and a volume condition that
/// is not abnormal when the node advertises VOLUME_CONDITION.
pub(super) async fn check_stats(cx: &Ctx, volume: &str, target: &Path) -> Check {
    if !cx.has_node(NodeCap::GetVolumeStats) {
        return Ok(());
    }
    let r = stats(cx, volume, &target.display().to_string())
        .await
        .expect_ok("NodeGetVolumeStats of the target")?;
    ensure!(!r.usage.is_empty(), "NodeGetVolumeStats without usage");
    for u in &r.usage {
        ensure!(
            u.total >= 0 && u.available >= 0 && u.used >= 0,
            "negative usage: {u:?}"
        );
        ensure!(
            matches!(Unit::try_from(u.unit), Ok(Unit::Bytes | Unit::Inodes)),
            "usage in an unknown unit: {u:?}"
        );
    }
    ensure!(
        r.usage
            .iter()
            .any(|u| u.unit == Unit::Bytes as i32 && u.total > 0),
        "no BYTES usage with a total: {:?}",
        r.usage
    );
    if cx.has_node(NodeCap::VolumeCondition) {
        let Some(condition) = r.volume_condition else {
            fail!("VOLUME_CONDITION is advertised but NodeGetVolumeStats has no volume_condition");
        };
        ensure!(
            !condition.abnormal,
            "a healthy published volume is abnormal: {}",
            condition.message
        );
    }
    Ok(())
}

fn node_expand_request(volume: &str, path: &str, bytes: i64) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: volume.to_string(),
        volume_path: path.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

async fn expand_missing(cx: Ctx, missing: Missing) -> Check {
    cx.need_node_cap(NodeCap::ExpandVolume)?;
    let req = match missing {
        Missing::VolumeId => {
            let target = cx.target_path()?;
            node_expand_request("", &target.display().to_string(), cx.cfg.expand_size)
        }
        _ => {
            let volume = cx.new_volume("node-expand-nopath").await?;
            node_expand_request(&volume.volume_id, "", cx.cfg.expand_size)
        }
    };
    cx.need_node()?
        .node_expand_volume(req)
        .await
        .expect_code(Code::InvalidArgument, "NodeExpandVolume")
}

async fn expand_unknown(cx: Ctx) -> Check {
    cx.need_node_cap(NodeCap::ExpandVolume)?;
    cx.need_node()?
        .node_expand_volume(node_expand_request(
            &unknown_id(&cx, "volume"),
            "some/path",
            cx.cfg.expand_size,
        ))
        .await
        .expect_code(Code::NotFound, "NodeExpandVolume of an unknown volume")
}

async fn expand_published(cx: Ctx) -> Check {
    cx.need_node_cap(NodeCap::ExpandVolume)?;
    let p = published(&cx, "node-expand", Mode::SingleNodeWriter).await?;
    if cx.has_ctl(CtlCap::ExpandVolume) {
        cx.ctl()
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: p.volume.volume_id.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: cx.cfg.expand_size,
                    limit_bytes: 0,
                }),
                volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
                ..Default::default()
            })
            .await
            .expect_ok("ControllerExpandVolume")?;
    }
    let mut req = node_expand_request(
        &p.volume.volume_id,
        &p.target.display().to_string(),
        cx.cfg.expand_size,
    );
    req.staging_target_path = p
        .staging
        .map(|s| s.display().to_string())
        .unwrap_or_default();
    cx.need_node()?
        .node_expand_volume(req)
        .await
        .expect_ok("NodeExpandVolume")?;
    Ok(())
}
