//! The chunk store of a namespace: file data. Each regular file is cut into chunks of the
//! namespace's chunk size, one chunk file `<oid hex>.<index>` per chunk, chunk *i* of object
//! *o* in directory `(o + i) mod dirs` (one directory per rank of the pool). Missing chunks
//! (and the part of a chunk beyond its file's end) are holes and read as zeros.
//!
//! The store also keeps what the data path needs between calls: open chunk files, chunks
//! and directories fsync must sync, writes in flight and the space they reserved (`space.rs`),
//! recycled chunk files (`spares.rs`), queued writes (`write_behind.rs`) and read-ahead
//! (`read_ahead.rs`), the last two served by the I/O threads (`io_threads.rs`).
//!
//! Two locks: the data gate, held shared by whatever reads or writes chunk files and
//! exclusively by whatever cuts, removes or links them (see [`ChunkStore::quiesce`]); and the
//! writes lock around the state, held briefly. A write reserves its space and takes its
//! chunk files under the writes lock, then moves its bytes without it, so writes (to
//! different files, or different chunks of one) reach the disk side by side. The gate is
//! taken before the writes lock.

mod io_threads;
mod read_ahead;
mod space;
mod spares;
mod state;
mod write_behind;

#[cfg(test)]
mod tests_read_ahead;
#[cfg(test)]
mod tests_space;
#[cfg(test)]
mod tests_spares;
#[cfg(test)]
mod tests_write_behind;

pub use space::{SpaceBudget, StatFs};
pub(crate) use spares::Spares;

use super::disk::{Disk, DiskFile};
use super::error::{DfsResult, Errno, err};
use super::inode::Oid;
use super::iobuf::IoBuf;
use crate::namespace::error::StorageResult;
use read_ahead::{ChunkAt, Fetch, copy_fetched};
use space::Space;
use state::WriteState;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use write_behind::Writes;

/// Open chunk files kept per namespace before the cache is emptied. Emptying it syncs
/// nothing: dirty chunks stay dirty and are opened again when they are synced.
const MAX_OPEN_CHUNKS: usize = 1024;
/// Dirty chunks the store remembers before it syncs them all (when it next empties the open
/// cache). Until then, a workload that writes many small files and never fsyncs them costs
/// no sync per file (the kernel's writeback has usually flushed them by the time they are
/// synced), and the set stays bounded.
const MAX_DIRTY_CHUNKS: usize = 65_536;

/// Chunks of a range probed one by one when cut or removed; a longer range (a sparse file, or
/// more than 4 GiB of 1 MiB chunks) lists the chunk directories instead: an `open` per chunk
/// of the range against a directory entry per chunk file of the container.
const PROBE_AT_MOST: u64 = 4096;

/// Largest file end: what off_t can address.
const MAX_FILE_END: u64 = i64::MAX as u64;

/// EFBIG unless [offset, offset + len) is addressable; else its end.
pub(crate) fn check_end(offset: u64, len: u64) -> DfsResult<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_END => Ok(end),
        _ => Err(err(Errno::FBIG, "beyond the largest file size")),
    }
}

/// One chunk's part of a write.
#[derive(Debug)]
struct WritePiece {
    idx: u64,
    file: Arc<dyn DiskFile>,
    /// Offset in the chunk.
    at: u64,
    len: u64,
}

/// Moves `data` into the pieces of its write, in order.
fn write_pieces(pieces: &[WritePiece], data: &[u8]) -> std::io::Result<()> {
    let mut done = 0usize;
    for p in pieces {
        let n = p.len as usize;
        p.file.write_at(p.at, &data[done..done + n])?;
        done += n;
    }
    Ok(())
}

/// A write (or allocation) whose chunk files are taken and whose space is reserved: it is in
/// flight until [`ChunkStore::finish_write`] or [`ChunkStore::queue_write`].
#[derive(Debug)]
pub(crate) struct ChunkWrite {
    pieces: Vec<WritePiece>,
    growth: u64,
}

