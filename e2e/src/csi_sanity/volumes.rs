//! CreateVolume, DeleteVolume, ControllerExpandVolume and ControllerModifyVolume.

use super::Runner;
use super::support::{Answer, Check, Ctx, Mode, ensure, fail, map, mount_cap, skip, unknown_id};
use dpufs_proto::csi::v1::controller_service_capability::rpc::Type as CtlCap;
use dpufs_proto::csi::v1::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use dpufs_proto::csi::v1::{self as csi, VolumeContentSource};
use tonic::Code;

pub(super) async fn cases(r: &mut Runner) {
    r.case("CreateVolume: no name is INVALID_ARGUMENT", create_no_name)
        .await;
    r.case(
        "CreateVolume: no volume capabilities is INVALID_ARGUMENT",
        create_no_caps,
    )
    .await;
    r.case(
        "CreateVolume: no capacity range creates a volume",
        create_no_capacity,
    )
    .await;
    r.case(
        "CreateVolume: the test size creates a volume at least that large",
        create_sized,
    )
    .await;
    r.case(
        "CreateVolume: the same name and size again is OK with the same volume",
        create_twice,
    )
    .await;
    r.case(
        "CreateVolume: the same name with another size is ALREADY_EXISTS",
        create_twice_other_size,
    )
    .await;
    r.case("CreateVolume: a 128-character name works", create_long_name)
        .await;
    r.case(
        "CreateVolume: from an existing snapshot",
        create_from_snapshot,
    )
    .await;
    r.case(
        "CreateVolume: from a snapshot that does not exist is NOT_FOUND",
        create_from_missing_snapshot,
    )
    .await;
    r.case(
        "CreateVolume: from an existing volume (clone)",
        create_from_volume,
    )
    .await;
    r.case(
        "CreateVolume: from a volume that does not exist is NOT_FOUND",
        create_from_missing_volume,
    )
    .await;
    r.case(
        "DeleteVolume: no volume id is INVALID_ARGUMENT",
        delete_no_id,
    )
    .await;
    r.case("DeleteVolume: an unknown volume id is OK", delete_unknown)
        .await;
    r.case(
        "DeleteVolume: deletes a volume, and again is OK",
        delete_twice,
    )
    .await;
    r.case(
        "ControllerExpandVolume: no volume id is INVALID_ARGUMENT",
        expand_no_id,
    )
    .await;
    r.case(
        "ControllerExpandVolume: no capacity range is INVALID_ARGUMENT",
        expand_no_range,
    )
    .await;
    r.case(
        "ControllerExpandVolume: grows a volume to at least the expand size",
        expand,
    )
    .await;
    r.case(
        "ControllerExpandVolume: a size the volume already has is OK",
        expand_smaller,
    )
    .await;
    r.case(
        "ControllerExpandVolume: an unknown volume is NOT_FOUND",
        expand_unknown,
    )
    .await;
    r.case(
        "ControllerModifyVolume: no volume id is INVALID_ARGUMENT",
        modify_no_id,
    )
    .await;
    r.case(
        "ControllerModifyVolume: an unknown volume is NOT_FOUND",
        modify_unknown,
    )
    .await;
    r.case(
        "ControllerModifyVolume: an unsupported parameter is INVALID_ARGUMENT",
        modify_unsupported,
    )
    .await;
    r.case(
        "ControllerModifyVolume: the configured mutable parameters are applied",
        modify,
    )
    .await;
}

fn ranged(
    mut req: csi::CreateVolumeRequest,
    required: i64,
    limit: i64,
) -> csi::CreateVolumeRequest {
    req.capacity_range = Some(csi::CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    });
    req
}

/// A volume's capacity is unknown (0) or at least `size`.
fn check_size(v: &csi::Volume, size: i64) -> Check {
    ensure!(
        v.capacity_bytes == 0 || v.capacity_bytes >= size,
        "volume {} has capacity_bytes {}, asked for at least {size}",
        v.volume_id,
        v.capacity_bytes
    );
    Ok(())
}

