//! The shared device table: one file per software device that every process using the device
//! maps, as every process shares one HCA and its one key index space.
//!
//! Layout: a header (magic, version, geometry, key generator, disabled checks, id counters,
//! device counters, context slots) followed by fixed-size entries indexed by the 24-bit key
//! index. Every field is an atomic, because other processes read and write the same memory.
//! An entry is changed under its own seqlock word (an odd value is held by one writer, taken by
//! CAS, so writers in different processes exclude each other) and read lock-free by any
//! process's responder, which retries when it sees a write in progress.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use memmap2::{MmapOptions, MmapRaw};

use crate::checks::{KeyedObject, ObjectKind, ObjectState};
use crate::error::{FabricError, Result};
use crate::keys::{KeyGen, MAX_TABLE_ENTRIES, make_key};
use crate::{Access, DeviceCounters, NicChecks};

const MAGIC: u64 = u64::from_le_bytes(*b"DPUFSdev");
const VERSION: u32 = 2;
/// Context slots, i.e. device opens alive at once on one node.
pub(crate) const MAX_CONTEXTS: usize = 1024;
/// Entries start at this offset, past the header.
const ENTRIES_OFFSET: usize = 8192;
/// Spins before a reader gives up on an entry that stays locked: a writer that died while
/// holding the lock must not hang every responder; the access is refused instead.
const READ_SPIN_LIMIT: u32 = 1 << 20;

/// Device counters kept in the header, shared by every process on the device.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    RemoteAccessErrors = 0,
    InvalidRequests = 1,
    BindErrors = 2,
    QpErrors = 3,
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    entries: AtomicU32,
    key_gen: AtomicU32,
    disabled_checks: AtomicU32,
    next_pd: AtomicU32,
    next_qp: AtomicU32,
    /// Sequential allocation cursor (index, before reduction modulo the table size).
    next_index: AtomicU32,
    /// Device-wide key byte counter of the mlx5-like generator.
    key_counter: AtomicU32,
    next_mem_id: AtomicU64,
    /// Random identity of this device, so two contexts can tell they share it.
    nonce: AtomicU64,
    counters: [AtomicU64; 4],
    /// pid of the process holding each context slot (0: free).
    contexts: [AtomicU32; MAX_CONTEXTS],
}

const _: () = assert!(std::mem::size_of::<Header>() <= ENTRIES_OFFSET);

/// One key index. `owner` is the allocation claim (context id, 0 when unused); the other fields
/// are written only under `seq`.
#[repr(C)]
struct Entry {
    seq: AtomicU32,
    owner: AtomicU32,
    /// kind (bits 0..8) | state (8..16) | access (16..32).
    word: AtomicU32,
    key: AtomicU32,
    pd: AtomicU32,
    qp: AtomicU32,
    mr_index: AtomicU32,
    /// MRs: number of windows bound over the region.
    bound: AtomicU32,
    base: AtomicU64,
    len: AtomicU64,
    mem_offset: AtomicU64,
    mem_id: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 64);

/// A plain copy of an entry's fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fields {
    /// `None`: the index holds no object.
    pub kind: Option<ObjectKind>,
    pub state: Option<ObjectState>,
    pub access: Access,
    pub key: u32,
    pub pd: u32,
    pub qp: u32,
    pub mr_index: u32,
    pub bound: u32,
    pub base: u64,
    pub len: u64,
    pub mem_offset: u64,
    pub mem_id: u64,
}

impl Fields {
    /// The object as the responder checks see it.
    pub fn object(&self) -> Option<KeyedObject> {
        Some(KeyedObject {
            kind: self.kind?,
            state: self.state.unwrap_or(ObjectState::Invalid),
            key: self.key,
            pd: self.pd,
            access: self.access,
            bound_qp: self.qp,
            base: self.base,
            len: self.len,
            mem_offset: self.mem_offset,
            mem_id: self.mem_id,
        })
    }

    fn word(&self) -> u32 {
        let kind = match self.kind {
            None => 0,
            Some(ObjectKind::Mr) => 1,
            Some(ObjectKind::Mw) => 2,
        };
        let state = match self.state {
            None => 0,
            Some(ObjectState::Free) => 1,
            Some(ObjectState::Valid) => 2,
            Some(ObjectState::Invalid) => 3,
        };
        kind | (state << 8) | (self.access.bits() << 16)
    }

    fn set_word(&mut self, word: u32) {
        self.kind = match word & 0xff {
            1 => Some(ObjectKind::Mr),
            2 => Some(ObjectKind::Mw),
            _ => None,
        };
        self.state = match (word >> 8) & 0xff {
            1 => Some(ObjectState::Free),
            2 => Some(ObjectState::Valid),
            3 => Some(ObjectState::Invalid),
            _ => None,
        };
        self.access = Access::from_bits_truncate(word >> 16);
    }
}

