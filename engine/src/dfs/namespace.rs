//! One container's POSIX namespace: metadata operations in one transaction
//! each, file data in chunk files, fsync that makes both durable.
//!
//! Durability follows POSIX: operations commit without forcing the disk;
//! `fsync` syncs the object's dirty chunk files and then commits durably,
//! which also persists every earlier metadata change (redb orders commits).

use super::disk::{Disk, DiskFile, RedbFile};
use super::inode::{Inode, Oid, ROOT, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, Time};
use super::{DfsResult, Errno, err};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// (directory, name) → object: a directory's entries are keys of its object.
const DIRENTS: TableDefinition<(u64, &str), u64> = TableDefinition::new("dirents");
const SYMLINKS: TableDefinition<u64, &str> = TableDefinition::new("symlinks");
const XATTRS: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("xattrs");
const SUPER: TableDefinition<&str, u64> = TableDefinition::new("super");
const NEXT_OID: &str = "next_oid";
const USED_BYTES: &str = "used_bytes";

/// Longest entry name (NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Largest extended attribute value (XATTR_SIZE_MAX).
const XATTR_MAX: usize = 64 << 10;

/// How a namespace is laid out.
#[derive(Debug, Clone)]
pub struct NamespaceConfig {
    /// The metadata store.
    pub meta_path: PathBuf,
    /// One chunk directory per rank of the pool; chunks are spread over them.
    pub chunk_dirs: Vec<PathBuf>,
    /// Bytes per chunk (DFS default 1 MiB).
    pub chunk_size: u64,
    /// Capacity limit of the container (a dpufs engine extension); None for none.
    pub quota: Option<u64>,
    /// A snapshot: every change fails with EROFS.
    pub read_only: bool,
}

/// An entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub oid: Oid,
    /// File type bits (`S_IFDIR`, `S_IFREG`, `S_IFLNK`).
    pub kind: u32,
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

/// File-system usage, as statfs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub files: u64,
}

/// One container's namespace.
#[derive(Debug)]
pub struct Namespace {
    disk: Arc<dyn Disk>,
    db: Database,
    cfg: NamespaceConfig,
    /// Serializes data writes with their space accounting.
    writes: Mutex<WriteState>,
}

#[derive(Debug, Default)]
struct WriteState {
    open: HashMap<(Oid, u64), Arc<dyn DiskFile>>,
    /// Chunks written since their last sync.
    dirty: HashSet<(Oid, u64)>,
}

/// Open chunk files kept per namespace before the cache is emptied.
const MAX_OPEN_CHUNKS: usize = 1024;

fn name_ok(name: &str) -> DfsResult<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
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

