//! What writes change in the metadata (a file's size and times, the namespace's bytes used),
//! kept in memory until a transaction records it, so a write costs no transaction.
//!
//! DFS has the same freedom: DAOS keeps a file's size implicitly in its object's extents, and
//! dfs_write updates no metadata record. Here the size must be recorded somewhere, so it is
//! recorded late: by the next transaction that reads or changes sizes (truncate, remove,
//! rename, fsync, a snapshot) and, to bound the memory, once many files have pending changes.
//! Durability is unchanged: transactions commit without forcing the disk, so until an fsync
//! a crash loses a recorded size exactly as it loses a pending one.
//!
//! Readers see the pending changes over the stored inode ([`Pending::apply`]), under the
//! same lock the recording transaction holds exclusively from its start to its commit, so no
//! reader sees a size go backwards while a record lands.

use super::super::inode::{Inode, Oid, Time};
use std::collections::HashMap;

/// Files with pending changes that make the next write record them all.
pub(crate) const RECORD_AT: usize = 4096;

/// One file's unrecorded writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Written {
    /// The furthest end written: the size is at least this.
    pub end: u64,
    /// When the last write happened: its mtime and ctime.
    pub at: Time,
}

/// Every unrecorded write of a namespace.
#[derive(Debug, Default)]
pub(super) struct Pending {
    files: HashMap<Oid, Written>,
    /// Data bytes the writes added (writes only add; what frees space is a transaction).
    growth: u64,
}

impl Pending {
    /// Notes a write of `oid` up to `end` that took `growth` more bytes.
    pub fn note(&mut self, oid: Oid, end: u64, growth: u64, at: Time) {
        let w = self.files.entry(oid).or_insert(Written { end, at });
        w.end = w.end.max(end);
        w.at = at;
        self.growth = self.growth.saturating_add(growth);
    }

    /// `ino` as the unrecorded writes left it.
    pub fn apply(&self, mut ino: Inode) -> Inode {
        if let Some(w) = self.files.get(&ino.oid) {
            ino.size = ino.size.max(w.end);
            ino.mtime = w.at;
            ino.ctime = w.at;
        }
        ino
    }

    /// Data bytes added since the last record.
    pub fn growth(&self) -> u64 {
        self.growth
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.growth == 0
    }

    /// Whether enough has piled up to record it now.
    pub fn full(&self) -> bool {
        self.files.len() >= RECORD_AT
    }

    /// The files with pending changes.
    pub fn files(&self) -> impl Iterator<Item = (Oid, Written)> + '_ {
        self.files.iter().map(|(&oid, &w)| (oid, w))
    }

    /// Forgets everything: a transaction recorded it.
    pub fn clear(&mut self) {
        self.files.clear();
        self.growth = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::inode::S_IFREG;

    fn file(oid: Oid, size: u64) -> Inode {
        let t = Time { secs: 1, nanos: 0 };
        Inode {
            oid,
            mode: S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            size,
            atime: t,
            mtime: t,
            ctime: t,
            parent: 1,
        }
    }

    #[test]
    fn sizes_only_grow_and_times_follow_the_last_write() {
        let mut p = Pending::default();
        let (t2, t3) = (Time { secs: 2, nanos: 0 }, Time { secs: 3, nanos: 0 });
        p.note(7, 100, 100, t2);
        p.note(7, 50, 0, t3);
        let ino = p.apply(file(7, 10));
        assert_eq!((ino.size, ino.mtime, ino.ctime), (100, t3, t3));
        // A stored size beyond every pending write stays.
        assert_eq!(p.apply(file(7, 500)).size, 500);
        // Other files are untouched.
        assert_eq!(p.apply(file(8, 10)), file(8, 10));
        assert_eq!(p.growth(), 100);
        p.clear();
        assert!(p.is_empty());
        assert_eq!(p.apply(file(7, 10)), file(7, 10));
    }
}
