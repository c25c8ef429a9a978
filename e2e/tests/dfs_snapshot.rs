//! Snapshots keep a point in time, clones of them are independent volumes, read-only
//! connections refuse changes, and destroy removes a container's namespace everywhere.

use dpufs_daos::dfs::{
    Dfs, Errno, ROOT_OID,
    conformance::{list, pattern, walk},
};
use dpufs_e2e::in_process::TestEngine;
use dpufs_engine::dfs_service::Rights;
use dpufs_proto::engine::v1 as eng;

const MIB: usize = 1 << 20;

fn read_path(dfs: &dyn Dfs, path: &str) -> Vec<u8> {
    let f = walk(dfs, ROOT_OID, path).unwrap();
    let mut buf = vec![0; f.size as usize];
    assert_eq!(dfs.read(f.oid, 0, &mut buf).unwrap(), buf.len());
    buf
}

fn snapshot(engine: &TestEngine, pool: &str, cont: &str, name: &str) -> u64 {
    engine
        .engine
        .snapshot_create(eng::SnapshotCreateReq {
            cont: TestEngine::cref(pool, cont),
            name: name.into(),
        })
        .unwrap()
        .epoch
}

fn clone(engine: &TestEngine, pool: &str, cont: &str, epoch: u64, label: &str) -> String {
    engine
        .engine
        .cont_clone_snapshot(eng::ContCloneReq {
            source: TestEngine::cref(pool, cont),
            epoch,
            target: Some(eng::ContCreateReq {
                label: label.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap()
        .uuid
}

#[test]
fn a_snapshot_keeps_the_old_data_and_a_clone_is_independent() {
    let engine = TestEngine::start(2);
    let pool = engine.pool("tank", 64 << 20, 1 << 30);
    let cont = engine.container(&pool, "vol", &[]);
    let live = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    let d = live.mkdir(ROOT_OID, "d", 0o755, 0, 0).unwrap();
    let f = live.create(d.oid, "f", 0o644, 0, 0).unwrap();
    let old = pattern(2 * MIB + 333, 1);
    live.write(f.oid, 0, &old).unwrap();
    live.create(ROOT_OID, "doomed", 0o644, 0, 0).unwrap();

    let epoch = snapshot(&engine, &pool, &cont, "before");
    // Modify in every way: overwrite, truncate, remove, create.
    live.write(f.oid, MIB as u64 - 10, b"new bytes across a chunk boundary")
        .unwrap();
    live.truncate(f.oid, MIB as u64 + 50).unwrap();
    live.unlink(ROOT_OID, "doomed").unwrap();
    live.create(ROOT_OID, "new", 0o644, 0, 0).unwrap();
    let now = read_path(&live, "d/f");

    let snap = engine.mount(&pool, &cont, Some(epoch), Rights::READ_WRITE);
    assert!(snap.mount_info().read_only);
    assert_eq!(
        read_path(&snap, "d/f"),
        old,
        "the snapshot shows the old data"
    );
    let mut names = list(&snap, ROOT_OID, 10).unwrap();
    names.sort();
    assert_eq!(names, ["d", "doomed"]);
    let sf = walk(&snap, ROOT_OID, "d/f").unwrap();
    assert_eq!(snap.write(sf.oid, 0, b"x").unwrap_err().errno, Errno::ROFS);
    assert_eq!(
        snap.create(ROOT_OID, "y", 0o644, 0, 0).unwrap_err().errno,
        Errno::ROFS
    );
    assert_eq!(snap.open(sf.oid, true).unwrap_err().errno, Errno::ROFS);

    let clone_id = clone(&engine, &pool, &cont, epoch, "vol-copy");
    let copy = engine.mount(&pool, &clone_id, None, Rights::READ_WRITE);
    assert!(!copy.mount_info().read_only);
    assert_eq!(
        read_path(&copy, "d/f"),
        old,
        "a clone starts as the snapshot"
    );
    let cf = walk(&copy, ROOT_OID, "d/f").unwrap();
    copy.write(cf.oid, 0, b"clone's own").unwrap();
    copy.create(ROOT_OID, "only-in-clone", 0o644, 0, 0).unwrap();
    live.write(f.oid, 5, b"source's own").unwrap();
    let now = {
        let mut n = now;
        n[5..17].copy_from_slice(b"source's own");
        n
    };
    assert_eq!(
        read_path(&live, "d/f"),
        now,
        "the clone's writes stay out of the source"
    );
    assert_eq!(&read_path(&copy, "d/f")[..11], b"clone's own");
    assert_eq!(
        &read_path(&copy, "d/f")[11..],
        &old[11..],
        "the source's stay out of the clone"
    );
    assert_eq!(
        read_path(&snap, "d/f"),
        old,
        "and the snapshot is untouched by both"
    );
    assert!(live.lookup(ROOT_OID, "only-in-clone").is_err());

    // A retry of the same clone (same UUID and label) returns it instead of copying again.
    let again = engine
        .engine
        .cont_clone_snapshot(eng::ContCloneReq {
            source: TestEngine::cref(&pool, &cont),
            snapshot_name: "before".into(),
            target: Some(eng::ContCreateReq {
                uuid: clone_id.clone(),
                label: "vol-copy".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(again.uuid, clone_id);
    assert_eq!(&read_path(&copy, "d/f")[..11], b"clone's own");

    // The source goes away; the clone stays whole.
    engine
        .engine
        .cont_destroy(eng::ContDestroyReq {
            cont: TestEngine::cref(&pool, &cont),
            force: true,
        })
        .unwrap();
    assert_eq!(&read_path(&copy, "d/f")[11..], &old[11..]);
    assert_eq!(live.getattr(ROOT_OID).unwrap_err().errno, Errno::STALE);
    assert_eq!(snap.getattr(ROOT_OID).unwrap_err().errno, Errno::STALE);
}

#[test]
fn snapshots_and_containers_leave_no_files_behind() {
    let engine = TestEngine::start(2);
    let pool = engine.pool("tank", 64 << 20, 1 << 30);
    let cont = engine.container(&pool, "vol", &[]);
    let live = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    let f = live.create(ROOT_OID, "f", 0o644, 0, 0).unwrap();
    live.write(f.oid, 0, &pattern(3 * MIB, 2)).unwrap();
    let e1 = snapshot(&engine, &pool, &cont, "one");
    snapshot(&engine, &pool, &cont, "two");
    let files = |sub: &str| -> usize {
        walkdir(&engine.path.join("ranks"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(sub))
            .count()
    };
    assert!(files(&format!("snaps/{cont}/{e1}")) > 0);
    engine
        .engine
        .snapshot_destroy(eng::SnapshotDestroyReq {
            cont: TestEngine::cref(&pool, &cont),
            epoch: e1,
            name: String::new(),
        })
        .unwrap();
    assert_eq!(
        files(&format!("snaps/{cont}/{e1}")),
        0,
        "a destroyed snapshot's files go"
    );
    assert!(files(&format!("conts/{cont}")) > 0);
    engine
        .engine
        .cont_destroy(eng::ContDestroyReq {
            cont: TestEngine::cref(&pool, &cont),
            force: false,
        })
        .unwrap();
    assert_eq!(
        files(&cont),
        0,
        "a destroyed container's namespace and snapshots go"
    );
}

#[test]
fn read_only_connections_refuse_changes() {
    let engine = TestEngine::start(1);
    let pool = engine.pool("tank", 64 << 20, 1 << 30);
    let cont = engine.container(&pool, "vol", &[]);
    let rw = engine.mount(&pool, &cont, None, Rights::READ_WRITE);
    let f = rw.create(ROOT_OID, "f", 0o644, 0, 0).unwrap();
    rw.write(f.oid, 0, b"data").unwrap();
    let ro = engine.mount(&pool, &cont, None, Rights::READ_ONLY);
    assert!(ro.mount_info().read_only);
    assert_eq!(read_path(&ro, "f"), b"data");
    assert_eq!(ro.write(f.oid, 0, b"x").unwrap_err().errno, Errno::ROFS);
    assert_eq!(ro.unlink(ROOT_OID, "f").unwrap_err().errno, Errno::ROFS);
    assert_eq!(ro.truncate(f.oid, 0).unwrap_err().errno, Errno::ROFS);
    assert_eq!(ro.open(f.oid, true).unwrap_err().errno, Errno::ROFS);
    ro.fsync(f.oid, false).unwrap();
    ro.open(f.oid, false).unwrap();
}

fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walkdir(&p));
            }
            out.push(p);
        }
    }
    out
}
