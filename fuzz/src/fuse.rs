//! FUSE requests served by the volume worker: the kernel's, or a guest's over virtio-fs in DPU
//! mode (where the sender is a VM, not the kernel we trust). Each input is one request as it
//! arrives on the connection, header and body, handed to fuse-backend-rs's server over the
//! worker's file system (`DfsFs`), whose backend is an engine in this process; replies go
//! to /dev/null. INIT was negotiated once, as on a mount.

use crate::engine::FuzzEngine;
use dpufs_csi::worker::fs::{DfsFs, FsConfig};
use dpufs_csi::worker::stats::Stats;
use dpufs_csi::worker::throttle::Throttle;
use dpufs_daos::dfs::EngineDfs;
use dpufs_node_api::control::OpStats;
use dpufs_node_api::qos::QosLimits;
use fuse_backend_rs::abi::fuse_abi::{Opcode, ROOT_ID as ROOT};
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FuseBuf, FuseDevWriter, Reader};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Largest request the worker reads (its buffer: 1 MiB of data and the header).
const MAX_REQUEST: usize = (1 << 20) + 4096;

pub struct FuseHarness {
    server: Server<Arc<DfsFs>>,
    stats: Arc<Stats>,
    sink: File,
    _engine: FuzzEngine,
}

impl FuseHarness {
    pub fn new() -> FuseHarness {
        let engine = FuzzEngine::start();
        let dfs = EngineDfs::mount(Arc::new(engine.connection())).expect("mount the container");
        let throttle = Arc::new(Throttle::new(QosLimits::UNLIMITED));
        let stats = Arc::new(Stats::new());
        let fs = DfsFs::new(
            Arc::new(dfs),
            None,
            FsConfig::default(),
            stats.clone(),
            None,
            throttle,
        );
        let harness = FuseHarness {
            server: Server::new(Arc::new(fs)),
            stats,
            sink: File::options()
                .write(true)
                .open("/dev/null")
                .expect("/dev/null"),
            _engine: engine,
        };
        harness.serve(&init());
        harness
    }

    /// Whether the worker served the request without an error (its counters say).
    pub fn run(&self, data: &[u8]) -> bool {
        if data.len() > MAX_REQUEST {
            return false;
        }
        let before = self.errors_and_ops();
        self.serve(data);
        let (errors, ops) = self.errors_and_ops();
        errors == before.0 && ops > before.1
    }

    /// The worker's failed and served operations so far.
    fn errors_and_ops(&self) -> (u64, u64) {
        let ops = self.stats.snapshot().ops;
        let sum = |f: fn(&OpStats) -> u64| ops.values().map(f).sum();
        (sum(|o| o.errors), sum(|o| o.count))
    }

    /// Serves one request; a request the server cannot decode or answer is an error, not a
    /// crash.
    fn serve(&self, data: &[u8]) {
        let mut buf = data.to_vec();
        let Ok(reader) = Reader::<()>::from_fuse_buffer(FuseBuf::new(&mut buf)) else {
            return;
        };
        let mut reply = vec![0; MAX_REQUEST];
        let writer = FuseDevWriter::<()>::new(self.sink.as_raw_fd(), &mut reply)
            .expect("a writer to /dev/null");
        let _ = self
            .server
            .handle_message(reader, writer.into(), None, None);
    }
}

/// A request: the header (length, opcode, unique id, node, uid, gid, pid) and `body`.
fn request(opcode: Opcode, node: u64, body: &[u8]) -> Vec<u8> {
    let len = (40 + body.len()) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(opcode as u32).to_le_bytes());
    out.extend_from_slice(&7u64.to_le_bytes());
    out.extend_from_slice(&node.to_le_bytes());
    for id in [1000u32, 1000, 4242, 0] {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(body);
    out
}

fn words(ws: &[u64], sizes: &[usize]) -> Vec<u8> {
    ws.iter()
        .zip(sizes)
        .flat_map(|(w, &n)| w.to_le_bytes()[..n].to_vec())
        .collect()
}

fn with_name(mut body: Vec<u8>, name: &str) -> Vec<u8> {
    body.extend_from_slice(name.as_bytes());
    body.push(0);
    body
}

/// INIT of protocol 7.31 with no flags.
fn init() -> Vec<u8> {
    request(Opcode::Init, 0, &words(&[7, 31, 1 << 17, 0], &[4, 4, 4, 4]))
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    // fh, offset, size, flags, lock owner, flags, padding.
    let io = |size: u64| words(&[0, 0, size, 0, 0, 0, 0], &[8, 8, 4, 4, 8, 4, 4]);
    let mut write = io(5);
    write.extend_from_slice(b"hello");
    // fh, offset, length, mode, padding: 64 KiB reserved (mode 0), or 1 TiB punched.
    let fallocate = |len: u64, mode: u64| words(&[0, 0, len, mode, 0], &[8, 8, 8, 4, 4]);
    let mut setxattr = with_name(words(&[1, 0], &[4, 4]), "user.k");
    setxattr.push(b'v');
    vec![
        ("init", init()),
        ("getattr", request(Opcode::Getattr, ROOT, &[0; 16])),
        (
            "create",
            request(
                Opcode::Create,
                ROOT,
                &with_name(words(&[0o101, 0o100644, 0o22, 0], &[4; 4]), "f"),
            ),
        ),
        (
            "mkdir",
            request(
                Opcode::Mkdir,
                ROOT,
                &with_name(words(&[0o755, 0o22], &[4, 4]), "d"),
            ),
        ),
        (
            "lookup",
            request(Opcode::Lookup, ROOT, &with_name(Vec::new(), "f")),
        ),
        ("write", request(Opcode::Write, 2, &write)),
        ("read", request(Opcode::Read, 2, &io(4096))),
        ("readdirplus", request(Opcode::Readdirplus, ROOT, &io(4096))),
        ("setxattr", request(Opcode::Setxattr, 2, &setxattr)),
        (
            "fallocate",
            request(Opcode::Fallocate, 2, &fallocate(1 << 16, 0)),
        ),
        (
            "fallocate-punch",
            request(Opcode::Fallocate, 2, &fallocate(1 << 40, 3)),
        ),
        (
            "getxattr",
            request(
                Opcode::Getxattr,
                2,
                &with_name(words(&[64, 0], &[4, 4]), "user.k"),
            ),
        ),
    ]
}
