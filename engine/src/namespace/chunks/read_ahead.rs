//! Read-ahead for sequential readers.
//!
//! A read that starts where the object's last read ended has the next chunks read on the
//! I/O threads (`io_threads.rs`), so the stream's next requests find their bytes in memory: the
//! disk works while the network carries the last reply, where a stream used to pay them
//! one after the other. What was read ahead of a chunk is dropped whenever the chunk
//! changes (a write landing in it, a cut), so a read never sees older bytes than a plain
//! read at the same moment would.

use super::io_threads;
use super::write_behind::Queued;
use crate::namespace::disk::{Disk, DiskFile};
use crate::namespace::inode::Oid;
use crate::namespace::iobuf::IoBuf;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

/// Chunks read ahead of a sequential reader.
const DEPTH: u64 = 2;
/// Chunks held per namespace; past it, what is held is dropped (readers that went away).
const MAX_CHUNKS: usize = 64;
/// Objects whose last read end is remembered.
const MAX_STREAMS: usize = 4096;
/// Larger chunks are not read ahead: the memory would outweigh the gain.
const MAX_CHUNK_SIZE: u64 = 4 << 20;

/// What was read ahead, and where readers are.
#[derive(Debug, Default)]
pub(super) struct ReadAhead {
    /// Where each object's last read ended.
    ends: HashMap<Oid, u64>,
    chunks: HashMap<(Oid, u64), Arc<Fetch>>,
}

/// One chunk being read ahead.
#[derive(Debug, Default)]
pub(super) struct Fetch {
    state: Mutex<FetchState>,
    ready: Condvar,
}

#[derive(Debug, Default)]
enum FetchState {
    /// Waiting for an I/O thread.
    #[default]
    Queued,
    Reading,
    /// The chunk's bytes; None if they could not be read (the reader reads for itself).
    Done(Option<IoBuf>),
    /// A reader came first and read for itself: no thread should read it now.
    Dropped,
}

impl ReadAhead {
    /// Drops what was read ahead of chunk `idx` of `oid` (it changed).
    pub(super) fn forget(&mut self, oid: Oid, idx: u64) {
        self.chunks.remove(&(oid, idx));
    }

    /// What was read ahead of `key`, taken if the read uses it to the chunk's end.
    pub(super) fn fetched(&mut self, key: (Oid, u64), to_end: bool) -> Option<Arc<Fetch>> {
        match to_end {
            true => self.chunks.remove(&key),
            false => self.chunks.get(&key).cloned(),
        }
    }

    /// Whether chunk `key` has been read ahead and is waiting in memory.
    #[cfg(test)]
    pub(super) fn holds(&self, key: (Oid, u64)) -> bool {
        self.chunks
            .get(&key)
            .is_some_and(|f| matches!(&*f.state.lock().expect("fetch"), FetchState::Done(Some(_))))
    }

    /// Drops everything read ahead (chunk files are being cut, removed or linked).
    pub(super) fn clear(&mut self) {
        self.chunks.clear();
    }
}

/// Where a chunk to read ahead is: open already (in the chunk store's cache), or a path the
/// I/O thread opens, off the writes lock.
pub(super) enum ChunkAt {
    Open(Arc<dyn DiskFile>),
    Path(Arc<dyn Disk>, PathBuf),
}

/// Reads the chunk whole: up to `len` bytes, a hole if it does not exist.
fn read_chunk(chunk: &ChunkAt, len: usize) -> std::io::Result<IoBuf> {
    let mut buf = IoBuf::new(len);
    let file = match chunk {
        ChunkAt::Open(f) => Some(f.clone()),
        ChunkAt::Path(disk, path) => match disk.open(path, false) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        },
    };
    let n = match file {
        Some(f) => f.read_at(0, buf.as_mut_slice())?,
        None => 0,
    };
    buf.as_mut_slice()[n..].fill(0);
    Ok(buf)
}

fn start_fetch(chunk: ChunkAt, len: usize) -> Arc<Fetch> {
    let fetch = Arc::new(Fetch::default());
    let job = fetch.clone();
    io_threads::submit(Box::new(move || {
        {
            let mut state = job.state.lock().expect("fetch");
            if matches!(*state, FetchState::Dropped) {
                return;
            }
            *state = FetchState::Reading;
        }
        let got = io_threads::catching(|| read_chunk(&chunk, len))
            .inspect_err(|e| tracing::debug!("read-ahead failed: {e}"))
            .ok();
        *job.state.lock().expect("fetch") = FetchState::Done(got);
        job.ready.notify_all();
    }));
    fetch
}

impl ReadAhead {
    /// Notes a read of [offset, end) of a file of `size` bytes cut in chunks of
    /// `chunk_size`; if it follows the last one, starts reading the chunks after it, from
    /// where `locate` says they are. Chunks with writes `queued` are left alone.
    pub(super) fn after_read(
        &mut self,
        queued: &Queued,
        oid: Oid,
        (offset, end): (u64, u64),
        (size, chunk_size): (u64, u64),
        locate: impl Fn(u64) -> ChunkAt,
    ) {
        let cs = chunk_size;
        if self.ends.len() >= MAX_STREAMS {
            self.ends.clear();
        }
        if self.ends.insert(oid, end) != Some(offset) || cs > MAX_CHUNK_SIZE {
            return;
        }
        if self.chunks.len() >= MAX_CHUNKS {
            self.chunks.clear();
        }
        let first = end / cs;
        for idx in (first..first + DEPTH).take_while(|i| i * cs < size) {
            let key = (oid, idx);
            // A chunk with writes queued is read once they land.
            if self.chunks.contains_key(&key) || queued.holds(key) {
                continue;
            }
            let fetch = start_fetch(locate(idx), cs as usize);
            self.chunks.insert(key, fetch);
        }
    }
}

/// Copies what was read ahead into `out` (the part of the chunk at `at`), once it is there;
/// false if the reader should read for itself: the chunk could not be read, or no I/O thread
/// has started on it (waiting behind other streams' read-ahead would cost more than reading).
pub(super) fn copy_fetched(fetch: &Fetch, at: u64, out: &mut [u8]) -> bool {
    let mut state = fetch.state.lock().expect("fetch");
    if matches!(*state, FetchState::Queued) {
        *state = FetchState::Dropped;
    }
    let state = fetch
        .ready
        .wait_while(state, |s| matches!(s, FetchState::Reading))
        .expect("fetch");
    let FetchState::Done(Some(buf)) = &*state else {
        return false;
    };
    let at = at as usize;
    out.copy_from_slice(&buf.as_slice()[at..at + out.len()]);
    true
}
