//! The metadata store of a namespace: inodes, directory entries, symlink targets, extended
//! attributes and the superblock, in one embedded transactional store (redb) per container.
//!
//! Every change is one transaction committed without forcing the disk;
//! [`MetaStore::commit_durably`] (fsync) makes it and every earlier one durable at once, since
//! redb orders commits.
//!
//! | table | key → value | DFS counterpart |
//! |---|---|---|
//! | `inodes` | oid → packed inode | the inode record in the parent entry |
//! | `entries` | (directory, hash of name, name) → oid | a dkey per entry of the directory object |
//! | `symlinks` | oid → target | akey `DFS_SLINK` |
//! | `xattrs` | (oid, name) → value | akeys `x:<name>` |
//! | `super` | `next_oid` (end of the oids reserved, `oids.rs`), `used_bytes`, `chunk_size` | the superblock object |
//! | `reclaim` | oid → size | DAOS's aggregation of punched objects |
//!
//! This file holds the store, its transactions and the object reads; names are in
//! `entries.rs` (lookup, listings) and `names.rs` (create, remove, rename), attributes in
//! `xattrs.rs`.

mod entries;
mod names;
mod oids;
mod pending;
mod xattrs;

#[cfg(test)]
mod tests;

pub use entries::{DirEntry, DirPage, name_hash};
pub(crate) use names::name_ok;
pub use names::{NAME_MAX, SYMLINK_MAX, Unreclaimed};
#[cfg(test)]
pub(crate) use pending::RECORD_AT;
pub use xattrs::{XATTR_VALUE_MAX, XattrSet};

use super::disk::{Disk, RedbFile};
use super::error::{DfsResult, Errno, err};
use super::inode::{Inode, Oid, ROOT, S_IFDIR, Time};
use crate::namespace::error::StorageResult;
use pending::Pending;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// (directory, hash of the name, name) → object: a directory's entries are keys of its
/// object, ordered by the hash that is also their readdir cookie (see `entries.rs`).
const ENTRIES: TableDefinition<(u64, u64, &str), u64> = TableDefinition::new("entries");
const SYMLINKS: TableDefinition<u64, &str> = TableDefinition::new("symlinks");
const XATTRS: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("xattrs");
/// The superblock, as DFS's SB object: counters and the layout fixed at creation.
const SUPER: TableDefinition<&str, u64> = TableDefinition::new("super");
/// Removed files whose chunk files are not cut yet: oid → size when removed.
const RECLAIM: TableDefinition<u64, u64> = TableDefinition::new("reclaim");
const NEXT_OID: &str = "next_oid";
const USED_BYTES: &str = "used_bytes";
const CHUNK_SIZE: &str = "chunk_size";

/// The inode of `oid`; ESTALE when the object is gone (oids are never reused).
fn get_inode<T: ReadableTable<u64, &'static [u8]>>(t: &T, oid: Oid) -> DfsResult<Inode> {
    let raw = t
        .get(oid)
        .storage()?
        .ok_or_else(|| err(Errno::STALE, format!("object {oid:#x} does not exist")))?;
    Inode::decode(oid, raw.value())
        .ok_or_else(|| err(Errno::IO, format!("object {oid:#x} has a corrupt inode")))
}

/// The inode of a directory; ENOTDIR for anything else.
fn get_dir<T: ReadableTable<u64, &'static [u8]>>(t: &T, oid: Oid) -> DfsResult<Inode> {
    let ino = get_inode(t, oid)?;
    if !ino.is_dir() {
        return Err(err(
            Errno::NOTDIR,
            format!("object {oid:#x} is not a directory"),
        ));
    }
    Ok(ino)
}

/// Writes an inode back.
fn put_inode(tx: &WriteTransaction, ino: &Inode) -> DfsResult<()> {
    tx.open_table(INODES)
        .storage()?
        .insert(ino.oid, ino.encode().as_slice())
        .storage()?;
    Ok(())
}

/// Adds `delta` to the count of data bytes.
fn adjust_used(tx: &WriteTransaction, delta: i64) -> DfsResult<()> {
    let mut sup = tx.open_table(SUPER).storage()?;
    let used = sup.get(USED_BYTES).storage()?.map_or(0, |v| v.value());
    sup.insert(USED_BYTES, used.saturating_add_signed(delta))
        .storage()?;
    Ok(())
}

