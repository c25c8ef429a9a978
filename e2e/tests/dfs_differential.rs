//! The differential POSIX suite (`dpufs_daos::dfs::conformance`) against a container of the
//! engine, reached through `EngineDfs` and the engine's data service: every case must give
//! what a local directory gives, apart from the documented DFS differences.

mod dfs_support;

use dfs_support::TestEngine;
use dpufs_daos::dfs::{LocalDfs, conformance};
use dpufs_engine::dfs_service::Rights;
use dpufs_proto::daos::props::CONT_DPUFS_CHUNK_SIZE;

fn run_suite(chunk_size: Option<u64>) {
    let engine = TestEngine::start(2);
    let pool = engine.pool("tank", 64 << 20, 1 << 30);
    let props: Vec<(u32, u64)> = chunk_size
        .map(|cs| (CONT_DPUFS_CHUNK_SIZE, cs))
        .into_iter()
        .collect();
    let cont = engine.container(&pool, "vol", &props);
    let subject = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    assert_eq!(
        subject.mount_info().chunk_size,
        chunk_size.unwrap_or(1 << 20)
    );
    let local = tempfile::tempdir().unwrap();
    let reference = LocalDfs::open(local.path()).unwrap();
    let report = conformance::run_all(&reference, &subject);
    report.assert_passed();
    assert_eq!(report.passed.len(), conformance::cases().len());
}

#[test]
fn engine_agrees_with_a_local_directory() {
    run_suite(None);
}

#[test]
fn engine_agrees_with_small_chunks_too() {
    // 4 KiB chunks: every case crosses many chunk boundaries and both ranks.
    run_suite(Some(4 << 10));
}