async fn create_no_name(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let req = cx.volume_request("", Mode::SingleNodeWriter);
    cx.try_create_volume(req)
        .await
        .expect_code(Code::InvalidArgument, "CreateVolume without a name")
}

async fn create_no_caps(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let mut req = cx.volume_request(&cx.name("nocaps"), Mode::SingleNodeWriter);
    req.volume_capabilities.clear();
    cx.try_create_volume(req)
        .await
        .expect_code(Code::InvalidArgument, "CreateVolume without capabilities")
}

/// csi-sanity's "NoCapacity" case sends a size; the spec makes `capacity_range` optional, so
/// here there is none.
async fn create_no_capacity(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let mut req = cx.volume_request(&cx.name("nocapacity"), Mode::SingleNodeWriter);
    req.capacity_range = None;
    let v = cx.create_volume(req).await?;
    ensure!(
        v.capacity_bytes >= 0,
        "negative capacity_bytes {}",
        v.capacity_bytes
    );
    Ok(())
}

async fn create_sized(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let req = cx.volume_request(&cx.name("sized"), Mode::SingleNodeWriter);
    match cx.try_create_volume(req).await {
        Err(s) if matches!(s.code(), Code::OutOfRange | Code::Unimplemented) => skip(format!(
            "the driver refuses required_bytes {} ({:?}: {}); set the test volume size",
            cx.cfg.volume_size,
            s.code(),
            s.message()
        )),
        answer => {
            let r = answer.expect_ok("CreateVolume")?;
            let Some(v) = r.volume.filter(|v| !v.volume_id.is_empty()) else {
                fail!("CreateVolume answered without a volume id");
            };
            check_size(&v, cx.cfg.volume_size)
        }
    }
}

async fn create_twice(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let req = cx.volume_request(&cx.name("twice"), Mode::SingleNodeWriter);
    let first = cx.create_volume(req.clone()).await?;
    let second = cx.create_volume(req).await?;
    check_size(&first, cx.cfg.volume_size)?;
    check_size(&second, cx.cfg.volume_size)?;
    ensure!(
        first.volume_id == second.volume_id,
        "the same request made two volumes: {} and {}",
        first.volume_id,
        second.volume_id
    );
    Ok(())
}

async fn create_twice_other_size(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let name = cx.name("twice-different");
    let size = cx.cfg.volume_size;
    let req = cx.volume_request(&name, Mode::SingleNodeWriter);
    cx.create_volume(ranged(req.clone(), size, size)).await?;
    cx.try_create_volume(ranged(req, 2 * size, 2 * size))
        .await
        .expect_code(
            Code::AlreadyExists,
            "CreateVolume of the same name with twice the size",
        )
}

async fn create_long_name(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    let name = cx.name_of_length("maxlen", 128);
    let v = cx
        .create_volume(cx.volume_request(&name, Mode::SingleNodeWriter))
        .await?;
    check_size(&v, cx.cfg.volume_size)
}

fn from(source: Source) -> Option<VolumeContentSource> {
    Some(VolumeContentSource {
        r#type: Some(source),
    })
}

async fn create_from_snapshot(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    cx.need_ctl(CtlCap::CreateDeleteSnapshot)?;
    let (_, snap) = cx.volume_with_snapshot("source").await?;
    let mut req = cx.volume_request(&cx.name("from-snapshot"), Mode::SingleNodeWriter);
    req.volume_content_source = from(Source::Snapshot(SnapshotSource {
        snapshot_id: snap.snapshot_id.clone(),
    }));
    let v = cx.create_volume(req).await?;
    check_size(&v, cx.cfg.volume_size)?;
    if let Some(Source::Snapshot(s)) = v.content_source.and_then(|c| c.r#type) {
        ensure!(
            s.snapshot_id == snap.snapshot_id,
            "the volume names source snapshot {}, not {}",
            s.snapshot_id,
            snap.snapshot_id
        );
    }
    Ok(())
}

