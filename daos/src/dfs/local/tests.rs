use super::*;
use crate::dfs::{Dfs, S_IFREG, SetAttr, XattrMode};

fn fs() -> (tempfile::TempDir, LocalDfs) {
    let dir = tempfile::tempdir().expect("tempdir");
    let dfs = LocalDfs::open(dir.path()).expect("open");
    (dir, dfs)
}

fn errno<T: std::fmt::Debug>(r: DfsResult<T>) -> Errno {
    r.expect_err("should fail").errno
}

#[test]
fn root_is_root_oid_and_a_directory() {
    let (_d, dfs) = fs();
    let a = dfs.getattr(ROOT_OID).unwrap();
    assert_eq!(a.oid, ROOT_OID);
    assert!(a.is_dir());
    assert_eq!(a.size, 0, "directories report size 0, as DFS does");
}

#[test]
fn create_write_read_and_lookup() {
    let (dir, dfs) = fs();
    let f = dfs.create(ROOT_OID, "f", 0o640, 0, 0).unwrap();
    assert_eq!(
        f.mode,
        S_IFREG | 0o640,
        "exact mode, not masked by the umask"
    );
    dfs.write(f.oid, 5, b"hello").unwrap();
    let mut buf = [7u8; 16];
    assert_eq!(dfs.read(f.oid, 0, &mut buf).unwrap(), 10);
    assert_eq!(&buf[..10], b"\0\0\0\0\0hello");
    assert_eq!(dfs.lookup(ROOT_OID, "f").unwrap().oid, f.oid);
    assert_eq!(
        std::fs::read(dir.path().join("f")).unwrap(),
        b"\0\0\0\0\0hello"
    );
    assert_eq!(errno(dfs.create(ROOT_OID, "f", 0o644, 0, 0)), Errno::EXIST);
    assert_eq!(errno(dfs.lookup(ROOT_OID, "nope")), Errno::NOENT);
    assert_eq!(errno(dfs.lookup(f.oid, "x")), Errno::NOTDIR);
}

#[test]
fn objects_survive_renames_of_their_directories() {
    let (dir, dfs) = fs();
    let a = dfs.mkdir(ROOT_OID, "a", 0o755, 0, 0).unwrap();
    let f = dfs.create(a.oid, "f", 0o644, 0, 0).unwrap();
    dfs.rename(ROOT_OID, "a", ROOT_OID, "b", false).unwrap();
    // Renamed behind our back too: the descriptors do not care.
    std::fs::rename(dir.path().join("b"), dir.path().join("c")).unwrap();
    dfs.write(f.oid, 0, b"x").unwrap();
    assert_eq!(std::fs::read(dir.path().join("c/f")).unwrap(), b"x");
    assert_eq!(
        dfs.create(a.oid, "g", 0o600, 0, 0).unwrap().mode,
        S_IFREG | 0o600
    );
}

#[test]
fn removed_objects_go_stale() {
    let (dir, dfs) = fs();
    let f = dfs.create(ROOT_OID, "f", 0o644, 0, 0).unwrap();
    dfs.unlink(ROOT_OID, "f").unwrap();
    assert_eq!(errno(dfs.getattr(f.oid)), Errno::STALE);
    let g = dfs.create(ROOT_OID, "g", 0o644, 0, 0).unwrap();
    std::fs::remove_file(dir.path().join("g")).unwrap();
    assert_eq!(errno(dfs.read(g.oid, 0, &mut [0; 4])), Errno::STALE);
    let h = dfs.create(ROOT_OID, "h", 0o644, 0, 0).unwrap();
    dfs.forget(h.oid);
    assert_eq!(errno(dfs.getattr(h.oid)), Errno::STALE);
    assert_eq!(dfs.lookup(ROOT_OID, "h").unwrap().oid, h.oid);
}

#[test]
fn errnos_are_the_kernels() {
    let (_d, dfs) = fs();
    let d = dfs.mkdir(ROOT_OID, "d", 0o755, 0, 0).unwrap();
    dfs.create(d.oid, "f", 0o644, 0, 0).unwrap();
    dfs.create(ROOT_OID, "f", 0o644, 0, 0).unwrap();
    assert_eq!(errno(dfs.rmdir(ROOT_OID, "d")), Errno::NOTEMPTY);
    assert_eq!(errno(dfs.rmdir(ROOT_OID, "f")), Errno::NOTDIR);
    assert_eq!(errno(dfs.unlink(ROOT_OID, "d")), Errno::ISDIR);
    assert_eq!(errno(dfs.unlink(ROOT_OID, "zz")), Errno::NOENT);
    assert_eq!(
        errno(dfs.rename(ROOT_OID, "d", d.oid, "sub", false)),
        Errno::INVAL
    );
    assert_eq!(
        errno(dfs.rename(ROOT_OID, "f", ROOT_OID, "d", false)),
        Errno::ISDIR
    );
    assert_eq!(
        errno(dfs.rename(ROOT_OID, "d", ROOT_OID, "f", true)),
        Errno::EXIST
    );
    assert_eq!(errno(dfs.open(d.oid, true)), Errno::ISDIR);
    assert_eq!(errno(dfs.lookup(ROOT_OID, "a/b")), Errno::INVAL);
    assert_eq!(errno(dfs.lookup(ROOT_OID, "..")), Errno::INVAL);
    assert_eq!(
        errno(dfs.create(ROOT_OID, &"n".repeat(256), 0o644, 0, 0)),
        Errno::NAMETOOLONG
    );
    dfs.create(ROOT_OID, &"n".repeat(255), 0o644, 0, 0).unwrap();
}

