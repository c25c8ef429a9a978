//! The CSI driver over a real DAOS system: a static directory whose system has `backend:
//! daos`. The controller creates each volume as a DAOS container through libdaos, granted to
//! its tenant's principal; the node plugin gives each tenant the uid its directory entry
//! names, or one of its `--tenant-uids` range, records it with the agent's user map, and
//! serves the volume with a libdfs worker running as that uid, which DAOS's agent vouches
//! for and DAOS's ACLs judge.

mod common;

use common::{can_mount, worker_bin};
use dpufs_e2e::csi_bed::{BedOptions, CsiPlugins, tempdir, two_tenants};
use dpufs_e2e::daos_system::{self, DaosSystem};
use tonic::Code;

/// team-a gets the first uid of the node's range.
const TEAM_A: (u32, &str) = (20001, "team-a");
/// team-b's directory entry names its uid, outside the range.
const TEAM_B: (u32, &str) = (30002, "team-b");

#[tokio::test(flavor = "multi_thread")]
async fn csi_volumes_are_served_as_their_tenants_uid_on_daos_2_8_0() {
    csi_on_daos(
        "csi_volumes_are_served_as_their_tenants_uid_on_daos_2_8_0",
        "2.8.0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn csi_volumes_are_served_as_their_tenants_uid_on_daos_2_6_5() {
    csi_on_daos(
        "csi_volumes_are_served_as_their_tenants_uid_on_daos_2_6_5",
        "2.6.5",
    )
    .await;
}

/// The plugins over `daos`'s pool `tank` (the directory's pool `fast`), the node's tenant
/// uids from 20001, team-b's fixed at 30002.
async fn plugins(daos: &DaosSystem) -> CsiPlugins {
    let pool = daos
        .dmg_json(&["pool", "query", "tank"])
        .expect("dmg pool query")["uuid"]
        .as_str()
        .expect("the pool's uuid")
        .to_string();
    let system = serde_json::json!({
        "name": daos_system::SYSTEM_NAME,
        "endpoints": [daos.endpoint()],
        "backend": "daos",
    });
    let env = vec![
        (
            "DPUFS_DAOS_LIB".to_string(),
            daos.prefix.lib_dir().display().to_string(),
        ),
        (
            "DAOS_AGENT_DRPC_DIR".to_string(),
            daos.agent_dir().display().to_string(),
        ),
        (
            "D_LOG_FILE".to_string(),
            daos.log_dir().join("csi-client.log").display().to_string(),
        ),
    ];
    let mut opts = BedOptions::new(worker_bin());
    opts.log_to_files = true;
    let node_args = vec!["--tenant-uids".into(), "20001-20009".into()];
    // Open to others, as /var/lib/dpufs is: the workers run as their tenants' uids and pass
    // through it to their own state directories.
    let dir = tempdir("dpufs-csi-daos-");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the bed");
    let mut tenants = two_tenants();
    tenants[1]["uid"] = TEAM_B.0.into();
    CsiPlugins::start(opts, dir, system, pool, tenants, node_args, env).await
}

/// The uid a process runs as (`/proc/PID/status`, its real uid).
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .expect("a Uid line")
}

/// The uid of the worker serving keeper volume `volume`.
fn worker_uid(plugins: &CsiPlugins, volume: &str) -> u32 {
    let pid = plugins
        .keeper_volumes()
        .into_iter()
        .find(|(v, _)| v == volume)
        .and_then(|(_, pid)| pid)
        .unwrap_or_else(|| panic!("no worker serves {volume}"));
    uid_of(pid)
}

async fn csi_on_daos(test: &str, version: &str) {
    if !can_mount() {
        return;
    }
    let Some(daos) = daos_system::with_pool(test, version, "2GiB", &[TEAM_A, TEAM_B]) else {
        return;
    };
    for (_, tenant) in [TEAM_A, TEAM_B] {
        let entry = format!("A::{tenant}@:r");
        daos.dmg(&["pool", "update-acl", "tank", "--entry", &entry])
            .expect("dmg pool update-acl");
    }
    let bed = plugins(&daos).await;

    // team-a's volume: a DAOS container granted to team-a@, served as team-a's uid.
    let a = bed.create("pvc-a", "ns-a").await;
    let acl = daos
        .daos(&["cont", "get-acl", "tank", container_of(&a.volume_id)])
        .expect("daos cont get-acl");
    assert!(acl.contains("A::team-a@:rwt"), "{acl}");
    let mount_a = bed.mount(&a.volume_id, "pod-a").await;
    std::fs::write(mount_a.1.join("a.txt"), b"written by team-a's pod").unwrap();
    assert_eq!(
        std::fs::read(mount_a.1.join("a.txt")).unwrap(),
        b"written by team-a's pod"
    );
    let served: Vec<(String, Option<u32>)> = bed.keeper_volumes();
    assert_eq!(served.len(), 1, "{served:?}");
    assert_eq!(worker_uid(&bed, &served[0].0), TEAM_A.0);

    // team-b's volume gets the uid its directory entry names.
    let b = bed.create("pvc-b", "ns-b").await;
    let staging_b = bed.path("pod-b-globalmount");
    std::fs::create_dir_all(&staging_b).unwrap();
    bed.stage(&b.volume_id, &staging_b).await.expect("stage b");
    let target_b = bed.path("pod-b/mount");
    std::fs::create_dir_all(target_b.parent().unwrap()).unwrap();
    bed.publish(&b.volume_id, &staging_b, &target_b, "ns-b", false)
        .await
        .expect("publish b");
    let volume_b = bed
        .keeper_volumes()
        .into_iter()
        .map(|(v, _)| v)
        .find(|v| *v != served[0].0)
        .expect("b's keeper volume");
    assert_eq!(worker_uid(&bed, &volume_b), TEAM_B.0);
    assert!(
        std::fs::read_dir(&target_b).unwrap().next().is_none(),
        "team-b's volume is its own container"
    );

    // The node recorded both uids, and the agent's files name them.
    let csi = bed.state.join("csi");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(csi.join("tenant-uids.json")).unwrap())
            .unwrap();
    assert_eq!(
        record["uids"],
        serde_json::json!({"team-a@": TEAM_A.0, "team-b@": TEAM_B.0})
    );
    let map = std::fs::read_to_string(csi.join("agent-user-map.yaml")).unwrap();
    for (uid, user) in [TEAM_A, TEAM_B] {
        assert!(
            map.contains(&format!("    {uid}:\n      user: {user}\n")),
            "{map}"
        );
    }

    // A pod of team-b may not use team-a's volume.
    let intruder = bed.path("intruder/mount");
    std::fs::create_dir_all(intruder.parent().unwrap()).unwrap();
    let err = bed
        .publish(&a.volume_id, &mount_a.0, &intruder, "ns-b", false)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Everything goes: mounts, workers, containers.
    bed.unmount(&a.volume_id, mount_a).await;
    bed.unpublish(&b.volume_id, &target_b)
        .await
        .expect("unpublish b");
    bed.unstage(&b.volume_id, &staging_b)
        .await
        .expect("unstage b");
    assert!(bed.keeper_volumes().is_empty());
    for v in [&a, &b] {
        bed.delete(&v.volume_id).await;
    }
    let left = daos
        .daos(&["cont", "list", "tank"])
        .expect("daos cont list");
    for v in [&a, &b] {
        assert!(!left.contains(container_of(&v.volume_id)), "{left}");
    }
}

/// The container UUID of a volume id (`v1/<system>/<pool>/<container>`).
fn container_of(volume_id: &str) -> &str {
    volume_id.rsplit('/').next().expect("a container")
}
