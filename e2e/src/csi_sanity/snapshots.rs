//! CreateSnapshot, DeleteSnapshot, ListSnapshots and GetSnapshot.

use super::Runner;
use super::support::{Answer, Check, Ctx, Verdict, check_snapshot, ensure, unknown_id};
use dpufs_proto::csi::v1::controller_service_capability::rpc::Type as CtlCap;
use dpufs_proto::csi::v1::{self as csi};
use std::collections::HashSet;
use tonic::Code;

pub(super) async fn cases(r: &mut Runner) {
    r.case(
        "CreateSnapshot: no name is INVALID_ARGUMENT",
        create_no_name,
    )
    .await;
    r.case(
        "CreateSnapshot: no source volume id is INVALID_ARGUMENT",
        create_no_source,
    )
    .await;
    r.case(
        "CreateSnapshot: the same name and source again is OK with the same snapshot",
        create_twice,
    )
    .await;
    r.case(
        "CreateSnapshot: the same name with another source is ALREADY_EXISTS",
        create_other_source,
    )
    .await;
    r.case(
        "CreateSnapshot: a 128-character name works, twice",
        create_long_name,
    )
    .await;
    r.case(
        "DeleteSnapshot: no snapshot id is INVALID_ARGUMENT",
        delete_no_id,
    )
    .await;
    r.case(
        "DeleteSnapshot: an unknown snapshot id is OK",
        delete_unknown,
    )
    .await;
    r.case(
        "DeleteSnapshot: deletes a snapshot, and again is OK",
        delete_twice,
    )
    .await;
    r.case(
        "ListSnapshots: answers without optional fields, every entry a complete snapshot",
        list,
    )
    .await;
    r.case(
        "ListSnapshots: by snapshot id, that snapshot only",
        list_by_id,
    )
    .await;
    r.case(
        "ListSnapshots: an unknown snapshot id lists nothing",
        list_unknown_id,
    )
    .await;
    r.case(
        "ListSnapshots: by source volume, that volume's snapshot only",
        list_by_source,
    )
    .await;
    r.case(
        "ListSnapshots: an unknown source volume lists nothing",
        list_unknown_source,
    )
    .await;
    r.case(
        "ListSnapshots: a new snapshot is listed, a deleted one no longer",
        list_new_and_deleted,
    )
    .await;
    r.case(
        "ListSnapshots: max_entries with next_token, then the rest at once",
        list_pages,
    )
    .await;
    r.case(
        "ListSnapshots: an invalid starting_token is ABORTED",
        list_bad_token,
    )
    .await;
    r.case("GetSnapshot: a snapshot is found by its id", get)
        .await;
    r.case("GetSnapshot: an unknown snapshot is NOT_FOUND", get_unknown)
        .await;
}

fn need(cx: &Ctx) -> Check {
    cx.need_ctl(CtlCap::CreateDeleteSnapshot)
}

fn need_list(cx: &Ctx) -> Check {
    cx.need_ctl(CtlCap::ListSnapshots)
}

async fn create_no_name(cx: Ctx) -> Check {
    need(&cx)?;
    let v = cx.new_volume("snap-noname").await?;
    cx.try_create_snapshot("", &v.volume_id)
        .await
        .expect_code(Code::InvalidArgument, "CreateSnapshot without a name")
}

async fn create_no_source(cx: Ctx) -> Check {
    need(&cx)?;
    cx.try_create_snapshot(&cx.name("snap-nosource"), "")
        .await
        .expect_code(Code::InvalidArgument, "CreateSnapshot without a source")
}

async fn create_twice(cx: Ctx) -> Check {
    need(&cx)?;
    let v = cx.new_volume("snap-twice").await?;
    let name = cx.name("snap-twice");
    let a = cx.create_snapshot(&name, &v.volume_id).await?;
    let b = cx.create_snapshot(&name, &v.volume_id).await?;
    ensure!(
        a.snapshot_id == b.snapshot_id,
        "the same request made two snapshots: {} and {}",
        a.snapshot_id,
        b.snapshot_id
    );
    Ok(())
}

async fn create_other_source(cx: Ctx) -> Check {
    need(&cx)?;
    let first = cx.new_volume("snap-src-a").await?;
    let name = cx.name("snap-shared");
    cx.create_snapshot(&name, &first.volume_id).await?;
    let other = cx.new_volume("snap-src-b").await?;
    cx.try_create_snapshot(&name, &other.volume_id)
        .await
        .expect_code(
            Code::AlreadyExists,
            "CreateSnapshot of a used name from another volume",
        )
}

