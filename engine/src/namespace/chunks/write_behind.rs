//! Write-behind of large writes.
//!
//! A large write is answered once its bytes are in the engine's memory, its space reserved
//! and its new size recorded; an I/O thread (`io_threads.rs`) then moves it to the chunk
//! files. A client stream sends its next request while the disk writes the last one, where
//! it used to pay the network and the disk one after the other.
//!
//! What a client can see stays as POSIX has it:
//! - ENOSPC is never deferred: space is reserved before the answer.
//! - Reads, later writes to the same chunk, truncation, removal, renames over a file and
//!   snapshots wait for the queued writes they could meet.
//! - fsync waits for every queued write; one that failed on the disk fails the object's
//!   next fsync with EIO, the way the kernel reports writeback errors.
//! - A crash loses only what no fsync acknowledged.
//!
//! [`Writes`] is the lock around the chunk store's state together with the signal that
//! queued writes landed, so whoever must wait for them waits on the lock's condition.

use super::state::WriteState;
use super::{WritePiece, io_threads, write_pieces};
use crate::namespace::error::{DfsResult, Errno, err};
use crate::namespace::inode::Oid;
use crate::namespace::iobuf::IoBuf;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Bytes a namespace may have queued before its writers wait for the disk.
const MAX_QUEUED_BYTES: u64 = 16 << 20;

/// The write state of a chunk store, and the signal that queued writes landed.
#[derive(Debug, Default)]
pub(super) struct Writes {
    state: Mutex<WriteState>,
    landed: Condvar,
}

/// Writes answered but not on the disk yet.
#[derive(Debug, Default)]
pub(super) struct Queued {
    /// Chunks with queued writes, and how many each has.
    chunks: HashMap<(Oid, u64), usize>,
    bytes: u64,
    /// Objects a queued write failed for, and why: their next fsync reports it.
    failed: HashMap<Oid, String>,
}

impl Queued {
    /// Whether a write is queued for one of the chunks `idx` of `oid`. An allocation's range
    /// may span 2^40 chunks: the shorter of the range and the queue is walked.
    fn holds_any(&self, oid: Oid, idx: &Range<u64>) -> bool {
        if idx.end.saturating_sub(idx.start) <= self.chunks.len() as u64 {
            idx.clone().any(|i| self.chunks.contains_key(&(oid, i)))
        } else {
            self.chunks
                .keys()
                .any(|&(o, i)| o == oid && idx.contains(&i))
        }
    }
}

impl Writes {
    pub(super) fn new(state: WriteState) -> Writes {
        Writes {
            state: Mutex::new(state),
            landed: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, WriteState> {
        self.state.lock().expect("writes lock")
    }

    /// Waits, the lock released meanwhile, until no write is queued for the chunks `idx` of
    /// `oid`, and (for a write of `room` bytes to be queued) the queue has room.
    pub(super) fn wait_for<'a>(
        &self,
        st: MutexGuard<'a, WriteState>,
        oid: Oid,
        idx: Range<u64>,
        room: u64,
    ) -> MutexGuard<'a, WriteState> {
        self.landed
            .wait_while(st, |s| {
                let q = &s.queued;
                (room > 0 && q.bytes > 0 && q.bytes + room > MAX_QUEUED_BYTES)
                    || q.holds_any(oid, &idx)
            })
            .expect("writes lock")
    }

    /// Waits until nothing is queued.
    pub(super) fn drain<'a>(&self, st: MutexGuard<'a, WriteState>) -> MutexGuard<'a, WriteState> {
        self.landed
            .wait_while(st, |s| !s.queued.chunks.is_empty())
            .expect("writes lock")
    }

    /// Queues a write whose space is reserved and whose growth and size are recorded
    /// ([`ChunkStore::record_growth`](super::ChunkStore::record_growth)) for an I/O thread to
    /// move `data` into its pieces.
    pub(super) fn queue(
        self: &Arc<Self>,
        oid: Oid,
        offset: u64,
        pieces: Vec<WritePiece>,
        data: IoBuf,
    ) {
        let len = data.len() as u64;
        {
            let mut st = self.lock();
            for p in &pieces {
                *st.queued.chunks.entry((oid, p.idx)).or_insert(0) += 1;
            }
            st.queued.bytes += len;
        }
        let writes = self.clone();
        io_threads::submit(Box::new(move || {
            let moved = io_threads::catching(|| write_pieces(&pieces, data.as_slice()));
            let failure = moved.err();
            if let Some(why) = &failure {
                tracing::error!(oid, offset, "a queued write failed: {why}");
            }
            writes.land(oid, &pieces, len, failure);
        }));
    }

    /// Ends a queued write: its chunks are dirty, and the failure, if any, is kept for fsync.
    fn land(&self, oid: Oid, pieces: &[WritePiece], bytes: u64, failure: Option<String>) {
        let mut st = self.lock();
        st.landed(oid, pieces);
        for p in pieces {
            let key = (oid, p.idx);
            if let Some(n) = st.queued.chunks.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    st.queued.chunks.remove(&key);
                }
            }
        }
        st.queued.bytes -= bytes;
        if let Some(why) = failure {
            st.queued.failed.insert(oid, why);
        }
        drop(st);
        self.landed.notify_all();
    }
}

impl Queued {
    /// Whether writes to chunk `key` are queued.
    pub(super) fn holds(&self, key: (Oid, u64)) -> bool {
        self.chunks.contains_key(&key)
    }

    /// Keeps a failure of `oid` for its next fsync (a chunk's sync that failed while the
    /// whole container was synced: fsync(2) reports an error once, so it is kept here).
    pub(super) fn fail(&mut self, oid: Oid, why: String) {
        self.failed.entry(oid).or_insert(why);
    }

    /// Whether some object's failure waits for its next fsync.
    pub(super) fn any_failed(&self) -> bool {
        !self.failed.is_empty()
    }

    /// EIO if a queued write of `oid` failed since the last time this was asked.
    pub(super) fn take_failure(&mut self, oid: Oid) -> DfsResult<()> {
        match self.failed.remove(&oid) {
            Some(why) => Err(err(Errno::IO, format!("an earlier write failed: {why}"))),
            None => Ok(()),
        }
    }
}
