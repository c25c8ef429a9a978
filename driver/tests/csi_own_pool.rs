//! `provisioning: pool`, a volume with a DAOS pool of its own, end to end: the controller and
//! node plugins as processes against a real engine, a real FUSE mount. The pool is checked in
//! the engine itself.

mod common;

use dpufs_csi::csi::VolumeId;
use dpufs_csi::csi::label::label_for;
use dpufs_e2e::csi_bed::{Bed, MIB, cap};
use dpufs_proto::csi::v1::volume_capability::access_mode::Mode;
use dpufs_proto::csi::v1::{self as csi, CreateVolumeRequest};
use std::collections::HashMap;
use std::io::Write;
use tonic::Code;

fn request(name: &str, bytes: i64, params: &[(&str, &str)]) -> CreateVolumeRequest {
    let mut parameters: HashMap<String, String> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parameters.insert("csi.storage.k8s.io/pvc/namespace".into(), "ns-a".into());
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(Mode::MultiNodeMultiWriter)],
        parameters,
        ..Default::default()
    }
}

const OWN: (&str, &str) = ("provisioning", "pool");

async fn create(bed: &Bed, req: CreateVolumeRequest) -> Result<csi::Volume, tonic::Status> {
    let r = bed.ctl.clone().create_volume(req).await?;
    Ok(r.into_inner().volume.expect("a volume"))
}

/// The labels of the engine's pools.
async fn pool_labels(bed: &Bed) -> Vec<String> {
    let pools = bed.vol.engine.client().list_pools().await.expect("pools");
    pools.into_iter().map(|p| p.label).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_with_a_pool_of_its_own_is_sized_enforced_listed_and_destroyed_with_it() {
    let bed = common::csi_bed::bed().await;
    let mgmt = bed.vol.engine.client();
    let vol = create(&bed, request("pvc-own", 64 * MIB, &[OWN]))
        .await
        .expect("CreateVolume");
    let id = VolumeId::parse(&vol.volume_id).unwrap();
    assert_ne!(id.pool.to_string(), bed.vol.pool, "not the shared pool");
    let info = mgmt.pool_query(&id.pool.to_string()).await.unwrap();
    assert_eq!(info.label, label_for("pvc-own"));
    let data = info.tiers.iter().find(|t| t.media == "NVME").unwrap().total;
    assert!(
        (64 << 20..72 << 20).contains(&data),
        "the data tier holds the capacity, not much more: {data}"
    );
    let acl = mgmt.pool_get_acl(&id.pool.to_string()).await.unwrap();
    assert!(acl.entries.iter().any(|e| e == "A::team-a@:r"), "{acl:?}");

    // Idempotent by name; another size or a shared pool for the same name is refused.
    let again = create(&bed, request("pvc-own", 64 * MIB, &[OWN])).await;
    assert_eq!(again.unwrap().volume_id, vol.volume_id);
    let bigger = create(&bed, request("pvc-own", 128 * MIB, &[OWN])).await;
    assert_eq!(bigger.unwrap_err().code(), Code::AlreadyExists);
    let shared = create(&bed, request("pvc-own", 64 * MIB, &[("pool", "fast")])).await;
    let shared = shared.unwrap_err();
    assert_eq!(shared.code(), Code::AlreadyExists, "{}", shared.message());
    let listed = bed
        .ctl
        .clone()
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed
            .entries
            .iter()
            .any(|e| e.volume.as_ref().unwrap().volume_id == vol.volume_id),
        "ListVolumes shows it"
    );

    // Mounted: the capacity holds, and no more.
    let mount = bed.mount(&vol.volume_id, "own").await;
    let mut f = std::fs::File::create(mount.1.join("fill")).unwrap();
    let chunk = vec![7u8; MIB as usize];
    let mut written = 0;
    let err = loop {
        match f.write_all(&chunk).and_then(|_| f.sync_data()) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written <= 80, "wrote {written} MiB into a 64 MiB volume");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(written >= 60, "only {written} MiB fit");
    drop(f);
    bed.unmount(&vol.volume_id, mount).await;

    // A snapshot keeps the deleted volume's pool; its last snapshot takes it.
    let snap = bed.snapshot("snap-own", &vol.volume_id).await;
    let mut from_snap = request("pvc-from-own", 64 * MIB, &[OWN]);
    from_snap.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            },
        )),
    });
    let refused = create(&bed, from_snap).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::InvalidArgument,
        "{}",
        refused.message()
    );
    bed.delete(&vol.volume_id).await;
    assert!(pool_labels(&bed).await.contains(&label_for("pvc-own")));
    bed.ctl
        .clone()
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!pool_labels(&bed).await.contains(&label_for("pvc-own")));

    // Without snapshots, DeleteVolume takes the pool at once; twice is fine.
    let other = create(&bed, request("pvc-own-2", 32 * MIB, &[OWN]))
        .await
        .unwrap();
    assert!(pool_labels(&bed).await.contains(&label_for("pvc-own-2")));
    bed.delete(&other.volume_id).await;
    bed.delete(&other.volume_id).await;
    assert_eq!(pool_labels(&bed).await, vec!["tank".to_string()]);
}
