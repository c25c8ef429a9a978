//! The Controller service: capabilities, capacity, listing, validation, ControllerGetVolume
//! and the attach step (ControllerPublish/Unpublish). CreateVolume, DeleteVolume, expansion and
//! modification are in `volumes`.

use super::Runner;
use super::support::{Answer, Check, Ctx, Mode, Verdict, ensure, fail, mount_cap, unknown_id};
use dpufs_proto::csi::v1::controller_service_capability::{self, rpc::Type as CtlCap};
use dpufs_proto::csi::v1::{self as csi};
use std::collections::HashSet;
use tonic::Code;

pub(super) async fn cases(r: &mut Runner) {
    r.case(
        "ControllerGetCapabilities: lists known capabilities only",
        capabilities,
    )
    .await;
    r.case("GetCapacity: answers without optional fields", capacity)
        .await;
    r.case(
        "GetCapacity: answers for the test parameters and a capability",
        capacity_for_parameters,
    )
    .await;
    r.case(
        "ListVolumes: answers without optional fields, every entry a volume with an id",
        list,
    )
    .await;
    r.case(
        "ListVolumes: an invalid starting_token is ABORTED",
        list_bad_token,
    )
    .await;
    r.case(
        "ListVolumes: a new volume is listed, a deleted one no longer",
        list_new_and_deleted,
    )
    .await;
    r.case(
        "ListVolumes: pages of max_entries with next_token list every volume once",
        list_pages,
    )
    .await;
    super::volumes::cases(r).await;
    r.case(
        "ValidateVolumeCapabilities: no volume id is INVALID_ARGUMENT",
        validate_no_id,
    )
    .await;
    r.case(
        "ValidateVolumeCapabilities: no capabilities is INVALID_ARGUMENT",
        validate_no_caps,
    )
    .await;
    r.case(
        "ValidateVolumeCapabilities: the capability a volume was created with is confirmed",
        validate_own,
    )
    .await;
    r.case(
        "ValidateVolumeCapabilities: an unknown volume is NOT_FOUND",
        validate_unknown,
    )
    .await;
    r.case(
        "ControllerGetVolume: a volume is found by its id",
        get_volume,
    )
    .await;
    r.case(
        "ControllerGetVolume: an unknown volume is NOT_FOUND",
        get_unknown,
    )
    .await;
    r.case(
        "ControllerPublishVolume: no volume id, node id or capability is INVALID_ARGUMENT",
        publish_arguments,
    )
    .await;
    r.case(
        "ControllerPublishVolume: an unknown volume or node is NOT_FOUND",
        publish_unknown,
    )
    .await;
    r.case(
        "ControllerPublishVolume: again with another readonly is ALREADY_EXISTS",
        publish_incompatible,
    )
    .await;
    r.case(
        "ControllerPublishVolume and ControllerUnpublishVolume: repeated, each is OK",
        publish_repeated,
    )
    .await;
    r.case(
        "ControllerUnpublishVolume: no volume id is INVALID_ARGUMENT",
        unpublish_no_id,
    )
    .await;
}

async fn capabilities(cx: Ctx) -> Check {
    cx.need_controller()?;
    let caps = cx
        .ctl()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .expect_ok("ControllerGetCapabilities")?
        .capabilities;
    for cap in &caps {
        let Some(controller_service_capability::Type::Rpc(rpc)) = &cap.r#type else {
            fail!("a capability without an rpc: {cap:?}");
        };
        match CtlCap::try_from(rpc.r#type) {
            Ok(CtlCap::Unknown) | Err(_) => fail!("unknown capability type {}", rpc.r#type),
            Ok(_) => {}
        }
    }
    Ok(())
}

fn check_capacity(r: &csi::GetCapacityResponse) -> Check {
    ensure!(
        r.available_capacity >= 0,
        "available_capacity {} is negative",
        r.available_capacity
    );
    if let (Some(min), Some(max)) = (r.minimum_volume_size, r.maximum_volume_size) {
        ensure!(min <= max, "minimum_volume_size {min} > maximum {max}");
    }
    if let Some(max) = r.maximum_volume_size {
        ensure!(max >= 0, "maximum_volume_size {max} is negative");
    }
    Ok(())
}

async fn capacity(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::GetCapacity)?;
    let r = cx
        .ctl()
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .expect_ok("GetCapacity")?;
    check_capacity(&r)
}

async fn capacity_for_parameters(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::GetCapacity)?;
    let r = cx
        .ctl()
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
            parameters: cx.cfg.volume_parameters.clone(),
            accessible_topology: None,
        })
        .await
        .expect_ok("GetCapacity with parameters")?;
    check_capacity(&r)
}