async fn create_from_missing_snapshot(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    cx.need_ctl(CtlCap::CreateDeleteSnapshot)?;
    let mut req = cx.volume_request(&cx.name("from-no-snapshot"), Mode::SingleNodeWriter);
    req.volume_content_source = from(Source::Snapshot(SnapshotSource {
        snapshot_id: unknown_id(&cx, "snapshot"),
    }));
    cx.try_create_volume(req).await.expect_code(
        Code::NotFound,
        "CreateVolume from a snapshot that does not exist",
    )
}

async fn create_from_volume(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    cx.need_ctl(CtlCap::CloneVolume)?;
    let source = cx.new_volume("clone-source").await?;
    let mut req = cx.volume_request(&cx.name("clone"), Mode::SingleNodeWriter);
    req.volume_content_source = from(Source::Volume(VolumeSource {
        volume_id: source.volume_id.clone(),
    }));
    let v = cx.create_volume(req).await?;
    check_size(&v, cx.cfg.volume_size)
}

async fn create_from_missing_volume(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    cx.need_ctl(CtlCap::CloneVolume)?;
    let mut req = cx.volume_request(&cx.name("clone-of-nothing"), Mode::SingleNodeWriter);
    req.volume_content_source = from(Source::Volume(VolumeSource {
        volume_id: unknown_id(&cx, "volume"),
    }));
    cx.try_create_volume(req).await.expect_code(
        Code::NotFound,
        "CreateVolume from a volume that does not exist",
    )
}

async fn delete(
    cx: &Ctx,
    id: &str,
) -> Result<tonic::Response<csi::DeleteVolumeResponse>, tonic::Status> {
    cx.ctl()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.to_string(),
            ..Default::default()
        })
        .await
}

async fn delete_no_id(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    delete(&cx, "")
        .await
        .expect_code(Code::InvalidArgument, "DeleteVolume without an id")
}

async fn delete_unknown(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteVolume)?;
    delete(&cx, &unknown_id(&cx, "volume"))
        .await
        .expect_ok("DeleteVolume of an unknown id")?;
    Ok(())
}

async fn delete_twice(cx: Ctx) -> Check {
    let v = cx.new_volume("delete").await?;
    delete(&cx, &v.volume_id).await.expect_ok("DeleteVolume")?;
    delete(&cx, &v.volume_id)
        .await
        .expect_ok("DeleteVolume again")?;
    if cx.has_ctl(CtlCap::GetVolume) {
        cx.ctl()
            .controller_get_volume(csi::ControllerGetVolumeRequest {
                volume_id: v.volume_id.clone(),
            })
            .await
            .expect_code(Code::NotFound, "ControllerGetVolume of the deleted volume")?;
    }
    Ok(())
}

fn expand_request(id: &str, required: Option<i64>) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: id.to_string(),
        capacity_range: required.map(|required_bytes| csi::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

async fn expand_no_id(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ExpandVolume)?;
    cx.ctl()
        .controller_expand_volume(expand_request("", Some(cx.cfg.expand_size)))
        .await
        .expect_code(
            Code::InvalidArgument,
            "ControllerExpandVolume without an id",
        )
}

/// csi-sanity sends this without a volume id too, so any id check passes it; here the
/// volume exists and only the (REQUIRED) capacity range is missing.
async fn expand_no_range(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ExpandVolume)?;
    let v = cx.new_volume("expand-norange").await?;
    cx.ctl()
        .controller_expand_volume(expand_request(&v.volume_id, None))
        .await
        .expect_code(
            Code::InvalidArgument,
            "ControllerExpandVolume without a capacity range",
        )
}

