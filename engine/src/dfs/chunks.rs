//! File data: each regular file is cut into chunks of the namespace's chunk size, one chunk
//! file per chunk, spread over the pool's ranks. Missing chunks (and the part of a chunk
//! beyond its file's end) are holes and read as zeros.

use super::ahead::{Fetch, copy_fetched};
use super::disk::DiskFile;
use super::inode::{Inode, Oid, Time};
use super::namespace::{INODES, Namespace, WriteState, get_inode, put_inode};
use super::{DfsError, DfsResult, Errno, err};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Open chunk files kept per namespace before the cache is emptied.
const MAX_OPEN_CHUNKS: usize = 1024;

/// Largest file end: what off_t can address.
const MAX_FILE_END: u64 = i64::MAX as u64;

/// One chunk's part of a write.
pub(super) struct WritePiece {
    pub(super) idx: u64,
    pub(super) file: Arc<dyn DiskFile>,
    /// Offset in the chunk.
    pub(super) at: u64,
    pub(super) len: u64,
}

/// Where a read finds one chunk's bytes.
enum Source {
    /// Read ahead (see `ahead.rs`).
    Fetched(Arc<Fetch>),
    /// In the chunk file; None for a hole.
    File(Option<Arc<dyn DiskFile>>),
}

/// Moves `data` into the pieces of its write, in order.
pub(super) fn write_pieces(pieces: &[WritePiece], data: &[u8]) -> std::io::Result<()> {
    let mut done = 0usize;
    for p in pieces {
        let n = p.len as usize;
        p.file.write_at(p.at, &data[done..done + n])?;
        done += n;
    }
    Ok(())
}

/// EFBIG unless [offset, offset + len) is addressable.
pub(super) fn check_end(offset: u64, len: u64) -> DfsResult<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_END => Ok(end),
        _ => Err(err(Errno::FBig, "beyond the largest file size")),
    }
}

fn mark_dir_dirty(st: &mut WriteState, path: &Path) {
    if let Some(dir) = path.parent() {
        st.dirty_dirs.insert(dir.to_path_buf());
        if let Some(up) = dir.parent() {
            st.dirty_dirs.insert(up.to_path_buf());
        }
    }
}

