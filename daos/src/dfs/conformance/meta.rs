//! Cases about attributes, extended attributes and listings.

use super::{Case, Obs, Pair, ids, list, walk};
use crate::dfs::{Dfs, DfsResult, Oid, SetAttr, TimeSet, Timespec, XattrMode};
use std::collections::HashSet;

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "setattr_mode_owner_times",
            run: setattr_mode_owner_times,
        },
        Case {
            name: "set_id_bits_cleared_by_writes_and_chown",
            run: set_id_bits_cleared_by_writes_and_chown,
        },
        Case {
            name: "xattrs",
            run: xattrs,
        },
        Case {
            name: "readdir_pages_with_cookies",
            run: readdir_pages_with_cookies,
        },
        Case {
            name: "readdir_resumes_across_unlink",
            run: readdir_resumes_across_unlink,
        },
    ]
}

fn set(dfs: &dyn Dfs, dir: Oid, path: &str, s: SetAttr) -> DfsResult<Obs> {
    let oid = walk(dfs, dir, path)?.oid;
    let a = dfs.setattr(oid, &s)?;
    let again = dfs.getattr(oid)?;
    Ok(Obs::All(vec![Obs::attr(&a), Obs::attr(&again)]))
}

fn setattr_mode_owner_times(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    p.check("setup", |d, dir| {
        d.create(dir, "f", 0o644, uid, gid)?;
        d.mkdir(dir, "d", 0o755, uid, gid).map(|_| Obs::Unit)
    });
    for (path, mode) in [("f", 0o600), ("f", 0o4755), ("d", 0o700), ("d", 0o1777)] {
        p.check(&format!("chmod {path} {mode:o}"), |d, dir| {
            set(
                d,
                dir,
                path,
                SetAttr {
                    mode: Some(mode),
                    ..SetAttr::default()
                },
            )
        });
    }
    p.check("chown", |d, dir| {
        set(
            d,
            dir,
            "d",
            SetAttr {
                uid: Some(4242),
                gid: Some(4343),
                ..SetAttr::default()
            },
        )
    });
    p.check("chgrp only", |d, dir| {
        set(
            d,
            dir,
            "d",
            SetAttr {
                gid: Some(77),
                ..SetAttr::default()
            },
        )
    });
    p.check("chmod and truncate together", |d, dir| {
        set(
            d,
            dir,
            "f",
            SetAttr {
                mode: Some(0o640),
                size: Some(12_345),
                ..SetAttr::default()
            },
        )
    });
    let at = |secs, nanos| TimeSet::At(Timespec { secs, nanos });
    p.check("set times", |d, dir| {
        let s = SetAttr {
            atime: Some(at(1_000_000_000, 123)),
            mtime: Some(at(1_500_000_000, 999_999_999)),
            ..SetAttr::default()
        };
        let oid = walk(d, dir, "f")?.oid;
        let a = d.setattr(oid, &s)?;
        Ok(Obs::Text(format!("{:?} {:?}", a.atime, a.mtime)))
    });
    p.check("set mtime only", |d, dir| {
        let oid = walk(d, dir, "f")?.oid;
        let a = d.setattr(
            oid,
            &SetAttr {
                mtime: Some(at(5, 6)),
                ..SetAttr::default()
            },
        )?;
        Ok(Obs::Text(format!("{:?} {:?}", a.atime, a.mtime)))
    });
    p.check("times to now", |d, dir| {
        let oid = walk(d, dir, "f")?.oid;
        let s = SetAttr {
            atime: Some(TimeSet::Now),
            mtime: Some(TimeSet::Now),
            ..SetAttr::default()
        };
        let a = d.setattr(oid, &s)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_secs() as i64);
        Ok(Obs::Flag(
            (a.mtime.secs - now).abs() < 60 && (a.atime.secs - now).abs() < 60,
        ))
    });
    p.check("symlink owner", |d, dir| {
        let l = d.symlink(dir, "l", "f", uid, gid)?;
        let a = d.setattr(
            l.oid,
            &SetAttr {
                uid: Some(99),
                gid: Some(98),
                ..SetAttr::default()
            },
        )?;
        Ok(Obs::attr(&a))
    });
}