/// csi-sanity wants exactly the expand size back; CSI's capacity range makes it a lower
/// bound, which is what is checked here.
async fn expand(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ExpandVolume)?;
    let v = cx.new_volume("expand").await?;
    let r = cx
        .ctl()
        .controller_expand_volume(expand_request(&v.volume_id, Some(cx.cfg.expand_size)))
        .await
        .expect_ok("ControllerExpandVolume")?;
    ensure!(
        r.capacity_bytes >= cx.cfg.expand_size,
        "expanded to required_bytes {}, capacity_bytes is {}",
        cx.cfg.expand_size,
        r.capacity_bytes
    );
    Ok(())
}

async fn expand_smaller(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ExpandVolume)?;
    let v = cx.new_volume("expand-smaller").await?;
    let r = cx
        .ctl()
        .controller_expand_volume(expand_request(&v.volume_id, Some(cx.cfg.volume_size / 2)))
        .await
        .expect_ok("ControllerExpandVolume to half the volume's size")?;
    ensure!(
        r.capacity_bytes >= v.capacity_bytes.max(cx.cfg.volume_size / 2),
        "a volume of {} bytes reports capacity_bytes {} after an expansion to {}",
        v.capacity_bytes,
        r.capacity_bytes,
        cx.cfg.volume_size / 2
    );
    Ok(())
}

async fn expand_unknown(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ExpandVolume)?;
    cx.ctl()
        .controller_expand_volume(expand_request(
            &unknown_id(&cx, "volume"),
            Some(cx.cfg.expand_size),
        ))
        .await
        .expect_code(
            Code::NotFound,
            "ControllerExpandVolume of an unknown volume",
        )
}

fn modify_request(
    id: &str,
    params: std::collections::HashMap<String, String>,
) -> csi::ControllerModifyVolumeRequest {
    csi::ControllerModifyVolumeRequest {
        volume_id: id.to_string(),
        mutable_parameters: params,
        ..Default::default()
    }
}

/// Mutable parameters for a request: the configured ones, else one the driver cannot know.
fn some_mutable(cx: &Ctx) -> std::collections::HashMap<String, String> {
    if cx.cfg.mutable_parameters.is_empty() {
        map(&[("csi-sanity.invalid/unknown", "1")])
    } else {
        cx.cfg.mutable_parameters.clone()
    }
}

async fn modify_no_id(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ModifyVolume)?;
    cx.ctl()
        .controller_modify_volume(modify_request("", some_mutable(&cx)))
        .await
        .expect_code(
            Code::InvalidArgument,
            "ControllerModifyVolume without an id",
        )
}

async fn modify_unknown(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ModifyVolume)?;
    if cx.cfg.mutable_parameters.is_empty() {
        return skip("no mutable parameters configured (an unknown key may be refused first)");
    }
    cx.ctl()
        .controller_modify_volume(modify_request(
            &unknown_id(&cx, "volume"),
            cx.cfg.mutable_parameters.clone(),
        ))
        .await
        .expect_code(
            Code::NotFound,
            "ControllerModifyVolume of an unknown volume",
        )
}

async fn modify_unsupported(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ModifyVolume)?;
    let v = cx.new_volume("modify-unsupported").await?;
    cx.ctl()
        .controller_modify_volume(modify_request(
            &v.volume_id,
            map(&[("csi-sanity.invalid/unknown", "1")]),
        ))
        .await
        .expect_code(
            Code::InvalidArgument,
            "ControllerModifyVolume with a parameter no driver knows",
        )
}

async fn modify(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ModifyVolume)?;
    if cx.cfg.mutable_parameters.is_empty() {
        return skip("no mutable parameters configured");
    }
    let v = cx.new_volume("modify").await?;
    cx.ctl()
        .controller_modify_volume(modify_request(
            &v.volume_id,
            cx.cfg.mutable_parameters.clone(),
        ))
        .await
        .expect_ok("ControllerModifyVolume")?;
    Ok(())
}