/// Writes the pending writes' sizes, times and growth into `tx`. An object removed since
/// has nothing left to record.
fn record(tx: &WriteTransaction, pending: &Pending) -> DfsResult<()> {
    for (oid, _) in pending.files() {
        let stored = get_inode(&tx.open_table(INODES).storage()?, oid);
        match stored {
            Ok(ino) => put_inode(tx, &pending.apply(ino))?,
            Err(e) if e.errno == Errno::STALE => {}
            Err(e) => return Err(e),
        }
    }
    adjust_used(tx, pending.growth() as i64)
}

/// One container's metadata store.
#[derive(Debug)]
pub(crate) struct MetaStore {
    disk: Arc<dyn Disk>,
    db: Database,
    path: PathBuf,
    /// A snapshot's: every change fails with EROFS.
    read_only: bool,
    /// Writes' size, time and space changes not recorded yet (see `pending.rs`).
    pending: RwLock<Pending>,
    /// Transactions committed so far, and how many of them are known durable.
    commits: AtomicU64,
    durable: AtomicU64,
    /// Oids reserved durably and not handed out yet.
    oids: Mutex<oids::OidRange>,
}

/// A change in progress, for what the namespace does across both stores in one transaction
/// (a truncation cuts chunk files and records the new size and use together).
pub(crate) struct MetaTx<'a>(&'a WriteTransaction);

impl std::fmt::Debug for MetaTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetaTx")
    }
}

impl MetaTx<'_> {
    /// The inode of `oid`; ESTALE when it is gone.
    pub fn inode(&self, oid: Oid) -> DfsResult<Inode> {
        get_inode(&self.0.open_table(INODES).storage()?, oid)
    }

    pub fn put_inode(&self, ino: &Inode) -> DfsResult<()> {
        put_inode(self.0, ino)
    }

    /// Adds `delta` to the namespace's count of data bytes.
    pub fn adjust_used(&self, delta: i64) -> DfsResult<()> {
        adjust_used(self.0, delta)
    }
}

impl Drop for MetaStore {
    /// A store closed in order (engine stop, container close) keeps what writes noted: they
    /// are recorded before the database closes, which persists its commits.
    fn drop(&mut self) {
        if let Err(e) = self.record_pending(&mut self.pending_mut()) {
            tracing::error!(path = %self.path.display(), "recording writes at close: {e}");
        }
    }
}

impl MetaStore {
    /// Opens (or creates) the store at `path`; [`MetaStore::init`] lays out a new one.
    pub fn open(disk: Arc<dyn Disk>, path: &Path, read_only: bool) -> DfsResult<MetaStore> {
        let file = disk.open(path, true).storage()?;
        if let Some(dir) = path.parent() {
            disk.sync_dir(dir).storage()?;
        }
        let db = Database::builder()
            .create_with_backend(RedbFile(file))
            .storage()?;
        Ok(MetaStore {
            disk,
            db,
            path: path.to_path_buf(),
            read_only,
            pending: RwLock::default(),
            commits: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            oids: Mutex::default(),
        })
    }

