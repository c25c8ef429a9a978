//! Whole lifecycles on the node, with real mounts and real files: create → stage → publish →
//! write and read through the target → stats → unpublish → unstage → delete, once and
//! repeated; repeated stage and publish; data across a new stage; read-only targets; a second
//! publish with other settings; one volume at two targets.

use super::Runner;
use super::node::{Published, check_stats, published, unpublish};
use super::support::{Answer, Check, Ctx, Mode, Verdict, ensure, fail, mounts_at, skip};
use dpufs_proto::csi::v1::controller_service_capability::rpc::Type as CtlCap;
use dpufs_proto::csi::v1::node_service_capability::rpc::Type as NodeCap;
use dpufs_proto::csi::v1::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use dpufs_proto::csi::v1::{self as csi, VolumeContentSource};
use std::path::{Path, PathBuf};
use tonic::Code;

pub(super) async fn cases(r: &mut Runner) {
    r.case(
        "Node lifecycle: create, stage, publish, write and read through the target, stats, unpublish, unstage, delete",
        |cx| repeated_lifecycle(cx, 1),
    )
    .await;
    r.case(
        "Node lifecycle: the whole lifecycle repeated (IdempotentCount) on the same paths",
        |cx| {
            let count = cx.cfg.idempotent_count;
            repeated_lifecycle(cx, count)
        },
    )
    .await;
    r.case(
        "Node idempotency: stage and publish repeated (IdempotentCount) are OK and mount once",
        repeated_calls,
    )
    .await;
    r.case(
        "Node: data written through a target is there after unpublish, unstage and a new stage",
        data_survives_restage,
    )
    .await;
    r.case(
        "Node: a volume from a snapshot holds the source's files of the snapshot's time, and only its own writes",
        |cx| restored(cx, Origin::Snapshot),
    )
    .await;
    r.case(
        "Node: a clone of a volume holds the source's files, and only its own writes",
        |cx| restored(cx, Origin::Volume),
    )
    .await;
    r.case(
        "NodePublishVolume: a readonly target refuses writes",
        readonly_target,
    )
    .await;
    r.case(
        "NodePublishVolume: the same target again is OK, with another readonly ALREADY_EXISTS",
        republish,
    )
    .await;
    r.case(
        "NodePublishVolume: a MULTI_NODE_MULTI_WRITER volume at two targets shares its data",
        |cx| two_targets(cx, Mode::MultiNodeMultiWriter),
    )
    .await;
    r.case(
        "NodePublishVolume: a SINGLE_NODE_MULTI_WRITER volume at two targets shares its data",
        |cx| two_targets(cx, Mode::SingleNodeMultiWriter),
    )
    .await;
    r.case(
        "NodePublishVolume: a SINGLE_NODE_SINGLE_WRITER volume at a second target is FAILED_PRECONDITION",
        single_writer_second_target,
    )
    .await;
}

/// Writes `data` to `dir/name` (synced) and reads it back.
pub(super) async fn write_and_read(dir: &Path, name: &str, data: &[u8]) -> Check {
    let path = dir.join(name);
    let data_len = data.len();
    let data = data.to_vec();
    let done = tokio::task::spawn_blocking(move || -> std::io::Result<Option<Vec<u8>>> {
        use std::io::Write;
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&data)?;
        f.sync_all()?;
        drop(f);
        let back = std::fs::read(&path)?;
        Ok((back != data).then_some(back))
    })
    .await;
    match done {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(back))) => fail!(
            "{name}: {} bytes written, {} different bytes read back",
            data_len,
            back.len()
        ),
        Ok(Err(e)) => fail!("writing and reading {}: {e}", dir.join(name).display()),
        Err(e) => fail!("file I/O task: {e}"),
    }
}

/// The content of `dir/name`.
async fn read(dir: &Path, name: &str) -> Result<Vec<u8>, Verdict> {
    let path = dir.join(name);
    match tokio::task::spawn_blocking(move || std::fs::read(path)).await {
        Ok(Ok(data)) => Ok(data),
        Ok(Err(e)) => fail!("reading {}: {e}", dir.join(name).display()),
        Err(e) => fail!("file I/O task: {e}"),
    }
}

