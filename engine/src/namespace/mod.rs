//! DFS on the engine: a POSIX namespace per container with DAOS's DFS semantics (directories
//! as objects, entries as keys, files in chunks, no hard links).
//!
//! A [`Namespace`] is composed of two stores it coordinates:
//! - the metadata store (`meta/`): inodes, directory entries, symlink targets, extended
//!   attributes and the superblock, in one embedded transactional store per container;
//! - the chunk store (`chunks/`): file data in chunk files spread over the pool's ranks,
//!   recycled chunk files, space accounting, queued writes and read-ahead.
//!
//! Operations that touch both (write, truncate, remove, rename over a file, fsync, snapshot)
//! are ordered here. Durability follows POSIX: operations commit without forcing the disk;
//! `fsync` syncs the object's written chunk files, then the chunk directories whose entries
//! changed, then commits the metadata durably, which also persists every earlier metadata
//! change (redb orders commits).

mod chunks;
pub mod disk;
mod error;
pub mod inode;
mod iobuf;
mod meta;
mod reclaim;
#[cfg(test)]
mod sim_disk;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_reclaim;

pub use chunks::{SpaceBudget, StatFs};
pub use disk::{Disk, RealDisk};
pub use error::{DfsError, DfsResult, Errno};
pub use inode::{Inode, Oid, ROOT, Time};
pub use iobuf::IoBuf;
pub use meta::{DirEntry, DirPage, NAME_MAX, SYMLINK_MAX, XATTR_VALUE_MAX, XattrSet, name_hash};

use crate::namespace::error::StorageResult;
use chunks::{ChunkStore, ChunkWrite, Quiesced, Spares, check_end};
use dpufs_proto::dfs::without_set_id;
use error::err;
use inode::S_IFMT;
use meta::{MetaStore, Unreclaimed, name_ok};
use reclaim::Reclaimer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How a namespace is laid out.
#[derive(Debug, Clone)]
pub struct NamespaceConfig {
    /// The metadata store.
    pub meta_path: PathBuf,
    /// One chunk directory per rank of the pool; chunks are spread over them.
    pub chunk_dirs: Vec<PathBuf>,
    /// Bytes per chunk of a new namespace (DFS default 1 MiB). An existing namespace keeps
    /// the size its superblock recorded at creation: its chunk files are cut that way.
    pub chunk_size: u64,
    /// Capacity limit of the container (a dpufs engine extension); None for none.
    pub quota: Option<u64>,
    /// A snapshot: every change fails with EROFS.
    pub read_only: bool,
    /// Space shared with the pool's other containers; None when only the quota limits.
    pub budget: Option<Arc<dyn SpaceBudget>>,
}

/// Attribute changes; None leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
}

/// One container's namespace (or one snapshot's, read-only).
#[derive(Debug)]
pub struct Namespace {
    // Dropped first: its thread uses both stores.
    reclaimer: Reclaimer,
    // Dropped next: closing the chunk store waits for the writes it answered.
    chunks: Arc<ChunkStore>,
    meta: Arc<MetaStore>,
    disk: Arc<dyn Disk>,
}

impl Namespace {
    /// Opens (or creates, with a root directory) the namespace.
    pub fn open(disk: Arc<dyn Disk>, cfg: NamespaceConfig) -> DfsResult<Namespace> {
        if cfg.chunk_dirs.is_empty() || cfg.chunk_size == 0 {
            return Err(err(
                Errno::INVAL,
                "a namespace needs chunk directories and a chunk size",
            ));
        }
        let meta = Arc::new(MetaStore::open(
            disk.clone(),
            &cfg.meta_path,
            cfg.read_only,
        )?);
        let chunk_size = meta.init(cfg.chunk_size)?;
        // A snapshot changes nothing, and has no spares: they are never linked into one. A
        // container cuts what its removed files left (a snapshot never holds any: see
        // `reclaim.rs`).
        let (spares, leftovers) = if cfg.read_only {
            (Spares::default(), Vec::new())
        } else {
            let spares = Spares::adopt(&*disk, &cfg.chunk_dirs).storage()?;
            (spares, meta.unreclaimed()?)
        };
        if !leftovers.is_empty() {
            // A clean stop may have left their removals in the page cache only.
            meta.commit_durably()?;
        }
        let chunks = Arc::new(ChunkStore::new(
            disk.clone(),
            cfg.chunk_dirs,
            chunk_size,
            (cfg.quota, cfg.budget),
            spares,
        ));
        Ok(Namespace {
            reclaimer: Reclaimer::new(chunks.clone(), meta.clone(), leftovers),
            chunks,
            meta,
            disk,
        })
    }