    /// Creates the root and the superblock of a new store; returns the chunk size the
    /// superblock records (`chunk_size` for a new one: chunk files are cut by it for good).
    pub fn init(&self, chunk_size: u64) -> DfsResult<u64> {
        let mut tx = self.db.begin_write().storage()?;
        // The superblock must be durable before any data is laid out by it.
        tx.set_durability(Durability::Immediate).storage()?;
        let recorded;
        {
            let mut inodes = tx.open_table(INODES).storage()?;
            let mut sup = tx.open_table(SUPER).storage()?;
            if inodes.get(ROOT).storage()?.is_none() {
                let now = Time::now();
                let root = Inode {
                    oid: ROOT,
                    mode: S_IFDIR | 0o755,
                    uid: 0,
                    gid: 0,
                    size: 0,
                    atime: now,
                    mtime: now,
                    ctime: now,
                    parent: ROOT,
                };
                inodes.insert(ROOT, root.encode().as_slice()).storage()?;
                sup.insert(NEXT_OID, ROOT + 1).storage()?;
            }
            let stored = sup.get(CHUNK_SIZE).storage()?.map(|v| v.value());
            recorded = match stored {
                Some(cs) => cs,
                None => {
                    sup.insert(CHUNK_SIZE, chunk_size).storage()?;
                    chunk_size
                }
            };
            tx.open_table(ENTRIES).storage()?;
            tx.open_table(SYMLINKS).storage()?;
            tx.open_table(XATTRS).storage()?;
            tx.open_table(RECLAIM).storage()?;
        }
        tx.commit().storage()?;
        Ok(recorded)
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether every change fails with EROFS (a snapshot's store).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// EROFS for a snapshot's store.
    pub fn writable(&self) -> DfsResult<()> {
        if self.read_only {
            return Err(err(Errno::ROFS, "a snapshot is read-only"));
        }
        Ok(())
    }

    /// Runs `f` in a write transaction committed without forcing the disk; EROFS for a
    /// snapshot's store. Pending writes are recorded in the same transaction, so `f` sees
    /// every size as readers do (a truncation, a removal).
    pub fn update<T>(&self, f: impl FnOnce(&MetaTx<'_>) -> DfsResult<T>) -> DfsResult<T> {
        self.transact_recording(|tx| f(&MetaTx(tx)))
    }

    /// A transaction for changes that neither read nor change files' sizes or the bytes
    /// used (names, directories, attributes): pending writes stay pending.
    fn transact<T>(&self, f: impl FnOnce(&WriteTransaction) -> DfsResult<T>) -> DfsResult<T> {
        self.commit_with(None, f)
    }

    /// A transaction that records every pending write first; readers wait for its commit.
    fn transact_recording<T>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> DfsResult<T>,
    ) -> DfsResult<T> {
        let mut pending = self.pending_mut();
        let v = self.commit_with(Some(&pending), f)?;
        pending.clear();
        Ok(v)
    }

    /// Records the pending writes in a transaction of their own, if there are any.
    fn record_pending(&self, pending: &mut Pending) -> DfsResult<()> {
        if pending.is_empty() {
            return Ok(());
        }
        self.commit_with(Some(pending), |_| Ok(()))?;
        pending.clear();
        Ok(())
    }

    fn commit_with<T>(
        &self,
        pending: Option<&Pending>,
        f: impl FnOnce(&WriteTransaction) -> DfsResult<T>,
    ) -> DfsResult<T> {
        self.writable()?;
        let mut tx = self.db.begin_write().storage()?;
        tx.set_durability(Durability::None).storage()?;
        let done = pending
            .map_or(Ok(()), |p| record(&tx, p))
            .and_then(|()| f(&tx));
        match done {
            Ok(v) => {
                tx.commit().storage()?;
                // Counted after the commit: a durable commit that misses it only makes this
                // one look not durable yet.
                self.commits.fetch_add(1, Ordering::SeqCst);
                Ok(v)
            }
            Err(e) => {
                tx.abort().storage()?;
                Err(e)
            }
        }
    }

    fn pending(&self) -> RwLockReadGuard<'_, Pending> {
        self.pending.read().unwrap_or_else(|p| p.into_inner())
    }

    fn pending_mut(&self) -> RwLockWriteGuard<'_, Pending> {
        self.pending.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Files with pending writes, for tests.
    #[cfg(test)]
    pub fn unrecorded_files(&self) -> usize {
        self.pending().files().count()
    }

    /// Makes every change so far durable.
    pub fn commit_durably(&self) -> DfsResult<()> {
        // Recorded without forcing the disk, so readers wait only for that commit; the
        // durable one below persists it (redb orders commits).
        self.record_pending(&mut self.pending_mut())?;
        self.commit_forced(|_| Ok(()))
    }

    /// Commits `f`'s changes and every earlier one durably.
    fn commit_forced(&self, f: impl FnOnce(&WriteTransaction) -> DfsResult<()>) -> DfsResult<()> {
        let mut tx = self.db.begin_write().storage()?;
        // Every commit counted so far came before this transaction began.
        let before = self.commits.load(Ordering::SeqCst);
        tx.set_durability(Durability::Immediate).storage()?;
        if let Err(e) = f(&tx) {
            tx.abort().storage()?;
            return Err(e);
        }
        tx.commit().storage()?;
        self.durable.fetch_max(before, Ordering::SeqCst);
        Ok(())
    }

    /// Transactions committed so far: a change made before this was read is durable once
    /// [`MetaStore::durable_commits`] reaches it.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::SeqCst)
    }

    /// How many of the first transactions are known durable.
    pub fn durable_commits(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }

