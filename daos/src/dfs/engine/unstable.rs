//! The objects this client changed since their last fsync, each with the write verifier of
//! the engine that acknowledged the change (`DfsReply.verifier`).
//!
//! The engine answers a change before it is durable; a crash of the engine loses every change
//! no fsync has covered. Once restarted it answers with a new verifier, so an object's fsync
//! answered under another verifier than one of its changes means the change may be lost: the
//! fsync fails with EIO, once, as Linux reports a writeback error. (NFSv3 clients compare the
//! verifiers of WRITE and COMMIT the same way; they keep the data and send it again, which a
//! client without a page cache cannot.)
//!
//! The table holds at most [`Unstable::MAX`] objects. A change that would go past that makes
//! the client sync the whole container first (`Syncfs`), as the kernel makes a writer wait
//! for writeback once too much is dirty. Objects whose changes an engine that is gone took
//! move out of the table into a list of their own, to be reported at their next fsync, so
//! they never fill the table; that list too keeps at most [`Unstable::MAX`] (then the oldest
//! news is dropped with a warning: a client with over 262,144 objects changed, unsynced, when
//! its engine crashed).

use super::Oid;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// An object's changes since its last fsync.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// The verifier of the oldest of them.
    verifier: u64,
    /// The mark ([`Unstable::mark`]) of the newest.
    last: u64,
}

#[derive(Debug)]
pub(super) struct Unstable {
    objects: Mutex<Tables>,
    /// Counts changes, so an fsync forgets only what happened before it was sent.
    marks: AtomicU64,
    max: usize,
}

#[derive(Debug, Default)]
struct Tables {
    /// Objects changed since their last fsync.
    pending: HashMap<Oid, Pending>,
    /// Objects some of whose changes an engine that is gone took: its verifier.
    lost: HashMap<Oid, u64>,
}

/// Changes acknowledged by an engine that is gone: `verifier` was its.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lost {
    pub verifier: u64,
}

impl Unstable {
    /// Objects tracked at most: about 40 bytes each in the table.
    pub const MAX: usize = 1 << 18;

    pub fn new(max: usize) -> Unstable {
        Unstable {
            objects: Mutex::default(),
            marks: AtomicU64::new(0),
            max,
        }
    }

