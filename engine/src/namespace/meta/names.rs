//! Creating, removing and renaming entries, each in one transaction. DFS has no hard links,
//! so an object goes with its only entry: its inode, symlink target and attributes in the
//! same transaction. A removed file's data is counted as freed in that transaction too (the
//! caller's `held_bytes` says how many bytes its chunk files hold), and the file is noted in
//! the `reclaim` table: its chunk files are cut later, once the removal is durable (see the
//! namespace's `reclaim.rs`).

use super::entries::{entry_key, has_entries};
use super::{ENTRIES, INODES, MetaStore, RECLAIM, SYMLINKS, adjust_used};
use super::{get_dir, get_inode, put_inode};
use crate::namespace::error::StorageResult;
use crate::namespace::error::{DfsResult, Errno, err};
use crate::namespace::inode::{Inode, Oid, ROOT, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, Time};
use dpufs_proto::dfs::owner_in_dir;
use redb::{ReadableTable, WriteTransaction};

pub use dpufs_proto::dfs::{NAME_MAX, SYMLINK_MAX, check_name as name_ok};

/// The inode an entry names, within a transaction.
fn entry(tx: &WriteTransaction, dir: Oid, name: &str) -> DfsResult<Inode> {
    let inodes = tx.open_table(INODES).storage()?;
    get_dir(&inodes, dir)?;
    let oid = tx
        .open_table(ENTRIES)
        .storage()?
        .get(entry_key(dir, name))
        .storage()?
        .map(|v| v.value());
    let oid = oid.ok_or_else(|| err(Errno::NOENT, format!("{name:?} not found")))?;
    get_inode(&inodes, oid)
}

/// A removed file whose chunk files are still to be cut: noted in the removing transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreclaimed {
    pub oid: Oid,
    /// Its size when removed: no chunk file lies beyond it.
    pub size: u64,
}

/// Deletes an object that is about to lose its only entry: its inode, symlink target and
/// xattrs, and for a file the bytes its chunk files hold (`held_bytes`) from the bytes used.
/// Directories must be empty. Returns the file to reclaim, with the bytes given back.
fn drop_object(
    tx: &WriteTransaction,
    ino: &Inode,
    held_bytes: &mut dyn FnMut(&Inode) -> DfsResult<u64>,
) -> DfsResult<Option<(Unreclaimed, u64)>> {
    if ino.is_dir() && has_entries(tx, ino.oid)? {
        return Err(err(
            Errno::NOTEMPTY,
            format!("directory {:#x} is not empty", ino.oid),
        ));
    }
    let mut gone = None;
    if ino.is_file() {
        let bytes = held_bytes(ino)?;
        adjust_used(tx, -(bytes as i64))?;
        tx.open_table(RECLAIM)
            .storage()?
            .insert(ino.oid, ino.size)
            .storage()?;
        let file = Unreclaimed {
            oid: ino.oid,
            size: ino.size,
        };
        gone = Some((file, bytes));
    }
    tx.open_table(INODES).storage()?.remove(ino.oid).storage()?;
    tx.open_table(SYMLINKS)
        .storage()?
        .remove(ino.oid)
        .storage()?;
    super::xattrs::drop_all(tx, ino.oid)?;
    Ok(gone)
}

/// Sets a directory's mtime and ctime: its entries changed.
fn touch(tx: &WriteTransaction, oid: Oid) -> DfsResult<()> {
    let mut ino = get_inode(&tx.open_table(INODES).storage()?, oid)?;
    let now = Time::now();
    ino.mtime = now;
    ino.ctime = now;
    put_inode(tx, &ino)
}

/// Whether `dir` is `ancestor` or lies below it.
fn is_ancestor(tx: &WriteTransaction, ancestor: Oid, mut dir: Oid) -> DfsResult<bool> {
    let inodes = tx.open_table(INODES).storage()?;
    loop {
        if dir == ancestor {
            return Ok(true);
        }
        if dir == ROOT {
            return Ok(false);
        }
        dir = get_inode(&inodes, dir)?.parent;
    }
}

impl MetaStore {
    /// Creates a regular file, directory or symlink in `dir`.
    fn make(
        &self,
        dir: Oid,
        name: &str,
        mode: u32,
        uid: u32,
        gid: u32,
        target: Option<&str>,
    ) -> DfsResult<Inode> {
        name_ok(name)?;
        // Taken before the transaction: reserving a range commits one of its own. A create
        // that fails leaves its oid unused, which costs nothing.
        let oid = self.new_oid()?;
        self.transact(|tx| {
            let mut parent = get_dir(&tx.open_table(INODES).storage()?, dir)?;
            let mut entries = tx.open_table(ENTRIES).storage()?;
            if entries.get(entry_key(dir, name)).storage()?.is_some() {
                return Err(err(Errno::EXIST, format!("{name:?} exists")));
            }
            let now = Time::now();
            // Applied here, in the transaction that makes the entry, so no client reads the
            // parent first.
            let (mode, gid) = owner_in_dir(parent.mode, parent.gid, mode, gid);
            let ino = Inode {
                oid,
                mode,
                uid,
                gid,
                size: target.map_or(0, |t| t.len() as u64),
                atime: now,
                mtime: now,
                ctime: now,
                parent: dir,
            };
            put_inode(tx, &ino)?;
            entries.insert(entry_key(dir, name), oid).storage()?;
            if let Some(t) = target {
                tx.open_table(SYMLINKS)
                    .storage()?
                    .insert(oid, t)
                    .storage()?;
            }
            parent.mtime = now;
            parent.ctime = now;
            put_inode(tx, &parent)?;
            Ok(ino)
        })
    }

