//! Object ids. An oid names a file's chunk files, so one a crash took back must never be handed
//! out again: a create the crash lost may have left chunk files (the kernel writes data back
//! without the metadata), and a new file with its oid would show their bytes after a
//! truncation upward or past a hole. Creates are not durable one by one, so oids are handed
//! out in memory from a range whose end the superblock holds durably (`next_oid`), as DAOS
//! hands out oid ranges (`daos_cont_alloc_oids`): one forced commit per range, and a crash
//! skips the rest of the range.

use super::{MetaStore, NEXT_OID, SUPER};
use crate::namespace::error::{DfsResult, StorageResult};
use crate::namespace::inode::{Oid, ROOT};
use redb::ReadableDatabase;

/// Oids reserved by one forced commit.
pub(super) const OID_RANGE: u64 = 1024;

/// The oids reserved and not handed out yet: [next, end). Empty before the first create of
/// this run.
#[derive(Debug, Default)]
pub(super) struct OidRange {
    next: Oid,
    end: Oid,
}

impl MetaStore {
    /// An oid no run of this store handed out before.
    pub(super) fn new_oid(&self) -> DfsResult<Oid> {
        self.writable()?;
        let mut range = self.oids.lock().unwrap_or_else(|p| p.into_inner());
        if range.next == range.end {
            let start = match range.end {
                0 => self.stored_next_oid()?,
                end => end,
            };
            let end = start + OID_RANGE;
            self.commit_forced(|tx| {
                tx.open_table(SUPER)
                    .storage()?
                    .insert(NEXT_OID, end)
                    .storage()?;
                Ok(())
            })?;
            *range = OidRange { next: start, end };
        }
        range.next += 1;
        Ok(range.next - 1)
    }

    /// The end of the last range reserved (the next oid, for a store from before ranges).
    fn stored_next_oid(&self) -> DfsResult<Oid> {
        let tx = self.db.begin_read().storage()?;
        let sup = tx.open_table(SUPER).storage()?;
        Ok(sup.get(NEXT_OID).storage()?.map_or(ROOT + 1, |v| v.value()))
    }
}