fn ensure_mounted(target: &Path) -> Check {
    ensure!(
        mounts_at(target) > 0,
        "{} is not a mount point after NodePublishVolume",
        target.display()
    );
    Ok(())
}

/// `count` rounds of the whole lifecycle, each with a new volume on the same staging path
/// and target.
async fn repeated_lifecycle(cx: Ctx, count: usize) -> Check {
    cx.need_node()?;
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let info = cx
        .need_node()?
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect_ok("NodeGetInfo")?;
    let staging = if cx.has_node(NodeCap::StageUnstageVolume) {
        Some(cx.staging_path()?)
    } else {
        None
    };
    let target = cx.target_path()?;
    for round in 1..=count {
        lifecycle(&cx, &info, staging.as_deref(), &target)
            .await
            .map_err(|v| match v {
                Verdict::Fail(why) if count > 1 => Verdict::Fail(format!("round {round}: {why}")),
                other => other,
            })?;
    }
    Ok(())
}

async fn lifecycle(
    cx: &Ctx,
    info: &csi::NodeGetInfoResponse,
    staging: Option<&Path>,
    target: &Path,
) -> Check {
    let mut req = cx.volume_request(&cx.name("lifecycle"), Mode::SingleNodeWriter);
    // As csi-sanity: the node's topology is the requisite one.
    if let Some(topology) = &info.accessible_topology {
        req.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![topology.clone()],
            preferred: vec![],
        });
    }
    let volume = cx.create_volume(req).await?;
    if let Some(staging) = staging {
        cx.stage(&volume, staging, Mode::SingleNodeWriter)
            .await
            .expect_ok("NodeStageVolume")?;
    }
    cx.publish(&volume, staging, target, Mode::SingleNodeWriter, false)
        .await
        .expect_ok("NodePublishVolume")?;
    ensure_mounted(target)?;
    let data = format!("csi-sanity {} {}\n", cx.run_id, volume.volume_id).repeat(64);
    write_and_read(target, "csi-sanity.txt", data.as_bytes()).await?;
    check_stats(cx, &volume.volume_id, target).await?;
    unpublish(cx, &volume.volume_id, target).await?;
    ensure!(
        !target.exists(),
        "NodeUnpublishVolume left the target {}",
        target.display()
    );
    if let Some(staging) = staging {
        let node = cx.need_node()?;
        node.clone()
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .expect_ok("NodeUnstageVolume")?;
        ensure!(
            mounts_at(staging) == 0,
            "{} is still a mount point after NodeUnstageVolume",
            staging.display()
        );
    }
    cx.ctl()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: volume.volume_id.clone(),
            ..Default::default()
        })
        .await
        .expect_ok("DeleteVolume")?;
    Ok(())
}

/// csi-sanity's "should be idempotent": NodeStageVolume and NodePublishVolume repeated with
/// the same arguments. Here also: the target is mounted once, not once per call, and one
/// unpublish clears it.
async fn repeated_calls(cx: Ctx) -> Check {
    cx.need_node()?;
    let volume = cx.new_volume("idempotent").await?;
    let count = cx.cfg.idempotent_count;
    let staging = if cx.has_node(NodeCap::StageUnstageVolume) {
        let staging = cx.staging_path()?;
        for i in 1..=count {
            cx.stage(&volume, &staging, Mode::SingleNodeWriter)
                .await
                .expect_ok(&format!("NodeStageVolume #{i}"))?;
        }
        Some(staging)
    } else {
        None
    };
    let target = cx.target_path()?;
    for i in 1..=count {
        cx.publish(
            &volume,
            staging.as_deref(),
            &target,
            Mode::SingleNodeWriter,
            false,
        )
        .await
        .expect_ok(&format!("NodePublishVolume #{i}"))?;
    }
    let mounts = mounts_at(&target);
    ensure!(
        mounts == 1,
        "{count} identical NodePublishVolume calls left {mounts} mounts at the target"
    );
    write_and_read(&target, "again.txt", b"idempotent").await?;
    unpublish(&cx, &volume.volume_id, &target).await?;
    ensure!(
        !target.exists(),
        "one NodeUnpublishVolume after repeated publishes left {}",
        target.display()
    );
    Ok(())
}

