//! The differential POSIX suite: every case runs the same steps on a reference backend
//! (a [`LocalDfs`](super::LocalDfs) over a local directory) and on the backend under test,
//! and each step's results must agree — data, errno, stat fields, listings.
//!
//! A step observes its backend through [`Obs`], which leaves out what legitimately differs
//! (object ids, clock-driven times, and the [`ALLOWED_DIFFERENCES`]). Objects are always
//! reached by name from the case's own directory, since oids differ between backends.
//!
//! ```no_run
//! # use dpufs_daos::dfs::{LocalDfs, conformance};
//! # let (tmp, other): (&std::path::Path, &dyn dpufs_daos::dfs::Dfs) = unimplemented!();
//! let reference = LocalDfs::open(tmp).unwrap();
//! conformance::run_all(&reference, other).assert_passed();
//! ```
//!
//! Ownership cases set uids and gids other than the caller's, which a local directory only
//! allows root to do; run the suite as root (the e2e suite does).

mod data;
mod meta;
mod names;

use super::{Attr, Dfs, DfsResult, Oid, ROOT_OID, S_IFDIR, S_IFMT};
use std::fmt;

/// Where a DFS volume may differ from a local file system, and is not compared. The same
/// list is in `docs/dfs.md`.
pub const ALLOWED_DIFFERENCES: &[(&str, &str)] = &[
    (
        "hard links",
        "DFS has none: the Dfs interface has no link call; files have nlink 1",
    ),
    (
        "flock",
        "node-local only (dfuse --enable-local-flock); not part of the Dfs interface",
    ),
    (
        "atime",
        "DFS does not track reads; compared only when set explicitly",
    ),
    (
        "mtime, ctime",
        "clocks differ; compared only when set explicitly",
    ),
    (
        "nlink of directories",
        "DFS reports 1; a local file system 2 plus subdirectories",
    ),
    (
        "blocks",
        "DFS derives them from the size; a local file system counts allocation",
    ),
    (
        "statfs",
        "sizes differ by design: only sanity (0 < free <= total) is compared",
    ),
    (
        "listing order, cookie values",
        "listings compare as sets; cookies by what resuming gives",
    ),
    (
        "xattr values over 63 KiB",
        "E2BIG on the engine (64 KiB message limit); Linux takes 64 KiB",
    ),
];

/// What stat shows that both backends must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttrView {
    pub kind: u32,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Not for directories (allow-listed).
    pub nlink: Option<u32>,
}

impl From<&Attr> for AttrView {
    fn from(a: &Attr) -> AttrView {
        AttrView {
            kind: a.kind(),
            perm: a.mode & !S_IFMT,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            nlink: (a.kind() != S_IFDIR).then_some(a.nlink),
        }
    }
}

/// One step's result, normalized for comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obs {
    Unit,
    Attr(AttrView),
    Bytes(Vec<u8>),
    Count(u64),
    /// Sorted.
    Names(Vec<String>),
    Text(String),
    Flag(bool),
    All(Vec<Obs>),
}

impl Obs {
    /// An attribute observation.
    pub fn attr(a: &Attr) -> Obs {
        Obs::Attr(a.into())
    }

    /// A set of names (sorted, duplicates kept so they show).
    pub fn names(mut names: Vec<String>) -> Obs {
        names.sort();
        Obs::Names(names)
    }
}

/// The two backends of a running case, each with the case's own directory.
pub struct Pair<'a> {
    reference: &'a dyn Dfs,
    subject: &'a dyn Dfs,
    dirs: (Oid, Oid),
    mismatches: Vec<String>,
}

impl fmt::Debug for Pair<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pair")
            .field("dirs", &self.dirs)
            .field("mismatches", &self.mismatches)
            .finish()
    }
}

fn show(r: &DfsResult<Obs>) -> String {
    match r {
        Ok(obs) => {
            let s = format!("{obs:?}");
            match s.char_indices().nth(300) {
                Some((cut, _)) => format!("{}…", &s[..cut]),
                None => s,
            }
        }
        Err(e) => format!("error {:?} ({})", e.errno, e.detail),
    }
}

impl Pair<'_> {
    /// Runs `step` on both backends (in the case's directory) and records any difference:
    /// errors agree when their errno does.
    pub fn check(&mut self, step: &str, f: impl Fn(&dyn Dfs, Oid) -> DfsResult<Obs>) {
        let want = f(self.reference, self.dirs.0);
        let got = f(self.subject, self.dirs.1);
        let same = match (&want, &got) {
            (Ok(a), Ok(b)) => a == b,
            (Err(a), Err(b)) => a.errno == b.errno,
            _ => false,
        };
        if !same {
            self.mismatches.push(format!(
                "{step}: reference gave {}, backend gave {}",
                show(&want),
                show(&got)
            ));
        }
    }
}