impl ChunkWrite {
    /// Bytes the write grows the chunk files by (reserved).
    pub fn growth(&self) -> u64 {
        self.growth
    }

    /// Moves `data` (the write's bytes) into the chunk files.
    pub fn write(&self, data: &[u8]) -> std::io::Result<()> {
        write_pieces(&self.pieces, data)
    }

    /// Gives the chunk files their blocks for the write's range, writing nothing.
    pub fn allocate(&self) -> std::io::Result<()> {
        self.pieces
            .iter()
            .try_for_each(|p| p.file.allocate(p.at, p.len))
    }
}

/// Where a read finds one chunk's bytes.
enum Source {
    /// Read ahead (see `read_ahead.rs`).
    Fetched(Arc<Fetch>),
    /// In the chunk file; None for a hole.
    File(Option<Arc<dyn DiskFile>>),
}

/// One namespace's chunk files.
#[derive(Debug)]
pub(crate) struct ChunkStore {
    disk: Arc<dyn Disk>,
    /// One per rank of the pool; chunks are spread over them.
    dirs: Vec<PathBuf>,
    /// From the superblock.
    chunk_size: u64,
    space: Space,
    /// The state and the signal of queued writes; shared with the I/O threads.
    writes: Arc<Writes>,
    /// The data gate (see the module).
    gate: RwLock<()>,
}

/// Every write held out and none queued: for changes that cut, remove or link chunk files.
/// Dropping it lets writes in again.
#[derive(Debug)]
pub(crate) struct Quiesced<'a> {
    store: &'a ChunkStore,
    st: MutexGuard<'a, WriteState>,
    _gate: RwLockWriteGuard<'a, ()>,
}

impl Drop for ChunkStore {
    /// A container closed (engine stop, pool removal) keeps every write it answered.
    fn drop(&mut self) {
        drop(self.writes.drain(self.writes.lock()));
    }
}

impl ChunkStore {
    /// A store over `dirs`, whose files are cut in chunks of `chunk_size`, limited by
    /// `quota` and `budget`, with the `spares` found there.
    pub fn new(
        disk: Arc<dyn Disk>,
        dirs: Vec<PathBuf>,
        chunk_size: u64,
        (quota, budget): (Option<u64>, Option<Arc<dyn SpaceBudget>>),
        spares: Spares,
    ) -> ChunkStore {
        ChunkStore {
            disk,
            dirs,
            chunk_size,
            space: Space::new(quota, budget),
            writes: Arc::new(Writes::new(WriteState {
                spares,
                ..WriteState::default()
            })),
            gate: RwLock::new(()),
        }
    }

    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Every chunk directory.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    pub fn quota(&self) -> Option<u64> {
        self.space.quota()
    }

    pub fn set_quota(&self, quota: Option<u64>) {
        self.space.set_quota(quota);
    }

    /// Gives freed bytes back to the pool.
    pub fn release(&self, freed: u64) {
        self.space.release(freed);
    }

    /// The data gate, shared: held by writes from taking their chunk files until their new
    /// size is recorded, so no truncation or removal comes in between.
    pub fn in_use(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().expect("data gate")
    }