async fn data_survives_restage(cx: Ctx) -> Check {
    cx.need_node_cap(NodeCap::StageUnstageVolume)?;
    let Published {
        volume,
        staging,
        target,
    } = published(&cx, "restage", Mode::SingleNodeWriter).await?;
    let Some(staging) = staging else {
        fail!("the node stages, but the volume was published without a staging path");
    };
    let data = format!("kept across stages {}", cx.run_id);
    write_and_read(&target, "kept.txt", data.as_bytes()).await?;
    unpublish(&cx, &volume.volume_id, &target).await?;
    cx.need_node()?
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .expect_ok("NodeUnstageVolume")?;
    cx.stage(&volume, &staging, Mode::SingleNodeWriter)
        .await
        .expect_ok("NodeStageVolume again")?;
    cx.publish(
        &volume,
        Some(&staging),
        &target,
        Mode::SingleNodeWriter,
        false,
    )
    .await
    .expect_ok("NodePublishVolume again")?;
    let back = read(&target, "kept.txt").await?;
    ensure!(
        back == data.as_bytes(),
        "after a new stage the file holds {:?}",
        String::from_utf8_lossy(&back)
    );
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Origin {
    Snapshot,
    Volume,
}

/// Whether `dir/name` exists, asked off the runtime's threads.
async fn exists(dir: &Path, name: &str) -> bool {
    let path = dir.join(name);
    tokio::task::spawn_blocking(move || path.exists())
        .await
        .unwrap_or(false)
}

/// A volume with a file, a snapshot of it (or not, for a clone), another file written after;
/// a new volume from the snapshot (or the volume), mounted: it has the first file, not the
/// second, and what is written to it stays out of the source.
async fn restored(cx: Ctx, from: Origin) -> Check {
    cx.need_node()?;
    match from {
        Origin::Snapshot => cx.need_ctl(CtlCap::CreateDeleteSnapshot)?,
        Origin::Volume => cx.need_ctl(CtlCap::CloneVolume)?,
    }
    let Published {
        volume: source,
        target: source_target,
        ..
    } = published(&cx, "restore-source", Mode::SingleNodeWriter).await?;
    let before = format!("before {}", cx.run_id);
    write_and_read(&source_target, "before.txt", before.as_bytes()).await?;
    let content = match from {
        Origin::Snapshot => {
            let snap = cx
                .create_snapshot(&cx.name("restore-snap"), &source.volume_id)
                .await?;
            write_and_read(&source_target, "after.txt", b"after the snapshot").await?;
            Source::Snapshot(SnapshotSource {
                snapshot_id: snap.snapshot_id,
            })
        }
        Origin::Volume => Source::Volume(VolumeSource {
            volume_id: source.volume_id.clone(),
        }),
    };
    let mut req = cx.volume_request(&cx.name("restored"), Mode::SingleNodeWriter);
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(content),
    });
    let restored = cx.create_volume(req).await?;
    let staging = cx
        .stage_if_needed(&restored, Mode::SingleNodeWriter)
        .await?;
    let target = cx.target_path()?;
    cx.publish(
        &restored,
        staging.as_deref(),
        &target,
        Mode::SingleNodeWriter,
        false,
    )
    .await
    .expect_ok("NodePublishVolume of the new volume")?;
    ensure_mounted(&target)?;
    let got = read(&target, "before.txt").await?;
    ensure!(
        got == before.as_bytes(),
        "the new volume's before.txt holds {:?}",
        String::from_utf8_lossy(&got)
    );
    ensure!(
        !exists(&target, "after.txt").await,
        "the volume from the snapshot has a file written after the snapshot"
    );
    write_and_read(&target, "own.txt", b"the new volume's own").await?;
    ensure!(
        !exists(&source_target, "own.txt").await,
        "a write to the new volume shows in its source"
    );
    Ok(())
}

