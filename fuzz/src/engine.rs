//! An engine in this process (`dpufs_e2e::in_process`), with a pool and a container, for the
//! targets whose input an engine or a worker over it serves. A container quota bounds what
//! fuzzed writes can take.

use dpufs_e2e::in_process::{InProcess, TestEngine};
use dpufs_engine::dfs_service::{ConnectionContext, Rights};
use dpufs_proto::daos::props::CONT_DPUFS_QUOTA;

pub struct FuzzEngine {
    engine: TestEngine,
    ctx: ConnectionContext,
    // Removed after the engine.
    _data: tempfile::TempDir,
}

/// Where the engine keeps its data: under `$DPUFS_FUZZ_DATA` (tools/fuzz.sh makes it, and
/// removes it with what AFL++'s killed children left there), else in memory (tmpfs) where there
/// is one. On a disk, a write-back storm of other work (a CI run's build) can stall one
/// metadata change for seconds, which AFL++ would report as a hang of the target.
fn data_dir() -> tempfile::TempDir {
    let shm = std::path::PathBuf::from("/dev/shm");
    let parent = match std::env::var_os("DPUFS_FUZZ_DATA") {
        Some(dir) => Some(std::path::PathBuf::from(dir)),
        None => shm.is_dir().then_some(shm),
    };
    let made = parent.and_then(|p| tempfile::tempdir_in(p).ok());
    made.unwrap_or_else(|| tempfile::tempdir().expect("a data directory"))
}

impl FuzzEngine {
    pub fn start() -> FuzzEngine {
        let data = data_dir();
        let engine = TestEngine::start_at(data.path(), 1);
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
        FuzzEngine {
            engine,
            ctx,
            _data: data,
        }
    }

    /// The engine itself, for its management services.
    pub fn engine(&self) -> std::sync::Arc<dpufs_engine::Engine> {
        self.engine.engine.clone()
    }

    /// A connection to the container: requests go to the data service unchanged.
    pub fn connection(&self) -> InProcess {
        InProcess {
            service: self.engine.service.clone(),
            ctx: self.ctx.clone(),
        }
    }
}