    /// Writes a durable point-in-time copy of the store to `target` (for a snapshot or a
    /// clone). Every earlier change is made durable first; metadata writers are held off
    /// while the file is copied.
    pub fn copy_to(&self, target: &Path) -> DfsResult<()> {
        self.commit_durably()?;
        // An open write transaction holds every metadata writer off while the
        // store is copied; it is aborted, never committed.
        let hold = self.db.begin_write().storage()?;
        let src = self.disk.open(&self.path, false).storage()?;
        let mut bytes = vec![0; src.size().storage()? as usize];
        src.read_at(0, &mut bytes).storage()?;
        let dst = self.disk.open(target, true).storage()?;
        dst.set_len(0).storage()?;
        dst.write_at(0, &bytes).storage()?;
        dst.sync().storage()?;
        hold.abort().storage()?;
        Ok(())
    }

    /// The inode of `oid` with its pending writes.
    pub fn getattr(&self, oid: Oid) -> DfsResult<Inode> {
        let pending = self.pending();
        let tx = self.db.begin_read().storage()?;
        Ok(pending.apply(get_inode(&tx.open_table(INODES).storage()?, oid)?))
    }

    /// The inode of `oid` if it is a regular file; EISDIR for a directory, EINVAL otherwise
    /// (`what` names the refused operation).
    pub fn regular_file(&self, oid: Oid, what: &str) -> DfsResult<Inode> {
        let ino = self.getattr(oid)?;
        only_files(&ino, what)?;
        Ok(ino)
    }

    pub fn readlink(&self, oid: Oid) -> DfsResult<String> {
        let tx = self.db.begin_read().storage()?;
        get_inode(&tx.open_table(INODES).storage()?, oid)?;
        let target = tx
            .open_table(SYMLINKS)
            .storage()?
            .get(oid)
            .storage()?
            .map(|v| v.value().to_string());
        target.ok_or_else(|| err(Errno::INVAL, format!("object {oid:#x} is not a symlink")))
    }

    /// Notes a write: the size (at least `end`), the times, and `growth` more data bytes.
    /// Nothing is written to the store (see `pending.rs`) unless many files are pending.
    pub fn record_write(&self, oid: Oid, end: u64, growth: u64) -> DfsResult<()> {
        self.writable()?;
        let mut pending = self.pending_mut();
        if pending.full() {
            // Before noting this one: a write that fails here is noted nowhere.
            self.record_pending(&mut pending)?;
        }
        pending.note(oid, end, growth, Time::now());
        Ok(())
    }

    /// Data bytes held by the namespace's files.
    pub fn used(&self) -> DfsResult<u64> {
        let pending = self.pending();
        let tx = self.db.begin_read().storage()?;
        let recorded = tx
            .open_table(SUPER)
            .storage()?
            .get(USED_BYTES)
            .storage()?
            .map_or(0, |v| v.value());
        Ok(recorded.saturating_add(pending.growth()))
    }

    /// Removed files whose chunk files may not be cut yet.
    pub fn unreclaimed(&self) -> DfsResult<Vec<Unreclaimed>> {
        let tx = self.db.begin_read().storage()?;
        let table = tx.open_table(RECLAIM).storage()?;
        table
            .iter()
            .storage()?
            .map(|row| {
                let (oid, size) = row.storage()?;
                Ok(Unreclaimed {
                    oid: oid.value(),
                    size: size.value(),
                })
            })
            .collect()
    }

    /// Forgets removed files whose chunk files are cut.
    pub fn forget_reclaimed(&self, oids: &[Oid]) -> DfsResult<()> {
        self.transact(|tx| {
            let mut table = tx.open_table(RECLAIM).storage()?;
            for &oid in oids {
                table.remove(oid).storage()?;
            }
            Ok(())
        })
    }

    /// Objects in the namespace (statfs's files).
    pub fn objects(&self) -> DfsResult<u64> {
        self.db
            .begin_read()
            .storage()?
            .open_table(INODES)
            .storage()?
            .len()
            .storage()
    }
}

/// Refuses what only a regular file can have done to it ("can only {what} regular files"):
/// EISDIR for a directory, EINVAL for anything else.
pub(crate) fn only_files(ino: &Inode, what: &str) -> DfsResult<()> {
    if ino.is_file() {
        return Ok(());
    }
    let errno = if ino.is_dir() {
        Errno::ISDIR
    } else {
        Errno::INVAL
    };
    Err(err(errno, format!("can only {what} regular files")))
}