    /// Holds every write out, waits for the queued ones to land and drops what was read
    /// ahead: for changes that cut, remove or link chunk files.
    pub fn quiesce(&self) -> Quiesced<'_> {
        let gate = self.gate.write().expect("data gate");
        let mut st = self.writes.drain(self.writes.lock());
        st.ahead.clear();
        Quiesced {
            store: self,
            st,
            _gate: gate,
        }
    }

    pub(crate) fn chunk_path(&self, oid: Oid, idx: u64) -> PathBuf {
        let dirs = &self.dirs;
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
                st.mark_dir_dirty(&path);
                st.spares.create(&*self.disk, &path)
            }
            other => other,
        };
        match opened {
            Ok(f) => {
                if st.open.len() >= MAX_OPEN_CHUNKS {
                    if st.dirty.len() >= MAX_DIRTY_CHUNKS {
                        self.sync_dirty(st, None)?;
                    }
                    st.open.clear();
                }
                st.open.insert((oid, idx), f.clone());
                Ok(Some(f))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).storage(),
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

    /// The chunks of `oid` in `range` that may have a file: the range itself when it is short,
    /// else the ones the chunk directories hold. A file's size says nothing of its data (a
    /// tenant may set it to 2^63 and write one byte), and cutting or removing it must cost
    /// what it holds, not one `open` per chunk of its size.
    fn chunks_in(&self, oid: Oid, range: std::ops::Range<u64>) -> DfsResult<Vec<u64>> {
        if range.end.saturating_sub(range.start) <= PROBE_AT_MOST {
            return Ok(range.collect());
        }
        let prefix = format!("{oid:x}.");
        let mut found = Vec::new();
        for dir in &self.dirs {
            for path in self.disk.list(dir).storage()? {
                let idx = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_prefix(&prefix).and_then(|i| i.parse::<u64>().ok()));
                found.extend(idx.filter(|i| range.contains(i)));
            }
        }
        found.sort_unstable();
        Ok(found)
    }

    /// The chunks [offset, offset + len) touches.
    fn chunk_range(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / self.chunk_size..(offset + len).div_ceil(self.chunk_size)
    }

    /// Reads `out.len()` bytes of `oid` (a file of `size` bytes) at `offset`, all within the
    /// file; holes read as zeros. Reads that follow each other have the next chunks read
    /// ahead.
    pub fn read(&self, oid: Oid, offset: u64, out: &mut [u8], size: u64) -> DfsResult<usize> {
        // A read at or past the end asks for nothing, at any offset a client sends (up to
        // 2^64 - 1, whose chunk has no end that fits a u64).
        if out.is_empty() {
            return Ok(0);
        }
        let len = out.len() as u64;
        // Held while the chunk files are read: none of them becomes a spare meanwhile.
        let _gate = self.gate.read().expect("data gate");
        // The lock only guards the chunk cache: reads run side by side.
        let sources: Vec<_> = {
            let st = self.writes.lock();
            let mut guard = self
                .writes
                .wait_for(st, oid, self.chunk_range(offset, len), 0);
            let st = &mut *guard;
            let sources = self
                .pieces(offset, len)
                .map(|(idx, at, n)| {
                    // Taken by the read that reaches the chunk's end (or the file's).
                    let last = at + n == self.chunk_size || idx * self.chunk_size + at + n >= size;
                    let fetched = st.ahead.fetched((oid, idx), last);
                    let source = match fetched {
                        Some(f) => Source::Fetched(f),
                        None => Source::File(self.chunk(st, oid, idx, false)?),
                    };
                    Ok((idx, source, at, n))
                })
                .collect::<DfsResult<_>>()?;
            let open = &st.open;
            st.ahead.after_read(
                &st.queued,
                oid,
                (offset, offset + len),
                (size, self.chunk_size),
                |idx| match open.get(&(oid, idx)) {
                    Some(f) => ChunkAt::Open(f.clone()),
                    None => ChunkAt::Path(self.disk.clone(), self.chunk_path(oid, idx)),
                },
            );
            sources
        };
        let mut done = 0usize;
        for (idx, source, at, n) in sources {
            let out = &mut out[done..done + n as usize];
            done += n as usize;
            let file = match source {
                Source::Fetched(f) if copy_fetched(&f, at, out) => continue,
                // It could not be read ahead: read it here.
                Source::Fetched(_) => self.chunk(&mut self.writes.lock(), oid, idx, false)?,
                Source::File(f) => f,
            };
            let got = match file {
                Some(f) => f.read_at(at, out).storage()?,
                None => 0,
            };
            out[got..].fill(0);
        }
        Ok(done)
    }

    /// Takes the chunk files of a write of [offset, offset + len) and reserves the space it
    /// grows them by, under the writes lock; None for an empty write. Waits for the queued
    /// writes of its chunks first, so writes to a chunk land in order, and (for a write to be
    /// queued, of `room` bytes) for room. `recorded` reads the use the superblock records.
    /// Callers hold [`ChunkStore::in_use`].
    pub fn start_write(
        &self,
        oid: Oid,
        (offset, len): (u64, u64),
        room: u64,
        recorded: impl FnOnce() -> DfsResult<u64>,
    ) -> DfsResult<Option<ChunkWrite>> {
        let st = self.writes.lock();
        if len == 0 {
            return Ok(None);
        }
        let mut st = self
            .writes
            .wait_for(st, oid, self.chunk_range(offset, len), room);
        // The growth is known, and reserved, before a chunk file is made: an allocation the
        // quota refuses must not first create a file for each chunk of its range.
        let growth = self.growth_of(&mut st, oid, offset, len)?;
        self.space.reserve(growth, st.pending_growth, recorded)?;
        let pieces = match self.take_pieces(&mut st, oid, offset, len) {
            Ok(pieces) => pieces,
            Err(e) => {
                self.space.release(growth);
                return Err(e);
            }
        };
        st.pending_growth += growth;
        for p in &pieces {
            let e = st.in_flight.entry((oid, p.idx)).or_insert((0, 0));
            *e = (e.0.max(p.at + p.len), e.1 + 1);
        }
        Ok(Some(ChunkWrite { pieces, growth }))
    }

    /// How many bytes the chunk files of [offset, offset + len) grow by: each piece reaches
    /// to its end in its chunk, past what the chunk's file holds or a write in flight
    /// promised. Only chunks that have a file are opened (see [`ChunkStore::chunks_in`]).
    fn growth_of(&self, st: &mut WriteState, oid: Oid, offset: u64, len: u64) -> DfsResult<u64> {
        let cs = self.chunk_size;
        let end = offset + len;
        let range = self.chunk_range(offset, len);
        let reach = |idx: u64| ((idx + 1) * cs).min(end) - idx * cs;
        // Every chunk from nothing: whole chunks up to the last, which the end cuts.
        let last = range.end - 1;
        let mut growth = (last - range.start) * cs + reach(last);
        for idx in self.chunks_in(oid, range)? {
            let promised = st.in_flight.get(&(oid, idx)).map_or(0, |e| e.0);
            let held = match self.chunk(st, oid, idx, false)? {
                Some(f) => f.size().storage()?,
                None => 0,
            };
            growth -= reach(idx).min(held.max(promised));
        }
        Ok(growth)
    }

    /// The pieces of [offset, offset + len), each with its chunk's file, made if missing and
    /// copied first if a snapshot shares it.
    fn take_pieces(
        &self,
        st: &mut WriteState,
        oid: Oid,
        offset: u64,
        len: u64,
    ) -> DfsResult<Vec<WritePiece>> {
        self.pieces(offset, len)
            .map(|(idx, at, len)| {
                let made = self.chunk(st, oid, idx, true)?.expect("created");
                let file = self.unshare(st, oid, idx, made)?;
                Ok(WritePiece { idx, file, at, len })
            })
            .collect()
    }

    /// Records a write's growth as used (`record`: the superblock's counter) and stops
    /// counting it as pending, in one step under the writes lock. Done in two, a reservation
    /// in between would count the growth twice (recorded and pending) and refuse space that
    /// is there. On an error nothing changed: the growth is still pending.
    pub fn record_growth(
        &self,
        write: &ChunkWrite,
        record: impl FnOnce() -> DfsResult<()>,
    ) -> DfsResult<()> {
        let mut st = self.writes.lock();
        record()?;
        st.pending_growth -= write.growth;
        Ok(())
    }

    /// Gives back the reservation of a write whose growth was not recorded: no longer
    /// pending, and returned to the pool.
    pub fn drop_reservation(&self, write: &ChunkWrite) {
        self.writes.lock().pending_growth -= write.growth;
        self.release(write.growth);
    }

    /// Ends a write whose bytes moved (or failed to): its chunks are dirty, whatever its
    /// outcome (bytes may have landed). Its reservation was recorded or dropped before.
    pub fn finish_write(&self, oid: Oid, write: &ChunkWrite) {
        self.writes.lock().landed(oid, &write.pieces);
    }

    /// Hands a write whose growth is recorded to an I/O thread, which moves `data` into its
    /// chunk files (see `write_behind.rs`).
    pub fn queue_write(&self, oid: Oid, offset: u64, write: ChunkWrite, data: IoBuf) {
        self.writes.queue(oid, offset, write.pieces, data);
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
        if !self.disk.is_shared(&path).storage()? {
            return Ok(f);
        }
        let mut bytes = vec![0; f.size().storage()? as usize];
        f.read_at(0, &mut bytes).storage()?;
        self.disk.remove(&path).storage()?;
        let copy = st.spares.create(&*self.disk, &path).storage()?;
        copy.write_at(0, &bytes).storage()?;
        st.open.insert((oid, idx), copy.clone());
        st.dirty.insert((oid, idx));
        st.mark_dir_dirty(&path);
        Ok(copy)
    }

    /// Syncs the written chunks (of one object, or all). A dirty chunk no longer in the open
    /// cache is opened again: fsync(2) makes a file's data durable through any descriptor
    /// of it, and a writeback error it had since it was closed is reported to the new
    /// descriptor (Linux reports an error no descriptor has seen to the next opener).
    fn sync_dirty(&self, st: &mut WriteState, only: Option<Oid>) -> DfsResult<()> {
        let chunks: Vec<(Oid, u64)> = match only {
            Some(oid) => st
                .dirty
                .range((oid, 0)..=(oid, u64::MAX))
                .copied()
                .collect(),
            None => st.dirty.iter().copied().collect(),
        };
        for key in chunks {
            if let Some(f) = self.dirty_file(st, key)? {
                f.sync().storage()?;
            }
            st.dirty.remove(&key);
        }
        Ok(())
    }

    /// A dirty chunk's file to sync: the open one, or the file opened again; None if it is
    /// gone (nothing of it is left to sync).
    fn dirty_file(
        &self,
        st: &WriteState,
        (oid, idx): (Oid, u64),
    ) -> DfsResult<Option<Arc<dyn DiskFile>>> {
        if let Some(f) = st.open.get(&(oid, idx)) {
            return Ok(Some(f.clone()));
        }
        match self.disk.open(&self.chunk_path(oid, idx), false) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).storage(),
        }
    }

    /// Syncs the directories whose entries changed (new, copied or removed chunk files).
    fn sync_dirs(&self, st: &mut WriteState) -> DfsResult<()> {
        for dir in std::mem::take(&mut st.dirty_dirs) {
            self.disk.sync_dir(&dir).storage()?;
        }
        Ok(())
    }

    /// Makes the object's data durable: its chunk files, then the chunk directories whose
    /// entries changed. Queued writes land first; EIO if one of this object's failed.
    pub fn sync_object(&self, oid: Oid) -> DfsResult<()> {
        let mut st = self.writes.drain(self.writes.lock());
        st.queued.take_failure(oid)?;
        self.sync_dirty(&mut st, Some(oid))?;
        self.sync_dirs(&mut st)
    }

    /// Makes every object's data durable, as [`ChunkStore::sync_object`] does one's. A
    /// failure belongs to its object: a chunk that fails to sync is kept as a failure of its
    /// object, for that object's next fsync, as failed queued writes are; the others go on.
    /// True when every object's data is durable and no failure waits for an fsync.
    pub fn sync_every_object(&self) -> DfsResult<bool> {
        let mut st = self.writes.drain(self.writes.lock());
        let dirty: Vec<(Oid, u64)> = st.dirty.iter().copied().collect();
        for key in dirty {
            let synced = self.dirty_file(&st, key)?.map_or(Ok(()), |f| f.sync());
            match synced {
                Ok(()) => {
                    st.dirty.remove(&key);
                }
                // Stays dirty, as with a failed fsync: the object's next one tries again.
                Err(e) => {
                    tracing::error!(oid = key.0, chunk = key.1, "syncing a chunk: {e}");
                    st.queued
                        .fail(key.0, format!("syncing chunk {}: {e}", key.1));
                }
            }
        }
        self.sync_dirs(&mut st)?;
        Ok(!st.queued.any_failed())
    }

    /// Empties detached spares (see [`Quiesced::detach_removed`]) and keeps them for new
    /// chunks. A crash before a spare is emptied leaves its bytes on the disk until a new
    /// chunk takes it, which empties it first.
    pub fn keep_spares(&self, spares: Vec<PathBuf>) -> DfsResult<()> {
        for spare in spares {
            self.disk
                .open(&spare, false)
                .storage()?
                .set_len(0)
                .storage()?;
            self.writes.lock().spares.keep(spare);
        }
        Ok(())
    }

    /// Makes the entries of the chunk directories that changed durable (chunk files made,
    /// renamed or removed). Held under the writes lock, as fsync holds it: an fsync never
    /// returns while a directory it needs is still being synced here.
    pub fn sync_changed_dirs(&self) -> DfsResult<()> {
        self.sync_dirs(&mut self.writes.lock())
    }

    /// Whether chunk `key` has been read ahead and is waiting in memory.
    #[cfg(test)]
    pub(crate) fn holds_read_ahead(&self, key: (Oid, u64)) -> bool {
        self.writes.lock().ahead.holds(key)
    }
}

