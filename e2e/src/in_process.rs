//! An engine in this process with its DFS data service reached through an in-process
//! [`DfsTransport`]: the request bytes go to `DataService::handle` unchanged and the bulk
//! buffer is the caller's own memory, standing in for RMA against a scoped rkey. The run
//! over the real fabric uses the same tests with another transport.

use dpufs_daos::dfs::{Bulk, DfsResult, DfsTransport, EngineDfs, TransportReply};
use dpufs_engine::dfs_service::{BulkIo, ConnectionContext, DataService, NoBulk, Rights};
use dpufs_engine::{Engine, EngineConfig};
use dpufs_proto::engine::v1 as eng;
use dpufs_proto::mgmt;
use std::sync::Arc;

/// The caller's buffer as the engine sees it: bounds-checked like an rkey's window.
#[derive(Debug)]
pub enum SliceBulk<'a> {
    ToServer(&'a [u8]),
    FromServer(&'a mut [u8], usize),
}

fn out_of_window() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "outside the rkey's window",
    )
}

impl BulkIo for SliceBulk<'_> {
    fn len(&self) -> usize {
        match self {
            SliceBulk::ToServer(b) => b.len(),
            SliceBulk::FromServer(b, _) => b.len(),
        }
    }
    fn pull(&mut self, offset: usize, out: &mut [u8]) -> std::io::Result<()> {
        match self {
            SliceBulk::ToServer(b) => {
                let end = offset.checked_add(out.len()).ok_or_else(out_of_window)?;
                let src = b.get(offset..end).ok_or_else(out_of_window)?;
                out.copy_from_slice(src);
                Ok(())
            }
            // The read-landing buffer is registered remote-write only.
            SliceBulk::FromServer(..) => Err(out_of_window()),
        }
    }
    fn push(&mut self, offset: usize, data: &[u8]) -> std::io::Result<()> {
        match self {
            SliceBulk::FromServer(b, moved) => {
                let end = offset.checked_add(data.len()).ok_or_else(out_of_window)?;
                b.get_mut(offset..end)
                    .ok_or_else(out_of_window)?
                    .copy_from_slice(data);
                *moved = (*moved).max(end);
                Ok(())
            }
            SliceBulk::ToServer(_) => Err(out_of_window()),
        }
    }
}

/// Requests of one connection, served by calling the data service directly.
#[derive(Debug)]
pub struct InProcess {
    pub service: DataService,
    pub ctx: ConnectionContext,
}

impl DfsTransport for InProcess {
    fn call(&self, request: &[u8], bulk: Bulk<'_>) -> DfsResult<TransportReply> {
        let (message, bulk_bytes) = match bulk {
            Bulk::None => (self.service.handle(&self.ctx, request, &mut NoBulk), 0),
            Bulk::ToServer(data) => {
                let n = data.len();
                let mut b = SliceBulk::ToServer(data);
                (self.service.handle(&self.ctx, request, &mut b), n)
            }
            Bulk::FromServer(buf) => {
                let mut b = SliceBulk::FromServer(buf, 0);
                let message = self.service.handle(&self.ctx, request, &mut b);
                let SliceBulk::FromServer(_, moved) = b else {
                    unreachable!()
                };
                (message, moved)
            }
        };
        Ok(TransportReply {
            message,
            bulk_bytes,
        })
    }
}

/// An engine in this process with its data in a temporary directory.
#[derive(Debug)]
pub struct TestEngine {
    pub engine: Arc<Engine>,
    pub service: DataService,
    /// The data directory.
    pub path: std::path::PathBuf,
    /// Removes it at the end, when the engine made it.
    _owned: Option<tempfile::TempDir>,
    // Dropped last: the ranks' listeners run on it.
    rt: tokio::runtime::Runtime,
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

impl TestEngine {
    /// An engine with `ranks` ranks in a new temporary directory.
    pub fn start(ranks: u32) -> TestEngine {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut engine = Self::start_at(dir.path(), ranks);
        engine._owned = Some(dir);
        engine
    }

    /// An engine on the data already in `path` (or a new one there), left in place.
    pub fn start_at(path: &std::path::Path, ranks: u32) -> TestEngine {
        let rt = runtime();
        let engine = Self::boot(&rt, path, ranks);
        TestEngine {
            service: DataService::new(engine.clone()),
            engine,
            path: path.to_path_buf(),
            _owned: None,
            rt,
        }
    }

    fn boot(rt: &tokio::runtime::Runtime, dir: &std::path::Path, ranks: u32) -> Arc<Engine> {
        let mut cfg = EngineConfig::new(dir.to_path_buf());
        cfg.ranks = ranks;
        let addr = "127.0.0.1:0".parse().expect("addr");
        Arc::new(rt.block_on(Engine::start(cfg, addr)).expect("engine start"))
    }

    /// Stops this engine and starts a new one on the same data (an orderly restart).
    pub fn restart(self) -> TestEngine {
        let TestEngine {
            engine,
            service,
            path,
            _owned,
            rt,
        } = self;
        let ranks = engine.config().ranks;
        drop(service);
        drop(engine);
        drop(rt);
        let mut engine = Self::start_at(&path, ranks);
        engine._owned = _owned;
        engine
    }

    /// A pool with `scm` and `nvme` bytes per rank; returns its UUID.
    pub fn pool(&self, label: &str, scm: u64, nvme: u64) -> String {
        let uuid = uuid::Uuid::new_v4().to_string();
        self.engine
            .pool_create(mgmt::PoolCreateReq {
                uuid: uuid.clone(),
                properties: vec![mgmt::PoolProperty {
                    number: 1,
                    value: Some(mgmt::pool_property::Value::Strval(label.into())),
                }],
                tier_bytes: vec![scm, nvme],
                ..Default::default()
            })
            .expect("pool create");
        uuid
    }

    /// A container with numeric properties; returns its UUID.
    pub fn container(&self, pool: &str, label: &str, props: &[(u32, u64)]) -> String {
        let properties = props
            .iter()
            .map(|&(number, v)| eng::ContProperty {
                number,
                value: Some(eng::cont_property::Value::Numval(v)),
            })
            .collect();
        self.engine
            .cont_create(eng::ContCreateReq {
                pool: pool.into(),
                label: label.into(),
                properties,
                ..Default::default()
            })
            .expect("container create")
            .uuid
    }

    /// A DFS client of a container (or one of its snapshots).
    pub fn mount(
        &self,
        pool: &str,
        cont: &str,
        snapshot: Option<u64>,
        rights: Rights,
    ) -> EngineDfs {
        let transport = InProcess {
            service: self.service.clone(),
            ctx: ConnectionContext {
                pool: pool.into(),
                container: cont.into(),
                snapshot,
                rights,
            },
        };
        EngineDfs::mount(Arc::new(transport)).expect("mount")
    }

    pub fn cref(pool: &str, cont: &str) -> Option<eng::ContRef> {
        Some(eng::ContRef {
            pool: pool.into(),
            cont: cont.into(),
        })
    }
}
