//! Cutting a removed file's chunk files after the removal is answered.
//!
//! Removing a file used to cut its chunk files inside the request: for each chunk, check
//! that no snapshot shares it, empty it and rename it into the spares. That was most of an
//! unlink's 120–240 µs in the engine. Now the removing transaction only counts the bytes the
//! chunk files hold as freed and notes the file in the metadata's `reclaim` table; this
//! module cuts them afterwards on a thread of the namespace's own. DAOS frees a punched
//! object's extents the same way, later, by aggregation.
//!
//! A file's chunk files are cut only once its removal is durable. Cutting earlier would let a
//! crash bring back a removed file whose removal was lost, with its data gone: fsync'd bytes
//! lost. Removals usually become durable with the next fsync of any file of the container;
//! when none comes within [`MAX_WAIT`], the thread commits durably itself (one forced commit
//! for every removal since, as a journaling file system commits every few seconds). The
//! table's rows are deleted once the cut is durable (the chunk directories synced); a crash in
//! between leaves rows whose chunk files are (partly) cut, and cutting them again at the next
//! open finds nothing more to do. A removal is queued before it lets writers in again, and
//! snapshots, which hold writers out, drain the queue first ([`Reclaimer::drain`]): they never
//! link the chunk files of removed files.
//!
//! Cutting holds the data gate (writes and metadata changes wait) only to take the chunk files
//! out of their names, a few files at a time; emptying them comes after.

use super::chunks::{ChunkStore, Quiesced};
use super::error::DfsResult;
use super::inode::Oid;
use super::meta::{MetaStore, Unreclaimed};
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest a removal waits for another commit to make it durable before the thread forces one.
const MAX_WAIT: Duration = if cfg!(test) {
    Duration::from_millis(50)
} else {
    Duration::from_secs(2)
};
/// Removals queued that make the thread force a durable commit at once, bounding the queue.
const FORCE_AT: usize = 1 << 16;
/// Files cut between two looks at the queue.
const BATCH: usize = 1024;
/// Files detached per hold of the data gate (a rename per chunk; emptying the spares comes
/// after): writes and metadata changes wait at most this many.
const SLICE: usize = 8;
/// An idle reclaim thread ends after this long; the next removal starts another.
const IDLE_EXIT: Duration = Duration::from_secs(2);
/// Wait before a failed batch is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// A removed file waiting to be cut.
#[derive(Debug, Clone, Copy)]
struct Queued {
    size: u64,
    /// The metadata commits counted once its removal committed: it is durable once that many
    /// are.
    commits: u64,
}

/// The reclaim thread of one namespace and its queue.
#[derive(Debug)]
pub(super) struct Reclaimer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    chunks: Arc<ChunkStore>,
    meta: Arc<MetaStore>,
    queue: Mutex<Queue>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Queue {
    files: BTreeMap<Oid, Queued>,
    /// When the oldest file in `files` was queued (or last waited for).
    since: Option<Instant>,
    running: bool,
    stopping: bool,
    /// Tests hold the thread off, to crash with removals not cut yet.
    #[cfg(test)]
    held: bool,
}

impl Reclaimer {
    /// A reclaimer for the namespace's stores, starting with the files a previous run left.
    pub fn new(
        chunks: Arc<ChunkStore>,
        meta: Arc<MetaStore>,
        leftovers: Vec<Unreclaimed>,
    ) -> Reclaimer {
        let reclaimer = Reclaimer {
            shared: Arc::new(Shared {
                chunks,
                meta,
                queue: Mutex::default(),
                wake: Condvar::new(),
            }),
            thread: Mutex::default(),
        };
        leftovers.into_iter().for_each(|f| reclaimer.queue(f));
        reclaimer
    }

    /// Queues a file whose removal committed; starts the thread if it is not running.
    pub fn queue(&self, file: Unreclaimed) {
        let commits = self.shared.meta.commits();
        let mut q = self.shared.lock();
        let queued = Queued {
            size: file.size,
            commits,
        };
        q.files.insert(file.oid, queued);
        q.since.get_or_insert_with(Instant::now);
        if q.running {
            // The thread looks again within MAX_WAIT anyway; only a full queue hurries it.
            if q.files.len() >= FORCE_AT {
                self.shared.wake.notify_one();
            }
            return;
        }
        q.running = true;
        drop(q);
        self.start();
    }

    fn start(&self) {
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("dfs-reclaim".into())
            .spawn(move || shared.run());
        match spawned {
            Ok(handle) => {
                let ended = self.thread.lock().expect("reclaim thread").replace(handle);
                // It left its loop before `running` went false: this waits for its return.
                ended.map(JoinHandle::join);
            }
            Err(e) => {
                // The rows stay in the table: the next open cuts them.
                tracing::error!("starting a reclaim thread: {e}");
                self.shared.lock().running = false;
            }
        }
    }

