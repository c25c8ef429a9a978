//! Cases about names: rename, removal, symlinks, name limits.

use super::{Case, Obs, Pair, ids, list, read_all, walk};
use crate::dfs::{Dfs, DfsResult, Oid};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "rename_over_a_file",
            run: rename_over_a_file,
        },
        Case {
            name: "rename_over_directories",
            run: rename_over_directories,
        },
        Case {
            name: "rename_into_own_subtree",
            run: rename_into_own_subtree,
        },
        Case {
            name: "rename_noreplace",
            run: rename_noreplace,
        },
        Case {
            name: "rename_kind_mismatches",
            run: rename_kind_mismatches,
        },
        Case {
            name: "unlink_and_rmdir_errors",
            run: unlink_and_rmdir_errors,
        },
        Case {
            name: "symlinks",
            run: symlinks,
        },
        Case {
            name: "name_limits",
            run: name_limits,
        },
    ]
}

fn make(dfs: &dyn Dfs, dir: Oid, spec: &[&str]) -> DfsResult<Obs> {
    let (uid, gid) = ids();
    for path in spec {
        let (parent, name) = match path.rsplit_once('/') {
            Some((p, n)) => (walk(dfs, dir, p)?.oid, n),
            None => (dir, *path),
        };
        // `name+` is a directory, anything else a file holding its own name.
        match name.strip_suffix('+') {
            Some(d) => dfs.mkdir(parent, d, 0o755, uid, gid).map(drop)?,
            None => {
                let f = dfs.create(parent, name, 0o644, uid, gid)?;
                dfs.write(f.oid, 0, name.as_bytes())?;
            }
        }
    }
    Ok(Obs::Unit)
}

fn names(dfs: &dyn Dfs, dir: Oid, path: &str) -> DfsResult<Obs> {
    let d = if path.is_empty() {
        dfs.getattr(dir)?
    } else {
        walk(dfs, dir, path)?
    };
    Ok(Obs::names(list(dfs, d.oid, 100)?))
}

fn rename(dfs: &dyn Dfs, dir: Oid, from: &str, to: &str, noreplace: bool) -> DfsResult<Obs> {
    let split = |path: &str| -> DfsResult<(Oid, String)> {
        Ok(match path.rsplit_once('/') {
            Some((p, n)) => (walk(dfs, dir, p)?.oid, n.to_string()),
            None => (dir, path.to_string()),
        })
    };
    let ((fp, fname), (tp, tname)) = (split(from)?, split(to)?);
    dfs.rename(fp, &fname, tp, &tname, noreplace)
        .map(|()| Obs::Unit)
}

fn rename_over_a_file(p: &mut Pair<'_>) {
    p.check("setup", |d, dir| make(d, dir, &["a", "b"]));
    p.check("rename a over b", |d, dir| rename(d, dir, "a", "b", false));
    p.check("listing", |d, dir| names(d, dir, ""));
    p.check("b has a's data", |d, dir| {
        Ok(Obs::Bytes(read_all(d, walk(d, dir, "b")?.oid)?))
    });
    p.check("a is gone", |d, dir| Ok(Obs::attr(&walk(d, dir, "a")?)));
    p.check("onto itself", |d, dir| rename(d, dir, "b", "b", false));
    p.check("missing source", |d, dir| rename(d, dir, "zz", "b", false));
}

fn rename_over_directories(p: &mut Pair<'_>) {
    p.check("setup", |d, dir| {
        make(d, dir, &["x+", "x/in", "y+", "z+", "z/in"])
    });
    p.check("over an empty directory", |d, dir| {
        rename(d, dir, "x", "y", false)
    });
    p.check("moved with its entries", |d, dir| names(d, dir, "y"));
    p.check("over a non-empty directory", |d, dir| {
        rename(d, dir, "y", "z", false)
    });
    p.check("listing", |d, dir| names(d, dir, ""));
    p.check("into another directory", |d, dir| {
        rename(d, dir, "y", "z/y2", false)
    });
    p.check("its entries follow", |d, dir| {
        Ok(Obs::attr(&walk(d, dir, "z/y2/in")?))
    });
}

fn rename_into_own_subtree(p: &mut Pair<'_>) {
    p.check("setup", |d, dir| make(d, dir, &["a+", "a/b+", "a/b/c+"]));
    p.check("into its child", |d, dir| {
        rename(d, dir, "a", "a/b/x", false)
    });
    p.check("into its grandchild", |d, dir| {
        rename(d, dir, "a", "a/b/c/x", false)
    });
    p.check("onto itself", |d, dir| rename(d, dir, "a", "a", false));
    p.check("a child up", |d, dir| rename(d, dir, "a/b/c", "c", false));
    p.check("listing", |d, dir| names(d, dir, ""));
}

fn rename_noreplace(p: &mut Pair<'_>) {
    p.check("setup", |d, dir| make(d, dir, &["f", "g", "e+"]));
    p.check("over a file", |d, dir| rename(d, dir, "f", "g", true));
    p.check("over an empty directory", |d, dir| {
        rename(d, dir, "f", "e", true)
    });
    p.check("onto itself", |d, dir| rename(d, dir, "f", "f", true));
    p.check("to a free name", |d, dir| rename(d, dir, "f", "h", true));
    p.check("listing", |d, dir| names(d, dir, ""));
}

