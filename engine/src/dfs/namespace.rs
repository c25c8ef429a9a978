//! One container's POSIX namespace: metadata operations in one transaction
//! each, file data in chunk files, fsync that makes both durable.
//!
//! Durability follows POSIX: operations commit without forcing the disk;
//! `fsync` syncs the object's dirty chunk files and then commits durably,
//! which also persists every earlier metadata change (redb orders commits).
//!
//! This file holds the store layout and the operations that create objects or
//! change their attributes; removal and rename are in `names.rs`, file data in
//! `chunks.rs`, listings in `dirents.rs`, space in `space.rs`, extended
//! attributes in `xattrs.rs` and snapshots in `snapshot.rs`.

use super::ahead::ReadAhead;
use super::behind::{Queued, Writes};
use super::dirents::entry_key;
use super::disk::{Disk, RedbFile};
use super::inode::{Inode, Oid, ROOT, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, Time};
use super::space::SpaceBudget;
use super::spares::Spares;
use super::{DfsResult, Errno, err};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, MutexGuard, RwLock, RwLockWriteGuard};

pub(super) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// (directory, hash of the name, name) → object: a directory's entries are keys of its
/// object, ordered by the hash that is also their readdir cookie (see `dirents.rs`).
pub(super) const ENTRIES: TableDefinition<(u64, u64, &str), u64> = TableDefinition::new("entries");
pub(super) const SYMLINKS: TableDefinition<u64, &str> = TableDefinition::new("symlinks");
pub(super) const XATTRS: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("xattrs");
/// The superblock, as DFS's SB object: counters and the layout fixed at creation.
pub(super) const SUPER: TableDefinition<&str, u64> = TableDefinition::new("super");
const NEXT_OID: &str = "next_oid";
pub(super) const USED_BYTES: &str = "used_bytes";
const CHUNK_SIZE: &str = "chunk_size";

/// Longest entry name (NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Longest symlink target (PATH_MAX less its NUL).
pub const SYMLINK_MAX: usize = 4095;

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

/// One container's namespace.
#[derive(Debug)]
pub struct Namespace {
    pub(super) disk: Arc<dyn Disk>,
    pub(super) db: Database,
    pub(super) cfg: NamespaceConfig,
    /// From the superblock.
    pub(super) chunk_size: u64,
    /// Current quota in bytes, 0 for none (changes while the namespace is open).
    pub(super) quota: AtomicU64,
    /// The chunk cache and the space accounting of writes. Held briefly: a write reserves its
    /// space and takes its chunk files under it, then moves its bytes without it, so writes
    /// (to different files, or different chunks of one) reach the disk side by side.
    /// Shared with the writer threads of queued writes (`behind.rs`).
    pub(super) writes: Arc<Writes>,
    /// Writes in flight hold it shared; whatever cuts, removes or links chunk files (truncate,
    /// unlink, rename over a file, snapshot) holds it exclusively, so no write lands in a chunk
    /// file as it is cut or linked. Taken before `writes`.
    pub(super) data_gate: RwLock<()>,
}

#[derive(Debug, Default)]
pub(super) struct WriteState {
    pub(super) open: HashMap<(Oid, u64), Arc<dyn super::disk::DiskFile>>,
    /// Chunks written since their last sync.
    pub(super) dirty: HashSet<(Oid, u64)>,
    /// Directories whose entries changed since the last fsync.
    pub(super) dirty_dirs: HashSet<PathBuf>,
    /// Chunk ends that writes in flight will reach, and how many such writes there are: their
    /// space is reserved but their bytes may not be in the file yet, so a concurrent write
    /// must not count the same growth again.
    pub(super) in_flight: HashMap<(Oid, u64), (u64, usize)>,
    /// Growth reserved by writes in flight, not yet in the recorded use.
    pub(super) pending_growth: u64,
    /// Emptied chunk files waiting to become new chunks.
    pub(super) spares: Spares,
    /// Writes answered but not on the disk yet.
    pub(super) queued: Queued,
    /// Chunks read ahead of sequential readers.
    pub(super) ahead: ReadAhead,
}

impl Drop for Namespace {
    /// A container closed (engine stop, pool removal) keeps every write it answered.
    fn drop(&mut self) {
        drop(self.writes.drain(self.writes.lock()));
    }
}

pub(super) fn name_ok(name: &str) -> DfsResult<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(err(Errno::Inval, format!("invalid entry name {name:?}")));
    }
    if name.len() > NAME_MAX {
        return Err(err(
            Errno::NameTooLong,
            format!("entry name of {} bytes", name.len()),
        ));
    }
    Ok(())
}

/// The inode of `oid`; ESTALE when the object is gone (oids are never reused).
pub(super) fn get_inode<T: ReadableTable<u64, &'static [u8]>>(t: &T, oid: Oid) -> DfsResult<Inode> {
    let raw = t
        .get(oid)?
        .ok_or_else(|| err(Errno::Stale, format!("object {oid:#x} does not exist")))?;
    Inode::decode(oid, raw.value())
        .ok_or_else(|| err(Errno::Io, format!("object {oid:#x} has a corrupt inode")))
}