fn set_id_bits_cleared_by_writes_and_chown(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    let chmod = |mode| SetAttr {
        mode: Some(mode),
        ..SetAttr::default()
    };
    for (name, mode) in [("both", 0o6755), ("sgid-no-x", 0o2644), ("plain", 0o755)] {
        let step = format!("{name}: privileged write, unprivileged ones in and outside its group");
        p.check(&step, |d, dir| {
            let oid = d.create(dir, name, 0o644, uid, gid)?.oid;
            d.setattr(oid, &chmod(mode))?;
            d.write(oid, 0, b"root")?;
            let kept = d.getattr(oid)?;
            d.write_unprivileged(oid, 4, b"user", gid)?;
            let in_group = d.getattr(oid)?;
            d.setattr(oid, &chmod(mode))?;
            d.write_unprivileged(oid, 8, b"else", gid + 1)?;
            let others = d.getattr(oid)?;
            Ok(Obs::All(
                [kept, in_group, others].iter().map(Obs::attr).collect(),
            ))
        });
    }
    p.check("chown clears set-user-ID", |d, dir| {
        let oid = d.create(dir, "owned", 0o644, uid, gid)?.oid;
        d.setattr(oid, &chmod(0o6755))?;
        set(
            d,
            dir,
            "owned",
            SetAttr {
                uid: Some(4242),
                ..SetAttr::default()
            },
        )
    });
}

fn xattrs(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    p.check("setup", |d, dir| {
        d.create(dir, "f", 0o644, uid, gid)?;
        d.mkdir(dir, "d", 0o755, uid, gid).map(|_| Obs::Unit)
    });
    let set = |path: &'static str, name: &'static str, value: &'static [u8], mode| {
        move |d: &dyn Dfs, dir: Oid| {
            d.setxattr(walk(d, dir, path)?.oid, name, value, mode)
                .map(|()| Obs::Unit)
        }
    };
    let get = |path: &'static str, name: &'static str| {
        move |d: &dyn Dfs, dir: Oid| Ok(Obs::Bytes(d.getxattr(walk(d, dir, path)?.oid, name)?))
    };
    let names = |path: &'static str| {
        move |d: &dyn Dfs, dir: Oid| Ok(Obs::names(d.listxattr(walk(d, dir, path)?.oid)?))
    };
    p.check("get missing", get("f", "user.a"));
    p.check(
        "replace missing",
        set("f", "user.a", b"1", XattrMode::Replace),
    );
    p.check("create", set("f", "user.a", b"1", XattrMode::Create));
    p.check(
        "create existing",
        set("f", "user.a", b"2", XattrMode::Create),
    );
    p.check("replace", set("f", "user.a", b"22", XattrMode::Replace));
    p.check("get", get("f", "user.a"));
    p.check("empty value", set("f", "user.empty", b"", XattrMode::Any));
    p.check("get empty", get("f", "user.empty"));
    p.check(
        "on a directory",
        set("d", "user.dir", b"on a dir", XattrMode::Any),
    );
    p.check("get on a directory", get("d", "user.dir"));
    p.check("list", names("f"));
    p.check("list a directory", names("d"));
    p.check("no namespace", set("f", "plain", b"x", XattrMode::Any));
    p.check("empty name", set("f", "", b"x", XattrMode::Any));
    // Large, but within one 4 KiB block: ext4 (the usual reference) keeps all of an
    // inode's attributes in one block unless ea_inode is on (ENOSPC otherwise).
    p.check("large value", |d, dir| {
        let v = super::pattern(3000, 3);
        let f = walk(d, dir, "f")?.oid;
        d.setxattr(f, "user.big", &v, XattrMode::Any)?;
        Ok(Obs::Bytes(d.getxattr(f, "user.big")?))
    });
    p.check("remove", |d, dir| {
        d.removexattr(walk(d, dir, "f")?.oid, "user.a")
            .map(|()| Obs::Unit)
    });
    p.check("remove again", |d, dir| {
        d.removexattr(walk(d, dir, "f")?.oid, "user.a")
            .map(|()| Obs::Unit)
    });
    p.check("list after", names("f"));
    p.check("user xattr on a symlink", |d, dir| {
        let l = d.symlink(dir, "l", "f", uid, gid)?;
        d.setxattr(l.oid, "user.x", b"1", XattrMode::Any)
            .map(|()| Obs::Unit)
    });
}