impl Namespace {
    pub(super) fn chunk_path(&self, oid: Oid, idx: u64) -> PathBuf {
        let dirs = &self.cfg.chunk_dirs;
        let rank = (oid.wrapping_add(idx) % dirs.len() as u64) as usize;
        dirs[rank].join(format!("{oid:x}.{idx}"))
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
        let opened = match self.disk.open(&path, false) {
            Err(e) if create && e.kind() == std::io::ErrorKind::NotFound => {
                mark_dir_dirty(st, &path);
                st.spares.create(&*self.disk, &path)
            }
            other => other,
        };
        match opened {
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

    /// The byte ranges of [offset, offset + len) within each chunk: (chunk, offset in it, length).
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let cs = self.chunk_size;
        let end = offset + len;
        self.chunk_range(offset, len).map(move |idx| {
            let start = (idx * cs).max(offset);
            let stop = ((idx + 1) * cs).min(end);
            (idx, start - idx * cs, stop - start)
        })
    }

    /// The chunks [offset, offset + len) touches.
    fn chunk_range(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / self.chunk_size..(offset + len).div_ceil(self.chunk_size)
    }

    /// The inode of `oid` if it is a regular file; EISDIR for a directory, EINVAL otherwise.
    fn regular_file(&self, oid: Oid, what: &str) -> DfsResult<Inode> {
        let ino = self.getattr(oid)?;
        if !ino.is_file() {
            let errno = if ino.is_dir() {
                Errno::IsDir
            } else {
                Errno::Inval
            };
            return Err(err(errno, format!("can only {what} regular files")));
        }
        Ok(ino)
    }

    /// Reads up to `buf.len()` bytes at `offset`; holes read as zeros.
    pub fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> DfsResult<usize> {
        let ino = self.regular_file(oid, "read")?;
        let len = (buf.len() as u64).min(ino.size.saturating_sub(offset));
        // Held while the chunk files are read: none of them becomes a spare meanwhile.
        let _gate = self.data_gate.read().expect("data gate");
        // The lock only guards the chunk cache: reads run side by side.
        let sources: Vec<_> = {
            let st = self.writes.lock();
            let mut st = self
                .writes
                .wait_for(st, oid, self.chunk_range(offset, len), 0);
            let sources = self
                .pieces(offset, len)
                .map(|(idx, at, n)| {
                    // Taken by the read that reaches the chunk's end (or the file's).
                    let last =
                        at + n == self.chunk_size || idx * self.chunk_size + at + n >= ino.size;
                    let fetched = st.ahead.fetched((oid, idx), last);
                    let source = match fetched {
                        Some(f) => Source::Fetched(f),
                        None => Source::File(self.chunk(&mut st, oid, idx, false)?),
                    };
                    Ok((idx, source, at, n))
                })
                .collect::<DfsResult<_>>()?;
            self.read_ahead(&mut st, oid, (offset, offset + len), ino.size);
            sources
        };
        let mut done = 0usize;
        for (idx, source, at, n) in sources {
            let out = &mut buf[done..done + n as usize];
            done += n as usize;
            let file = match source {
                Source::Fetched(f) if copy_fetched(&f, at, out) => continue,
                // It could not be read ahead: read it here.
                Source::Fetched(_) => self.chunk(&mut self.writes.lock(), oid, idx, false)?,
                Source::File(f) => f,
            };
            let got = match file {
                Some(f) => f.read_at(at, out)?,
                None => 0,
            };
            out[got..].fill(0);
        }
        Ok(done)
    }

    /// Writes `data` at `offset`. Space is taken from the quota and the pool before
    /// anything is written, so a full container or pool loses nothing it had.
    pub fn write(&self, oid: Oid, offset: u64, data: &[u8]) -> DfsResult<()> {
        self.writable()?;
        let end = check_end(offset, data.len() as u64)?;
        let _gate = self.data_gate.read().expect("data gate");
        self.change_chunks(oid, offset, data.len() as u64, end, |pieces| {
            write_pieces(pieces, data)
        })
    }

    /// Takes the space of [offset, offset + len) now (fallocate(2) modes 0 and KEEP_SIZE):
    /// the chunk files get their blocks, so later writes there neither fail for space nor
    /// wait for the file system to allocate. Extends the size to the end unless `keep_size`.
    pub fn allocate(&self, oid: Oid, offset: u64, len: u64, keep_size: bool) -> DfsResult<()> {
        self.writable()?;
        let end = check_end(offset, len)?;
        // Held from the size check on, so no truncation slips in between.
        let _gate = self.data_gate.read().expect("data gate");
        let size = self.regular_file(oid, "allocate")?.size;
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
        self.change_chunks(oid, offset, stop - offset, new_end, |pieces| {
            pieces.iter().try_for_each(|p| p.file.allocate(p.at, p.len))
        })
    }

    /// Applies `apply` to the chunks' pieces of [offset, offset + len) after reserving the
    /// space they grow by; then records a size of at least `new_end`, the times and the space
    /// used. Callers hold the data gate shared.
    fn change_chunks(
        &self,
        oid: Oid,
        offset: u64,
        len: u64,
        new_end: u64,
        apply: impl FnOnce(&[WritePiece]) -> std::io::Result<()>,
    ) -> DfsResult<()> {
        let Some((files, growth)) = self.start_write(oid, offset, len, 0)? else {
            // pwrite(2) of nothing changes nothing, not even the size.
            return Ok(());
        };
        let moved = apply(&files).map_err(DfsError::from);
        // Recorded before the change stops being in flight, so its growth is always counted
        // once against the quota: pending, then used.
        let written = moved.and_then(|()| self.record_write(oid, new_end, growth));
        self.finish_write(oid, &files, growth);
        if written.is_err() {
            self.release(growth);
        }
        written
    }

    /// Takes the chunk files of a write and reserves its space, under the writes lock; None
    /// for an empty write. Waits for the queued writes of its chunks first, so writes to a
    /// chunk land in order, and (for a write to be queued, of `room` bytes) for room.
    pub(super) fn start_write(
        &self,
        oid: Oid,
        offset: u64,
        len: u64,
        room: u64,
    ) -> DfsResult<Option<(Vec<WritePiece>, u64)>> {
        let st = self.writes.lock();
        self.regular_file(oid, "write")?;
        if len == 0 {
            return Ok(None);
        }
        let mut st = self
            .writes
            .wait_for(st, oid, self.chunk_range(offset, len), room);
        let mut growth = 0u64;
        let mut files = Vec::new();
        for (idx, at, n) in self.pieces(offset, len) {
            let f = self.chunk(&mut st, oid, idx, true)?.expect("created");
            let f = self.unshare(&mut st, oid, idx, f)?;
            let promised = st.in_flight.get(&(oid, idx)).map_or(0, |e| e.0);
            growth += (at + n).saturating_sub(f.size()?.max(promised));
            files.push(WritePiece {
                idx,
                file: f,
                at,
                len: n,
            });
        }
        self.reserve(growth, st.pending_growth)?;
        st.pending_growth += growth;
        for p in &files {
            let e = st.in_flight.entry((oid, p.idx)).or_insert((0, 0));
            *e = (e.0.max(p.at + p.len), e.1 + 1);
        }
        Ok(Some((files, growth)))
    }

    /// Marks the chunks of a write dirty, whatever its outcome (bytes may have landed), and
    /// ends its reservation.
    pub(super) fn finish_write(&self, oid: Oid, files: &[WritePiece], growth: u64) {
        let mut st = self.writes.lock();
        st.pending_growth -= growth;
        st.landed(oid, files);
    }
}

impl WriteState {
    /// The bytes of a write are in its chunk files (or failed to get there): the chunks are
    /// dirty and no longer in flight.
    pub(super) fn landed(&mut self, oid: Oid, files: &[WritePiece]) {
        for p in files {
            let key = (oid, p.idx);
            // The cache may have been emptied meanwhile; fsync finds dirty chunks there.
            self.open.entry(key).or_insert_with(|| p.file.clone());
            self.dirty.insert(key);
            self.ahead.forget(oid, p.idx);
            if let Some(e) = self.in_flight.get_mut(&key) {
                e.1 -= 1;
                if e.1 == 0 {
                    self.in_flight.remove(&key);
                }
            }
        }
    }
}

impl Namespace {
    /// The size (at least `end`), times and space use after a write.
    pub(super) fn record_write(&self, oid: Oid, end: u64, growth: u64) -> DfsResult<()> {
        self.update(|tx| {
            let mut ino = get_inode(&tx.open_table(INODES)?, oid)?;
            ino.size = ino.size.max(end);
            let now = Time::now();
            ino.mtime = now;
            ino.ctime = now;
            put_inode(tx, &ino)?;
            super::space::adjust_used(tx, growth as i64)
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
        let copy = st.spares.create(&*self.disk, &path)?;
        copy.write_at(0, &bytes)?;
        st.open.insert((oid, idx), copy.clone());
        st.dirty.insert((oid, idx));
        mark_dir_dirty(st, &path);
        Ok(copy)
    }

    /// Frees the data of [new_size, old_size): whole chunks are removed, the
    /// chunk holding the new end is cut (after unsharing it, so a snapshot keeps
    /// its bytes). Returns the bytes freed.
    pub(super) fn cut_chunks(
        &self,
        st: &mut WriteState,
        oid: Oid,
        new_size: u64,
        old_size: u64,
    ) -> DfsResult<u64> {
        let cs = self.chunk_size;
        let mut freed = 0;
        for idx in new_size / cs..old_size.div_ceil(cs) {
            let Some(f) = self.chunk(st, oid, idx, false)? else {
                continue;
            };
            let keep = new_size.saturating_sub(idx * cs).min(cs);
            let len = f.size()?;
            if keep == 0 {
                let path = self.chunk_path(oid, idx);
                st.spares.retire(&*self.disk, &path, &*f)?;
                mark_dir_dirty(st, &path);
                freed += len;
            } else if len > keep {
                let f = self.unshare(st, oid, idx, f)?;
                f.set_len(keep)?;
                st.dirty.insert((oid, idx));
                freed += len - keep;
            }
        }
        let kept = new_size.div_ceil(cs);
        st.open.retain(|(o, i), _| *o != oid || *i < kept);
        st.dirty.retain(|(o, i)| *o != oid || *i < kept);
        Ok(freed)
    }

    /// Syncs the written chunks (of one object, or all).
    pub(super) fn sync_dirty(&self, st: &mut WriteState, only: Option<Oid>) -> DfsResult<()> {
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

    /// Syncs the directories whose entries changed (new, copied or removed chunk files).
    pub(super) fn sync_dirs(&self, st: &mut WriteState) -> DfsResult<()> {
        for dir in std::mem::take(&mut st.dirty_dirs) {
            self.disk.sync_dir(&dir)?;
        }
        Ok(())
    }

    /// Makes the object's data and every metadata change so far durable: chunk data
    /// first, then the chunk directories, then the metadata that points at them.
    /// Queued writes land first; EIO if one of this object's failed.
    pub fn fsync(&self, oid: Oid) -> DfsResult<()> {
        let mut st = self.writes.drain(self.writes.lock());
        st.queued.take_failure(oid)?;
        self.sync_dirty(&mut st, Some(oid))?;
        self.sync_dirs(&mut st)?;
        drop(st);
        self.commit_durably()
    }
}
