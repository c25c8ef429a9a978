//! Cases about objects and their data.

use super::{Case, Obs, Pair, ids, pattern, read_all, walk};
use crate::dfs::{Dfs, DfsResult, Oid, SetAttr};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "create_lookup_getattr",
            run: create_lookup_getattr,
        },
        Case {
            name: "write_read_at_offsets",
            run: write_read_at_offsets,
        },
        Case {
            name: "sparse_files_read_zeros",
            run: sparse_files_read_zeros,
        },
        Case {
            name: "truncate_down_and_up",
            run: truncate_down_and_up,
        },
        Case {
            name: "large_files_span_chunks",
            run: large_files_span_chunks,
        },
        Case {
            name: "allocate_extends_or_keeps_the_size",
            run: allocate_extends_or_keeps_the_size,
        },
        Case {
            name: "wrong_kinds_for_io",
            run: wrong_kinds_for_io,
        },
        Case {
            name: "removed_objects_are_stale",
            run: removed_objects_are_stale,
        },
        Case {
            name: "fsync_and_statfs",
            run: fsync_and_statfs,
        },
    ]
}

fn file(dfs: &dyn Dfs, dir: Oid, name: &str) -> DfsResult<Oid> {
    let (uid, gid) = ids();
    dfs.create(dir, name, 0o644, uid, gid).map(|a| a.oid)
}

fn read_at(dfs: &dyn Dfs, dir: Oid, name: &str, offset: u64, len: usize) -> DfsResult<Obs> {
    let f = walk(dfs, dir, name)?;
    let mut buf = vec![0xEE; len];
    let n = dfs.read(f.oid, offset, &mut buf)?;
    buf.truncate(n);
    Ok(Obs::Bytes(buf))
}

fn content(dfs: &dyn Dfs, dir: Oid, name: &str) -> DfsResult<Obs> {
    let f = walk(dfs, dir, name)?;
    Ok(Obs::All(vec![
        Obs::attr(&f),
        Obs::Bytes(read_all(dfs, f.oid)?),
    ]))
}

fn truncate(dfs: &dyn Dfs, dir: Oid, name: &str, size: u64) -> DfsResult<Obs> {
    let f = walk(dfs, dir, name)?;
    Ok(Obs::attr(&dfs.truncate(f.oid, size)?))
}

fn create_lookup_getattr(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    p.check("create", |d, dir| {
        Ok(Obs::attr(&d.create(dir, "f", 0o640, uid, gid)?))
    });
    p.check("lookup", |d, dir| Ok(Obs::attr(&d.lookup(dir, "f")?)));
    p.check("getattr", |d, dir| {
        Ok(Obs::attr(&d.getattr(d.lookup(dir, "f")?.oid)?))
    });
    p.check("create again", |d, dir| {
        Ok(Obs::attr(&d.create(dir, "f", 0o600, uid, gid)?))
    });
    p.check("lookup missing", |d, dir| {
        Ok(Obs::attr(&d.lookup(dir, "nope")?))
    });
    p.check("mkdir", |d, dir| {
        Ok(Obs::attr(&d.mkdir(dir, "d", 0o750, uid, gid)?))
    });
    p.check("mkdir over file", |d, dir| {
        Ok(Obs::attr(&d.mkdir(dir, "f", 0o750, uid, gid)?))
    });
    p.check("create in a file", |d, dir| {
        let f = d.lookup(dir, "f")?;
        Ok(Obs::attr(&d.create(f.oid, "x", 0o644, uid, gid)?))
    });
    p.check("lookup in a file", |d, dir| {
        Ok(Obs::attr(&walk(d, dir, "f/x")?))
    });
    p.check("nested create", |d, dir| {
        let sub = d.lookup(dir, "d")?;
        d.create(sub.oid, "inner", 0o604, uid, gid)?;
        Ok(Obs::attr(&walk(d, dir, "d/inner")?))
    });
}