async fn readonly_target(cx: Ctx) -> Check {
    cx.need_node()?;
    let volume = cx.new_volume("readonly").await?;
    let staging = cx.stage_if_needed(&volume, Mode::SingleNodeWriter).await?;
    let target = cx.target_path()?;
    cx.publish(
        &volume,
        staging.as_deref(),
        &target,
        Mode::SingleNodeWriter,
        true,
    )
    .await
    .expect_ok("NodePublishVolume readonly")?;
    ensure_mounted(&target)?;
    let path = target.join("must-not-exist.txt");
    match tokio::task::spawn_blocking(move || std::fs::write(path, b"x")).await {
        Ok(Ok(())) => fail!("a write through the readonly target succeeded"),
        Ok(Err(e)) => ensure!(
            matches!(
                e.raw_os_error(),
                Some(libc::EROFS | libc::EACCES | libc::EPERM)
            ),
            "a write through the readonly target failed with {e}, not EROFS"
        ),
        Err(e) => fail!("file I/O task: {e}"),
    }
    Ok(())
}

/// CSI's second-publish rules: identical arguments at the same target are OK; the same
/// target with another `readonly` is ALREADY_EXISTS.
async fn republish(cx: Ctx) -> Check {
    let Published {
        volume,
        staging,
        target,
    } = published(&cx, "republish", Mode::SingleNodeWriter).await?;
    cx.publish(
        &volume,
        staging.as_deref(),
        &target,
        Mode::SingleNodeWriter,
        false,
    )
    .await
    .expect_ok("NodePublishVolume again, identical")?;
    cx.publish(
        &volume,
        staging.as_deref(),
        &target,
        Mode::SingleNodeWriter,
        true,
    )
    .await
    .expect_code(
        Code::AlreadyExists,
        "NodePublishVolume at the same target, now readonly",
    )
}

/// The volume of `mode`, created, staged and published at two targets; what is written at
/// one is read at the other. MULTI_NODE_MULTI_WRITER is CSI's own rule (a different target is
/// OK for MULTI_NODE_* modes); SINGLE_NODE_MULTI_WRITER needs the node's capability, as in
/// csi-sanity.
async fn two_targets(cx: Ctx, mode: Mode) -> Check {
    cx.need_node()?;
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    if mode == Mode::SingleNodeMultiWriter {
        cx.need_node_cap(NodeCap::SingleNodeMultiWriter)?;
    }
    let req = cx.volume_request(&cx.name("two-targets"), mode);
    let volume = match cx.try_create_volume(req).await {
        Err(s) if mode == Mode::MultiNodeMultiWriter && s.code() == Code::InvalidArgument => {
            return skip(format!(
                "the driver does not create MULTI_NODE_MULTI_WRITER volumes ({})",
                s.message()
            ));
        }
        answer => match answer.expect_ok("CreateVolume")?.volume {
            Some(v) if !v.volume_id.is_empty() => v,
            other => fail!("CreateVolume answered without a volume id: {other:?}"),
        },
    };
    let staging = cx.stage_if_needed(&volume, mode).await?;
    let targets: Vec<PathBuf> = vec![cx.target_path()?, cx.target_path()?];
    for (i, target) in targets.iter().enumerate() {
        cx.publish(&volume, staging.as_deref(), target, mode, false)
            .await
            .expect_ok(&format!("NodePublishVolume at target {}", i + 1))?;
        ensure_mounted(target)?;
    }
    let data = format!("shared {}", cx.run_id);
    write_and_read(&targets[0], "shared.txt", data.as_bytes()).await?;
    let seen = read(&targets[1], "shared.txt").await?;
    ensure!(
        seen == data.as_bytes(),
        "the second target reads {:?}",
        String::from_utf8_lossy(&seen)
    );
    Ok(())
}

/// csi-sanity 5.5: a SINGLE_NODE_SINGLE_WRITER volume published at one target is refused at
/// a second with FAILED_PRECONDITION.
async fn single_writer_second_target(cx: Ctx) -> Check {
    cx.need_node_cap(NodeCap::SingleNodeMultiWriter)?;
    let Published {
        volume, staging, ..
    } = published(&cx, "single-writer", Mode::SingleNodeSingleWriter).await?;
    let second = cx.target_path()?;
    cx.publish(
        &volume,
        staging.as_deref(),
        &second,
        Mode::SingleNodeSingleWriter,
        false,
    )
    .await
    .expect_code(
        Code::FailedPrecondition,
        "NodePublishVolume of a SINGLE_NODE_SINGLE_WRITER volume at a second target",
    )
}