fn readdir_pages_with_cookies(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    p.check("populate", |d, dir| {
        for i in 0..120 {
            let name = format!("entry-{i:03}");
            if i % 7 == 0 {
                d.mkdir(dir, &name, 0o755, uid, gid)?;
            } else {
                d.create(dir, &name, 0o644, uid, gid)?;
            }
        }
        Ok(Obs::Unit)
    });
    for page in [1, 13, 120, 1000] {
        p.check(&format!("pages of {page}"), |d, dir| {
            Ok(Obs::names(list(d, dir, page)?))
        });
    }
    p.check("kinds", |d, dir| {
        let page = d.readdir(dir, 0, 1000)?;
        let kinds = page
            .entries
            .iter()
            .map(|e| format!("{} {:o}", e.name, e.kind))
            .collect();
        Ok(Obs::All(vec![Obs::names(kinds), Obs::Flag(page.end)]))
    });
    p.check("an empty directory", |d, dir| {
        let e = d.mkdir(dir, "zz-empty", 0o755, uid, gid)?;
        let page = d.readdir(e.oid, 0, 10)?;
        Ok(Obs::All(vec![
            Obs::Count(page.entries.len() as u64),
            Obs::Flag(page.end),
        ]))
    });
    p.check("a file", |d, dir| {
        let f = walk(d, dir, "entry-001")?;
        d.readdir(f.oid, 0, 10).map(|_| Obs::Unit)
    });
}

fn readdir_resumes_across_unlink(p: &mut Pair<'_>) {
    let (uid, gid) = ids();
    p.check("populate", |d, dir| {
        for i in 0..60 {
            d.create(dir, &format!("f{i}"), 0o644, uid, gid)?;
        }
        Ok(Obs::Unit)
    });
    // Orders differ between backends, so each removes its own "last seen" and "not yet
    // seen" entries; what must agree is that resuming neither repeats nor skips survivors.
    p.check("resume", |d, dir| {
        let first = d.readdir(dir, 0, 10)?;
        let last = first.entries.last().cloned().expect("ten entries");
        let ahead = d.readdir(dir, last.cookie, 1)?.entries[0].name.clone();
        d.unlink(dir, &last.name)?;
        d.unlink(dir, &ahead)?;
        d.create(dir, "late-arrival", 0o644, uid, gid)?;
        let mut seen: Vec<String> = first.entries.iter().map(|e| e.name.clone()).collect();
        let mut cookie = last.cookie;
        loop {
            let page = d.readdir(dir, cookie, 7)?;
            seen.extend(page.entries.iter().map(|e| e.name.clone()));
            cookie = page.entries.last().map_or(cookie, |e| e.cookie);
            if page.end {
                break;
            }
        }
        // POSIX leaves it open whether an entry created during a listing shows.
        seen.retain(|n| n != "late-arrival");
        let unique: HashSet<&String> = seen.iter().collect();
        Ok(Obs::All(vec![
            Obs::Count(seen.len() as u64),
            Obs::Flag(unique.len() == seen.len()),
            Obs::Flag(!seen.contains(&ahead)),
        ]))
    });
}