    /// Creates a regular file; EEXIST if the name is taken.
    pub fn create(&self, dir: Oid, name: &str, perm: u32, uid: u32, gid: u32) -> DfsResult<Inode> {
        self.make(dir, name, S_IFREG | (perm & !S_IFMT), uid, gid, None)
    }

    pub fn mkdir(&self, dir: Oid, name: &str, perm: u32, uid: u32, gid: u32) -> DfsResult<Inode> {
        self.make(dir, name, S_IFDIR | (perm & !S_IFMT), uid, gid, None)
    }

    pub fn symlink(
        &self,
        dir: Oid,
        name: &str,
        target: &str,
        uid: u32,
        gid: u32,
    ) -> DfsResult<Inode> {
        if target.is_empty() {
            return Err(err(Errno::NOENT, "empty symlink target"));
        }
        if target.len() > SYMLINK_MAX || target.contains('\0') {
            let errno = if target.contains('\0') {
                Errno::INVAL
            } else {
                Errno::NAMETOOLONG
            };
            return Err(err(errno, "symlink target too long or with a NUL"));
        }
        self.make(dir, name, S_IFLNK | 0o777, uid, gid, Some(target))
    }

    /// Removes entry `name` of `dir` with its object: a directory (`want_dir`, and then
    /// only an empty one) or anything else. Returns a removed file to reclaim, with the data
    /// bytes given back. The name was checked by the caller.
    pub fn remove_entry(
        &self,
        dir: Oid,
        name: &str,
        want_dir: bool,
        mut held_bytes: impl FnMut(&Inode) -> DfsResult<u64>,
    ) -> DfsResult<Option<(Unreclaimed, u64)>> {
        self.transact_recording(|tx| {
            let victim = entry(tx, dir, name)?;
            match (want_dir, victim.is_dir()) {
                (true, false) => {
                    return Err(err(Errno::NOTDIR, format!("{name:?} is not a directory")));
                }
                (false, true) => return Err(err(Errno::ISDIR, format!("{name:?} is a directory"))),
                _ => {}
            }
            let gone = drop_object(tx, &victim, &mut held_bytes)?;
            tx.open_table(ENTRIES)
                .storage()?
                .remove(entry_key(dir, name))
                .storage()?;
            touch(tx, dir)?;
            Ok(gone)
        })
    }

    /// Renames atomically, replacing the target as rename(2) does; `noreplace` gives
    /// EEXIST instead. Returns a replaced file to reclaim, with the data bytes given back.
    /// The names were checked by the caller.
    pub fn rename(
        &self,
        (from_dir, from): (Oid, &str),
        (to_dir, to): (Oid, &str),
        noreplace: bool,
        mut held_bytes: impl FnMut(&Inode) -> DfsResult<u64>,
    ) -> DfsResult<Option<(Unreclaimed, u64)>> {
        self.transact_recording(|tx| {
            let mut moving = entry(tx, from_dir, from)?;
            get_dir(&tx.open_table(INODES).storage()?, to_dir)?;
            if moving.is_dir() && is_ancestor(tx, moving.oid, to_dir)? {
                return Err(err(Errno::INVAL, "cannot move a directory into itself"));
            }
            let mut gone = None;
            match entry(tx, to_dir, to) {
                // As renameat2: NOREPLACE refuses any existing target, itself included.
                Ok(_) if noreplace => return Err(err(Errno::EXIST, format!("{to:?} exists"))),
                Ok(existing) if existing.oid == moving.oid => return Ok(None),
                Ok(existing) => {
                    match (moving.is_dir(), existing.is_dir()) {
                        (true, false) => {
                            return Err(err(Errno::NOTDIR, format!("{to:?} is not a directory")));
                        }
                        (false, true) => {
                            return Err(err(Errno::ISDIR, format!("{to:?} is a directory")));
                        }
                        _ => {}
                    }
                    gone = drop_object(tx, &existing, &mut held_bytes)?;
                }
                Err(e) if e.errno == Errno::NOENT => {}
                Err(e) => return Err(e),
            }
            let mut entries = tx.open_table(ENTRIES).storage()?;
            entries.remove(entry_key(from_dir, from)).storage()?;
            entries
                .insert(entry_key(to_dir, to), moving.oid)
                .storage()?;
            drop(entries);
            moving.parent = to_dir;
            moving.ctime = Time::now();
            put_inode(tx, &moving)?;
            touch(tx, from_dir)?;
            if to_dir != from_dir {
                touch(tx, to_dir)?;
            }
            Ok(gone)
        })
    }
}