impl Entry {
    fn load(&self) -> Fields {
        let mut f = Fields {
            key: self.key.load(Ordering::Relaxed),
            pd: self.pd.load(Ordering::Relaxed),
            qp: self.qp.load(Ordering::Relaxed),
            mr_index: self.mr_index.load(Ordering::Relaxed),
            bound: self.bound.load(Ordering::Relaxed),
            base: self.base.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
            mem_offset: self.mem_offset.load(Ordering::Relaxed),
            mem_id: self.mem_id.load(Ordering::Relaxed),
            ..Fields::default()
        };
        f.set_word(self.word.load(Ordering::Relaxed));
        f
    }

    fn store(&self, f: &Fields) {
        self.word.store(f.word(), Ordering::Relaxed);
        self.key.store(f.key, Ordering::Relaxed);
        self.pd.store(f.pd, Ordering::Relaxed);
        self.qp.store(f.qp, Ordering::Relaxed);
        self.mr_index.store(f.mr_index, Ordering::Relaxed);
        self.bound.store(f.bound, Ordering::Relaxed);
        self.base.store(f.base, Ordering::Relaxed);
        self.len.store(f.len, Ordering::Relaxed);
        self.mem_offset.store(f.mem_offset, Ordering::Relaxed);
        self.mem_id.store(f.mem_id, Ordering::Relaxed);
    }
}

/// What the opener asks for when it creates the device file; an existing file keeps its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    pub entries: u32,
    pub key_gen: KeyGen,
    pub disabled_checks: NicChecks,
}

/// A mapped device table.
#[derive(Debug)]
pub(crate) struct DeviceTable {
    map: MmapRaw,
    entries: u32,
}