impl Quiesced<'_> {
    /// Frees the data of [new_size, old_size) of `oid`: whole chunks are retired (kept as
    /// spares or removed), the chunk holding the new end is cut (after unsharing it, so a
    /// snapshot keeps its bytes). Returns the bytes freed.
    pub fn cut(&mut self, oid: Oid, new_size: u64, old_size: u64) -> DfsResult<u64> {
        let store = self.store;
        let st = &mut *self.st;
        let cs = store.chunk_size;
        let mut freed = 0;
        for idx in store.chunks_in(oid, new_size / cs..old_size.div_ceil(cs))? {
            let Some(f) = store.chunk(st, oid, idx, false)? else {
                continue;
            };
            let keep = new_size.saturating_sub(idx * cs).min(cs);
            let len = f.size().storage()?;
            if keep == 0 {
                let path = store.chunk_path(oid, idx);
                st.spares.retire(&*store.disk, &path, &*f).storage()?;
                st.mark_dir_dirty(&path);
                freed += len;
            } else if len > keep {
                let f = store.unshare(st, oid, idx, f)?;
                f.set_len(keep).storage()?;
                st.dirty.insert((oid, idx));
                freed += len - keep;
            }
        }
        let kept = new_size.div_ceil(cs);
        st.open.retain(|(o, i), _| *o != oid || *i < kept);
        let cut: Vec<_> = st
            .dirty
            .range((oid, kept)..=(oid, u64::MAX))
            .copied()
            .collect();
        for key in cut {
            st.dirty.remove(&key);
        }
        Ok(freed)
    }

    /// Makes [start, end) of `oid` a hole and returns the bytes freed. A chunk whose data
    /// lies wholly inside it is retired, as a cut retires it; one whose data ends inside it is
    /// cut back to the hole's start; one with data on both sides of it gets zeros there. Each
    /// is unshared first, so a snapshot keeps its bytes. Only the chunks at the hole's two
    /// ends are ever written, whatever its length.
    pub fn punch(&mut self, oid: Oid, start: u64, end: u64) -> DfsResult<u64> {
        let store = self.store;
        let st = &mut *self.st;
        let cs = store.chunk_size;
        let mut freed = 0;
        for idx in store.chunks_in(oid, store.chunk_range(start, end - start))? {
            let Some(f) = store.chunk(st, oid, idx, false)? else {
                continue;
            };
            let len = f.size().storage()?;
            // The hole within this chunk.
            let (from, to) = (start.saturating_sub(idx * cs), (end - idx * cs).min(cs));
            if from >= len {
                continue;
            }
            if from == 0 && to >= len {
                let path = store.chunk_path(oid, idx);
                st.spares.retire(&*store.disk, &path, &*f).storage()?;
                st.mark_dir_dirty(&path);
                st.open.remove(&(oid, idx));
                st.dirty.remove(&(oid, idx));
                freed += len;
                continue;
            }
            let f = store.unshare(st, oid, idx, f)?;
            if to >= len {
                f.set_len(from).storage()?;
                freed += len - from;
            } else {
                f.write_at(from, &vec![0; (to - from) as usize]).storage()?;
            }
            st.dirty.insert((oid, idx));
        }
        Ok(freed)
    }

    /// Takes the chunk files of removed file `oid` (of `size` bytes) out of their names:
    /// returns the spares they became, to be emptied without holding writes out
    /// ([`ChunkStore::keep_spares`]). Shared ones are deleted, missing ones skipped.
    pub fn detach_removed(&mut self, oid: Oid, size: u64) -> DfsResult<Vec<PathBuf>> {
        let store = self.store;
        let st = &mut *self.st;
        let mut spares = Vec::new();
        for idx in store.chunks_in(oid, 0..size.div_ceil(store.chunk_size))? {
            st.open.remove(&(oid, idx));
            st.dirty.remove(&(oid, idx));
            let path = store.chunk_path(oid, idx);
            if let Some(spare) = st.spares.detach(&*store.disk, &path).storage()? {
                spares.push(spare);
            }
            st.mark_dir_dirty(&path);
        }
        Ok(spares)
    }

    /// The bytes the chunk files of `oid` (a file of `size` bytes) hold: what removing it
    /// gives back once they are cut.
    pub fn held_bytes(&self, oid: Oid, size: u64) -> DfsResult<u64> {
        let store = self.store;
        let mut held = 0;
        for idx in store.chunks_in(oid, 0..size.div_ceil(store.chunk_size))? {
            held += match self.st.open.get(&(oid, idx)) {
                Some(f) => f.size().storage()?,
                None => store
                    .disk
                    .size_of(&store.chunk_path(oid, idx))
                    .storage()?
                    .unwrap_or(0),
            };
        }
        Ok(held)
    }

    /// Makes every chunk written so far durable, and the directories whose entries changed.
    pub fn sync_all(&mut self) -> DfsResult<()> {
        self.store.sync_dirty(&mut self.st, None)?;
        self.store.sync_dirs(&mut self.st)
    }

    /// Hard-links every chunk file into `targets` (one per chunk directory, in order) for a
    /// snapshot or clone: shared until either side changes a chunk, which copies it first.
    /// Spares are never linked; neither is `skip` (the metadata store, which lives in the
    /// first chunk directory).
    pub fn link_into(&self, targets: &[PathBuf], skip: &Path) -> DfsResult<()> {
        let disk = &self.store.disk;
        for (from, to) in self.store.dirs.iter().zip(targets) {
            for path in disk.list(from).storage()? {
                if path != skip
                    && !spares::is_spares_dir(&path)
                    && let Some(name) = path.file_name()
                {
                    disk.link(&path, &to.join(name)).storage()?;
                }
            }
        }
        Ok(())
    }
}