/// The inode of a directory; ENOTDIR for anything else.
pub(super) fn get_dir<T: ReadableTable<u64, &'static [u8]>>(t: &T, oid: Oid) -> DfsResult<Inode> {
    let ino = get_inode(t, oid)?;
    if !ino.is_dir() {
        return Err(err(
            Errno::NotDir,
            format!("object {oid:#x} is not a directory"),
        ));
    }
    Ok(ino)
}

/// Writes an inode back.
pub(super) fn put_inode(tx: &WriteTransaction, ino: &Inode) -> DfsResult<()> {
    tx.open_table(INODES)?
        .insert(ino.oid, ino.encode().as_slice())?;
    Ok(())
}

impl Namespace {
    /// Opens (or creates, with a root directory) the namespace.
    pub fn open(disk: Arc<dyn Disk>, cfg: NamespaceConfig) -> DfsResult<Namespace> {
        if cfg.chunk_dirs.is_empty() || cfg.chunk_size == 0 {
            return Err(err(
                Errno::Inval,
                "a namespace needs chunk directories and a chunk size",
            ));
        }
        let file = disk.open(&cfg.meta_path, true)?;
        if let Some(dir) = cfg.meta_path.parent() {
            disk.sync_dir(dir)?;
        }
        let db = Database::builder().create_with_backend(RedbFile(file))?;
        // A snapshot changes nothing, and has no spares: they are never linked into one.
        let spares = if cfg.read_only {
            Spares::default()
        } else {
            Spares::adopt(&*disk, &cfg.chunk_dirs)?
        };
        let mut ns = Namespace {
            disk,
            db,
            quota: AtomicU64::new(cfg.quota.unwrap_or(0)),
            chunk_size: cfg.chunk_size,
            cfg,
            writes: Arc::new(Writes::new(WriteState {
                spares,
                ..WriteState::default()
            })),
            data_gate: RwLock::new(()),
        };
        ns.chunk_size = ns.init()?;
        Ok(ns)
    }

    /// Creates the root and the superblock of a new namespace; returns the chunk size.
    fn init(&self) -> DfsResult<u64> {
        let mut tx = self.db.begin_write()?;
        // The superblock must be durable before any data is laid out by it.
        tx.set_durability(Durability::Immediate)?;
        let chunk_size;
        {
            let mut inodes = tx.open_table(INODES)?;
            let mut sup = tx.open_table(SUPER)?;
            if inodes.get(ROOT)?.is_none() {
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
                inodes.insert(ROOT, root.encode().as_slice())?;
                sup.insert(NEXT_OID, ROOT + 1)?;
            }
            let stored = sup.get(CHUNK_SIZE)?.map(|v| v.value());
            chunk_size = match stored {
                Some(cs) => cs,
                None => {
                    sup.insert(CHUNK_SIZE, self.cfg.chunk_size)?;
                    self.cfg.chunk_size
                }
            };
            tx.open_table(ENTRIES)?;
            tx.open_table(SYMLINKS)?;
            tx.open_table(XATTRS)?;
        }
        tx.commit()?;
        Ok(chunk_size)
    }

    /// Bytes per chunk of this namespace's files.
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Whether every change fails with EROFS (a snapshot).
    pub fn read_only(&self) -> bool {
        self.cfg.read_only
    }

    /// Holds every write out, waits for the queued ones to land, drops what was read ahead,
    /// and takes the write state: for changes that cut, remove or link chunk files.
    pub(super) fn quiesce(&self) -> (RwLockWriteGuard<'_, ()>, MutexGuard<'_, WriteState>) {
        let gate = self.data_gate.write().expect("data gate");
        let mut st = self.writes.drain(self.writes.lock());
        st.ahead.clear();
        (gate, st)
    }