impl DeviceTable {
    /// Opens (creating and initialising if needed) the device file at `path`.
    pub fn open(path: &Path, geometry: Geometry) -> Result<DeviceTable> {
        let fail = |reason: String| FabricError::Device {
            path: path.display().to_string(),
            reason,
        };
        if geometry.entries < 2 || geometry.entries > MAX_TABLE_ENTRIES {
            return Err(fail(format!(
                "table size {} outside 2..={MAX_TABLE_ENTRIES}",
                geometry.entries
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| FabricError::io(format!("open device {}", path.display()), e))?;
        // The first opener initialises the file; the lock keeps a concurrent opener from
        // mapping a half-written header.
        let _lock = FileLock::exclusive(&file)?;
        let size = file
            .metadata()
            .map_err(|e| FabricError::io("stat device", e))?
            .len();
        let fresh = size == 0;
        if fresh {
            let total = ENTRIES_OFFSET as u64 + u64::from(geometry.entries) * 64;
            file.set_len(total)
                .map_err(|e| FabricError::io("size device", e))?;
        }
        let map = MmapOptions::new()
            .map_raw(&file)
            .map_err(|e| FabricError::io("map device", e))?;
        if map.len() < ENTRIES_OFFSET {
            return Err(fail("file too short".into()));
        }
        let mut table = DeviceTable { map, entries: 0 };
        let h = table.header();
        if fresh {
            h.version.store(VERSION, Ordering::Relaxed);
            h.entries.store(geometry.entries, Ordering::Relaxed);
            h.key_gen.store(geometry.key_gen.code(), Ordering::Relaxed);
            h.disabled_checks
                .store(geometry.disabled_checks.bits(), Ordering::Relaxed);
            h.next_pd.store(1, Ordering::Relaxed);
            h.next_qp.store(1, Ordering::Relaxed);
            h.next_index.store(1, Ordering::Relaxed);
            h.next_mem_id.store(1, Ordering::Relaxed);
            h.nonce.store(rand::random::<u64>() | 1, Ordering::Relaxed);
            h.magic.store(MAGIC, Ordering::Release);
        }
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(fail("not a dpufs software device".into()));
        }
        if h.version.load(Ordering::Relaxed) != VERSION {
            return Err(fail(format!(
                "device version {} (expected {VERSION})",
                h.version.load(Ordering::Relaxed)
            )));
        }
        let entries = h.entries.load(Ordering::Relaxed);
        if KeyGen::from_code(h.key_gen.load(Ordering::Relaxed)).is_none()
            || table.map.len() < ENTRIES_OFFSET + entries as usize * 64
        {
            return Err(fail("corrupt header".into()));
        }
        table.entries = entries;
        Ok(table)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least ENTRIES_OFFSET bytes (checked in open), page-aligned,
        // and Header (atomics only, size asserted above) fits; atomics make concurrent access
        // from other processes sound.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    fn entry(&self, index: u32) -> Option<&Entry> {
        if index == 0 || index >= self.entries {
            return None;
        }
        // SAFETY: index < entries, and open checked that the mapping holds `entries` 64-byte
        // entries after the header; Entry has only atomic fields and 8-byte alignment, which the
        // page-aligned mapping plus 64-byte stride provide.
        Some(unsafe {
            &*(self.map.as_ptr().add(ENTRIES_OFFSET + index as usize * 64) as *const Entry)
        })
    }

    /// Key generator recorded in the header.
    pub fn key_gen(&self) -> KeyGen {
        KeyGen::from_code(self.header().key_gen.load(Ordering::Relaxed)).unwrap_or_default()
    }

    /// Checks disabled for the whole device (set when the device was created).
    pub fn disabled_checks(&self) -> NicChecks {
        NicChecks::from_bits_truncate(self.header().disabled_checks.load(Ordering::Relaxed))
    }

    /// New device-wide PD id.
    pub fn new_pd_id(&self) -> u32 {
        self.header().next_pd.fetch_add(1, Ordering::Relaxed)
    }

    /// New device-wide QP id (also the QP number; sequential, as ReDMArk V5 observes).
    pub fn new_qp_id(&self) -> u32 {
        self.header().next_qp.fetch_add(1, Ordering::Relaxed)
    }

    /// This device's random identity (never 0).
    pub fn nonce(&self) -> u64 {
        self.header().nonce.load(Ordering::Relaxed)
    }

    /// New id for registered memory; never reused, so a stale id finds nothing.
    pub fn new_mem_id(&self) -> u64 {
        self.header().next_mem_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Adds one to a device counter.
    pub fn bump(&self, counter: Counter) {
        self.header().counters[counter as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Snapshot of the device counters.
    pub fn counters(&self) -> DeviceCounters {
        let c = |k: Counter| self.header().counters[k as usize].load(Ordering::Relaxed);
        DeviceCounters {
            remote_access_errors: c(Counter::RemoteAccessErrors),
            invalid_requests: c(Counter::InvalidRequests),
            bind_errors: c(Counter::BindErrors),
            qp_errors: c(Counter::QpErrors),
        }
    }

    /// Takes a free context slot for process `pid`; the context id is the slot number plus one.
    pub fn register_context(&self, pid: u32) -> Result<u32> {
        for (slot, cell) in self.header().contexts.iter().enumerate() {
            if cell
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(slot as u32 + 1);
            }
        }
        Err(FabricError::InvalidArgument(format!(
            "all {MAX_CONTEXTS} device contexts are in use"
        )))
    }

    /// Releases a context slot taken by [`DeviceTable::register_context`].
    pub fn release_context(&self, ctx: u32) {
        if let Some(cell) = self.header().contexts.get(ctx as usize - 1) {
            cell.store(0, Ordering::Release);
        }
    }

    /// Contexts whose process is gone: `(context id, pid)`.
    pub fn dead_contexts(&self, alive: impl Fn(u32) -> bool) -> Vec<(u32, u32)> {
        self.header()
            .contexts
            .iter()
            .enumerate()
            .filter_map(|(slot, cell)| {
                let pid = cell.load(Ordering::Acquire);
                (pid != 0 && !alive(pid)).then_some((slot as u32 + 1, pid))
            })
            .collect()
    }

    /// Claims the context slot of a dead process for reaping, so two openers don't both reap it.
    pub fn claim_dead_context(&self, ctx: u32, pid: u32) -> bool {
        self.header().contexts[ctx as usize - 1]
            .compare_exchange(pid, u32::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Indexes owned by context `ctx`.
    pub fn owned_by(&self, ctx: u32) -> Vec<u32> {
        (1..self.entries)
            .filter(|&i| {
                self.entry(i)
                    .is_some_and(|e| e.owner.load(Ordering::Acquire) == ctx)
            })
            .collect()
    }

    /// Claims a free index for context `ctx` and gives it its first key. The entry is left
    /// without an object; the caller fills it with [`DeviceTable::update`].
    pub fn alloc(&self, ctx: u32, key_gen: KeyGen) -> Result<(u32, u32)> {
        let h = self.header();
        let usable = self.entries - 1;
        let claim = |index: u32| {
            self.entry(index).is_some_and(|e| {
                e.owner
                    .compare_exchange(0, ctx, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
        };
        let index = match key_gen {
            KeyGen::Mlx5Like | KeyGen::BnxtLike => (0..usable).find_map(|_| {
                let i = h.next_index.fetch_add(1, Ordering::Relaxed) % usable + 1;
                claim(i).then_some(i)
            }),
            KeyGen::Random => (0..64)
                .map(|_| rand::random_range(1..self.entries))
                .find(|&i| claim(i))
                .or_else(|| (1..self.entries).find(|&i| claim(i))),
        }
        .ok_or(FabricError::TableFull)?;
        let byte = match key_gen {
            KeyGen::Mlx5Like => h.key_counter.fetch_add(1, Ordering::Relaxed) as u8,
            KeyGen::BnxtLike => 0,
            KeyGen::Random => rand::random(),
        };
        let key = make_key(index, byte);
        self.update(index, |f| {
            *f = Fields {
                key,
                ..Fields::default()
            }
        });
        Ok((index, key))
    }

    /// Consistent copy of an entry's fields; `None` for an index outside the table or an entry
    /// that stays locked (its writer died).
    pub fn read(&self, index: u32) -> Option<Fields> {
        let e = self.entry(index)?;
        for _ in 0..READ_SPIN_LIMIT {
            let s1 = e.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let f = e.load();
            fence(Ordering::Acquire);
            if e.seq.load(Ordering::Relaxed) == s1 {
                return Some(f);
            }
        }
        None
    }

    /// The object at `index`, if any.
    pub fn object(&self, index: u32) -> Option<KeyedObject> {
        self.read(index)?.object()
    }

    /// Changes an entry under its seqlock: `change` sees the current fields and edits them in
    /// place; its result is returned. Writers are mutually exclusive (the odd sequence value is
    /// taken by CAS), so `change` is an atomic read-modify-write.
    pub fn update<R>(&self, index: u32, change: impl FnOnce(&mut Fields) -> R) -> Option<R> {
        let e = self.entry(index)?;
        let mut spins = 0u32;
        let s = loop {
            let s = e.seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && e.seq
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break s;
            }
            spins += 1;
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        };
        fence(Ordering::Release);
        let mut f = e.load();
        let before = f;
        let r = change(&mut f);
        if f != before {
            e.store(&f);
        }
        e.seq.store(s.wrapping_add(2), Ordering::Release);
        Some(r)
    }

    /// Empties an entry and gives its index back for allocation.
    pub fn free(&self, index: u32) {
        self.update(index, |f| *f = Fields::default());
        if let Some(e) = self.entry(index) {
            e.owner.store(0, Ordering::Release);
        }
    }

    /// Unlocks an entry whose writer died holding its seqlock (reaping a dead context).
    pub fn force_unlock(&self, index: u32) {
        if let Some(e) = self.entry(index) {
            let s = e.seq.load(Ordering::Relaxed);
            if s & 1 == 1 {
                let _ = e.seq.compare_exchange(
                    s,
                    s.wrapping_add(1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
        }
    }
}

/// `flock(LOCK_EX)` held until dropped.
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    fn exclusive(file: &'a File) -> Result<FileLock<'a>> {
        loop {
            // SAFETY: flock on a valid, open file descriptor.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(FileLock(file));
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(FabricError::io("lock device", err));
            }
        }
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocking a lock this process holds on a valid descriptor.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dir: &Path, key_gen: KeyGen) -> DeviceTable {
        DeviceTable::open(
            &dir.join("dev"),
            Geometry {
                entries: 64,
                key_gen,
                disabled_checks: NicChecks::NONE,
            },
        )
        .unwrap()
    }

    #[test]
    fn mlx5_like_keys_are_sequential() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path(), KeyGen::Mlx5Like);
        let (_, a) = t.alloc(1, KeyGen::Mlx5Like).unwrap();
        let (_, b) = t.alloc(1, KeyGen::Mlx5Like).unwrap();
        assert_eq!(b - a, 0x101);
    }

    #[test]
    fn two_mappings_share_entries_and_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let t1 = table(dir.path(), KeyGen::Random);
        let t2 = table(dir.path(), KeyGen::Mlx5Like);
        // The second opener adopts the creator's generator.
        assert_eq!(t2.key_gen(), KeyGen::Random);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20 {
            let (i, _) = t1.alloc(1, KeyGen::Random).unwrap();
            let (j, _) = t2.alloc(2, KeyGen::Random).unwrap();
            assert!(seen.insert(i) && seen.insert(j));
        }
        let (i, key) = t1.alloc(1, KeyGen::Random).unwrap();
        t1.update(i, |f| {
            f.kind = Some(ObjectKind::Mr);
            f.state = Some(ObjectState::Valid);
            f.len = 4096;
        });
        let seen_by_other = t2.object(i).unwrap();
        assert_eq!(seen_by_other.key, key);
        assert_eq!(seen_by_other.len, 4096);
        t2.free(i);
        assert_eq!(t1.object(i), None);
    }

    #[test]
    fn table_fills_up() {
        let dir = tempfile::tempdir().unwrap();
        let t = table(dir.path(), KeyGen::BnxtLike);
        for _ in 0..63 {
            t.alloc(1, KeyGen::BnxtLike).unwrap();
        }
        assert!(matches!(
            t.alloc(1, KeyGen::BnxtLike),
            Err(FabricError::TableFull)
        ));
        assert_eq!(t.owned_by(1).len(), 63);
    }
}