/// One case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    pub run: fn(&mut Pair<'_>),
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Every case.
pub fn cases() -> Vec<Case> {
    let mut all = data::cases();
    all.extend(names::cases());
    all.extend(meta::cases());
    all
}

/// Runs one case in a fresh directory named after it on each backend.
pub fn run_case(case: &Case, reference: &dyn Dfs, subject: &dyn Dfs) -> Result<(), Vec<String>> {
    let (uid, gid) = ids();
    let setup = |dfs: &dyn Dfs| {
        dfs.mkdir(ROOT_OID, case.name, 0o755, uid, gid)
            .map(|a| a.oid)
    };
    let dirs = match (setup(reference), setup(subject)) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => return Err(vec![format!("case directory: {a:?} / {b:?}")]),
    };
    let mut pair = Pair {
        reference,
        subject,
        dirs,
        mismatches: Vec::new(),
    };
    (case.run)(&mut pair);
    if pair.mismatches.is_empty() {
        Ok(())
    } else {
        Err(pair.mismatches)
    }
}

/// What a run of the suite found.
#[derive(Debug, Default)]
pub struct Report {
    pub passed: Vec<&'static str>,
    pub failed: Vec<(&'static str, Vec<String>)>,
}

impl Report {
    /// Panics with every difference found, if any.
    pub fn assert_passed(&self) {
        if self.failed.is_empty() {
            return;
        }
        let mut msg = format!(
            "{} of {} cases differ:\n",
            self.failed.len(),
            self.failed.len() + self.passed.len()
        );
        for (case, diffs) in &self.failed {
            for d in diffs {
                msg.push_str(&format!("  {case}: {d}\n"));
            }
        }
        panic!("{msg}");
    }
}

impl Report {
    /// Like [`Report::assert_passed`], but a backend's own known differences are accepted:
    /// each `(case, step, why)` names a step of a case whose results may differ. Every
    /// entry must match a difference found, so the list cannot outlive what it excuses.
    pub fn assert_passed_except(&self, known: &[(&str, &str, &str)]) {
        let mut used = vec![false; known.len()];
        let mut unexpected = Vec::new();
        for (case, diffs) in &self.failed {
            for d in diffs {
                let step = d.split(": reference gave").next().unwrap_or(d);
                match known.iter().position(|(c, s, _)| c == case && *s == step) {
                    Some(i) => used[i] = true,
                    None => unexpected.push(format!("  {case}: {d}")),
                }
            }
        }
        let stale: Vec<String> = known
            .iter()
            .zip(&used)
            .filter(|(_, used)| !**used)
            .map(|((case, step, _), _)| format!("  {case}: {step}"))
            .collect();
        assert!(
            unexpected.is_empty() && stale.is_empty(),
            "differences not on the backend's list:\n{}\nlisted differences that did not occur:\n{}",
            unexpected.join("\n"),
            stale.join("\n")
        );
    }
}

/// Runs every case.
pub fn run_all(reference: &dyn Dfs, subject: &dyn Dfs) -> Report {
    let mut report = Report::default();
    for case in cases() {
        match run_case(&case, reference, subject) {
            Ok(()) => report.passed.push(case.name),
            Err(diffs) => report.failed.push((case.name, diffs)),
        }
    }
    report
}

/// Owner ids for created objects: someone other than root when running as root (so
/// ownership really travels), else the caller.
pub fn ids() -> (u32, u32) {
    // SAFETY: geteuid/getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 { (1000, 1000) } else { (uid, gid) }
}

/// Resolves `a/b/c` from `dir`.
pub fn walk(dfs: &dyn Dfs, dir: Oid, path: &str) -> DfsResult<Attr> {
    let mut at = dfs.getattr(dir)?;
    for part in path.split('/') {
        at = dfs.lookup(at.oid, part)?;
    }
    Ok(at)
}

/// The whole content of a file.
pub fn read_all(dfs: &dyn Dfs, oid: Oid) -> DfsResult<Vec<u8>> {
    let size = dfs.getattr(oid)?.size as usize;
    let mut buf = vec![0xEE; size + 1];
    let n = dfs.read(oid, 0, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// Names in a directory, read in pages of `page`.
pub fn list(dfs: &dyn Dfs, dir: Oid, page: usize) -> DfsResult<Vec<String>> {
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let p = dfs.readdir(dir, cookie, page)?;
        names.extend(p.entries.iter().map(|e| e.name.clone()));
        if let Some(last) = p.entries.last() {
            cookie = last.cookie;
        }
        if p.end {
            return Ok(names);
        }
        if p.entries.is_empty() {
            return Err(super::DfsError::new(
                super::Errno::IO,
                "empty page before the end",
            ));
        }
    }
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8)
        .collect()
}
