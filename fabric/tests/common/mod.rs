//! Set-up shared by the session test binaries: a scratch device directory and a key-value
//! session server on node 2 of it, trusting one node agent.

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
