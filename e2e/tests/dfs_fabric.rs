//! DFS over the real fabric: a `dpufs-engine` process serving its data service on the software
//! RDMA device, a tenant session in this process (its own device context, PD, QPs, scoped
//! rkeys), and `EngineDfs` on top.
//!
//! - the differential POSIX suite agrees with a local directory over this path too;
//! - kill -9 of the engine during writes loses nothing that was fsync'd, and the restarted
//!   engine serves a consistent namespace;
//! - a capability the engine does not trust is refused at connect.

use dpufs_daos::dfs::{Dfs, DfsResult, EngineDfs, LocalDfs, ROOT_OID, conformance, fabric};
use dpufs_daos::{ContainerAdmin, ContainerSpec, EngineContainers, PoolSize, PoolSpec};
use dpufs_e2e::{EngineOpts, EngineProcess};
use dpufs_fabric::session::{AgentKey, Capability, Rights, SessionConfig, TenantSession};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// An engine with a pool and a POSIX container, and the agent key its data service trusts.
struct Stack {
    _dir: tempfile::TempDir,
    fabric_dir: PathBuf,
    engine: EngineProcess,
    agent: AgentKey,
    pool: String,
    container: String,
}

fn fabric_dir(base: &Path) -> PathBuf {
    // Shared memory, like the default device directory; one per test for isolation.
    let dir = tempfile::Builder::new()
        .prefix("dpufs-e2e-fabric")
        .tempdir_in("/dev/shm")
        .map(|d| d.keep())
        .unwrap_or_else(|_| base.join("fabric"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Stack {
    fn start() -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let agent = AgentKey::generate().unwrap();
        let key_file = dir.path().join("agent.pub");
        std::fs::write(&key_file, agent.public_key().unwrap().to_pem().unwrap()).unwrap();
        let fabric_dir = fabric_dir(dir.path());
        let opts = EngineOpts {
            ranks: 2,
            agent_keys: vec![key_file],
            fabric_dir: Some(fabric_dir.clone()),
            ..EngineOpts::default()
        };
        let engine = EngineProcess::start(&dir.path().join("engine"), opts).unwrap();
        let (pool, container) = provision(&engine);
        Stack {
            _dir: dir,
            fabric_dir,
            engine,
            agent,
            pool,
            container,
        }
    }

    /// A new tenant session (a worker's) mounted on the container with `agent`'s capability.
    fn mount_with(&self, agent: &AgentKey) -> (TenantSession<SoftDevice>, DfsResult<EngineDfs>) {
        let device =
            SoftDevice::open(&DeviceOptions::new("worker-node").in_dir(&self.fabric_dir)).unwrap();
        let session = TenantSession::open(device, SessionConfig::default()).unwrap();
        let claims = Capability::new(
            "tenant-a",
            "vol-1",
            self.pool.clone(),
            self.container.clone(),
            Rights::READ_WRITE,
            Duration::from_secs(600),
        );
        let cap = agent.sign(&claims).unwrap();
        let addr = self
            .engine
            .fabric_addr
            .expect("the engine serves the fabric");
        let dfs = fabric::mount(&session, addr, cap);
        (session, dfs)
    }

    fn mount(&self) -> (TenantSession<SoftDevice>, EngineDfs) {
        let (session, dfs) = self.mount_with(&self.agent);
        (session, dfs.expect("mount over the fabric"))
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.engine.kill();
        let _ = std::fs::remove_dir_all(&self.fabric_dir);
    }
}

fn provision(engine: &EngineProcess) -> (String, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mgmt = engine.client();
        let pool = mgmt
            .pool_create(&PoolSpec::new("tank", PoolSize::total(2 << 30)))
            .await
            .unwrap()
            .uuid;
        let cont = EngineContainers::new(&mgmt)
            .create(&ContainerSpec {
                pool: pool.clone(),
                label: "vol".into(),
                ..ContainerSpec::default()
            })
            .await
            .unwrap()
            .uuid;
        (pool, cont)
    })
}

#[test]
fn the_differential_suite_passes_over_the_fabric() {
    let stack = Stack::start();
    let (_session, subject) = stack.mount();
    let local = tempfile::tempdir().unwrap();
    let reference = LocalDfs::open(local.path()).unwrap();
    let report = conformance::run_all(&reference, &subject);
    report.assert_passed();
    assert_eq!(report.passed.len(), conformance::cases().len());
}

#[test]
fn large_io_moves_byte_exact_through_scoped_rkeys() {
    let stack = Stack::start();
    let (session, dfs) = stack.mount();
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
    let stack = Stack::start();
    let stranger = AgentKey::generate().unwrap();
    let (_session, dfs) = stack.mount_with(&stranger);
    let err = dfs.expect_err("an untrusted agent's capability must be refused");
    assert_eq!(err.errno, dpufs_daos::dfs::Errno::ACCES, "{err}");
}

/// kill -9 of the engine process while a writer is busy: everything acknowledged by fsync is
/// there after the restart, and the namespace is consistent (every entry resolves, new writes
/// work).
#[test]
fn kill_dash_nine_during_writes_loses_nothing_fsynced() {
    let mut stack = Stack::start();
    let synced = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (session, dfs) = stack.mount();
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

    let (_session, dfs) = stack.mount();
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
