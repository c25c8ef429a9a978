//! Space: a container's quota and a pool's capacity both end in a clean ENOSPC, and
//! nothing written before is lost or changed; PoolQuery's free space follows the data.

use dpufs_daos::dfs::{Dfs, Errno, ROOT_OID, conformance::pattern};
use dpufs_e2e::in_process::TestEngine;
use dpufs_engine::dfs_service::Rights;
use dpufs_proto::daos::props::{CONT_DPUFS_CHUNK_SIZE, CONT_DPUFS_QUOTA};
use dpufs_proto::engine::v1 as eng;
use dpufs_proto::mgmt;

const MIB: u64 = 1 << 20;

fn read_file(dfs: &dyn Dfs, name: &str) -> Vec<u8> {
    let f = dfs.lookup(ROOT_OID, name).unwrap();
    let mut buf = vec![0; f.size as usize];
    assert_eq!(dfs.read(f.oid, 0, &mut buf).unwrap(), buf.len());
    buf
}

/// Free bytes of the pool's data tier, as PoolQuery reports them.
fn pool_free(engine: &TestEngine, pool: &str) -> (u64, u64) {
    let q = engine
        .engine
        .pool_query(mgmt::PoolQueryReq {
            id: pool.into(),
            ..Default::default()
        })
        .unwrap();
    let nvme = &q.tier_stats[1];
    (nvme.free, nvme.total)
}

#[test]
fn a_quota_ends_in_enospc_and_keeps_what_was_written() {
    let engine = TestEngine::start(2);
    let pool = engine.pool("tank", 64 * MIB, 256 * MIB);
    let cont = engine.container(
        &pool,
        "vol",
        &[
            (CONT_DPUFS_QUOTA, 3 * MIB),
            (CONT_DPUFS_CHUNK_SIZE, 256 << 10),
        ],
    );
    let dfs = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    let s = dfs.statfs().unwrap();
    assert_eq!((s.total_bytes, s.free_bytes), (3 * MIB, 3 * MIB));

    let f = dfs.create(ROOT_OID, "f", 0o644, 0, 0).unwrap();
    let first = pattern(2 * MIB as usize + 5000, 1);
    dfs.write(f.oid, 0, &first).unwrap();
    dfs.fsync(f.oid, false).unwrap();
    let g = dfs.create(ROOT_OID, "g", 0o644, 0, 0).unwrap();
    let err = dfs.write(g.oid, 0, &pattern(MIB as usize, 2)).unwrap_err();
    assert_eq!(err.errno, Errno::NOSPC, "{err}");
    assert_eq!(read_file(&dfs, "f"), first, "earlier data intact");
    assert_eq!(
        dfs.getattr(g.oid).unwrap().size,
        0,
        "the refused write left nothing"
    );
    // Overwriting in place needs no space; what fits still goes in.
    dfs.write(f.oid, 100, b"in place").unwrap();
    dfs.write(g.oid, 0, &pattern(500_000, 3)).unwrap();
    assert!(dfs.statfs().unwrap().free_bytes < 1 << 20);

    // Raising the quota applies to the mounted container at once.
    engine
        .engine
        .cont_set_prop(eng::ContSetPropReq {
            cont: TestEngine::cref(&pool, &cont),
            properties: vec![eng::ContProperty {
                number: CONT_DPUFS_QUOTA,
                value: Some(eng::cont_property::Value::Numval(8 * MIB)),
            }],
        })
        .unwrap();
    dfs.write(g.oid, 500_000, &pattern(MIB as usize, 4))
        .unwrap();
    assert_eq!(dfs.statfs().unwrap().total_bytes, 8 * MIB);
}

#[test]
fn a_full_pool_ends_in_enospc_for_every_container() {
    let engine = TestEngine::start(2);
    // The data tier holds 16 MiB per rank: 32 MiB for the pool.
    let pool = engine.pool("small", 16 * MIB, 16 * MIB);
    let (free, total) = pool_free(&engine, &pool);
    assert_eq!((free, total), (32 * MIB, 32 * MIB));
    let a_id = engine.container(&pool, "a", &[]);
    let b_id = engine.container(&pool, "b", &[]);
    let a = engine.mount(&pool, &a_id, None, Rights::READ_WRITE);
    let b = engine.mount(&pool, &b_id, None, Rights::READ_WRITE);

    let fa = a.create(ROOT_OID, "fa", 0o644, 0, 0).unwrap();
    let a_data = pattern(20 * MIB as usize, 5);
    a.write(fa.oid, 0, &a_data).unwrap();
    assert_eq!(
        pool_free(&engine, &pool).0,
        12 * MIB,
        "PoolQuery follows the data"
    );

    let fb = b.create(ROOT_OID, "fb", 0o644, 0, 0).unwrap();
    let b_data = pattern(10 * MIB as usize, 6);
    b.write(fb.oid, 0, &b_data).unwrap();
    // 2 MiB left: one more 1 MiB piece fits, a 3 MiB write cannot complete.
    let err = b
        .write(fb.oid, 10 * MIB, &pattern(3 * MIB as usize, 7))
        .unwrap_err();
    assert_eq!(err.errno, Errno::NOSPC, "{err}");
    let small = b.write(fb.oid, 20 * MIB, &[1; 4096]);
    assert!(small.is_ok() || small.unwrap_err().errno == Errno::NOSPC);
    assert_eq!(
        &read_file(&b, "fb")[..b_data.len()],
        &b_data[..],
        "earlier data intact"
    );
    assert_eq!(read_file(&a, "fa"), a_data, "the other container is intact");
    assert!(b.statfs().unwrap().free_bytes < MIB);

    // Freeing space in one container makes room in the other.
    a.unlink(ROOT_OID, "fa").unwrap();
    b.write(fb.oid, 0, &pattern(17 * MIB as usize, 8)).unwrap();

    // A clone of b's 17 MiB cannot fit in the 15 MiB left: DER_NOSPACE.
    let snap = engine
        .engine
        .snapshot_create(eng::SnapshotCreateReq {
            cont: TestEngine::cref(&pool, &b_id),
            name: "s".into(),
        })
        .unwrap();
    b.write(fb.oid, 0, &pattern(MIB as usize, 9)).unwrap();
    let err = engine
        .engine
        .cont_clone_snapshot(eng::ContCloneReq {
            source: TestEngine::cref(&pool, &b_id),
            epoch: snap.epoch,
            target: Some(eng::ContCreateReq {
                label: "copy".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("DER_NOSPACE") || format!("{err:?}").contains("NoSpace"),
        "{err:?}"
    );

    // Destroying a container gives its space back.
    engine
        .engine
        .cont_destroy(eng::ContDestroyReq {
            cont: TestEngine::cref(&pool, &b_id),
            force: false,
        })
        .unwrap();
    assert_eq!(pool_free(&engine, &pool).0, 32 * MIB);
}

#[test]
fn usage_survives_a_restart() {
    let engine = TestEngine::start(1);
    let pool = engine.pool("tank", 16 * MIB, 64 * MIB);
    let cont = engine.container(&pool, "vol", &[]);
    let dfs = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    let f = dfs.create(ROOT_OID, "f", 0o644, 0, 0).unwrap();
    let data = pattern(3 * MIB as usize + 17, 11);
    dfs.write(f.oid, 0, &data).unwrap();
    dfs.fsync(f.oid, false).unwrap();
    drop(dfs);
    let engine = engine.restart();
    assert_eq!(pool_free(&engine, &pool).0, 64 * MIB - data.len() as u64);
    let dfs = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    assert_eq!(read_file(&dfs, "f"), data);
}
