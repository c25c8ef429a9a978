//! Fuzz targets for every decoder that takes bytes from another process (docs/reliability.md,
//! "Fuzzing"). Each [`Target`] feeds one input to the decoders a peer reaches with it, the way
//! the receiving process runs them, and checks what they promise beyond not panicking (what
//! decodes encodes back to the same value; the engine answers every request with a message).
//!
//! The `dpufs-fuzz` binary (feature `afl`, built by `cargo afl` in `tools/fuzz.sh`) runs one
//! target under AFL++; this library's tests run every checked-in corpus input through its
//! target, so an input that once crashed stays fixed.

mod csi;
mod dfs;
mod dpu;
mod engine;
mod fabric;
mod fuse;
mod mgmt;
mod node;

use std::path::PathBuf;

/// A fuzz target: what it decodes, and whose bytes those are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Software-RDMA frame headers and QP endpoints; session request and reply headers;
    /// capabilities and their claims (another node's fabric peer).
    FabricWire,
    /// The tenant-session handshake: hello, signed capability checked against a trusted
    /// agent key, claims, and the server's answer (any client of an engine's data port).
    Handshake,
    /// A `DfsRequest` served by an engine's data service (a worker of a tenant).
    DfsRequest,
    /// The keeper's and the worker control socket's request and reply lines, the handover
    /// record, QoS files and mountinfo lines (processes of the node).
    NodeProtocols,
    /// CSI request fields: volume and snapshot ids, StorageClass and VolumeAttributesClass
    /// parameters, endpoints, and CSI messages as kubelet and the sidecars send them.
    CsiFields,
    /// The DPU control channel's and NVIDIA DPF's storage-plugin requests (the host, DPF).
    DpuChannel,
    /// A FUSE request served by the volume worker (the kernel, or a guest over virtio-fs).
    FuseRequest,
    /// A request to the engine's management services (DAOS's `MgmtSvc`, `ContainerSvc`,
    /// `RankControl`), as the operator and the CSI controller send them over gRPC.
    MgmtRequest,
}

impl Target {
    pub const ALL: [Target; 8] = [
        Target::FabricWire,
        Target::Handshake,
        Target::DfsRequest,
        Target::NodeProtocols,
        Target::CsiFields,
        Target::DpuChannel,
        Target::FuseRequest,
        Target::MgmtRequest,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::FabricWire => "fabric_wire",
            Target::Handshake => "handshake",
            Target::DfsRequest => "dfs_request",
            Target::NodeProtocols => "node_protocols",
            Target::CsiFields => "csi_fields",
            Target::DpuChannel => "dpu_channel",
            Target::FuseRequest => "fuse_request",
            Target::MgmtRequest => "mgmt_request",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The checked-in inputs AFL starts from (`fuzz/corpus/<name>`).
    pub fn corpus(self) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(self.name())
    }

    /// What the target needs across inputs (an engine, a file system), made once.
    pub fn harness(self) -> Harness {
        let state = match self {
            Target::Handshake => State::Handshake(fabric::HandshakeKeys::new()),
            Target::DfsRequest => State::Dfs(Box::new(dfs::DfsHarness::new())),
            Target::FuseRequest => State::Fuse(Box::new(fuse::FuseHarness::new())),
            Target::MgmtRequest => State::Mgmt(Box::new(mgmt::MgmtHarness::new())),
            _ => State::None,
        };
        Harness {
            target: self,
            state,
        }
    }
}

/// A target with its state, ready for inputs.
pub struct Harness {
    target: Target,
    state: State,
}

enum State {
    None,
    Handshake(fabric::HandshakeKeys),
    Dfs(Box<dfs::DfsHarness>),
    Fuse(Box<fuse::FuseHarness>),
    Mgmt(Box<mgmt::MgmtHarness>),
}

impl Harness {
    /// Feeds one input to the target's decoders; panics (a crash, to AFL) when one breaks a
    /// promise. Returns whether the input was accepted: it decoded and passed the checks of
    /// its fields (the engine and the worker served it without an error).
    pub fn run(&self, data: &[u8]) -> bool {
        match (&self.state, self.target) {
            (State::Handshake(keys), _) => fabric::handshake(keys, data),
            (State::Dfs(h), _) => h.run(data),
            (State::Fuse(h), _) => h.run(data),
            (State::Mgmt(h), _) => h.run(data),
            (_, Target::FabricWire) => fabric::wire(data),
            (_, Target::NodeProtocols) => node::run(data),
            (_, Target::CsiFields) => csi::run(data),
            (_, Target::DpuChannel) => dpu::run(data),
            (State::None, t) => unreachable!("{} has state", t.name()),
        }
    }
}

/// Seed inputs of every target: valid messages made by the real encoders, which AFL mutates.
pub fn seeds() -> Vec<(Target, &'static str, Vec<u8>)> {
    let mut all = Vec::new();
    let mut add = |t: Target, seeds: Vec<(&'static str, Vec<u8>)>| {
        all.extend(seeds.into_iter().map(|(n, b)| (t, n, b)));
    };
    add(Target::FabricWire, fabric::wire_seeds());
    add(Target::Handshake, fabric::handshake_seeds());
    add(Target::DfsRequest, dfs::seeds());
    add(Target::NodeProtocols, node::seeds());
    add(Target::CsiFields, csi::seeds());
    add(Target::DpuChannel, dpu::seeds());
    add(Target::FuseRequest, fuse::seeds());
    add(Target::MgmtRequest, mgmt::seeds());
    all
}