fn write_read_at_offsets(p: &mut Pair<'_>) {
    p.check("create", |d, dir| file(d, dir, "f").map(|_| Obs::Unit));
    p.check("write at 0", |d, dir| {
        d.write(walk(d, dir, "f")?.oid, 0, b"hello world")
            .map(|()| Obs::Unit)
    });
    p.check("overwrite inside", |d, dir| {
        d.write(walk(d, dir, "f")?.oid, 3, b"XYZW")
            .map(|()| Obs::Unit)
    });
    p.check("extend", |d, dir| {
        d.write(walk(d, dir, "f")?.oid, 11, b"!!")
            .map(|()| Obs::Unit)
    });
    p.check("content", |d, dir| content(d, dir, "f"));
    p.check("read a window", |d, dir| read_at(d, dir, "f", 5, 3));
    p.check("read across the end", |d, dir| {
        read_at(d, dir, "f", 10, 100)
    });
    p.check("read at the end", |d, dir| read_at(d, dir, "f", 13, 10));
    p.check("read past the end", |d, dir| read_at(d, dir, "f", 1000, 10));
    p.check("empty write past the end", |d, dir| {
        d.write(walk(d, dir, "f")?.oid, 500, b"")?;
        content(d, dir, "f")
    });
}

fn sparse_files_read_zeros(p: &mut Pair<'_>) {
    p.check("create", |d, dir| file(d, dir, "s").map(|_| Obs::Unit));
    p.check("write far out", |d, dir| {
        let f = walk(d, dir, "s")?.oid;
        d.write(f, (1 << 20) + 3, b"tail")?;
        d.write(f, 10, b"head")?;
        content(d, dir, "s")
    });
    p.check("read the hole", |d, dir| read_at(d, dir, "s", 4096, 8192));
    p.check("truncate into the hole", |d, dir| {
        truncate(d, dir, "s", 300_000)
    });
    p.check("content after", |d, dir| content(d, dir, "s"));
}

fn truncate_down_and_up(p: &mut Pair<'_>) {
    p.check("create", |d, dir| file(d, dir, "t").map(|_| Obs::Unit));
    p.check("write", |d, dir| {
        d.write(walk(d, dir, "t")?.oid, 0, &pattern(100_000, 1))
            .map(|()| Obs::Unit)
    });
    p.check("truncate down", |d, dir| truncate(d, dir, "t", 30_001));
    p.check("content down", |d, dir| content(d, dir, "t"));
    p.check("truncate up", |d, dir| truncate(d, dir, "t", 200_000));
    p.check("content up", |d, dir| content(d, dir, "t"));
    p.check("write after", |d, dir| {
        d.write(walk(d, dir, "t")?.oid, 150_000, b"again")?;
        content(d, dir, "t")
    });
    p.check("truncate to zero", |d, dir| truncate(d, dir, "t", 0));
    p.check("same size", |d, dir| truncate(d, dir, "t", 0));
}

fn large_files_span_chunks(p: &mut Pair<'_>) {
    // Larger than the default 1 MiB chunk and max_io, and aligned to neither.
    let len = (3 << 20) + 12_345;
    p.check("create", |d, dir| file(d, dir, "big").map(|_| Obs::Unit));
    p.check("write", |d, dir| {
        d.write(walk(d, dir, "big")?.oid, 777, &pattern(len, 9))
            .map(|()| Obs::Unit)
    });
    p.check("content", |d, dir| content(d, dir, "big"));
    p.check("across a chunk boundary", |d, dir| {
        read_at(d, dir, "big", (1 << 20) - 100, 300)
    });
    p.check("overwrite across chunks", |d, dir| {
        let f = walk(d, dir, "big")?.oid;
        d.write(f, (2 << 20) - 5000, &pattern(1 << 20, 77))?;
        content(d, dir, "big")
    });
}

fn allocate(dfs: &dyn Dfs, dir: Oid, name: &str, at: u64, len: u64, keep: bool) -> DfsResult<Obs> {
    let f = walk(dfs, dir, name)?.oid;
    dfs.allocate(f, at, len, keep)?;
    content(dfs, dir, name)
}

