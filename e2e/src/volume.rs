//! An engine volume as a node sees one: a `dpufs-engine` serving its data service on the
//! software fabric for one node agent's key, a pool, a POSIX container in it, and the
//! capabilities that agent signs for workers.

use crate::{EngineNetwork, EngineOpts, EngineProcess};
use dpufs_daos::{ContainerAdmin, ContainerSpec, EngineContainers, PoolSize, PoolSpec};
use dpufs_fabric::session::{AgentKey, Capability, Rights, SignedCapability};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A running engine with one container, and the agent key it trusts. Drop kills the engine
/// and removes the fabric's device directory.
#[derive(Debug)]
pub struct EngineVolume {
    /// The engine process.
    pub engine: EngineProcess,
    /// The node agent's key (the engine trusts its public half).
    pub agent: AgentKey,
    /// Pool and container uuids.
    pub pool: String,
    pub container: String,
    /// The software fabric's device directory (shared memory) for this engine's node.
    pub fabric_dir: PathBuf,
    dir: tempfile::TempDir,
}

impl EngineVolume {
    /// Starts an engine with `ranks` ranks and a pool of `pool_bytes` holding one container.
    pub fn start(ranks: u32, pool_bytes: u64) -> EngineVolume {
        EngineVolume::start_on(ranks, pool_bytes, None)
    }

    /// The same, the engine on `network` (`None`: loopback).
    pub fn start_on(ranks: u32, pool_bytes: u64, network: Option<EngineNetwork>) -> EngineVolume {
        let dir = tempfile::Builder::new()
            .prefix("dpufs-vol-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let agent = AgentKey::generate().expect("agent key");
        let key_file = dir.path().join("agent.pub");
        let pem = agent.public_key().and_then(|k| k.to_pem()).expect("PEM");
        std::fs::write(&key_file, pem).expect("write agent key");
        let fabric_dir = fabric_dir(dir.path());
        let opts = EngineOpts {
            ranks,
            capacity: pool_bytes.max(1 << 30) * 2,
            agent_keys: vec![key_file],
            fabric_dir: Some(fabric_dir.clone()),
            // Expiry tests use capabilities of a few seconds.
            capability_skew_secs: Some(0),
            network,
            ..EngineOpts::default()
        };
        let engine = EngineProcess::start(&dir.path().join("engine"), opts).expect("engine");
        let (pool, container) = provision(&engine, pool_bytes);
        EngineVolume {
            engine,
            agent,
            pool,
            container,
            fabric_dir,
            dir,
        }
    }

    /// The data service's fabric address.
    pub fn fabric_addr(&self) -> std::net::SocketAddr {
        self.engine
            .fabric_addr
            .expect("the engine serves the fabric")
    }

    /// A capability for the container signed by `agent`.
    pub fn capability_by(
        &self,
        agent: &AgentKey,
        rights: Rights,
        ttl: Duration,
    ) -> SignedCapability {
        let claims = Capability::new(
            "tenant-a",
            "vol-1",
            self.pool.clone(),
            self.container.clone(),
            rights,
            ttl,
        );
        agent.sign(&claims).expect("sign")
    }

    /// A read-write capability for ten minutes, signed by the trusted agent.
    pub fn capability(&self) -> SignedCapability {
        self.capability_by(&self.agent, Rights::READ_WRITE, Duration::from_secs(600))
    }

    /// Writes `cap` to a file (hex, as the worker's --capability reads it) and returns its path.
    pub fn write_capability(&self, name: &str, cap: &SignedCapability) -> PathBuf {
        let path = self.dir.path().join(name);
        crate::write_file_atomic(&path, cap.to_hex().as_bytes());
        path
    }

    /// Arguments of `dpufs-csi worker` serving this volume with the capability in `cap_file`.
    pub fn worker_args(&self, cap_file: &Path) -> Vec<String> {
        vec![
            "--backend".into(),
            format!("engine:{}", self.fabric_addr()),
            "--capability".into(),
            cap_file.display().to_string(),
            "--fabric-dir".into(),
            self.fabric_dir.display().to_string(),
        ]
    }

    /// Where the engine keeps its data (the backing directory of benchmarks).
    pub fn data_dir(&self) -> &Path {
        &self.engine.data_dir
    }
}

impl Drop for EngineVolume {
    fn drop(&mut self) {
        self.engine.kill();
        let _ = std::fs::remove_dir_all(&self.fabric_dir);
    }
}

/// A device directory in shared memory (like the default), one per volume for isolation.
fn fabric_dir(base: &Path) -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix("dpufs-e2e-fabric")
        .tempdir_in("/dev/shm")
        .map(|d| d.keep())
        .unwrap_or_else(|_| base.join("fabric"));
    std::fs::create_dir_all(&dir).expect("fabric dir");
    dir
}

fn provision(engine: &EngineProcess, pool_bytes: u64) -> (String, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mgmt = engine.client();
        let pool = mgmt
            .pool_create(&PoolSpec::new("tank", PoolSize::total(pool_bytes)))
            .await
            .expect("pool create")
            .uuid;
        let cont = EngineContainers::new(&mgmt)
            .create(&ContainerSpec {
                pool: pool.clone(),
                label: "vol".into(),
                ..ContainerSpec::default()
            })
            .await
            .expect("container create")
            .uuid;
        (pool, cont)
    })
}