#[test]
fn readdir_pages_resume_after_concurrent_unlink() {
    let (_d, dfs) = fs();
    for i in 0..50 {
        dfs.create(ROOT_OID, &format!("e{i:02}"), 0o644, 0, 0)
            .unwrap();
    }
    let first = dfs.readdir(ROOT_OID, 0, 10).unwrap();
    assert_eq!(first.entries.len(), 10);
    assert!(!first.end);
    // Remove the last entry seen and one not seen yet.
    let last = first.entries.last().unwrap().clone();
    dfs.unlink(ROOT_OID, &last.name).unwrap();
    let all: Vec<_> = dfs.readdir(ROOT_OID, 0, 100).unwrap().entries;
    // (By name: on ext4 a cookie is the position after its entry, which moves when the
    // entry that followed it goes; resuming from the old value still works.)
    let unseen = all
        .iter()
        .find(|e| !first.entries.iter().any(|f| f.name == e.name))
        .unwrap()
        .name
        .clone();
    dfs.unlink(ROOT_OID, &unseen).unwrap();
    let mut names: Vec<String> = first.entries.iter().map(|e| e.name.clone()).collect();
    let mut cookie = last.cookie;
    loop {
        let page = dfs.readdir(ROOT_OID, cookie, 7).unwrap();
        names.extend(page.entries.iter().map(|e| e.name.clone()));
        if let Some(e) = page.entries.last() {
            cookie = e.cookie;
        }
        if page.end {
            break;
        }
    }
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "no entry repeated");
    assert_eq!(
        names.len(),
        49,
        "every surviving entry seen once (plus the removed one seen before)"
    );
    assert!(!names.contains(&unseen));
}

#[test]
fn setattr_symlink_and_xattrs() {
    let (_d, dfs) = fs();
    let f = dfs.create(ROOT_OID, "f", 0o644, 0, 0).unwrap();
    let t = Timespec {
        secs: 1_000_000,
        nanos: 5,
    };
    let a = dfs
        .setattr(
            f.oid,
            &SetAttr {
                mode: Some(0o600),
                uid: Some(1234),
                gid: Some(99),
                size: Some(3 << 20),
                atime: Some(TimeSet::At(t)),
                mtime: Some(TimeSet::At(t)),
            },
        )
        .unwrap();
    assert_eq!(
        (a.mode, a.uid, a.gid, a.size),
        (S_IFREG | 0o600, 1234, 99, 3 << 20)
    );
    assert_eq!((a.atime, a.mtime), (t, t));
    assert_eq!(dfs.truncate(f.oid, 1).unwrap().size, 1);

    let l = dfs.symlink(ROOT_OID, "l", "../some/where", 7, 8).unwrap();
    assert_eq!((l.kind(), l.size, l.uid, l.gid), (S_IFLNK, 13, 7, 8));
    assert_eq!(dfs.readlink(l.oid).unwrap(), "../some/where");
    assert_eq!(errno(dfs.readlink(f.oid)), Errno::INVAL);

    assert_eq!(errno(dfs.getxattr(f.oid, "user.a")), Errno::NODATA);
    assert_eq!(
        errno(dfs.setxattr(f.oid, "user.a", b"1", XattrMode::Replace)),
        Errno::NODATA
    );
    dfs.setxattr(f.oid, "user.a", b"1", XattrMode::Create)
        .unwrap();
    assert_eq!(
        errno(dfs.setxattr(f.oid, "user.a", b"2", XattrMode::Create)),
        Errno::EXIST
    );
    dfs.setxattr(f.oid, "user.a", b"22", XattrMode::Replace)
        .unwrap();
    assert_eq!(dfs.getxattr(f.oid, "user.a").unwrap(), b"22");
    assert_eq!(dfs.listxattr(f.oid).unwrap(), vec!["user.a".to_string()]);
    dfs.removexattr(f.oid, "user.a").unwrap();
    assert_eq!(errno(dfs.removexattr(f.oid, "user.a")), Errno::NODATA);
    dfs.fsync(f.oid, false).unwrap();
    dfs.fsync(ROOT_OID, true).unwrap();
    assert!(dfs.statfs().unwrap().total_bytes > 0);
}

#[test]
fn the_conformance_suite_agrees_with_itself() {
    // Two local directories must agree on every case: proves the cases are deterministic
    // and that what they compare is not an artefact of one directory.
    let (_a, reference) = fs();
    let (_b, other) = fs();
    crate::dfs::conformance::run_all(&reference, &other).assert_passed();
}