    /// Runs `f` in a write transaction committed without forcing the disk.
    pub(super) fn update<T>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> DfsResult<T>,
    ) -> DfsResult<T> {
        self.writable()?;
        let mut tx = self.db.begin_write()?;
        tx.set_durability(Durability::None)?;
        match f(&tx) {
            Ok(v) => {
                tx.commit()?;
                Ok(v)
            }
            Err(e) => {
                tx.abort()?;
                Err(e)
            }
        }
    }

    pub(super) fn writable(&self) -> DfsResult<()> {
        if self.cfg.read_only {
            return Err(err(Errno::RoFs, "a snapshot is read-only"));
        }
        Ok(())
    }

    /// The object an entry names.
    pub fn lookup(&self, dir: Oid, name: &str) -> DfsResult<Inode> {
        name_ok(name)?;
        let tx = self.db.begin_read()?;
        let inodes = tx.open_table(INODES)?;
        get_dir(&inodes, dir)?;
        let oid = tx
            .open_table(ENTRIES)?
            .get(entry_key(dir, name))?
            .map(|v| v.value())
            .ok_or_else(|| err(Errno::NoEnt, format!("{name:?} not found")))?;
        get_inode(&inodes, oid)
    }

    pub fn getattr(&self, oid: Oid) -> DfsResult<Inode> {
        get_inode(&self.db.begin_read()?.open_table(INODES)?, oid)
    }

    /// Checks that `oid` can be opened (for writing, if `write`).
    pub fn open_object(&self, oid: Oid, write: bool) -> DfsResult<Inode> {
        let ino = self.getattr(oid)?;
        match ino.mode & S_IFMT {
            S_IFLNK => Err(err(Errno::Loop, "cannot open a symlink")),
            S_IFDIR if write => Err(err(Errno::IsDir, "cannot write a directory")),
            _ if write => self.writable().map(|()| ino),
            _ => Ok(ino),
        }
    }

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
        self.update(|tx| {
            let mut parent = get_dir(&tx.open_table(INODES)?, dir)?;
            let mut entries = tx.open_table(ENTRIES)?;
            if entries.get(entry_key(dir, name))?.is_some() {
                return Err(err(Errno::Exist, format!("{name:?} exists")));
            }
            let mut sup = tx.open_table(SUPER)?;
            let oid = sup.get(NEXT_OID)?.map_or(ROOT + 1, |v| v.value());
            sup.insert(NEXT_OID, oid + 1)?;
            let now = Time::now();
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
            entries.insert(entry_key(dir, name), oid)?;
            if let Some(t) = target {
                tx.open_table(SYMLINKS)?.insert(oid, t)?;
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
            return Err(err(Errno::NoEnt, "empty symlink target"));
        }
        if target.len() > SYMLINK_MAX || target.contains('\0') {
            let errno = if target.contains('\0') {
                Errno::Inval
            } else {
                Errno::NameTooLong
            };
            return Err(err(errno, "symlink target too long or with a NUL"));
        }
        self.make(dir, name, S_IFLNK | 0o777, uid, gid, Some(target))
    }

    pub fn readlink(&self, oid: Oid) -> DfsResult<String> {
        let tx = self.db.begin_read()?;
        get_inode(&tx.open_table(INODES)?, oid)?;
        let target = tx
            .open_table(SYMLINKS)?
            .get(oid)?
            .map(|v| v.value().to_string());
        target.ok_or_else(|| err(Errno::Inval, format!("object {oid:#x} is not a symlink")))
    }

    /// Changes attributes; a size change truncates or extends (sparse).
    pub fn setattr(&self, oid: Oid, set: SetAttr) -> DfsResult<Inode> {
        let (_gate, mut st) = self.quiesce();
        let (ino, freed) = self.update(|tx| {
            let mut ino = get_inode(&tx.open_table(INODES)?, oid)?;
            let now = Time::now();
            let mut freed = 0;
            if let Some(size) = set.size {
                if !ino.is_file() {
                    let errno = if ino.is_dir() {
                        Errno::IsDir
                    } else {
                        Errno::Inval
                    };
                    return Err(err(errno, "only files have a size to set"));
                }
                super::chunks::check_end(size, 0)?;
                if size < ino.size {
                    freed = self.cut_chunks(&mut st, oid, size, ino.size)?;
                    super::space::adjust_used(tx, -(freed as i64))?;
                }
                ino.size = size;
                ino.mtime = now;
            }
            if let Some(mode) = set.mode {
                ino.mode = (ino.mode & S_IFMT) | (mode & !S_IFMT);
            }
            ino.uid = set.uid.unwrap_or(ino.uid);
            ino.gid = set.gid.unwrap_or(ino.gid);
            ino.atime = set.atime.unwrap_or(ino.atime);
            ino.mtime = set.mtime.unwrap_or(ino.mtime);
            ino.ctime = now;
            put_inode(tx, &ino)?;
            Ok((ino, freed))
        })?;
        self.release(freed);
        Ok(ino)
    }

    /// Makes every metadata change so far durable.
    pub(super) fn commit_durably(&self) -> DfsResult<()> {
        let mut tx = self.db.begin_write()?;
        tx.set_durability(Durability::Immediate)?;
        tx.commit()?;
        Ok(())
    }

    /// Every chunk directory of this namespace (for destroy and snapshots).
    pub fn chunk_dirs(&self) -> &[PathBuf] {
        &self.cfg.chunk_dirs
    }

    /// The metadata store's path.
    pub fn meta_path(&self) -> &Path {
        &self.cfg.meta_path
    }

    /// Objects in the namespace (statfs's files).
    pub fn objects(&self) -> DfsResult<u64> {
        use redb::ReadableTableMetadata;
        Ok(self.db.begin_read()?.open_table(INODES)?.len()?)
    }
}