    /// Bytes per chunk of this namespace's files.
    pub fn chunk_size(&self) -> u64 {
        self.chunks.chunk_size()
    }

    /// Whether every change fails with EROFS (a snapshot).
    pub fn read_only(&self) -> bool {
        self.meta.read_only()
    }

    /// Every chunk directory of this namespace.
    pub fn chunk_dirs(&self) -> &[PathBuf] {
        self.chunks.dirs()
    }

    /// The metadata store's path.
    pub fn meta_path(&self) -> &Path {
        self.meta.path()
    }

    /// The object an entry names.
    pub fn lookup(&self, dir: Oid, name: &str) -> DfsResult<Inode> {
        self.meta.lookup(dir, name)
    }

    pub fn getattr(&self, oid: Oid) -> DfsResult<Inode> {
        self.meta.getattr(oid)
    }

    /// Checks that `oid` can be opened (for writing, if `write`).
    pub fn open_object(&self, oid: Oid, write: bool) -> DfsResult<Inode> {
        let ino = self.getattr(oid)?;
        match ino.mode & S_IFMT {
            inode::S_IFLNK => Err(err(Errno::LOOP, "cannot open a symlink")),
            inode::S_IFDIR if write => Err(err(Errno::ISDIR, "cannot write a directory")),
            _ if write => self.meta.writable().map(|()| ino),
            _ => Ok(ino),
        }
    }

    /// Creates a regular file; EEXIST if the name is taken.
    pub fn create(&self, dir: Oid, name: &str, perm: u32, uid: u32, gid: u32) -> DfsResult<Inode> {
        self.meta.create(dir, name, perm, uid, gid)
    }

    pub fn mkdir(&self, dir: Oid, name: &str, perm: u32, uid: u32, gid: u32) -> DfsResult<Inode> {
        self.meta.mkdir(dir, name, perm, uid, gid)
    }

    pub fn symlink(
        &self,
        dir: Oid,
        name: &str,
        target: &str,
        uid: u32,
        gid: u32,
    ) -> DfsResult<Inode> {
        self.meta.symlink(dir, name, target, uid, gid)
    }

    pub fn readlink(&self, oid: Oid) -> DfsResult<String> {
        self.meta.readlink(oid)
    }