async fn create_long_name(cx: Ctx) -> Check {
    need(&cx)?;
    let v = cx.new_volume("snap-maxlen").await?;
    let name = cx.name_of_length("snap-maxlen", 128);
    let a = cx.create_snapshot(&name, &v.volume_id).await?;
    let b = cx.create_snapshot(&name, &v.volume_id).await?;
    ensure!(
        a.snapshot_id == b.snapshot_id,
        "two snapshots for one name: {} and {}",
        a.snapshot_id,
        b.snapshot_id
    );
    Ok(())
}

async fn delete(
    cx: &Ctx,
    id: &str,
) -> Result<tonic::Response<csi::DeleteSnapshotResponse>, tonic::Status> {
    cx.ctl()
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: id.to_string(),
            ..Default::default()
        })
        .await
}

async fn delete_no_id(cx: Ctx) -> Check {
    need(&cx)?;
    delete(&cx, "")
        .await
        .expect_code(Code::InvalidArgument, "DeleteSnapshot without an id")
}

async fn delete_unknown(cx: Ctx) -> Check {
    need(&cx)?;
    delete(&cx, &unknown_id(&cx, "snapshot"))
        .await
        .expect_ok("DeleteSnapshot of an unknown id")?;
    Ok(())
}

async fn delete_twice(cx: Ctx) -> Check {
    need(&cx)?;
    let (_, snap) = cx.volume_with_snapshot("snap-delete").await?;
    delete(&cx, &snap.snapshot_id)
        .await
        .expect_ok("DeleteSnapshot")?;
    delete(&cx, &snap.snapshot_id)
        .await
        .expect_ok("DeleteSnapshot again")?;
    if cx.has_ctl(CtlCap::ListSnapshots) {
        let left = list_snapshots(&cx, &snap.snapshot_id, "").await?;
        ensure!(
            left.is_empty(),
            "the deleted snapshot is still listed: {left:?}"
        );
    }
    Ok(())
}

/// One ListSnapshots call (no paging) by snapshot id and/or source.
async fn list_snapshots(
    cx: &Ctx,
    snapshot_id: &str,
    source: &str,
) -> Result<Vec<csi::Snapshot>, Verdict> {
    let r = cx
        .ctl()
        .list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: snapshot_id.to_string(),
            source_volume_id: source.to_string(),
            ..Default::default()
        })
        .await
        .expect_ok("ListSnapshots")?;
    Ok(r.entries.into_iter().filter_map(|e| e.snapshot).collect())
}

