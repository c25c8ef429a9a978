//! The differential POSIX suite (`dpufs_daos::dfs::conformance`) against a container of the
//! engine, reached through `EngineDfs` and the engine's data service: every case must give
//! what a local directory gives, apart from the documented DFS differences.

use dpufs_daos::dfs::{LocalDfs, conformance};
use dpufs_e2e::in_process::TestEngine;
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

/// Inline I/O that contradicts itself or exceeds the limit is refused with EINVAL, and a
/// refused write changes nothing.
#[test]
fn malformed_inline_io_is_refused() {
    use dpufs_daos::dfs::{Bulk, Dfs, DfsTransport};
    use dpufs_e2e::in_process::InProcess;
    use dpufs_engine::dfs_service::ConnectionContext;
    use dpufs_proto::dfs::MAX_INLINE;
    use dpufs_proto::engine::v1::{self as eng, dfs_request::Op};
    use prost::Message;

    let engine = TestEngine::start(1);
    let pool = engine.pool("tank", 64 << 20, 1 << 30);
    let cont = engine.container(&pool, "vol", &[]);
    let dfs = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    assert_eq!(dfs.mount_info().max_inline, MAX_INLINE);
    let file = dfs
        .create(dpufs_daos::dfs::ROOT_OID, "f", 0o644, 0, 0)
        .unwrap();
    let raw = InProcess {
        service: engine.service.clone(),
        ctx: ConnectionContext {
            pool: pool.clone(),
            container: cont.clone(),
            snapshot: None,
            rights: Rights::READ_WRITE,
        },
    };
    let errno_of = |op: Op| {
        let request = eng::DfsRequest {
            id: 9,
            op: Some(op),
        }
        .encode_to_vec();
        let reply = raw.call(&request, Bulk::None).unwrap();
        eng::DfsReply::decode(reply.message.as_slice())
            .unwrap()
            .errno
    };
    let write = |len: u32, data: Vec<u8>| {
        Op::Write(eng::Write {
            oid: file.oid,
            offset: 0,
            len,
            data,
            kill_suidgid: true,
            writer_gid: 1,
        })
    };
    assert_eq!(errno_of(write(5, vec![1; 3])), libc::EINVAL, "len ≠ bytes");
    let over = MAX_INLINE + 1;
    assert_eq!(errno_of(write(over as u32, vec![1; over])), libc::EINVAL);
    let read = Op::Read(eng::Read {
        oid: file.oid,
        offset: 0,
        len: over as u32,
        inline: true,
    });
    assert_eq!(errno_of(read), libc::EINVAL);
    assert_eq!(
        dfs.getattr(file.oid).unwrap().size,
        0,
        "nothing was written"
    );
}
