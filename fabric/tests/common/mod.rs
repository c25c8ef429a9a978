//! Set-up shared by the fabric test binaries: a scratch device directory, a key-value
//! session server on node 2 of it trusting one node agent, and the per-case tests of the
//! conformance suite. Each binary uses a part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use dpufs_fabric::session::testing::KvStore;
use dpufs_fabric::session::{AgentKey, RunningServer, ServerConfig, SessionServer, TrustedAgents};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};

/// A device directory in shared memory, like the default one, else in the temp dir.
pub fn device_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::Builder::new().prefix(prefix).tempdir())
        .expect("temp device dir")
}

/// A session server serving `store` on a new context of node 2's device in `dir`, trusting
/// capabilities signed by `agent`.
pub fn kv_server(
    dir: &Path,
    agent: &AgentKey,
    store: &Arc<KvStore>,
    config: ServerConfig,
) -> RunningServer<SoftDevice> {
    let mut trusted = TrustedAgents::new();
    trusted.add(agent.public_key().unwrap());
    let dev = SoftDevice::open(&DeviceOptions::new("node2").in_dir(dir)).unwrap();
    let listen = "127.0.0.1:0".parse().unwrap();
    SessionServer::bind(dev, listen, trusted, store.handler(), config)
        .unwrap()
        .spawn()
        .unwrap()
}

/// A test's session server: a device directory, the node agent key it trusts, and a server
/// on node 2 serving a [`KvStore`].
pub struct KvBed {
    pub dir: tempfile::TempDir,
    pub agent: AgentKey,
    pub store: Arc<KvStore>,
    pub server: RunningServer<SoftDevice>,
}

impl KvBed {
    /// A bed in a new device directory named with `prefix`.
    pub fn start(prefix: &str, config: ServerConfig) -> KvBed {
        let dir = device_dir(prefix);
        let agent = AgentKey::generate().unwrap();
        let store = KvStore::new();
        let server = kv_server(dir.path(), &agent, &store, config);
        KvBed {
            dir,
            agent,
            store,
            server,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.server().local_addr()
    }
}

/// One `#[test]` per conformance case, each calling the including file's `run_case(name)`,
/// and a test that its provider (the including file's `type Device`) has no case without
/// one. Used as `dpufs_fabric::conformance_cases!(case_tests);`.
#[allow(unused_macros)] // by the conformance binaries only
macro_rules! case_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_case(stringify!($name));
            }
        )*

        #[test]
        fn every_case_has_a_test() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in dpufs_fabric::conformance::cases::<Device>() {
                assert!(tested.contains(&name), "case {name} has no test");
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use case_tests;