fn allocate_extends_or_keeps_the_size(p: &mut Pair<'_>) {
    p.check("create", |d, dir| file(d, dir, "a").map(|_| Obs::Unit));
    p.check("write", |d, dir| {
        d.write(walk(d, dir, "a")?.oid, 5000, b"kept")
            .map(|()| Obs::Unit)
    });
    // Across chunks and over the written bytes, unaligned.
    p.check("extend", |d, dir| {
        allocate(d, dir, "a", 100, (2 << 20) + 77, false)
    });
    p.check("inside", |d, dir| allocate(d, dir, "a", 4096, 4096, false));
    p.check("keep size past the end", |d, dir| {
        allocate(d, dir, "a", 1 << 20, 4 << 20, true)
    });
    p.check("keep size beyond the end", |d, dir| {
        allocate(d, dir, "a", 8 << 20, 4096, true)
    });
    p.check("write into it", |d, dir| {
        d.write(walk(d, dir, "a")?.oid, (1 << 20) - 2, b"span")?;
        content(d, dir, "a")
    });
    p.check("truncate after", |d, dir| truncate(d, dir, "a", 6000));
}

fn wrong_kinds_for_io(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    p.check("setup", |d, dir| {
        d.mkdir(dir, "d", 0o755, uid, gid)?;
        d.symlink(dir, "l", "d", uid, gid)?;
        Ok(Obs::Unit)
    });
    p.check("read a directory", |d, dir| read_at(d, dir, "d", 0, 10));
    p.check("write a directory", |d, dir| {
        d.write(walk(d, dir, "d")?.oid, 0, b"x").map(|()| Obs::Unit)
    });
    p.check("truncate a directory", |d, dir| truncate(d, dir, "d", 0));
    p.check("open a directory to write", |d, dir| {
        Ok(Obs::attr(&d.open(walk(d, dir, "d")?.oid, true)?))
    });
    p.check("open a directory to read", |d, dir| {
        Ok(Obs::attr(&d.open(walk(d, dir, "d")?.oid, false)?))
    });
    p.check("open a symlink", |d, dir| {
        Ok(Obs::attr(&d.open(walk(d, dir, "l")?.oid, false)?))
    });
    p.check("read a symlink", |d, dir| read_at(d, dir, "l", 0, 10));
    p.check("write a symlink", |d, dir| {
        d.write(walk(d, dir, "l")?.oid, 0, b"x").map(|()| Obs::Unit)
    });
    p.check("truncate a symlink", |d, dir| truncate(d, dir, "l", 0));
}

fn removed_objects_are_stale(p: &mut Pair<'_>) {
    p.check("a removed file", |d, dir| {
        let f = file(d, dir, "f")?;
        d.unlink(dir, "f")?;
        Ok(Obs::attr(&d.getattr(f)?))
    });
    p.check("reading it", |d, dir| {
        let f = file(d, dir, "g")?;
        d.unlink(dir, "g")?;
        d.read(f, 0, &mut [0; 8]).map(|n| Obs::Count(n as u64))
    });
    p.check("a removed directory", |d, dir| {
        let (uid, gid) = ids();
        let sub = d.mkdir(dir, "sub", 0o755, uid, gid)?.oid;
        d.rmdir(dir, "sub")?;
        Ok(Obs::attr(&d.open(sub, false)?))
    });
    p.check("a replaced file", |d, dir| {
        let a = file(d, dir, "a")?;
        file(d, dir, "b")?;
        let b = d.lookup(dir, "b")?.oid;
        d.rename(dir, "a", dir, "b", false)?;
        Ok(Obs::All(vec![
            Obs::attr(&d.getattr(a)?),
            Obs::Flag(d.getattr(b).is_err()),
        ]))
    });
}

fn fsync_and_statfs(p: &mut Pair<'_>) {
    p.check("fsync a file", |d, dir| {
        let f = file(d, dir, "f")?;
        d.write(f, 0, b"durable")?;
        d.fsync(f, false)?;
        d.fsync(f, true).map(|()| Obs::Unit)
    });
    p.check("fsync a directory", |d, dir| {
        d.fsync(dir, false).map(|()| Obs::Unit)
    });
    p.check("statfs is sane", |d, _| {
        let s = d.statfs()?;
        Ok(Obs::Flag(
            s.total_bytes > 0 && s.free_bytes <= s.total_bytes && s.files > 0,
        ))
    });
    p.check("set nothing", |d, dir| {
        Ok(Obs::attr(
            &d.setattr(walk(d, dir, "f")?.oid, &SetAttr::default())?,
        ))
    });
}