async fn list(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ListVolumes)?;
    let r = cx
        .ctl()
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .expect_ok("ListVolumes")?;
    for entry in &r.entries {
        ensure!(
            entry
                .volume
                .as_ref()
                .is_some_and(|v| !v.volume_id.is_empty()),
            "an entry without a volume id: {entry:?}"
        );
    }
    Ok(())
}

async fn list_bad_token(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ListVolumes)?;
    cx.ctl()
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 0,
            starting_token: format!("invalid-token-{}", cx.run_id),
        })
        .await
        .expect_code(
            Code::Aborted,
            "ListVolumes with a token the driver never gave",
        )
}

/// Every volume id, page by page (`max_entries` each; 0: the driver's choice), with the size
/// of each page.
pub(super) async fn list_all(cx: &Ctx, max_entries: i32) -> Result<Vec<Vec<String>>, Verdict> {
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let r = cx
            .ctl()
            .list_volumes(csi::ListVolumesRequest {
                max_entries,
                starting_token: token.clone(),
            })
            .await
            .expect_ok(&format!("ListVolumes (page {})", pages.len() + 1))?;
        let ids: Vec<String> = r
            .entries
            .iter()
            .map(|e| {
                e.volume
                    .as_ref()
                    .map(|v| v.volume_id.clone())
                    .unwrap_or_default()
            })
            .collect();
        ensure!(
            max_entries == 0 || ids.len() <= max_entries as usize,
            "page {} has {} entries, max_entries was {max_entries}",
            pages.len() + 1,
            ids.len()
        );
        pages.push(ids);
        if r.next_token.is_empty() {
            return Ok(pages);
        }
        ensure!(
            r.next_token != token,
            "ListVolumes answered token {token:?} with the same next_token"
        );
        ensure!(pages.len() < 10_000, "ListVolumes never ends");
        token = r.next_token;
    }
}

async fn list_new_and_deleted(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ListVolumes)?;
    let before: Vec<String> = list_all(&cx, 0).await?.concat();
    let volume = cx.new_volume("list").await?;
    let with: Vec<String> = list_all(&cx, 0).await?.concat();
    ensure!(
        with.contains(&volume.volume_id),
        "the new volume {} is not listed",
        volume.volume_id
    );
    ensure!(
        with.len() == before.len() + 1,
        "{} volumes listed before the create, {} after",
        before.len(),
        with.len()
    );
    cx.ctl()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: volume.volume_id.clone(),
            ..Default::default()
        })
        .await
        .expect_ok("DeleteVolume")?;
    let after: Vec<String> = list_all(&cx, 0).await?.concat();
    ensure!(
        !after.contains(&volume.volume_id),
        "the deleted volume {} is still listed",
        volume.volume_id
    );
    ensure!(
        after.len() == before.len(),
        "{} volumes listed before, {} after create and delete",
        before.len(),
        after.len()
    );
    Ok(())
}

async fn list_pages(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::ListVolumes)?;
    let mut made = Vec::new();
    for _ in 0..3 {
        made.push(cx.new_volume("page").await?.volume_id);
    }
    let all: Vec<String> = list_all(&cx, 0).await?.concat();
    let pages = list_all(&cx, 2).await?;
    ensure!(
        pages[0].len() == 2,
        "the first page of max_entries 2 has {} entries ({} volumes exist)",
        pages[0].len(),
        all.len()
    );
    ensure!(
        pages.len() >= 2,
        "{} volumes exist, but the first page of 2 has no next_token",
        all.len()
    );
    let paged: Vec<String> = pages.concat();
    let unique: HashSet<&String> = paged.iter().collect();
    ensure!(
        unique.len() == paged.len(),
        "a volume listed twice across pages: {paged:?}"
    );
    ensure!(
        paged.len() == all.len(),
        "pages of 2 list {} volumes, one listing {}",
        paged.len(),
        all.len()
    );
    for id in &made {
        ensure!(unique.contains(id), "volume {id} is on no page");
    }
    Ok(())
}

async fn validate_no_id(cx: Ctx) -> Check {
    cx.need_controller()?;
    cx.ctl()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .expect_code(
            Code::InvalidArgument,
            "ValidateVolumeCapabilities without an id",
        )
}

async fn validate_no_caps(cx: Ctx) -> Check {
    let volume = cx.new_volume("validate-nocaps").await?;
    cx.ctl()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: volume.volume_id,
            volume_context: volume.volume_context,
            ..Default::default()
        })
        .await
        .expect_code(
            Code::InvalidArgument,
            "ValidateVolumeCapabilities without capabilities",
        )
}