fn get_inode<T: ReadableTable<u64, &'static [u8]>>(t: &T, oid: Oid) -> DfsResult<Inode> {
    let raw = t
        .get(oid)?
        .ok_or_else(|| err(Errno::NoEnt, format!("object {oid:#x} does not exist")))?;
    Inode::decode(oid, raw.value())
        .ok_or_else(|| err(Errno::Io, format!("object {oid:#x} has a corrupt inode")))
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
        let db = Database::builder().create_with_backend(RedbFile(file))?;
        let ns = Namespace {
            disk,
            db,
            cfg,
            writes: Mutex::new(WriteState::default()),
        };
        ns.init_root()?;
        Ok(ns)
    }

    fn init_root(&self) -> DfsResult<()> {
        let tx = self.db.begin_write()?;
        {
            let mut inodes = tx.open_table(INODES)?;
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
                tx.open_table(SUPER)?.insert(NEXT_OID, ROOT + 1)?;
            }
            tx.open_table(DIRENTS)?;
            tx.open_table(SYMLINKS)?;
            tx.open_table(XATTRS)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Runs `f` in a write transaction committed without forcing the disk.
    fn update<T>(&self, f: impl FnOnce(&WriteTransaction) -> DfsResult<T>) -> DfsResult<T> {
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

    /// The object an entry names.
    pub fn lookup(&self, dir: Oid, name: &str) -> DfsResult<Inode> {
        let tx = self.db.begin_read()?;
        let oid = tx
            .open_table(DIRENTS)?
            .get((dir, name))?
            .map(|v| v.value())
            .ok_or_else(|| err(Errno::NoEnt, format!("{name:?} not found")))?;
        get_inode(&tx.open_table(INODES)?, oid)
    }

    pub fn getattr(&self, oid: Oid) -> DfsResult<Inode> {
        get_inode(&self.db.begin_read()?.open_table(INODES)?, oid)
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
            let mut inodes = tx.open_table(INODES)?;
            let mut parent = get_inode(&inodes, dir)?;
            if !parent.is_dir() {
                return Err(err(
                    Errno::NotDir,
                    format!("object {dir:#x} is not a directory"),
                ));
            }
            let mut dirents = tx.open_table(DIRENTS)?;
            if dirents.get((dir, name))?.is_some() {
                return Err(err(Errno::Exist, format!("{name:?} exists")));
            }
            let mut sup = tx.open_table(SUPER)?;
            let oid = sup.get(NEXT_OID)?.map_or(ROOT + 1, |v| v.value());
            sup.insert(NEXT_OID, oid + 1)?;
            let now = Time::now();
            let size = target.map_or(0, |t| t.len() as u64);
            let ino = Inode {
                oid,
                mode,
                uid,
                gid,
                size,
                atime: now,
                mtime: now,
                ctime: now,
                parent: dir,
            };
            inodes.insert(oid, ino.encode().as_slice())?;
            dirents.insert((dir, name), oid)?;
            if let Some(t) = target {
                tx.open_table(SYMLINKS)?.insert(oid, t)?;
            }
            parent.mtime = now;
            parent.ctime = now;
            inodes.insert(dir, parent.encode().as_slice())?;
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
        self.make(dir, name, S_IFLNK | 0o777, uid, gid, Some(target))
    }

    pub fn readlink(&self, oid: Oid) -> DfsResult<String> {
        let tx = self.db.begin_read()?;
        let target = tx
            .open_table(SYMLINKS)?
            .get(oid)?
            .map(|v| v.value().to_string());
        target.ok_or_else(|| err(Errno::Inval, format!("object {oid:#x} is not a symlink")))
    }

    /// Entries of `dir` after the name `after` (empty: from the start), in
    /// name order; resuming from the last name returned is stable under
    /// concurrent changes.
    pub fn readdir(&self, dir: Oid, after: &str, max: usize) -> DfsResult<Vec<DirEntry>> {
        let tx = self.db.begin_read()?;
        let inodes = tx.open_table(INODES)?;
        if !get_inode(&inodes, dir)?.is_dir() {
            return Err(err(
                Errno::NotDir,
                format!("object {dir:#x} is not a directory"),
            ));
        }
        let dirents = tx.open_table(DIRENTS)?;
        let mut out = Vec::new();
        for entry in dirents.range((dir, after)..(dir + 1, ""))? {
            let (key, oid) = entry?;
            let (_, name) = key.value();
            if name == after {
                continue;
            }
            if out.len() == max {
                break;
            }
            let kind = get_inode(&inodes, oid.value())?.mode & S_IFMT;
            out.push(DirEntry {
                name: name.to_string(),
                oid: oid.value(),
                kind,
            });
        }
        Ok(out)
    }

    /// Changes attributes; a size change truncates or extends (sparse).
    pub fn setattr(&self, oid: Oid, set: SetAttr) -> DfsResult<Inode> {
        let mut st = self.writes.lock().expect("writes lock");
        self.update(|tx| {
            let mut inodes = tx.open_table(INODES)?;
            let mut ino = get_inode(&inodes, oid)?;
            let now = Time::now();
            if let Some(size) = set.size {
                if !ino.is_file() {
                    return Err(err(
                        if ino.is_dir() {
                            Errno::IsDir
                        } else {
                            Errno::Inval
                        },
                        "only files have a size to set",
                    ));
                }
                if size < ino.size {
                    let freed = self.cut_chunks(&mut st, oid, size, ino.size)?;
                    adjust_used(tx, -(freed as i64))?;
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
            inodes.insert(oid, ino.encode().as_slice())?;
            Ok(ino)
        })
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
        let mut st = self.writes.lock().expect("writes lock");
        self.update(|tx| {
            let victim = self.entry(tx, dir, name)?;
            match (want_dir, victim.is_dir()) {
                (true, false) => {
                    return Err(err(Errno::NotDir, format!("{name:?} is not a directory")));
                }
                (false, true) => return Err(err(Errno::IsDir, format!("{name:?} is a directory"))),
                _ => {}
            }
            self.drop_object(tx, &mut st, &victim)?;
            tx.open_table(DIRENTS)?.remove((dir, name))?;
            self.touch(tx, dir)
        })
    }

    /// The inode an entry names, within a transaction.
    fn entry(&self, tx: &WriteTransaction, dir: Oid, name: &str) -> DfsResult<Inode> {
        let oid = tx.open_table(DIRENTS)?.get((dir, name))?.map(|v| v.value());
        let oid = oid.ok_or_else(|| err(Errno::NoEnt, format!("{name:?} not found")))?;
        get_inode(&tx.open_table(INODES)?, oid)
    }

    /// Deletes an object that is about to lose its only entry: its inode,
    /// symlink target, xattrs and data. Directories must be empty.
    fn drop_object(
        &self,
        tx: &WriteTransaction,
        st: &mut WriteState,
        ino: &Inode,
    ) -> DfsResult<()> {
        if ino.is_dir()
            && tx
                .open_table(DIRENTS)?
                .range((ino.oid, "")..(ino.oid + 1, ""))?
                .next()
                .is_some()
        {
            return Err(err(
                Errno::NotEmpty,
                format!("directory {:#x} is not empty", ino.oid),
            ));
        }
        if ino.is_file() {
            let freed = self.cut_chunks(st, ino.oid, 0, ino.size)?;
            adjust_used(tx, -(freed as i64))?;
        }
        tx.open_table(INODES)?.remove(ino.oid)?;
        tx.open_table(SYMLINKS)?.remove(ino.oid)?;
        let mut xattrs = tx.open_table(XATTRS)?;
        let names: Vec<String> = xattrs
            .range((ino.oid, "")..(ino.oid + 1, ""))?
            .map(|e| e.map(|(k, _)| k.value().1.to_string()))
            .collect::<Result<_, _>>()?;
        for n in names {
            xattrs.remove((ino.oid, n.as_str()))?;
        }
        Ok(())
    }

    fn touch(&self, tx: &WriteTransaction, oid: Oid) -> DfsResult<()> {
        let mut inodes = tx.open_table(INODES)?;
        let mut ino = get_inode(&inodes, oid)?;
        let now = Time::now();
        ino.mtime = now;
        ino.ctime = now;
        inodes.insert(oid, ino.encode().as_slice())?;
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
        name_ok(to)?;
        let mut st = self.writes.lock().expect("writes lock");
        self.update(|tx| {
            let mut moving = self.entry(tx, from_dir, from)?;
            if !get_inode(&tx.open_table(INODES)?, to_dir)?.is_dir() {
                return Err(err(
                    Errno::NotDir,
                    format!("object {to_dir:#x} is not a directory"),
                ));
            }
            if moving.is_dir() && self.is_ancestor(tx, moving.oid, to_dir)? {
                return Err(err(Errno::Inval, "cannot move a directory into itself"));
            }
            match self.entry(tx, to_dir, to) {
                Ok(existing) if existing.oid == moving.oid => return Ok(()),
                Ok(_) if noreplace => return Err(err(Errno::Exist, format!("{to:?} exists"))),
                Ok(existing) => {
                    match (moving.is_dir(), existing.is_dir()) {
                        (true, false) => {
                            return Err(err(Errno::NotDir, format!("{to:?} is not a directory")));
                        }
                        (false, true) => {
                            return Err(err(Errno::IsDir, format!("{to:?} is a directory")));
                        }
                        _ => {}
                    }
                    self.drop_object(tx, &mut st, &existing)?;
                }
                Err(e) if e.errno == Errno::NoEnt => {}
                Err(e) => return Err(e),
            }
            let mut dirents = tx.open_table(DIRENTS)?;
            dirents.remove((from_dir, from))?;
            dirents.insert((to_dir, to), moving.oid)?;
            drop(dirents);
            moving.parent = to_dir;
            moving.ctime = Time::now();
            tx.open_table(INODES)?
                .insert(moving.oid, moving.encode().as_slice())?;
            self.touch(tx, from_dir)?;
            if to_dir != from_dir {
                self.touch(tx, to_dir)?;
            }
            Ok(())
        })
    }

    /// Whether `dir` is `ancestor` or lies below it.
    fn is_ancestor(&self, tx: &WriteTransaction, ancestor: Oid, mut dir: Oid) -> DfsResult<bool> {
        let inodes = tx.open_table(INODES)?;
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

    fn chunk_path(&self, oid: Oid, idx: u64) -> PathBuf {
        let dirs = &self.cfg.chunk_dirs;
        dirs[((oid + idx) % dirs.len() as u64) as usize].join(format!("{oid:x}.{idx}"))
    }

    /// The chunk file, from the cache or the disk; None when it does not exist
    /// and `create` is not set (a hole).
    fn chunk(
        &self,
        st: &mut WriteState,
        oid: Oid,
        idx: u64,
        create: bool,
    ) -> DfsResult<Option<Arc<dyn DiskFile>>> {
        if let Some(f) = st.open.get(&(oid, idx)) {
            return Ok(Some(f.clone()));
        }
        let path = self.chunk_path(oid, idx);
        match self.disk.open(&path, create) {
            Ok(f) => {
                if st.open.len() >= MAX_OPEN_CHUNKS {
                    self.sync_dirty(st, None)?;
                    st.open.clear();
                }
                st.open.insert((oid, idx), f.clone());
                Ok(Some(f))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The byte ranges of [offset, offset + len) within each chunk.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let cs = self.cfg.chunk_size;
        let end = offset + len;
        (offset / cs..end.div_ceil(cs)).map(move |idx| {
            let start = (idx * cs).max(offset);
            let stop = ((idx + 1) * cs).min(end);
            (idx, start - idx * cs, stop - start)
        })
    }

    /// Reads up to `buf.len()` bytes at `offset`; holes read as zeros.
    pub fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> DfsResult<usize> {
        let ino = self.getattr(oid)?;
        if ino.is_dir() {
            return Err(err(Errno::IsDir, "cannot read a directory"));
        }
        let len = (buf.len() as u64).min(ino.size.saturating_sub(offset));
        let mut st = self.writes.lock().expect("writes lock");
        let mut done = 0usize;
        for (idx, at, n) in self.pieces(offset, len) {
            let out = &mut buf[done..done + n as usize];
            let got = match self.chunk(&mut st, oid, idx, false)? {
                Some(f) => f.read_at(at, out)?,
                None => 0,
            };
            out[got..].fill(0);
            done += n as usize;
        }
        Ok(done)
    }

    /// Writes `data` at `offset`. Space is checked against the quota before
    /// anything is written, so a full container loses nothing it had.
    pub fn write(&self, oid: Oid, offset: u64, data: &[u8]) -> DfsResult<()> {
        self.writable()?;
        let mut st = self.writes.lock().expect("writes lock");
        let ino = self.getattr(oid)?;
        if !ino.is_file() {
            return Err(err(
                if ino.is_dir() {
                    Errno::IsDir
                } else {
                    Errno::Inval
                },
                "can only write regular files",
            ));
        }
        let mut growth = 0u64;
        let mut files = Vec::new();
        for (idx, at, n) in self.pieces(offset, data.len() as u64) {
            let f = self.chunk(&mut st, oid, idx, true)?.expect("created");
            let f = self.unshare(&mut st, oid, idx, f)?;
            growth += (at + n).saturating_sub(f.size()?);
            files.push((idx, f, at, n));
        }
        self.reserve(growth)?;
        let mut done = 0usize;
        for (idx, f, at, n) in files {
            f.write_at(at, &data[done..done + n as usize])?;
            st.dirty.insert((oid, idx));
            done += n as usize;
        }
        self.update(|tx| {
            let mut inodes = tx.open_table(INODES)?;
            let mut ino = get_inode(&inodes, oid)?;
            ino.size = ino.size.max(offset + data.len() as u64);
            let now = Time::now();
            ino.mtime = now;
            ino.ctime = now;
            inodes.insert(oid, ino.encode().as_slice())?;
            drop(inodes);
            adjust_used(tx, growth as i64)
        })
    }

    /// Copy-on-write: a chunk file shared with a snapshot is copied before it
    /// is changed.
    fn unshare(
        &self,
        st: &mut WriteState,
        oid: Oid,
        idx: u64,
        f: Arc<dyn DiskFile>,
    ) -> DfsResult<Arc<dyn DiskFile>> {
        let path = self.chunk_path(oid, idx);
        if !self.disk.is_shared(&path)? {
            return Ok(f);
        }
        let mut bytes = vec![0; f.size()? as usize];
        f.read_at(0, &mut bytes)?;
        self.disk.remove(&path)?;
        let copy = self.disk.open(&path, true)?;
        copy.write_at(0, &bytes)?;
        st.open.insert((oid, idx), copy.clone());
        Ok(copy)
    }

    fn used(&self) -> DfsResult<u64> {
        let tx = self.db.begin_read()?;
        Ok(tx
            .open_table(SUPER)?
            .get(USED_BYTES)?
            .map_or(0, |v| v.value()))
    }

    /// ENOSPC if `growth` more bytes would exceed the container's quota.
    fn reserve(&self, growth: u64) -> DfsResult<()> {
        if let Some(quota) = self.cfg.quota
            && growth > 0
        {
            let used = self.used()?;
            if used + growth > quota {
                return Err(err(
                    Errno::NoSpc,
                    format!("container quota of {quota} bytes reached ({used} used)"),
                ));
            }
        }
        Ok(())
    }

    /// Frees the data of [new_size, old_size): whole chunks are removed, the
    /// chunk holding the new end is cut. Returns the bytes freed.
    fn cut_chunks(
        &self,
        st: &mut WriteState,
        oid: Oid,
        new_size: u64,
        old_size: u64,
    ) -> DfsResult<u64> {
        let cs = self.cfg.chunk_size;
        let mut freed = 0;
        for idx in new_size / cs..old_size.div_ceil(cs) {
            let Some(f) = self.chunk(st, oid, idx, false)? else {
                continue;
            };
            let keep = new_size.saturating_sub(idx * cs).min(cs);
            let len = f.size()?;
            if keep == 0 {
                self.disk.remove(&self.chunk_path(oid, idx))?;
                freed += len;
            } else if len > keep {
                f.set_len(keep)?;
                freed += len - keep;
            }
        }
        let kept = new_size.div_ceil(cs);
        st.open.retain(|(o, i), _| *o != oid || *i < kept);
        st.dirty.retain(|(o, i)| *o != oid || *i < kept);
        Ok(freed)
    }

    fn sync_dirty(&self, st: &mut WriteState, only: Option<Oid>) -> DfsResult<()> {
        let chunks: Vec<(Oid, u64)> = st
            .dirty
            .iter()
            .copied()
            .filter(|(o, _)| only.is_none_or(|x| x == *o))
            .collect();
        for key in chunks {
            if let Some(f) = st.open.get(&key) {
                f.sync()?;
            }
            st.dirty.remove(&key);
        }
        Ok(())
    }

    /// Makes the object's data and every metadata change so far durable.
    pub fn fsync(&self, oid: Oid) -> DfsResult<()> {
        let mut st = self.writes.lock().expect("writes lock");
        self.sync_dirty(&mut st, Some(oid))?;
        drop(st);
        let mut tx = self.db.begin_write()?;
        tx.set_durability(Durability::Immediate)?;
        tx.commit()?;
        Ok(())
    }

    pub fn statfs(&self, capacity: u64) -> DfsResult<StatFs> {
        let total = self.cfg.quota.map_or(capacity, |q| q.min(capacity));
        let tx = self.db.begin_read()?;
        Ok(StatFs {
            total_bytes: total,
            free_bytes: total.saturating_sub(self.used()?),
            files: tx.open_table(INODES)?.len()?,
        })
    }

    pub fn setxattr(&self, oid: Oid, name: &str, value: &[u8]) -> DfsResult<()> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(err(Errno::Range, "attribute name must be 1 to 255 bytes"));
        }
        if value.len() > XATTR_MAX {
            return Err(err(Errno::Range, "attribute value larger than 64 KiB"));
        }
        self.update(|tx| {
            get_inode(&tx.open_table(INODES)?, oid)?;
            tx.open_table(XATTRS)?.insert((oid, name), value)?;
            Ok(())
        })
    }

    pub fn getxattr(&self, oid: Oid, name: &str) -> DfsResult<Vec<u8>> {
        let tx = self.db.begin_read()?;
        get_inode(&tx.open_table(INODES)?, oid)?;
        let v = tx
            .open_table(XATTRS)?
            .get((oid, name))?
            .map(|v| v.value().to_vec());
        v.ok_or_else(|| err(Errno::NoData, format!("no attribute {name:?}")))
    }

    pub fn listxattr(&self, oid: Oid) -> DfsResult<Vec<String>> {
        let tx = self.db.begin_read()?;
        get_inode(&tx.open_table(INODES)?, oid)?;
        let t = tx.open_table(XATTRS)?;
        let names = t
            .range((oid, "")..(oid + 1, ""))?
            .map(|e| e.map(|(k, _)| k.value().1.to_string()));
        Ok(names.collect::<Result<_, _>>()?)
    }

    pub fn removexattr(&self, oid: Oid, name: &str) -> DfsResult<()> {
        self.update(|tx| {
            let removed = tx.open_table(XATTRS)?.remove((oid, name))?.is_some();
            if removed {
                Ok(())
            } else {
                Err(err(Errno::NoData, format!("no attribute {name:?}")))
            }
        })
    }

    fn writable(&self) -> DfsResult<()> {
        if self.cfg.read_only {
            return Err(err(Errno::RoFs, "a snapshot is read-only"));
        }
        Ok(())
    }

    /// Writes a point-in-time copy of this namespace to `target` (same number
    /// of chunk directories): the metadata store is copied and the chunk files
    /// are linked, so data is shared until either side writes (copy-on-write).
    pub fn snapshot_to(&self, target: &NamespaceConfig) -> DfsResult<()> {
        if target.chunk_dirs.len() != self.cfg.chunk_dirs.len() {
            return Err(err(
                Errno::Inval,
                "a snapshot needs as many chunk directories as its source",
            ));
        }
        let mut st = self.writes.lock().expect("writes lock");
        self.sync_dirty(&mut st, None)?;
        let mut flush = self.db.begin_write()?;
        flush.set_durability(Durability::Immediate)?;
        flush.commit()?;
        // An open write transaction holds every metadata writer off while the
        // store is copied; it is aborted, never committed.
        let hold = self.db.begin_write()?;
        let src = self.disk.open(&self.cfg.meta_path, false)?;
        let mut bytes = vec![0; src.size()? as usize];
        src.read_at(0, &mut bytes)?;
        let dst = self.disk.open(&target.meta_path, true)?;
        dst.set_len(0)?;
        dst.write_at(0, &bytes)?;
        dst.sync()?;
        hold.abort()?;
        for (from, to) in self.cfg.chunk_dirs.iter().zip(&target.chunk_dirs) {
            for path in self.disk.list(from)? {
                if path != self.cfg.meta_path
                    && let Some(name) = path.file_name()
                {
                    self.disk.link(&path, &to.join(name))?;
                }
            }
        }
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
}

fn adjust_used(tx: &WriteTransaction, delta: i64) -> DfsResult<()> {
    let mut sup = tx.open_table(SUPER)?;
    let used = sup.get(USED_BYTES)?.map_or(0, |v| v.value());
    sup.insert(USED_BYTES, used.saturating_add_signed(delta))?;
    Ok(())
}