/// Every snapshot's id, following next_token.
async fn list_all(cx: &Ctx) -> Result<Vec<String>, Verdict> {
    let mut ids = Vec::new();
    let mut token = String::new();
    for page in 1.. {
        let r = cx
            .ctl()
            .list_snapshots(csi::ListSnapshotsRequest {
                starting_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect_ok(&format!("ListSnapshots (page {page})"))?;
        ids.extend(
            r.entries
                .into_iter()
                .filter_map(|e| e.snapshot)
                .map(|s| s.snapshot_id),
        );
        if r.next_token.is_empty() {
            break;
        }
        ensure!(page < 10_000, "ListSnapshots never ends");
        token = r.next_token;
    }
    Ok(ids)
}

async fn list(cx: Ctx) -> Check {
    need_list(&cx)?;
    let r = cx
        .ctl()
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .expect_ok("ListSnapshots")?;
    for entry in &r.entries {
        let Some(s) = &entry.snapshot else {
            super::support::fail!("an entry without a snapshot: {entry:?}");
        };
        check_snapshot(s, &s.source_volume_id)?;
        ensure!(
            !s.source_volume_id.is_empty(),
            "snapshot {} has no source volume id",
            s.snapshot_id
        );
    }
    Ok(())
}

/// Three volumes with a snapshot each: the one to look for is the second.
async fn three_snapshots(cx: &Ctx) -> Result<csi::Snapshot, Verdict> {
    need(cx)?;
    cx.volume_with_snapshot("list-unrelated-1").await?;
    let (_, target) = cx.volume_with_snapshot("list-target").await?;
    cx.volume_with_snapshot("list-unrelated-2").await?;
    Ok(target)
}

async fn list_by_id(cx: Ctx) -> Check {
    need_list(&cx)?;
    let target = three_snapshots(&cx).await?;
    let found = list_snapshots(&cx, &target.snapshot_id, "").await?;
    ensure!(
        found.len() == 1 && found[0].snapshot_id == target.snapshot_id,
        "ListSnapshots by id {} answered {found:?}",
        target.snapshot_id
    );
    check_snapshot(&found[0], &target.source_volume_id)
}

async fn list_unknown_id(cx: Ctx) -> Check {
    need_list(&cx)?;
    let found = list_snapshots(&cx, &unknown_id(&cx, "snapshot"), "").await?;
    ensure!(
        found.is_empty(),
        "ListSnapshots of an unknown id answered {found:?}"
    );
    Ok(())
}

async fn list_by_source(cx: Ctx) -> Check {
    need_list(&cx)?;
    let target = three_snapshots(&cx).await?;
    let found = list_snapshots(&cx, "", &target.source_volume_id).await?;
    ensure!(
        found.len() == 1 && found[0].snapshot_id == target.snapshot_id,
        "ListSnapshots by source {} answered {found:?}",
        target.source_volume_id
    );
    check_snapshot(&found[0], &target.source_volume_id)
}

async fn list_unknown_source(cx: Ctx) -> Check {
    need_list(&cx)?;
    let found = list_snapshots(&cx, "", &unknown_id(&cx, "volume")).await?;
    ensure!(
        found.is_empty(),
        "ListSnapshots of an unknown source answered {found:?}"
    );
    Ok(())
}

async fn list_new_and_deleted(cx: Ctx) -> Check {
    need_list(&cx)?;
    need(&cx)?;
    let before = list_all(&cx).await?;
    let (_, snap) = cx.volume_with_snapshot("list-new").await?;
    let with = list_all(&cx).await?;
    ensure!(
        with.contains(&snap.snapshot_id) && with.len() == before.len() + 1,
        "{} snapshots before, {} after a new one ({} listed: {})",
        before.len(),
        with.len(),
        snap.snapshot_id,
        with.contains(&snap.snapshot_id)
    );
    delete(&cx, &snap.snapshot_id)
        .await
        .expect_ok("DeleteSnapshot")?;
    let after = list_all(&cx).await?;
    ensure!(
        !after.contains(&snap.snapshot_id) && after.len() == before.len(),
        "{} snapshots before, {} after create and delete",
        before.len(),
        after.len()
    );
    Ok(())
}

async fn list_pages(cx: Ctx) -> Check {
    need_list(&cx)?;
    need(&cx)?;
    let existing = list_all(&cx).await?.len();
    for i in existing..5 {
        cx.volume_with_snapshot(&format!("page-{i}")).await?;
    }
    let all = list_all(&cx).await?;
    let first = cx
        .ctl()
        .list_snapshots(csi::ListSnapshotsRequest {
            max_entries: 2,
            ..Default::default()
        })
        .await
        .expect_ok("ListSnapshots with max_entries 2")?;
    ensure!(
        first.entries.len() == 2,
        "max_entries 2 answered {} entries ({} snapshots exist)",
        first.entries.len(),
        all.len()
    );
    ensure!(
        !first.next_token.is_empty(),
        "{} snapshots exist, but a page of 2 has no next_token",
        all.len()
    );
    let rest = cx
        .ctl()
        .list_snapshots(csi::ListSnapshotsRequest {
            starting_token: first.next_token.clone(),
            ..Default::default()
        })
        .await
        .expect_ok("ListSnapshots from next_token")?;
    ensure!(
        rest.entries.len() == all.len() - 2,
        "after a page of 2 of {} snapshots, the rest has {}",
        all.len(),
        rest.entries.len()
    );
    let ids: HashSet<String> = first
        .entries
        .iter()
        .chain(&rest.entries)
        .filter_map(|e| e.snapshot.as_ref().map(|s| s.snapshot_id.clone()))
        .collect();
    ensure!(
        ids.len() == all.len(),
        "the two pages list {} different snapshots of {}",
        ids.len(),
        all.len()
    );
    Ok(())
}

async fn list_bad_token(cx: Ctx) -> Check {
    need_list(&cx)?;
    cx.ctl()
        .list_snapshots(csi::ListSnapshotsRequest {
            starting_token: format!("invalid-token-{}", cx.run_id),
            ..Default::default()
        })
        .await
        .expect_code(
            Code::Aborted,
            "ListSnapshots with a token the driver never gave",
        )
}

async fn get(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::GetSnapshot)?;
    let (_, snap) = cx.volume_with_snapshot("get").await?;
    let r = cx
        .ctl()
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .expect_ok("GetSnapshot")?;
    let Some(got) = r.snapshot else {
        super::support::fail!("GetSnapshot answered without a snapshot");
    };
    ensure!(
        got.snapshot_id == snap.snapshot_id,
        "GetSnapshot of {} answered {}",
        snap.snapshot_id,
        got.snapshot_id
    );
    check_snapshot(&got, &snap.source_volume_id)
}

async fn get_unknown(cx: Ctx) -> Check {
    cx.need_ctl(CtlCap::GetSnapshot)?;
    cx.ctl()
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: unknown_id(&cx, "snapshot"),
            ..Default::default()
        })
        .await
        .expect_code(Code::NotFound, "GetSnapshot of an unknown snapshot")
}
