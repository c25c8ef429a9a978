//! DFS over the real fabric: a `dpufs-engine` process serving its data service on the software
//! RDMA device, a tenant session in this process (its own device context, PD, QPs, scoped
//! rkeys), and `EngineDfs` on top.
//!
//! - the differential POSIX suite agrees with a local directory over this path too;
//! - kill -9 of the engine during writes loses nothing that was fsync'd, and the restarted
//!   engine serves a consistent namespace;
//! - a capability the engine does not trust is refused at connect.

use dpufs_daos::dfs::{Dfs, DfsResult, EngineDfs, LocalDfs, ROOT_OID, conformance, fabric};
use dpufs_e2e::volume::EngineVolume;
use dpufs_fabric::session::{AgentKey, Rights, SessionConfig, TenantSession};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A new tenant session (a worker's) mounted on the volume's container with a capability
/// signed by `agent`.
fn mount_with(
    vol: &EngineVolume,
    agent: &AgentKey,
) -> (TenantSession<SoftDevice>, DfsResult<EngineDfs>) {
    let device =
        SoftDevice::open(&DeviceOptions::new("worker-node").in_dir(&vol.fabric_dir)).unwrap();
    let session = TenantSession::open(device, SessionConfig::default()).unwrap();
    let cap = vol.capability_by(agent, Rights::READ_WRITE, Duration::from_secs(600));
    let dfs = fabric::mount(&session, vol.fabric_addr(), cap);
    (session, dfs)
}

fn mount(vol: &EngineVolume) -> (TenantSession<SoftDevice>, EngineDfs) {
    let (session, dfs) = mount_with(vol, &vol.agent);
    (session, dfs.expect("mount over the fabric"))
}

fn start() -> EngineVolume {
    EngineVolume::start(2, 2 << 30)
}

#[test]
fn the_differential_suite_passes_over_the_fabric() {
    let stack = start();
    let (_session, subject) = mount(&stack);
    let local = tempfile::tempdir().unwrap();
    let reference = LocalDfs::open(local.path()).unwrap();
    let report = conformance::run_all(&reference, &subject);
    report.assert_passed();
    assert_eq!(report.passed.len(), conformance::cases().len());
}

#[test]
fn large_io_moves_byte_exact_through_scoped_rkeys() {
    let stack = start();
    let (session, dfs) = mount(&stack);
    let f = dfs.create(ROOT_OID, "big", 0o644, 0, 0).unwrap();
    // 9 MiB + 123 bytes at an unaligned offset: many pipelined 1 MiB pieces.
    let data: Vec<u8> = (0..(9 << 20) + 123).map(|i| (i * 31 % 251) as u8).collect();
    dfs.write(f.oid, 4097, &data).unwrap();
    let mut back = vec![0; data.len()];
    assert_eq!(dfs.read(f.oid, 4097, &mut back).unwrap(), data.len());
    assert!(back == data, "data differs after the round trip");
    let stats = session.stats();
    assert!(
        stats.binds >= 18,
        "every piece is bound to its own window: {stats:?}"
    );
}

#[test]
fn a_capability_from_an_untrusted_agent_is_refused() {
    let stack = start();
    let stranger = AgentKey::generate().unwrap();
    let (_session, dfs) = mount_with(&stack, &stranger);
    let err = dfs.expect_err("an untrusted agent's capability must be refused");
    assert_eq!(err.errno, dpufs_daos::dfs::Errno::ACCES, "{err}");
}

/// kill -9 of the engine process while a writer is busy: everything acknowledged by fsync is
/// there after the restart, and the namespace is consistent (every entry resolves, new writes
/// work).
#[test]
fn kill_dash_nine_during_writes_loses_nothing_fsynced() {
    let mut stack = start();
    let synced = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (session, dfs) = mount(&stack);
        let (synced, stop) = (synced.clone(), stop.clone());
        std::thread::spawn(move || {
            let _session = session;
            // File n holds n's pattern; it counts once it and its entry are fsync'd.
            for n in 0u64.. {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(f) = dfs.create(ROOT_OID, &format!("f{n}"), 0o644, 0, 0) else {
                    break;
                };
                let body = pattern(n);
                if dfs.write(f.oid, 0, &body).is_err() || dfs.fsync(f.oid, false).is_err() {
                    break;
                }
                synced.store(n + 1, Ordering::Release);
                // Unsynced extra writes in between: may or may not survive.
                let _ = dfs.write(f.oid, body.len() as u64, b"tail-not-synced");
            }
        })
    };
    while synced.load(Ordering::Acquire) < 20 {
        std::thread::sleep(Duration::from_millis(20));
    }
    stack.engine.crash_and_restart().unwrap();
    stop.store(true, Ordering::Release);
    writer.join().unwrap();
    let acknowledged = synced.load(Ordering::Acquire);

    let (_session, dfs) = mount(&stack);
    for n in 0..acknowledged {
        let f = dfs
            .lookup(ROOT_OID, &format!("f{n}"))
            .unwrap_or_else(|e| panic!("fsync'd file f{n} is gone: {e}"));
        let body = pattern(n);
        let mut back = vec![0; body.len()];
        assert_eq!(dfs.read(f.oid, 0, &mut back).unwrap(), body.len());
        assert!(back == body, "fsync'd data of f{n} differs");
    }
    let listing = conformance::list(&dfs, ROOT_OID, 64).unwrap();
    assert!(listing.len() as u64 >= acknowledged);
    for name in &listing {
        dfs.lookup(ROOT_OID, name)
            .unwrap_or_else(|e| panic!("listed entry {name} does not resolve: {e}"));
    }
    let f = dfs.create(ROOT_OID, "after", 0o644, 0, 0).unwrap();
    dfs.write(f.oid, 0, b"new writes work").unwrap();
}

fn pattern(n: u64) -> Vec<u8> {
    (0..(64 << 10) + n as usize)
        .map(|i| (i as u64 ^ n.wrapping_mul(2654435761)) as u8)
        .collect()
}