/// csi-sanity only wants capabilities in a confirmation if there is one; CreateVolume's
/// contract (the volume supports every requested capability) means the capability a volume
/// was created with must be confirmed.
async fn validate_own(cx: Ctx) -> Check {
    let volume = cx.new_volume("validate").await?;
    let r = cx
        .ctl()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: volume.volume_id,
            volume_context: volume.volume_context,
            volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
            parameters: cx.cfg.volume_parameters.clone(),
            ..Default::default()
        })
        .await
        .expect_ok("ValidateVolumeCapabilities")?;
    let Some(confirmed) = r.confirmed else {
        fail!(
            "the capability the volume was created with is not confirmed: {:?}",
            r.message
        );
    };
    ensure!(
        !confirmed.volume_capabilities.is_empty(),
        "a confirmation without capabilities"
    );
    Ok(())
}

async fn validate_unknown(cx: Ctx) -> Check {
    cx.need_controller()?;
    cx.ctl()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: unknown_id(&cx, "volume"),
            volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .expect_code(
            Code::NotFound,
            "ValidateVolumeCapabilities of an unknown volume",
        )
}

async fn get_volume(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::GetVolume)?;
    let volume = cx.new_volume("get").await?;
    let r = cx
        .ctl()
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: volume.volume_id.clone(),
        })
        .await
        .expect_ok("ControllerGetVolume")?;
    let got = r.volume.map(|v| v.volume_id).unwrap_or_default();
    ensure!(
        got == volume.volume_id,
        "ControllerGetVolume of {} answered volume {got:?}",
        volume.volume_id
    );
    if cx.has_ctl(CtlCap::VolumeCondition) {
        ensure!(
            r.status.and_then(|s| s.volume_condition).is_some(),
            "VOLUME_CONDITION is advertised but ControllerGetVolume has no volume_condition"
        );
    }
    Ok(())
}

async fn get_unknown(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::GetVolume)?;
    cx.ctl()
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: unknown_id(&cx, "volume"),
        })
        .await
        .expect_code(Code::NotFound, "ControllerGetVolume of an unknown volume")
}

async fn publish_arguments(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::PublishUnpublishVolume)?;
    let calls = [
        (
            "no volume id",
            csi::ControllerPublishVolumeRequest::default(),
        ),
        (
            "no node id",
            csi::ControllerPublishVolumeRequest {
                volume_id: unknown_id(&cx, "volume"),
                ..Default::default()
            },
        ),
        (
            "no volume capability",
            csi::ControllerPublishVolumeRequest {
                volume_id: unknown_id(&cx, "volume"),
                node_id: unknown_id(&cx, "node"),
                ..Default::default()
            },
        ),
    ];
    for (what, req) in calls {
        cx.ctl().controller_publish_volume(req).await.expect_code(
            Code::InvalidArgument,
            &format!("ControllerPublishVolume with {what}"),
        )?;
    }
    Ok(())
}

async fn publish_unknown(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::PublishUnpublishVolume)?;
    cx.controller_publish(&unknown_id(&cx, "volume"), &unknown_id(&cx, "node"), false)
        .await
        .expect_code(
            Code::NotFound,
            "ControllerPublishVolume of an unknown volume",
        )?;
    let volume = cx.new_volume("publish-unknown-node").await?;
    cx.controller_publish(&volume.volume_id, &unknown_id(&cx, "node"), false)
        .await
        .expect_code(Code::NotFound, "ControllerPublishVolume to an unknown node")
}

async fn publish_incompatible(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::PublishUnpublishVolume)?;
    cx.need_ctl(CtlCap::PublishReadonly)?;
    let node = cx.node_id().await?;
    let volume = cx.new_volume("publish-incompatible").await?;
    cx.controller_publish(&volume.volume_id, &node, false)
        .await
        .expect_ok("ControllerPublishVolume")?;
    cx.controller_publish(&volume.volume_id, &node, true)
        .await
        .expect_code(
            Code::AlreadyExists,
            "ControllerPublishVolume again, now readonly",
        )
}

async fn publish_repeated(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::PublishUnpublishVolume)?;
    let node = cx.node_id().await?;
    let volume = cx.new_volume("publish-repeated").await?;
    for i in 0..cx.cfg.idempotent_count {
        cx.controller_publish(&volume.volume_id, &node, false)
            .await
            .expect_ok(&format!("ControllerPublishVolume #{}", i + 1))?;
    }
    for i in 0..cx.cfg.idempotent_count {
        cx.ctl()
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                node_id: node.clone(),
                ..Default::default()
            })
            .await
            .expect_ok(&format!("ControllerUnpublishVolume #{}", i + 1))?;
    }
    Ok(())
}

async fn unpublish_no_id(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::PublishUnpublishVolume)?;
    cx.ctl()
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest::default())
        .await
        .expect_code(
            Code::InvalidArgument,
            "ControllerUnpublishVolume without a volume id",
        )
}