fn rename_kind_mismatches(p: &mut Pair<'_>) {
    p.check("setup", |d, dir| make(d, dir, &["f", "d+", "d/in"]));
    p.check("a file over a directory", |d, dir| {
        rename(d, dir, "f", "d", false)
    });
    p.check("a directory over a file", |d, dir| {
        rename(d, dir, "d", "f", false)
    });
    p.check("from a file's entry", |d, dir| {
        rename(d, dir, "f/x", "y", false)
    });
    p.check("into a file", |d, dir| rename(d, dir, "d", "f/x", false));
    p.check("bad target name", |d, dir| rename(d, dir, "f", "..", false));
    p.check("listing", |d, dir| names(d, dir, ""));
}

fn unlink_and_rmdir_errors(p: &mut Pair<'_>) {
    p.check("setup", |d, dir| {
        make(d, dir, &["f", "e+", "full+", "full/in"])
    });
    p.check("rmdir a file", |d, dir| {
        d.rmdir(dir, "f").map(|()| Obs::Unit)
    });
    p.check("unlink a directory", |d, dir| {
        d.unlink(dir, "e").map(|()| Obs::Unit)
    });
    p.check("rmdir non-empty", |d, dir| {
        d.rmdir(dir, "full").map(|()| Obs::Unit)
    });
    p.check("unlink missing", |d, dir| {
        d.unlink(dir, "nope").map(|()| Obs::Unit)
    });
    p.check("rmdir missing", |d, dir| {
        d.rmdir(dir, "nope").map(|()| Obs::Unit)
    });
    p.check("unlink in a file", |d, dir| {
        d.unlink(d.lookup(dir, "f")?.oid, "x").map(|()| Obs::Unit)
    });
    p.check("unlink", |d, dir| d.unlink(dir, "f").map(|()| Obs::Unit));
    p.check("rmdir", |d, dir| d.rmdir(dir, "e").map(|()| Obs::Unit));
    p.check("empty it and rmdir", |d, dir| {
        d.unlink(walk(d, dir, "full")?.oid, "in")?;
        d.rmdir(dir, "full").map(|()| Obs::Unit)
    });
    p.check("listing", |d, dir| names(d, dir, ""));
}

fn symlinks(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    p.check("create", |d, dir| {
        Ok(Obs::attr(&d.symlink(
            dir,
            "l",
            "../some/where",
            uid,
            gid,
        )?))
    });
    p.check("lookup", |d, dir| Ok(Obs::attr(&d.lookup(dir, "l")?)));
    p.check("readlink", |d, dir| {
        Ok(Obs::Text(d.readlink(walk(d, dir, "l")?.oid)?))
    });
    p.check("dangling is fine", |d, dir| {
        Ok(Obs::attr(&d.symlink(dir, "m", "nowhere", uid, gid)?))
    });
    p.check("name taken", |d, dir| {
        Ok(Obs::attr(&d.symlink(dir, "l", "x", uid, gid)?))
    });
    p.check("empty target", |d, dir| {
        Ok(Obs::attr(&d.symlink(dir, "n", "", uid, gid)?))
    });
    p.check("readlink a file", |d, dir| {
        let f = d.create(dir, "f", 0o644, uid, gid)?;
        Ok(Obs::Text(d.readlink(f.oid)?))
    });
    p.check("readlink a directory", |d, dir| {
        Ok(Obs::Text(d.readlink(dir)?))
    });
    p.check("long target", |d, dir| {
        let t = "t/".repeat(1000);
        d.symlink(dir, "long", &t, uid, gid)?;
        Ok(Obs::Text(d.readlink(walk(d, dir, "long")?.oid)?))
    });
    p.check("rename it", |d, dir| rename(d, dir, "l", "l2", false));
    p.check("unlink it", |d, dir| {
        d.unlink(dir, "l2").map(|()| Obs::Unit)
    });
    p.check("listing", |d, dir| names(d, dir, ""));
}

fn name_limits(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    let n255 = "n".repeat(255);
    let n256 = "n".repeat(256);
    let multi = "é".repeat(127); // 254 bytes
    p.check("255 bytes", |d, dir| {
        Ok(Obs::attr(&d.create(dir, &n255, 0o644, uid, gid)?))
    });
    p.check("256 bytes", |d, dir| {
        Ok(Obs::attr(&d.create(dir, &n256, 0o644, uid, gid)?))
    });
    p.check("lookup 256", |d, dir| Ok(Obs::attr(&d.lookup(dir, &n256)?)));
    p.check("mkdir 256", |d, dir| {
        Ok(Obs::attr(&d.mkdir(dir, &n256, 0o755, uid, gid)?))
    });
    p.check("multibyte", |d, dir| {
        Ok(Obs::attr(&d.mkdir(dir, &multi, 0o755, uid, gid)?))
    });
    p.check("rename to 256", |d, dir| {
        d.rename(dir, &n255, dir, &n256, false).map(|()| Obs::Unit)
    });
    for bad in ["", ".", "..", "a/b"] {
        p.check(&format!("create {bad:?}"), |d, dir| {
            Ok(Obs::attr(&d.create(dir, bad, 0o644, uid, gid)?))
        });
    }
    p.check("listing", |d, dir| names(d, dir, ""));
}
