//! Per-tenant identity on real DAOS: a worker started with a tenant's uid (`--uid`) loads
//! DAOS's libraries as root, drops to that uid, and only then connects to its pool, so the
//! node's agent vouches for the uid, which its `client_user_map` maps to the tenant's DAOS
//! name; DAOS's pool and container ACLs then decide what the worker may mount.

mod common;

use common::{
    Backing, KeeperMount, Opts, WorkerProc, can_mount, pass_fuse_fd, tempdir, worker_bin,
};
use dpufs_e2e::daos_system::{self, DaosSystem};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TENANT_A: (u32, &str) = (20001, "tenant-a");
const TENANT_B: (u32, &str) = (20002, "tenant-b");
/// A uid the agent has no entry for.
const UNMAPPED: u32 = 20003;

/// Container `container` of pool `tank`, served as uid `uid`.
struct TenantVolume<'a> {
    daos: &'a DaosSystem,
    container: &'a str,
    uid: u32,
}

impl Backing for TenantVolume<'_> {
    fn worker_args(&self) -> Vec<String> {
        let uid = self.uid.to_string();
        vec![
            "--backend".into(),
            format!("daos:tank/{}", self.container),
            "--daos-lib".into(),
            self.daos.prefix.lib_dir().display().to_string(),
            "--uid".into(),
            uid.clone(),
            "--gid".into(),
            uid,
        ]
    }

    fn worker_env(&self) -> Vec<(String, String)> {
        let log = self.daos.log_dir().join(format!("worker-{}.log", self.uid));
        vec![
            (
                "DAOS_AGENT_DRPC_DIR".into(),
                self.daos.agent_dir().display().to_string(),
            ),
            ("D_LOG_FILE".into(), log.display().to_string()),
        ]
    }
}

/// What a worker that must not start says on its way out.
fn refusal(volume: &TenantVolume<'_>) -> String {
    let keeper = KeeperMount::new();
    let state = tempdir("dpufs-tenant-state-");
    let mut cmd = Command::new(worker_bin());
    cmd.arg("worker").args(volume.worker_args());
    pass_fuse_fd(&mut cmd, keeper.raw_fd());
    let mut child = cmd
        .arg("--state-dir")
        .arg(state.path())
        .envs(volume.worker_env())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the worker of uid {} kept running", volume.uid);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("uid {} on {}: {}", volume.uid, volume.container, err.trim());
    err
}

#[test]
fn a_tenants_worker_mounts_what_daos_grants_its_uid_on_daos_2_8_0() {
    tenants(
        "a_tenants_worker_mounts_what_daos_grants_its_uid_on_daos_2_8_0",
        "2.8.0",
    );
}

#[test]
fn a_tenants_worker_mounts_what_daos_grants_its_uid_on_daos_2_6_5() {
    tenants(
        "a_tenants_worker_mounts_what_daos_grants_its_uid_on_daos_2_6_5",
        "2.6.5",
    );
}

fn tenants(test: &str, version: &str) {
    if !can_mount() {
        return;
    }
    let Some(daos) = daos_system::with_pool(test, version, "1GiB", &[TENANT_A, TENANT_B]) else {
        return;
    };
    for (container, (_, tenant)) in [("vol-a", TENANT_A), ("vol-b", TENANT_B)] {
        let entry = format!("A::{tenant}@:r");
        daos.dmg(&["pool", "update-acl", "tank", "--entry", &entry])
            .unwrap();
        daos.daos(&["cont", "create", "tank", container, "--type=POSIX"])
            .unwrap();
        let entry = format!("A::{tenant}@:rwt");
        daos.daos(&["cont", "update-acl", "tank", container, "--entry", &entry])
            .unwrap();
    }

    // Tenant A's worker serves vol-a as tenant A's uid.
    let volume_a = TenantVolume {
        daos: &daos,
        container: "vol-a",
        uid: TENANT_A.0,
    };
    let keeper = KeeperMount::new();
    let state = tempdir("dpufs-tenant-state-");
    let worker = WorkerProc::start_at(
        &volume_a,
        &keeper.mountpoint,
        state.path(),
        Opts {
            args: Vec::new(),
            fuse_fd: Some(keeper.raw_fd()),
        },
        Vec::new(),
    );
    assert_eq!(worker.control("health")["uid"], TENANT_A.0);
    std::fs::write(keeper.mountpoint.join("a.txt"), b"tenant a").unwrap();
    assert_eq!(
        std::fs::read(keeper.mountpoint.join("a.txt")).unwrap(),
        b"tenant a"
    );

    // Tenant B's uid may not open vol-a: DAOS refuses, and the worker says so.
    let err = refusal(&TenantVolume {
        uid: TENANT_B.0,
        ..volume_a
    });
    assert!(err.contains("mount DAOS container tank/vol-a"), "{err}");
    assert!(
        err.contains("DER_NO_PERM") || err.to_lowercase().contains("permission"),
        "{err}"
    );
    // A uid the agent cannot name gets no credential at all.
    let err = refusal(&TenantVolume {
        uid: UNMAPPED,
        container: "vol-b",
        ..volume_a
    });
    assert!(err.contains("mount DAOS container tank/vol-b"), "{err}");
    assert!(err.contains("connecting to pool tank"), "{err}");
    // Tenant B's own container is its to mount.
    let keeper_b = KeeperMount::new();
    let state_b = tempdir("dpufs-tenant-state-");
    let worker_b = WorkerProc::start_at(
        &TenantVolume {
            daos: &daos,
            container: "vol-b",
            uid: TENANT_B.0,
        },
        &keeper_b.mountpoint,
        state_b.path(),
        Opts {
            args: Vec::new(),
            fuse_fd: Some(keeper_b.raw_fd()),
        },
        Vec::new(),
    );
    assert!(
        std::fs::read_dir(&keeper_b.mountpoint)
            .unwrap()
            .next()
            .is_none(),
        "vol-b is empty: tenant A's file is in vol-a only"
    );
    drop((worker, worker_b));
}
