//! An engine in this process (`dpufs_e2e::in_process`), with a pool and a container, for the
//! targets whose input an engine or a worker over it serves. A container quota bounds what
//! fuzzed writes can take.

use dpufs_e2e::in_process::{InProcess, TestEngine};
use dpufs_engine::dfs_service::{ConnectionContext, Rights};
use dpufs_proto::daos::props::CONT_DPUFS_QUOTA;

pub struct FuzzEngine {
    engine: TestEngine,
    ctx: ConnectionContext,
}

impl FuzzEngine {
    pub fn start() -> FuzzEngine {
        let engine = TestEngine::start(1);
        let pool = engine.pool("fuzz", 64 << 20, 256 << 20);
        let container = engine.container(&pool, "fuzz", &[(CONT_DPUFS_QUOTA, 32 << 20)]);
        let rights = Rights {
            read: true,
            write: true,
        };
        let ctx = ConnectionContext {
            pool,
            container,
            snapshot: None,
            rights,
        };
        FuzzEngine { engine, ctx }
    }

    /// A connection to the container: requests go to the data service unchanged.
    pub fn connection(&self) -> InProcess {
        InProcess {
            service: self.engine.service.clone(),
            ctx: self.ctx.clone(),
        }
    }
}