    /// Cuts every queued file now, under the caller's hold of the data gate (a snapshot, so
    /// it links none of their chunk files).
    pub fn drain(&self, held: &mut Quiesced<'_>) -> DfsResult<()> {
        let files: Vec<_> = self.shared.lock().files.iter().map(file).collect();
        if files.is_empty() {
            return Ok(());
        }
        self.shared.meta.commit_durably()?;
        for f in &files {
            held.cut(f.oid, 0, f.size)?;
        }
        held.sync_all()?;
        self.shared.forget(&files)
    }

    /// Holds the thread off (or lets it go), for tests.
    #[cfg(test)]
    pub fn hold(&self, held: bool) {
        self.shared.lock().held = held;
        self.shared.wake.notify_all();
    }

    /// Waits until every queued file is cut, for tests.
    #[cfg(test)]
    pub fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.shared.lock().files.is_empty() {
            assert!(Instant::now() < deadline, "removed files were never cut");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Reclaimer {
    /// Stops the thread between slices; what it did not cut stays in the table for the next
    /// open.
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
        if let Some(handle) = self.thread.lock().expect("reclaim thread").take() {
            let _ = handle.join();
        }
    }
}

/// Held by the thread while it runs: should it end by a panic, the next removal starts
/// another (an ordinary end says so itself, under the queue's lock).
struct Restartable<'a>(&'a Shared);

impl Drop for Restartable<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().running = false;
        }
    }
}

fn file((&oid, queued): (&Oid, &Queued)) -> Unreclaimed {
    Unreclaimed {
        oid,
        size: queued.size,
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) {
        let _restartable = Restartable(self);
        while let Some((batch, durable)) = self.next_batch() {
            if let Err(e) = self.reclaim(&batch, durable) {
                tracing::error!(files = batch.len(), "cutting removed files' data: {e}");
                let q = self.lock();
                drop(self.wake.wait_timeout_while(q, RETRY, |q| !q.stopping));
            }
        }
    }

    /// The next files to cut, and whether their removals are durable already (else a
    /// durable commit must come first); None when the thread should end (stopping, or idle
    /// for [`IDLE_EXIT`]).
    fn next_batch(&self) -> Option<(Vec<Unreclaimed>, bool)> {
        let mut q = self.lock();
        loop {
            if q.stopping {
                q.running = false;
                return None;
            }
            #[cfg(test)]
            if q.held {
                q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let durable = self.meta.durable_commits();
            let ready: Vec<_> = q
                .files
                .iter()
                .filter(|(_, f)| f.commits <= durable)
                .take(BATCH)
                .map(file)
                .collect();
            if !ready.is_empty() {
                return Some((ready, true));
            }
            let wait = match q.since.map(|since| since.elapsed()) {
                Some(age) if q.files.len() >= FORCE_AT || age >= MAX_WAIT => {
                    return Some((q.files.iter().take(BATCH).map(file).collect(), false));
                }
                Some(age) => MAX_WAIT - age,
                None => IDLE_EXIT,
            };
            let (next, waited) = self
                .wake
                .wait_timeout(q, wait)
                .unwrap_or_else(|p| p.into_inner());
            q = next;
            if waited.timed_out() && q.files.is_empty() && !q.stopping {
                q.running = false;
                return None;
            }
        }
    }

    /// Makes the batch's removals durable unless they are, cuts their chunk files a slice
    /// at a time, makes the renames durable, then forgets them (a row whose deletion outlived
    /// a crash that lost the renames would leave chunk files no one cuts).
    fn reclaim(&self, batch: &[Unreclaimed], durable: bool) -> DfsResult<()> {
        if !durable {
            self.meta.commit_durably()?;
        }
        for slice in batch.chunks(SLICE) {
            if self.lock().stopping {
                return Ok(());
            }
            let mut spares = Vec::new();
            let mut held = self.chunks.quiesce();
            for f in slice {
                spares.extend(held.detach_removed(f.oid, f.size)?);
            }
            drop(held);
            self.chunks.keep_spares(spares)?;
        }
        self.chunks.sync_changed_dirs()?;
        self.forget(batch)
    }

    /// Deletes the rows of cut files, and takes them off the queue.
    fn forget(&self, files: &[Unreclaimed]) -> DfsResult<()> {
        let oids: Vec<Oid> = files.iter().map(|f| f.oid).collect();
        self.meta.forget_reclaimed(&oids)?;
        let mut q = self.lock();
        for oid in &oids {
            q.files.remove(oid);
        }
        // Whatever is left waits for durability from now on.
        q.since = (!q.files.is_empty()).then(Instant::now);
        Ok(())
    }
}