    /// Up to `max` entries of `dir` after `cookie` (0 starts at the beginning), more only
    /// to finish a run of equal hashes.
    pub fn readdir(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage> {
        self.meta.readdir(dir, cookie, max)
    }

    /// Changes attributes; a size change truncates or extends (sparse). Only a size change
    /// holds writes out (it may cut chunk files): a chmod, chown or utimes, three of every
    /// file `cp -a` writes, neither waits for queued writes to land nor drops what was read
    /// ahead.
    pub fn setattr(&self, oid: Oid, set: SetAttr) -> DfsResult<Inode> {
        let mut held = set.size.map(|_| self.chunks.quiesce());
        let (ino, freed) = self.meta.update(|tx| {
            let mut ino = tx.inode(oid)?;
            let now = Time::now();
            let mut freed = 0;
            if let Some(size) = set.size {
                meta::only_files(&ino, "set the size of")?;
                check_end(size, 0)?;
                if size < ino.size {
                    let held = held.as_mut().expect("held for a size change");
                    freed = held.cut(oid, size, ino.size)?;
                    tx.adjust_used(-(freed as i64))?;
                }
                ino.size = size;
                ino.mtime = now;
            }
            if (set.uid.is_some() || set.gid.is_some()) && !ino.is_dir() {
                // chown(2) clears them (an explicit mode below still wins).
                ino.mode = without_set_id(ino.mode, true);
            }
            if let Some(mode) = set.mode {
                ino.mode = (ino.mode & S_IFMT) | (mode & !S_IFMT);
            }
            ino.uid = set.uid.unwrap_or(ino.uid);
            ino.gid = set.gid.unwrap_or(ino.gid);
            ino.atime = set.atime.unwrap_or(ino.atime);
            ino.mtime = set.mtime.unwrap_or(ino.mtime);
            ino.ctime = now;
            tx.put_inode(&ino)?;
            Ok((ino, freed))
        })?;
        self.chunks.release(freed);
        Ok(ino)
    }

    /// Clears the set-ID bits a write by a writer without CAP_FSETID whose group is
    /// `writer_gid` clears (see [`without_set_id`]); changes nothing, in no transaction, when
    /// there are none to clear.
    pub fn drop_set_id(&self, oid: Oid, writer_gid: u32) -> DfsResult<()> {
        let ino = self.getattr(oid)?;
        let mode = without_set_id(ino.mode, ino.gid == writer_gid);
        if mode == ino.mode {
            return Ok(());
        }
        let set = SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        self.setattr(oid, set).map(drop)
    }

    /// Removes a file or symlink entry and its data.
    pub fn unlink(&self, dir: Oid, name: &str) -> DfsResult<()> {
        self.remove_entry(dir, name, false)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, dir: Oid, name: &str) -> DfsResult<()> {
        self.remove_entry(dir, name, true)
    }

    fn remove_entry(&self, dir: Oid, name: &str, want_dir: bool) -> DfsResult<()> {
        name_ok(name)?;
        let held = self.chunks.quiesce();
        let gone = self.meta.remove_entry(dir, name, want_dir, |ino| {
            held.held_bytes(ino.oid, ino.size)
        })?;
        self.reclaim(gone, held);
        Ok(())
    }

    /// Renames atomically, replacing the target as rename(2) does;
    /// `noreplace` gives EEXIST instead.
    pub fn rename(
        &self,
        from_dir: Oid,
        from: &str,
        to_dir: Oid,
        to: &str,
        noreplace: bool,
    ) -> DfsResult<()> {
        name_ok(from)?;
        name_ok(to)?;
        let held = self.chunks.quiesce();
        let gone = self
            .meta
            .rename((from_dir, from), (to_dir, to), noreplace, |ino| {
                held.held_bytes(ino.oid, ino.size)
            })?;
        self.reclaim(gone, held);
        Ok(())
    }

    /// Gives a removed file's bytes back to the pool and queues its chunk files to be cut
    /// (see `reclaim.rs`), then lets writers in again. Queued while they are still held out:
    /// a snapshot, which holds them out too, must find the file in the queue once its row is
    /// in the metadata, or it would link the chunk files.
    fn reclaim(&self, gone: Option<(Unreclaimed, u64)>, held: Quiesced<'_>) {
        if let Some((file, bytes)) = gone {
            self.chunks.release(bytes);
            self.reclaimer.queue(file);
        }
        drop(held);
    }

    /// Reads up to `buf.len()` bytes at `offset`; holes read as zeros.
    pub fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> DfsResult<usize> {
        let ino = self.meta.regular_file(oid, "read")?;
        let len = (buf.len() as u64).min(ino.size.saturating_sub(offset));
        self.chunks
            .read(oid, offset, &mut buf[..len as usize], ino.size)
    }

    /// Writes `data` at `offset`. Space is taken from the quota and the pool before
    /// anything is written, so a full container or pool loses nothing it had.
    pub fn write(&self, oid: Oid, offset: u64, data: &[u8]) -> DfsResult<()> {
        self.meta.writable()?;
        let end = check_end(offset, data.len() as u64)?;
        let _in_use = self.chunks.in_use();
        self.change_chunks(oid, (offset, data.len() as u64), end, |w| w.write(data))
    }

    /// Writes `data` at `offset` like [`Namespace::write`], but answers once the write is
    /// queued for the disk: its space reserved and its size recorded (see the chunk store's
    /// write-behind).
    pub fn write_behind(&self, oid: Oid, offset: u64, data: IoBuf) -> DfsResult<()> {
        self.meta.writable()?;
        let len = data.len() as u64;
        let end = check_end(offset, len)?;
        let _in_use = self.chunks.in_use();
        let Some(write) = self.start_write(oid, (offset, len), len)? else {
            return Ok(());
        };
        let recorded = self
            .chunks
            .record_growth(&write, || self.meta.record_write(oid, end, write.growth()));
        if let Err(e) = recorded {
            self.chunks.drop_reservation(&write);
            self.chunks.finish_write(oid, &write);
            return Err(e);
        }
        self.chunks.queue_write(oid, offset, write, data);
        Ok(())
    }

    /// Takes the space of [offset, offset + len) now (fallocate(2) modes 0 and KEEP_SIZE):
    /// the chunk files get their blocks, so later writes there neither fail for space nor
    /// wait for the file system to allocate. Extends the size to the end unless `keep_size`.
    pub fn allocate(&self, oid: Oid, offset: u64, len: u64, keep_size: bool) -> DfsResult<()> {
        self.meta.writable()?;
        let end = check_end(offset, len)?;
        // Held from the size check on, so no truncation slips in between.
        let _in_use = self.chunks.in_use();
        let size = self.meta.regular_file(oid, "allocate")?.size;
        // With KEEP_SIZE nothing past the end is reserved: truncation and removal cut chunk
        // files only up to the size, so a chunk file beyond it would leak.
        let (stop, new_end) = if keep_size {
            (end.min(size), 0)
        } else {
            (end, end)
        };
        if stop <= offset {
            return Ok(());
        }
        self.change_chunks(oid, (offset, stop - offset), new_end, |w| w.allocate())
    }

    /// Makes [offset, offset + len) of regular file `oid` read as zeros and gives its space
    /// back (fallocate(2)'s PUNCH_HOLE); the size stays, and past it there is nothing to
    /// punch. Like a truncation it holds writes out while it cuts chunk files.
    pub fn punch(&self, oid: Oid, offset: u64, len: u64) -> DfsResult<()> {
        self.meta.writable()?;
        let end = check_end(offset, len)?;
        let mut held = self.chunks.quiesce();
        let freed = self.meta.update(|tx| {
            let mut ino = tx.inode(oid)?;
            meta::only_files(&ino, "punch holes in")?;
            let stop = end.min(ino.size);
            if stop <= offset {
                return Ok(0);
            }
            let freed = held.punch(oid, offset, stop)?;
            tx.adjust_used(-(freed as i64))?;
            let now = Time::now();
            ino.mtime = now;
            ino.ctime = now;
            tx.put_inode(&ino)?;
            Ok(freed)
        })?;
        self.chunks.release(freed);
        Ok(())
    }

    /// Takes the chunk files of a write to regular file `oid` and reserves its space.
    fn start_write(&self, oid: Oid, range: (u64, u64), room: u64) -> DfsResult<Option<ChunkWrite>> {
        self.meta.regular_file(oid, "write")?;
        self.chunks
            .start_write(oid, range, room, || self.meta.used())
    }

    /// Applies `apply` to the chunks of [offset, offset + len) after reserving the space they
    /// grow by; then records a size of at least `new_end`, the times and the space used.
    /// Callers hold the chunk store's data gate shared.
    fn change_chunks(
        &self,
        oid: Oid,
        range: (u64, u64),
        new_end: u64,
        apply: impl FnOnce(&ChunkWrite) -> std::io::Result<()>,
    ) -> DfsResult<()> {
        let Some(write) = self.start_write(oid, range, 0)? else {
            // pwrite(2) of nothing changes nothing, not even the size.
            return Ok(());
        };
        let moved = apply(&write).storage();
        // Recorded (and no longer pending) in one step, so its growth is always counted
        // exactly once against the quota.
        let written = moved.and_then(|()| {
            self.chunks.record_growth(&write, || {
                self.meta.record_write(oid, new_end, write.growth())
            })
        });
        if written.is_err() {
            self.chunks.drop_reservation(&write);
        }
        self.chunks.finish_write(oid, &write);
        written
    }

    /// Makes the object's data and every metadata change so far durable: chunk data
    /// first, then the chunk directories, then the metadata that points at them.
    /// Queued writes land first; EIO if one of this object's failed.
    pub fn fsync(&self, oid: Oid) -> DfsResult<()> {
        self.chunks.sync_object(oid)?;
        self.meta.commit_durably()
    }

    /// Makes every change so far durable (syncfs(2)): every object's chunk data, the chunk
    /// directories, then the metadata. A write that failed (queued, or its chunk's sync here)
    /// is reported to its object's next [`Namespace::fsync`], not here; true when none
    /// waits to be.
    pub fn sync_all(&self) -> DfsResult<bool> {
        let clean = self.chunks.sync_every_object()?;
        self.meta.commit_durably()?;
        Ok(clean)
    }

    pub fn setxattr(&self, oid: Oid, name: &str, value: &[u8], how: XattrSet) -> DfsResult<()> {
        self.meta.setxattr(oid, name, value, how)
    }

    pub fn getxattr(&self, oid: Oid, name: &str) -> DfsResult<Vec<u8>> {
        self.meta.getxattr(oid, name)
    }

    pub fn listxattr(&self, oid: Oid) -> DfsResult<Vec<String>> {
        self.meta.listxattr(oid)
    }

    pub fn removexattr(&self, oid: Oid, name: &str) -> DfsResult<()> {
        self.meta.removexattr(oid, name)
    }

    /// Data bytes held by the namespace's files.
    pub fn used(&self) -> DfsResult<u64> {
        self.meta.used()
    }

    /// Objects in the namespace (statfs's files).
    pub fn objects(&self) -> DfsResult<u64> {
        self.meta.objects()
    }

    /// The container's quota, if it has one.
    pub fn quota(&self) -> Option<u64> {
        self.chunks.quota()
    }

    /// Changes the quota (a container property) of an open namespace. Lowering it below
    /// what is used refuses further growth; nothing is removed.
    pub fn set_quota(&self, quota: Option<u64>) {
        self.chunks.set_quota(quota);
    }

    /// Usage against `capacity` (the pool's) or the quota, whichever is smaller.
    pub fn statfs(&self, capacity: u64) -> DfsResult<StatFs> {
        let total = self.quota().map_or(capacity, |q| q.min(capacity));
        Ok(StatFs {
            total_bytes: total,
            free_bytes: total.saturating_sub(self.used()?),
            files: self.objects()?,
        })
    }

    /// Writes a point-in-time copy of this namespace to `target` (same number of chunk
    /// directories), durably: the metadata store copied while metadata writers are held off,
    /// every chunk file hard-linked while data writers are. Open it with `read_only` for a
    /// snapshot, without for a clone; data stays shared until either side writes a chunk,
    /// which copies it first (copy-on-write).
    pub fn snapshot_to(&self, target: &NamespaceConfig) -> DfsResult<()> {
        if target.chunk_dirs.len() != self.chunks.dirs().len() {
            return Err(err(
                Errno::INVAL,
                "a snapshot needs as many chunk directories as its source",
            ));
        }
        // Every data change stays out until the chunks are linked.
        let mut held = self.chunks.quiesce();
        self.reclaimer.drain(&mut held)?;
        held.sync_all()?;
        self.meta.copy_to(&target.meta_path)?;
        held.link_into(&target.chunk_dirs, self.meta.path())?;
        for dir in target
            .chunk_dirs
            .iter()
            .map(|d| d.as_path())
            .chain(target.meta_path.parent())
        {
            self.disk.sync_dir(dir).storage()?;
            if let Some(up) = dir.parent() {
                self.disk.sync_dir(up).storage()?;
            }
        }
        Ok(())
    }

    /// Holds off (or lets go) the cutting of removed files' chunk files, for tests.
    #[cfg(test)]
    fn hold_reclaim(&self, held: bool) {
        self.reclaimer.hold(held);
    }

    /// Waits until the chunk files of every removed file are cut, for tests.
    #[cfg(test)]
    fn wait_reclaimed(&self) {
        self.reclaimer.wait_idle();
    }

    /// The chunk store, for tests that look inside it.
    #[cfg(test)]
    fn chunks(&self) -> &ChunkStore {
        &self.chunks
    }

    /// Files whose writes are not recorded in the metadata store yet, for tests.
    #[cfg(test)]
    fn unrecorded_files(&self) -> usize {
        self.meta.unrecorded_files()
    }
}
