//! What the chunk store keeps between calls, under one lock (`Writes`, `write_behind.rs`):
//! open chunk files, what fsync still has to sync, the writes in flight and the space they
//! reserved, the spares, the queued writes and what was read ahead.

use super::WritePiece;
use super::read_ahead::ReadAhead;
use super::spares::Spares;
use super::write_behind::Queued;
use crate::namespace::disk::DiskFile;
use crate::namespace::inode::Oid;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Default)]
pub(super) struct WriteState {
    pub(super) open: HashMap<(Oid, u64), Arc<dyn DiskFile>>,
    /// Chunks written since their last sync, open or not (a chunk closed by the cache is
    /// opened again to be synced). Ordered, so one object's chunks are a range.
    pub(super) dirty: BTreeSet<(Oid, u64)>,
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

impl WriteState {
    /// The bytes of a write are in its chunk files (or failed to get there): the chunks are
    /// dirty and no longer in flight.
    pub(super) fn landed(&mut self, oid: Oid, files: &[WritePiece]) {
        for p in files {
            let key = (oid, p.idx);
            // The cache may have been emptied meanwhile: the next write or fsync of the
            // chunk finds it open.
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

    /// A chunk file was created, copied or removed at `path`: its directory (and, for a
    /// directory just created, the one above) must be synced before metadata points at it.
    pub(super) fn mark_dir_dirty(&mut self, path: &Path) {
        if let Some(dir) = path.parent() {
            self.dirty_dirs.insert(dir.to_path_buf());
            if let Some(up) = dir.parent() {
                self.dirty_dirs.insert(up.to_path_buf());
            }
        }
    }
}