    fn objects(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the changes stand now; an fsync sent after this covers every change before it.
    pub fn mark(&self) -> u64 {
        self.marks.load(Ordering::Acquire)
    }

    /// Records that `oid` changed under `verifier`. False when the table is full and `oid`
    /// is not in it: the caller syncs the container ([`Unstable::synced_all`]) and records
    /// the change again.
    pub fn changed(&self, oid: Oid, verifier: u64) -> bool {
        if verifier == 0 {
            // An engine that does not say: nothing to compare.
            return true;
        }
        let mut t = self.objects();
        let last = self.marks.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(p) = t.pending.get_mut(&oid) {
            p.last = last;
            return true;
        }
        if t.pending.len() >= self.max {
            return false;
        }
        t.pending.insert(oid, Pending { verifier, last });
        true
    }

    /// `oid`'s fsync, sent at `mark`, was answered under `verifier`. Its changes before the
    /// mark are durable unless one was acknowledged by another engine: then they may be
    /// lost, and this says so once.
    pub fn synced(&self, oid: Oid, mark: u64, verifier: u64) -> Result<(), Lost> {
        let mut t = self.objects();
        let oldest = match t.pending.entry(oid) {
            Entry::Occupied(e) if e.get().last <= mark => Some(e.remove().verifier),
            // Changed again while the fsync was on its way: the newer change is not covered
            // and is tracked from here under the fsync's verifier.
            Entry::Occupied(mut e) => Some(std::mem::replace(&mut e.get_mut().verifier, verifier)),
            Entry::Vacant(_) => None,
        };
        let gone = t
            .lost
            .remove(&oid)
            .or(oldest.filter(|&v| verifier != 0 && v != verifier));
        match gone {
            Some(verifier) => Err(Lost { verifier }),
            None => Ok(()),
        }
    }

    /// The whole container was synced, sent at `mark`, answered under `verifier`: every
    /// object whose changes that covered and that engine acknowledged leaves the table.
    /// Objects with changes from an engine that is gone move to the lost list, for their
    /// own fsync to report.
    pub fn synced_all(&self, mark: u64, verifier: u64) {
        let mut t = self.objects();
        let Tables { pending, lost } = &mut *t;
        pending.retain(|&oid, p| {
            if p.verifier != verifier {
                if lost.len() >= self.max && !lost.contains_key(&oid) {
                    tracing::warn!(oid, "too many objects with lost changes to remember");
                } else {
                    lost.entry(oid).or_insert(p.verifier);
                }
                return false;
            }
            p.last > mark
        });
    }

    /// Objects tracked now, and those whose lost changes wait to be reported.
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        let t = self.objects();
        (t.pending.len(), t.lost.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fsync_under_the_verifier_of_the_changes_succeeds_and_forgets_them() {
        let u = Unstable::new(8);
        assert!(u.changed(7, 100));
        assert!(u.changed(7, 100));
        assert_eq!(u.len(), (1, 0));
        let mark = u.mark();
        assert_eq!(u.synced(7, mark, 100), Ok(()));
        assert_eq!(u.len(), (0, 0));
    }

    #[test]
    fn an_fsync_after_the_engine_restarted_reports_the_loss_once() {
        let u = Unstable::new(8);
        assert!(u.changed(7, 100));
        // The engine restarted: a later change keeps the oldest verifier.
        assert!(u.changed(7, 200));
        let mark = u.mark();
        assert_eq!(u.synced(7, mark, 200), Err(Lost { verifier: 100 }));
        assert_eq!(u.synced(7, u.mark(), 200), Ok(()), "reported once");
        // Another object, never changed under the old engine, syncs fine.
        assert!(u.changed(8, 200));
        assert_eq!(u.synced(8, u.mark(), 200), Ok(()));
    }

    #[test]
    fn a_change_after_the_fsync_was_sent_stays_tracked() {
        let u = Unstable::new(8);
        assert!(u.changed(7, 100));
        let mark = u.mark();
        assert!(u.changed(7, 100));
        assert_eq!(u.synced(7, mark, 100), Ok(()));
        assert_eq!(u.len(), (1, 0));
        // The engine restarts before the newer change is synced.
        assert_eq!(u.synced(7, u.mark(), 200), Err(Lost { verifier: 100 }));
    }

    #[test]
    fn a_full_table_refuses_new_objects_until_a_sync_of_everything() {
        let u = Unstable::new(2);
        assert!(u.changed(1, 100));
        assert!(u.changed(2, 200));
        assert!(
            u.changed(1, 200),
            "an object already tracked is always taken"
        );
        assert!(!u.changed(3, 200));
        u.synced_all(u.mark(), 200);
        // Object 1's first change was the old engine's: it waits for its fsync to report,
        // outside the table.
        assert_eq!(u.len(), (0, 1));
        assert!(u.changed(3, 200));
        assert!(u.changed(4, 200));
        assert_eq!(u.synced(1, u.mark(), 200), Err(Lost { verifier: 100 }));
        assert_eq!(u.synced(1, u.mark(), 200), Ok(()), "reported once");
    }

    #[test]
    fn objects_changed_under_a_dead_engine_never_fill_the_table() {
        let u = Unstable::new(2);
        assert!(u.changed(1, 100));
        assert!(u.changed(2, 100));
        // The engine restarted; the next change finds the table full and syncs everything.
        assert!(!u.changed(3, 200));
        u.synced_all(u.mark(), 200);
        assert_eq!(u.len(), (0, 2));
        assert!(u.changed(3, 200));
        assert!(u.changed(4, 200));
        // A change of an object with lost changes still reports them at its fsync.
        assert!(!u.changed(1, 200));
        u.synced_all(u.mark(), 200);
        assert!(u.changed(1, 200));
        assert_eq!(u.synced(1, u.mark(), 200), Err(Lost { verifier: 100 }));
        assert_eq!(u.synced(2, u.mark(), 200), Err(Lost { verifier: 100 }));
        assert_eq!(u.len(), (0, 0));
    }

    #[test]
    fn an_engine_that_does_not_say_is_never_suspected() {
        let u = Unstable::new(8);
        assert!(u.changed(7, 0));
        assert_eq!(u.len(), (0, 0));
        assert_eq!(u.synced(7, u.mark(), 0), Ok(()));
    }
}
