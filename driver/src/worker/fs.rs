// Over 600 lines: the one FileSystem impl, every FUSE operation next to the others it mirrors.
//! The volume's file system: fuse-backend-rs's [`FileSystem`] over a [`Dfs`].
//!
//! Transport-agnostic: the same [`DfsFs`] serves `/dev/fuse` (host mode) and virtio-fs (DPU
//! mode, `super::vhost_user`) through fuse-backend-rs's `Server`. Nothing here depends on state a successor
//! process could not rebuild:
//! - **inode = oid.** FUSE's root nodeid 1 is [`ROOT_OID`]; every other nodeid is the object
//!   id the backend gave, which is stable and never reused while a kernel may hold it. The
//!   generation is always 0.
//! - **file handles are stateless**: every open answers fh 0, and every call names the object
//!   by its nodeid, so a new worker serves a kernel's open files without knowing them.
//! - **readdir offsets are the backend's cookies**, which stay valid across changes and
//!   across worker restarts.
//! - **lookup counts** are kept only when the backend asks for forgets (LocalDfs holds a
//!   descriptor per object); a successor that starts with none just releases those objects
//!   early, which costs that backend a new lookup, never data.
//!
//! Configuration (TTLs, data cache, writeback) comes from the command line, not from the INIT
//! handshake, so a worker that takes over an initialised connection behaves the same.

use super::backend::ForgetHook;
use super::dfs_io::DfsIo;
use super::entry_cache::EntryCache;
use super::known_dirs::KnownDirs;
use super::stats::{Op, Stats};
use super::throttle::Throttle;
use dpufs_daos::dfs::{
    Attr, Dfs, DfsError, Errno, Oid, ROOT_OID, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, SetAttr, TimeSet,
    Timespec, XattrMode, mode_without_set_id,
};
use dpufs_node_api::control::FsUsage;
use dpufs_node_api::handover::{HandoverError, SESSION_VERSION, SessionConfig, SessionRecord};
use fuse_backend_rs::abi::fuse_abi::{
    CreateIn, FOPEN_IN_KILL_SUIDGID, WRITE_KILL_PRIV, stat64, statvfs64,
};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, FsOptions, GetxattrReply, ListxattrReply, OpenOptions,
    SetattrValid, ZeroCopyReader, ZeroCopyWriter,
};
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A listing's entry as FUSE sends it.
fn dirent(e: &dpufs_daos::dfs::DirEntry) -> DirEntry<'_> {
    DirEntry {
        ino: e.oid,
        offset: e.cookie,
        type_: e.kind >> 12,
        name: e.name.as_bytes(),
    }
}

/// Keeps what a listing page of `dir` after `cookie` says: each entry's attributes where the
/// backend gave them, and where the listing ends.
fn keep_page(
    kept: &EntryCache,
    ticket: super::entry_cache::Ticket,
    dir: Oid,
    cookie: u64,
    page: &dpufs_daos::dfs::DirPage,
) {
    for e in &page.entries {
        if let Some(a) = &e.attr {
            kept.keep(ticket, dir, &e.name, a);
        }
    }
    if page.end {
        let last = page.entries.last().map_or(cookie, |e| e.cookie);
        kept.keep_end(ticket, dir, last);
    }
}

/// File capabilities (`security.capability`) are not supported: the kernel asks for this
/// attribute before the first write to a file (to drop it; HANDLE_KILLPRIV_V2 makes that once
/// per inode), and answering "none" here instead of asking the backend saves a round trip to
/// the engine. Setting it fails with EOPNOTSUPP, as on file systems without file
/// capabilities.
const FILE_CAPABILITIES: &CStr = c"security.capability";

/// `FOPEN_NOFLUSH` (kernel 5.16+): close(2) sends no FLUSH (ignored by the kernel with the
/// writeback cache, where FLUSH writes dirty pages back). The worker buffers nothing, so a
/// FLUSH would only cost a round trip, and a close that needs no server cannot hang while
/// workers change (exec closes inherited descriptors too).
const FOPEN_NOFLUSH: u32 = 1 << 5;
/// `FOPEN_PARALLEL_DIRECT_WRITES` (kernel 6.2+): direct writes to one file that stay inside
/// its size may run in parallel. fuse-backend-rs 0.14 has no name for either flag.
const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

/// Who may change the volume's data (part of the handover's session record).
pub use dpufs_node_api::handover::AccessMode;

/// Caching and semantics of one mount.
#[derive(Clone, Debug)]
pub struct FsConfig {
    /// How long the kernel may trust attributes (stat) without asking.
    pub attr_ttl: Duration,
    /// How long the kernel may trust a name → inode binding without asking.
    pub entry_ttl: Duration,
    /// How long the kernel may remember that a name does not exist (0: never).
    pub negative_ttl: Duration,
    /// Use the page cache for file data (`false`: every read and write goes to the worker).
    pub data_cache: bool,
    /// Who writes.
    pub access: AccessMode,
    /// Buffer writes in the kernel (FUSE writeback cache); only with [`AccessMode::SingleWriter`].
    /// Write errors (ENOSPC, EIO) then surface at fsync or close, not at write.
    pub writeback_cache: bool,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig::for_access(AccessMode::MultiWriter)
    }
}

/// How long a single-writer mount lets the kernel trust names, attributes and absent names.
/// Every change then goes through this kernel, which drops what its own requests change, so
/// longer only saves more round trips; past a minute the lookups saved are few (one per
/// name and minute), while an engine crash that took back unsynced creates leaves the kernel
/// showing them (their requests fail ESTALE) no longer than this.
pub const SINGLE_WRITER_TTL: Duration = Duration::from_secs(60);

impl FsConfig {
    /// The caching a mount written as `access` says gets by default. Several writers: names
    /// and attributes for 1 s and no absent names (close-to-open consistency, another node's
    /// changes seen within a second). One writer: [`SINGLE_WRITER_TTL`] for all three.
    pub fn for_access(access: AccessMode) -> FsConfig {
        let (ttl, negative_ttl) = match access {
            AccessMode::SingleWriter => (SINGLE_WRITER_TTL, SINGLE_WRITER_TTL),
            AccessMode::MultiWriter | AccessMode::ReadOnly => {
                (Duration::from_secs(1), Duration::ZERO)
            }
        };
        FsConfig {
            attr_ttl: ttl,
            entry_ttl: ttl,
            negative_ttl,
            data_cache: true,
            access,
            writeback_cache: false,
        }
    }
}

impl FsConfig {
    /// Whether the worker answers lookups in the directories it made itself: only where it
    /// is the only writer, and only for as long as the kernel trusts absent names.
    fn knows_new_dirs(&self) -> bool {
        self.access == AccessMode::SingleWriter && !self.negative_ttl.is_zero()
    }

    /// How long the worker keeps the names, attributes and listing ends the backend gave
    /// (see [`EntryCache`]): only where it is the only writer, and no longer than the kernel
    /// may trust them.
    fn keeps_entries_for(&self) -> Option<Duration> {
        let keep = self.entry_ttl.min(self.attr_ttl);
        (self.access == AccessMode::SingleWriter && !keep.is_zero()).then_some(keep)
    }

    /// Rejects combinations that would break coherence.
    pub fn validate(&self) -> Result<(), String> {
        if self.writeback_cache && self.access != AccessMode::SingleWriter {
            return Err(
                "the writeback cache needs --access single-writer (one writing node)".to_string(),
            );
        }
        if self.writeback_cache && !self.data_cache {
            return Err("the writeback cache needs the data cache".to_string());
        }
        Ok(())
    }

    fn read_only(&self) -> bool {
        self.access == AccessMode::ReadOnly
    }

    /// The settings a successor must be told about (the handover's session record).
    pub fn session_config(&self) -> SessionConfig {
        SessionConfig {
            attr_ttl_secs: self.attr_ttl.as_secs_f64(),
            entry_ttl_secs: self.entry_ttl.as_secs_f64(),
            negative_ttl_secs: self.negative_ttl.as_secs_f64(),
            data_cache: self.data_cache,
            access: self.access,
            writeback_cache: self.writeback_cache,
        }
    }

    /// The INIT flags this configuration asks for.
    pub fn wanted_options(&self) -> FsOptions {
        let mut want = FsOptions::ASYNC_READ
            | FsOptions::BIG_WRITES
            | FsOptions::MAX_PAGES
            | FsOptions::ASYNC_DIO
            | FsOptions::PARALLEL_DIROPS
            | FsOptions::ATOMIC_O_TRUNC
            | FsOptions::CACHE_SYMLINKS
            | FsOptions::HANDLE_KILLPRIV_V2
            // Listings carry attributes once the kernel sees them used (ls -l, find -type
            // on file systems without d_type): no lookup per entry.
            | FsOptions::DO_READDIRPLUS
            | FsOptions::READDIRPLUS_AUTO;
        if self.data_cache && self.access == AccessMode::MultiWriter {
            want |= FsOptions::AUTO_INVAL_DATA;
        }
        if self.writeback_cache {
            want |= FsOptions::WRITEBACK_CACHE;
        }
        want
    }

    /// FOPEN_* flags of every open file.
    fn open_options(&self) -> OpenOptions {
        let mut bits = FOPEN_PARALLEL_DIRECT_WRITES | FOPEN_NOFLUSH;
        if !self.data_cache {
            bits |= OpenOptions::DIRECT_IO.bits();
        } else if self.access != AccessMode::MultiWriter {
            bits |= OpenOptions::KEEP_CACHE.bits();
        }
        // SAFETY: `from_bits_unchecked` is unsafe only because it accepts bits the type has
        // no name for; both extra bits are valid kernel flags, sent as they are.
        unsafe { OpenOptions::from_bits_unchecked(bits) }
    }
}

/// What a successful INIT negotiated, for the state directory (a successor that takes the
/// connection over does not see INIT again).
#[derive(Debug, Default)]
pub struct Negotiated {
    /// Flags the kernel offered.
    pub offered: AtomicU64,
    /// Flags in use (offered and wanted).
    pub enabled: AtomicU64,
    /// INIT has been answered.
    pub done: std::sync::atomic::AtomicBool,
}

/// What the worker remembers of an object the kernel holds.
#[derive(Clone, Copy)]
struct Held {
    /// The kernel's lookup count.
    count: u64,
    /// File type bits when it was last handed out (to detect a backend reusing an oid).
    kind: u32,
}

/// Per-object lookup counts, for backends that want to hear about forgets.
struct LookupCounts {
    shards: Vec<Mutex<HashMap<Oid, Held>>>,
    forget: ForgetHook,
}

impl LookupCounts {
    const SHARDS: usize = 64;

    fn shard(&self, oid: Oid) -> std::sync::MutexGuard<'_, HashMap<Oid, Held>> {
        let i = (oid.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % Self::SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether `op` is a metadata request that counts against the volume's `maxIops` (admitted
/// in [`DfsFs::op`]): every operation that may ask the backend something. Reads and writes
/// are admitted with their bytes where they start; the others here never reach the backend.
/// Without this a tenant held to its IOPS could still flood the engine with creates, lookups
/// or listings.
fn counts_as_metadata_request(op: Op) -> bool {
    !matches!(
        op,
        Op::Read
            | Op::Write
            | Op::Init
            | Op::Destroy
            | Op::Forget
            | Op::Flush
            | Op::Link
            | Op::Release
            | Op::Releasedir
    )
}

/// The file system served to the kernel.
pub struct DfsFs {
    dfs: Arc<dyn Dfs>,
    cfg: FsConfig,
    stats: Arc<Stats>,
    counts: Option<LookupCounts>,
    negotiated: Arc<Negotiated>,
    session_record: Option<PathBuf>,
    throttle: Arc<Throttle>,
    /// On a single-writer volume, the names of the directories this worker made.
    known: Option<KnownDirs>,
    /// On a single-writer volume, what the backend answered, kept for the kernel's timeouts.
    kept: Option<EntryCache>,
}

impl std::fmt::Debug for DfsFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DfsFs")
            .field("cfg", &self.cfg)
            .field("lookup_counts", &self.counts.is_some())
            .finish_non_exhaustive()
    }
}

pub(super) fn err(e: DfsError) -> io::Error {
    tracing::debug!(errno = e.errno.0, "{}", e.detail);
    io::Error::from_raw_os_error(e.errno.0)
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// A name from the kernel as the `&str` the Dfs API takes. DFS names are bytes, the API's are
/// UTF-8: other names are refused with EILSEQ.
fn name_str(name: &CStr) -> io::Result<&str> {
    name.to_str().map_err(|_| errno(libc::EILSEQ))
}

/// stat(2) fields of an object. The kernel fills st_dev; st_blksize is left to the mount's
/// block size (4 KiB).
pub fn to_stat(a: &Attr) -> stat64 {
    // SAFETY: stat64 is plain data; all-zero is a valid value.
    let mut st: stat64 = unsafe { std::mem::zeroed() };
    st.st_ino = a.oid;
    st.st_mode = a.mode;
    st.st_nlink = a.nlink.max(1) as _;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_size = a.size as i64;
    st.st_blocks = a.blocks as i64;
    st.st_atime = a.atime.secs;
    st.st_atime_nsec = a.atime.nanos as i64;
    st.st_mtime = a.mtime.secs;
    st.st_mtime_nsec = a.mtime.nanos as i64;
    st.st_ctime = a.ctime.secs;
    st.st_ctime_nsec = a.ctime.nanos as i64;
    st
}

impl DfsFs {
    /// A file system over `dfs`. `forget`: see [`super::backend::Backend::forget`].
    /// `session_record`: where to write what INIT negotiated. `throttle`: the QoS caps
    /// reads and writes wait for.
    pub fn new(
        dfs: Arc<dyn Dfs>,
        forget: Option<ForgetHook>,
        cfg: FsConfig,
        stats: Arc<Stats>,
        session_record: Option<PathBuf>,
        throttle: Arc<Throttle>,
    ) -> DfsFs {
        DfsFs {
            dfs,
            stats,
            counts: forget.map(|forget| LookupCounts {
                shards: (0..LookupCounts::SHARDS)
                    .map(|_| Mutex::new(HashMap::new()))
                    .collect(),
                forget,
            }),
            negotiated: Arc::new(Negotiated::default()),
            session_record,
            throttle,
            known: cfg
                .knows_new_dirs()
                .then(|| KnownDirs::new(cfg.negative_ttl)),
            kept: cfg.keeps_entries_for().map(EntryCache::new),
            cfg,
        }
    }

    /// The volume's usage, as statfs(2) of the volume reports it (also what the control
    /// socket's `statfs` answers).
    pub fn usage(&self) -> io::Result<FsUsage> {
        let s = self.dfs.statfs().map_err(err)?;
        const BSIZE: u64 = 4096;
        // DFS has no inode table: report plenty of free inodes.
        const FREE_FILES: u64 = 1 << 32;
        Ok(FsUsage {
            block_size: BSIZE,
            blocks: s.total_bytes / BSIZE,
            blocks_free: s.free_bytes / BSIZE,
            blocks_available: s.free_bytes / BSIZE,
            files: s.files + FREE_FILES,
            files_free: FREE_FILES,
        })
    }

    /// What INIT negotiated (shared with the control socket).
    pub fn negotiated(&self) -> Arc<Negotiated> {
        self.negotiated.clone()
    }

    /// Runs one operation with its stats.
    fn op<T>(&self, op: Op, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        if counts_as_metadata_request(op) {
            // Before the operation's clock starts, as for reads and writes.
            self.throttle.admit(0);
        }
        let start: Instant = self.stats.begin();
        let r = f();
        self.stats
            .end(op, start, r.as_ref().err().and_then(|e| e.raw_os_error()));
        r
    }

    fn entry(&self, a: &Attr) -> Entry {
        self.entry_aged(a, Duration::ZERO)
    }

    /// The entry of an answer the backend gave `age` ago: the timeouts less its age.
    fn entry_aged(&self, a: &Attr, age: Duration) -> Entry {
        Entry {
            inode: a.oid,
            generation: 0,
            attr: to_stat(a),
            attr_flags: 0,
            attr_timeout: self.cfg.attr_ttl.saturating_sub(age),
            entry_timeout: self.cfg.entry_ttl.saturating_sub(age),
        }
    }

    /// Lists `dir` after `cookie`, `max` entries a request (with attributes if `plus`),
    /// handing each to `emit` until it says the reply is full (`false`).
    fn list(
        &self,
        dir: Oid,
        mut cookie: u64,
        (max, plus): (usize, bool),
        emit: &mut dyn FnMut(&dpufs_daos::dfs::DirEntry) -> io::Result<bool>,
    ) -> io::Result<()> {
        let max = max.clamp(1, 1024);
        loop {
            if self.kept.as_ref().is_some_and(|k| k.ends_at(dir, cookie)) {
                self.stats.cached_answer();
                return Ok(());
            }
            let ticket = self.kept.as_ref().map(EntryCache::ticket);
            let page = if plus {
                self.dfs.readdir_plus(dir, cookie, max)
            } else {
                self.dfs.readdir(dir, cookie, max)
            }
            .map_err(err)?;
            if let (Some(kept), Some(ticket)) = (&self.kept, ticket) {
                keep_page(kept, ticket, dir, cookie, &page);
            }
            for e in &page.entries {
                if !emit(e)? {
                    // The kernel resumes after the last entry sent.
                    return Ok(());
                }
                cookie = e.cookie;
            }
            if page.end || page.entries.is_empty() {
                return Ok(());
            }
        }
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.cfg.read_only() {
            Err(errno(libc::EROFS))
        } else {
            Ok(())
        }
    }

    /// Counts one more kernel reference to a new or looked-up object.
    ///
    /// When the count goes from zero to one, the object is checked to still be held by the
    /// backend: a forget of the same object may have released it between the backend's
    /// lookup and now (ESTALE then means: look it up again).
    ///
    /// An object of another type under an oid the kernel still holds means the backend
    /// reused the oid too early (a broken backend contract the kernel answers with EIO on
    /// the old inode): logged, since nothing here can repair it.
    fn remember(&self, attr: &Attr) -> Result<(), DfsError> {
        let Some(counts) = &self.counts else {
            return Ok(());
        };
        let oid = attr.oid;
        if oid == ROOT_OID {
            return Ok(());
        }
        let mut shard = counts.shard(oid);
        let held = shard.get(&oid).copied();
        match held {
            None => {
                self.dfs.holds(oid)?;
            }
            Some(h) if h.kind != attr.kind() => tracing::error!(
                "the backend reused object id {oid:#x} while the kernel holds it \
                 (type {:o}, now {:o})",
                h.kind,
                attr.kind()
            ),
            Some(_) => {}
        }
        shard.insert(
            oid,
            Held {
                count: held.map_or(0, |h| h.count) + 1,
                kind: attr.kind(),
            },
        );
        Ok(())
    }

    /// A lookup that also counts the kernel's new reference.
    fn lookup_attr(&self, parent: Oid, name: &str) -> Result<Attr, DfsError> {
        let mut last = None;
        for _ in 0..3 {
            let attr = self.dfs.lookup(parent, name)?;
            match self.remember(&attr) {
                Ok(()) => return Ok(attr),
                Err(e) if e.errno == Errno::STALE => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| DfsError::new(Errno::STALE, "object released during lookup")))
    }

    /// The answer to a lookup of an absent name: a negative entry (nodeid 0) the kernel
    /// caches for the negative TTL, or ENOENT where it caches none.
    fn absent(&self) -> io::Result<Entry> {
        if self.cfg.negative_ttl.is_zero() {
            return Err(errno(libc::ENOENT));
        }
        Ok(Entry {
            inode: 0,
            entry_timeout: self.cfg.negative_ttl,
            ..Entry::default()
        })
    }

    /// `name` may be in `parent` from now on (see [`KnownDirs`]): before a change makes it.
    fn may_hold(&self, parent: Oid, name: &str) {
        if let Some(k) = &self.known {
            k.may_hold(parent, name);
        }
    }

    /// `name` is gone from `parent`: after a change removed it.
    fn removed(&self, parent: Oid, name: &str) {
        if let Some(k) = &self.known {
            k.removed(parent, name);
        }
    }

    /// After a change (whatever its outcome) of `name` in `parent`: what the worker kept
    /// of the name and of the directory is dropped.
    fn entry_changed(&self, parent: Oid, name: &str) {
        if let Some(k) = &self.kept {
            k.entry_changed(parent, name);
        }
    }

    /// After a change (whatever its outcome) of `oid` itself: what the worker kept of it is
    /// dropped.
    fn object_changed(&self, oid: Oid) {
        if let Some(k) = &self.kept {
            k.changed(oid);
        }
    }

    /// Runs the change `f` of `name` in `parent`, then drops what it may have made stale.
    fn changing_entry<T>(&self, parent: Oid, name: &str, f: impl FnOnce() -> T) -> T {
        let r = f();
        self.entry_changed(parent, name);
        r
    }

    /// Runs the change `f` of `oid`, then drops what it may have made stale.
    fn changing<T>(&self, oid: Oid, f: impl FnOnce() -> T) -> T {
        let r = f();
        self.object_changed(oid);
        r
    }

    /// A new object `name` in `parent`, kept (after [`DfsFs::entry_changed`]: the kernel
    /// holds the directory's lock for the change, so nothing else changes the name meanwhile).
    fn keep_new(&self, parent: Oid, name: &str, attr: &Attr) {
        if let Some(k) = &self.kept {
            k.keep(k.ticket(), parent, name, attr);
        }
    }

    /// What the worker kept of `name` in `parent`, counted as a new kernel reference.
    fn kept_entry(&self, parent: Oid, name: &str) -> Option<Entry> {
        let (attr, age) = self.kept.as_ref()?.lookup(parent, name)?;
        // A released object (LocalDfs) is looked up again.
        self.remember(&attr).ok()?;
        self.stats.cached_answer();
        Some(self.entry_aged(&attr, age))
    }

    /// A new object's entry, counted.
    fn created(&self, attr: Attr) -> io::Result<Entry> {
        self.remember(&attr).map_err(err)?;
        Ok(self.entry(&attr))
    }

    fn forget_one(&self, oid: Oid, n: u64) {
        let Some(counts) = &self.counts else {
            return;
        };
        if oid == ROOT_OID {
            return;
        }
        let mut shard = counts.shard(oid);
        let Some(held) = shard.get_mut(&oid) else {
            // Not counted (a predecessor handed it out): the kernel is done with it.
            (counts.forget)(oid);
            return;
        };
        held.count = held.count.saturating_sub(n);
        if held.count == 0 {
            shard.remove(&oid);
            // Under the shard lock, so a concurrent lookup of the same object either
            // precedes this (and its count keeps it) or sees the release (and retries).
            (counts.forget)(oid);
        }
    }

    /// Owner and mode of a new object of type and permission bits `mode`: the caller, with
    /// the group of a set-group-ID parent directory (the backend decides whether that costs a
    /// read of the parent: the engine applies the rule in the create itself).
    fn new_owner(&self, ctx: &Context, parent: Oid, mode: u32) -> io::Result<(u32, u32, u32)> {
        let (mode, gid) = self.dfs.owner_in(parent, mode, ctx.gid).map_err(err)?;
        Ok((ctx.uid, gid, mode & 0o7777))
    }

    /// A directory's attributes as this worker's last change of an entry there left them
    /// (the backend's reply carried them), while they are younger than the attribute
    /// timeout, with what is left of it: exactly what the kernel would have cached had the
    /// change's reply carried them. The kernel forgets them at the change and asks at its
    /// next permission check there, one round trip per create or unlink otherwise.
    fn changed_dir(&self, oid: Oid) -> Option<(Attr, Duration)> {
        let (attr, at) = self.dfs.take_changed_dir(oid)?;
        let left = self.cfg.attr_ttl.checked_sub(at.elapsed())?;
        (!left.is_zero()).then_some((attr, left))
    }

    /// Drops what [`DfsFs::changed_dir`] would answer for `oid`: a change of the object itself
    /// (setattr, extended attributes) makes it older than what the engine holds.
    fn forget_changed_dir(&self, oid: Oid) {
        let _ = self.dfs.take_changed_dir(oid);
    }

    /// open(O_TRUNC): truncates, and with `FOPEN_IN_KILL_SUIDGID` in `fuse_flags` (a caller
    /// without CAP_FSETID, in group `gid`) clears the set-ID bits as well.
    fn truncate_on_open(
        &self,
        oid: Oid,
        flags: u32,
        (fuse_flags, gid): (u32, u32),
    ) -> io::Result<()> {
        if flags & libc::O_TRUNC as u32 == 0 {
            return Ok(());
        }
        let mut set = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        if fuse_flags & FOPEN_IN_KILL_SUIDGID != 0 {
            set.mode = mode_without_set_id(&*self.dfs, oid, gid).map_err(err)?;
        }
        self.dfs.setattr(oid, &set).map_err(err).map(drop)
    }

    fn write_session_record(&self, offered: FsOptions, enabled: FsOptions) {
        let Some(path) = &self.session_record else {
            return;
        };
        let record = SessionRecord {
            version: SESSION_VERSION,
            offered: offered.bits(),
            enabled: enabled.bits(),
            offered_names: format!("{offered:?}"),
            enabled_names: format!("{enabled:?}"),
            max_write: crate::fuse::MAX_PAYLOAD as u32,
            config: self.cfg.session_config(),
        };
        let text = serde_json::to_string_pretty(&record).expect("a record serializes");
        if let Err(e) = super::write_atomic(path, text.as_bytes()) {
            tracing::warn!(
                "cannot record the negotiated session in {}: {e}",
                path.display()
            );
        }
    }

    /// Takes over a connection another worker initialised: what it negotiated is ours now
    /// (INIT will not come again).
    pub fn restore(&self, record: &SessionRecord) -> Result<(), HandoverError> {
        record.check(&self.cfg.session_config())?;
        self.negotiated
            .offered
            .store(record.offered, Ordering::Relaxed);
        self.negotiated
            .enabled
            .store(record.enabled, Ordering::Relaxed);
        self.negotiated.done.store(true, Ordering::Release);
        Ok(())
    }

    /// fallocate(2)'s ZERO_RANGE: the range reads as zeros, its space is taken where the
    /// backend can reserve space (DFS cannot: there it stays a hole, as after a punch), and
    /// unless `keep_size` a range past the end extends the size.
    fn zero_range(&self, oid: Oid, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
        let end = offset.checked_add(len).ok_or_else(|| errno(libc::EFBIG))?;
        self.dfs.punch(oid, offset, len).map_err(err)?;
        match self.dfs.allocate(oid, offset, len, keep_size) {
            Err(e) if e.errno == Errno::OPNOTSUPP => {}
            reserved => return reserved.map_err(err),
        }
        if !keep_size && end > self.dfs.getattr(oid).map_err(err)?.size {
            self.dfs.truncate(oid, end).map_err(err)?;
        }
        Ok(())
    }
}

impl FileSystem for DfsFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        self.op(Op::Init, || {
            let want = self.cfg.wanted_options();
            let enabled = capable & want;
            self.negotiated
                .offered
                .store(capable.bits(), Ordering::Relaxed);
            self.negotiated
                .enabled
                .store(enabled.bits(), Ordering::Relaxed);
            if self.cfg.writeback_cache && !enabled.contains(FsOptions::WRITEBACK_CACHE) {
                tracing::warn!("the kernel did not offer the writeback cache");
            }
            self.write_session_record(capable, enabled);
            self.negotiated.done.store(true, Ordering::Release);
            tracing::info!("FUSE session initialised: {enabled:?}");
            Ok(want)
        })
    }

    fn destroy(&self) {
        let _ = self.op(Op::Destroy, || Ok(()));
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        self.op(Op::Lookup, || {
            let name = name_str(name)?;
            if self.known.as_ref().is_some_and(|k| k.absent(parent, name)) {
                self.stats.absent_answer();
                return self.absent();
            }
            if let Some(entry) = self.kept_entry(parent, name) {
                return Ok(entry);
            }
            let ticket = self.kept.as_ref().map(EntryCache::ticket);
            match self.lookup_attr(parent, name) {
                Ok(attr) => {
                    if let (Some(k), Some(t)) = (&self.kept, ticket) {
                        k.keep(t, parent, name, &attr);
                    }
                    Ok(self.entry(&attr))
                }
                Err(e) if e.errno == Errno::NOENT => self.absent(),
                Err(e) => Err(err(e)),
            }
        })
    }

    fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
        self.stats.count(Op::Forget, 1);
        self.forget_one(inode, count);
    }

    fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
        self.stats.count(Op::Forget, requests.len() as u64);
        for (inode, count) in requests {
            self.forget_one(inode, count);
        }
    }

    fn getattr(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: Option<u64>,
    ) -> io::Result<(stat64, Duration)> {
        self.op(Op::Getattr, || {
            if let Some((a, ttl)) = self.changed_dir(inode) {
                self.stats.changed_dir_answer();
                return Ok((to_stat(&a), ttl));
            }
            if let Some((a, age)) = self.kept.as_ref().and_then(|k| k.attr(inode)) {
                self.stats.cached_answer();
                return Ok((to_stat(&a), self.cfg.attr_ttl.saturating_sub(age)));
            }
            let a = self.dfs.getattr(inode).map_err(err)?;
            Ok((to_stat(&a), self.cfg.attr_ttl))
        })
    }

    fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        attr: stat64,
        _handle: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        self.op(Op::Setattr, || {
            self.changing(inode, || {
                self.check_writable()?;
                self.forget_changed_dir(inode);
                let mut set = SetAttr::default();
                if valid.contains(SetattrValid::MODE) {
                    set.mode = Some(attr.st_mode & 0o7777);
                }
                if valid.contains(SetattrValid::UID) {
                    set.uid = Some(attr.st_uid);
                }
                if valid.contains(SetattrValid::GID) {
                    set.gid = Some(attr.st_gid);
                }
                if valid.contains(SetattrValid::SIZE) {
                    set.size = Some(attr.st_size as u64);
                    if valid.contains(SetattrValid::KILL_SUIDGID) && set.mode.is_none() {
                        // A truncation by a caller without CAP_FSETID (HANDLE_KILLPRIV_V2).
                        set.mode = mode_without_set_id(&*self.dfs, inode, ctx.gid).map_err(err)?;
                    }
                }
                if valid.contains(SetattrValid::ATIME_NOW) {
                    set.atime = Some(TimeSet::Now);
                } else if valid.contains(SetattrValid::ATIME) {
                    set.atime = Some(TimeSet::At(Timespec {
                        secs: attr.st_atime,
                        nanos: attr.st_atime_nsec as u32,
                    }));
                }
                if valid.contains(SetattrValid::MTIME_NOW) {
                    set.mtime = Some(TimeSet::Now);
                } else if valid.contains(SetattrValid::MTIME) {
                    set.mtime = Some(TimeSet::At(Timespec {
                        secs: attr.st_mtime,
                        nanos: attr.st_mtime_nsec as u32,
                    }));
                }
                let a = if set == SetAttr::default() {
                    // Only ctime (or nothing the DFS stores): report the current attributes.
                    self.dfs.getattr(inode)
                } else {
                    self.dfs.setattr(inode, &set)
                }
                .map_err(err)?;
                Ok((to_stat(&a), self.cfg.attr_ttl))
            })
        })
    }

    fn readlink(&self, _ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        self.op(Op::Readlink, || {
            Ok(self.dfs.readlink(inode).map_err(err)?.into_bytes())
        })
    }

    fn symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
    ) -> io::Result<Entry> {
        self.op(Op::Symlink, || {
            self.check_writable()?;
            let (name, target) = (name_str(name)?, name_str(linkname)?);
            let (uid, gid, _) = self.new_owner(ctx, parent, S_IFLNK | 0o777)?;
            self.may_hold(parent, name);
            let a = self
                .changing_entry(parent, name, || {
                    self.dfs.symlink(parent, name, target, uid, gid)
                })
                .map_err(err)?;
            self.keep_new(parent, name, &a);
            self.created(a)
        })
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        _rdev: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        self.op(Op::Mknod, || {
            self.check_writable()?;
            if mode & S_IFMT != S_IFREG {
                // DFS has no device nodes, FIFOs or sockets.
                return Err(errno(libc::EPERM));
            }
            let name = name_str(name)?;
            let (uid, gid, mode) = self.new_owner(ctx, parent, mode)?;
            self.may_hold(parent, name);
            let a = self
                .changing_entry(parent, name, || {
                    self.dfs.create(parent, name, mode, uid, gid)
                })
                .map_err(err)?;
            self.keep_new(parent, name, &a);
            self.created(a)
        })
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        self.op(Op::Mkdir, || {
            self.check_writable()?;
            let name = name_str(name)?;
            let (uid, gid, mode) = self.new_owner(ctx, parent, S_IFDIR | mode)?;
            self.may_hold(parent, name);
            let a = self
                .changing_entry(parent, name, || {
                    self.dfs.mkdir(parent, name, mode, uid, gid)
                })
                .map_err(err)?;
            if let Some(k) = &self.known {
                k.made(a.oid);
            }
            self.keep_new(parent, name, &a);
            self.created(a)
        })
    }

    fn unlink(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.op(Op::Unlink, || {
            self.check_writable()?;
            let name = name_str(name)?;
            self.changing_entry(parent, name, || self.dfs.unlink(parent, name))
                .map_err(err)?;
            self.removed(parent, name);
            Ok(())
        })
    }

    fn rmdir(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.op(Op::Rmdir, || {
            self.check_writable()?;
            let name = name_str(name)?;
            self.changing_entry(parent, name, || self.dfs.rmdir(parent, name))
                .map_err(err)?;
            self.removed(parent, name);
            Ok(())
        })
    }

    fn rename(
        &self,
        _ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.op(Op::Rename, || {
            self.check_writable()?;
            if flags & !libc::RENAME_NOREPLACE != 0 {
                // RENAME_EXCHANGE and RENAME_WHITEOUT: not in DFS.
                return Err(errno(libc::EINVAL));
            }
            let noreplace = flags & libc::RENAME_NOREPLACE != 0;
            let (from, to) = (name_str(oldname)?, name_str(newname)?);
            self.may_hold(newdir, to);
            let renamed = self.dfs.rename(olddir, from, newdir, to, noreplace);
            self.entry_changed(olddir, from);
            self.entry_changed(newdir, to);
            renamed.map_err(err)?;
            // A rename onto itself succeeds and leaves the name.
            if (olddir, from) != (newdir, to) {
                self.removed(olddir, from);
            }
            Ok(())
        })
    }

    fn link(
        &self,
        _ctx: &Context,
        _inode: u64,
        _newparent: u64,
        _newname: &CStr,
    ) -> io::Result<Entry> {
        // DFS has no hard links: link(2)'s "the file system does not support hard links".
        self.op(Op::Link, || Err(errno(libc::EPERM)))
    }

    fn open(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        self.op(Op::Open, || {
            let acc = flags as i32 & libc::O_ACCMODE;
            let write = acc == libc::O_WRONLY || acc == libc::O_RDWR;
            let truncate = flags & libc::O_TRUNC as u32 != 0;
            if (write || truncate) && self.cfg.read_only() {
                return Err(errno(libc::EROFS));
            }
            // A read-only open only asks whether the backend still holds the object: the kernel
            // opens only what it looked up (never a symlink, and a directory by OPENDIR), and
            // the handles are stateless. The engine answers that without a round trip (one of
            // every small file a loader reads): a file another mount removed fails at its first
            // read (ESTALE, as on NFS). A backend with a table of held objects (libdfs, a local
            // directory) answers from it, so after a worker's replacement the kernel gets its
            // ESTALE here, where it looks the name up again.
            if write || truncate {
                self.dfs.open(inode, write).map_err(err)?;
            } else {
                self.dfs.holds(inode).map_err(err)?;
            }
            if truncate {
                self.changing(inode, || {
                    self.truncate_on_open(inode, flags, (fuse_flags, ctx.gid))
                })?;
            }
            Ok((None, self.cfg.open_options(), None))
        })
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        self.op(Op::Create, || {
            self.check_writable()?;
            let name = name_str(name)?;
            let (uid, gid, mode) = self.new_owner(ctx, parent, S_IFREG | args.mode)?;
            self.may_hold(parent, name);
            let created = self.changing_entry(parent, name, || {
                self.dfs.create(parent, name, mode, uid, gid)
            });
            let entry = match created {
                Ok(a) => {
                    self.keep_new(parent, name, &a);
                    self.created(a)?
                }
                // open(O_CREAT) without O_EXCL on a name that appeared since the kernel's
                // lookup: open what is there, as a local file system would.
                Err(e) if e.errno == Errno::EXIST && args.flags & libc::O_EXCL as u32 == 0 => {
                    let a = self.lookup_attr(parent, name).map_err(err)?;
                    if a.kind() == S_IFDIR {
                        self.forget_one(a.oid, 1);
                        return Err(errno(libc::EISDIR));
                    }
                    if let Err(e) = self.dfs.open(a.oid, true) {
                        self.forget_one(a.oid, 1);
                        return Err(err(e));
                    }
                    self.changing(a.oid, || {
                        self.truncate_on_open(a.oid, args.flags, (args.fuse_flags, ctx.gid))
                    })?;
                    let a = self.dfs.getattr(a.oid).map_err(err)?;
                    self.entry(&a)
                }
                Err(e) => return Err(err(e)),
            };
            Ok((entry, None, self.cfg.open_options(), None))
        })
    }

    fn read(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        // Before the operation's clock starts: the latencies stay the backend's.
        self.throttle.admit(u64::from(size));
        self.op(Op::Read, || {
            let mut io = DfsIo {
                dfs: &*self.dfs,
                oid: inode,
                unprivileged: None,
            };
            let n = w.write_from(&mut io, size as usize, offset)?;
            self.stats.add_read(n as u64);
            Ok(n)
        })
    }

    fn write(
        &self,
        ctx: &Context,
        inode: u64,
        _handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        _flags: u32,
        fuse_flags: u32,
    ) -> io::Result<usize> {
        self.throttle.admit(u64::from(size));
        self.op(Op::Write, || {
            self.check_writable()?;
            let mut io = DfsIo {
                dfs: &*self.dfs,
                oid: inode,
                unprivileged: (fuse_flags & WRITE_KILL_PRIV != 0).then_some(ctx.gid),
            };
            self.changing(inode, || r.read_exact_to(&mut io, size as usize, offset))?;
            self.stats.add_written(size as u64);
            Ok(size as usize)
        })
    }

    fn flush(&self, _ctx: &Context, _inode: u64, _handle: u64, _lock_owner: u64) -> io::Result<()> {
        // Nothing is buffered in the worker: every write reached the backend before it was
        // answered. (With the writeback cache the kernel flushes its dirty pages before this
        // and reports their errors to close.)
        self.op(Op::Flush, || Ok(()))
    }

    fn fsync(&self, _ctx: &Context, inode: u64, datasync: bool, _handle: u64) -> io::Result<()> {
        self.op(Op::Fsync, || self.dfs.fsync(inode, datasync).map_err(err))
    }

    fn fsyncdir(&self, _ctx: &Context, inode: u64, datasync: bool, _handle: u64) -> io::Result<()> {
        self.op(Op::Fsyncdir, || {
            self.dfs.fsync(inode, datasync).map_err(err)
        })
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.op(Op::Fallocate, || {
            self.changing(inode, || {
                self.check_writable()?;
                let mode = mode as i32;
                let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
                match mode & !libc::FALLOC_FL_KEEP_SIZE {
                    0 => self
                        .dfs
                        .allocate(inode, offset, length, keep_size)
                        .map_err(err),
                    libc::FALLOC_FL_PUNCH_HOLE if keep_size => {
                        self.dfs.punch(inode, offset, length).map_err(err)
                    }
                    libc::FALLOC_FL_ZERO_RANGE => self.zero_range(inode, offset, length, keep_size),
                    _ => Err(errno(libc::EOPNOTSUPP)),
                }
            })
        })
    }

    fn release(
        &self,
        _ctx: &Context,
        _inode: u64,
        _flags: u32,
        _handle: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.op(Op::Release, || Ok(()))
    }

    fn statfs(&self, _ctx: &Context, _inode: u64) -> io::Result<statvfs64> {
        self.op(Op::Statfs, || {
            let u = self.usage()?;
            // SAFETY: statvfs64 is plain data; all-zero is a valid value.
            let mut st: statvfs64 = unsafe { std::mem::zeroed() };
            st.f_bsize = u.block_size;
            st.f_frsize = u.block_size;
            st.f_blocks = u.blocks;
            st.f_bfree = u.blocks_free;
            st.f_bavail = u.blocks_available;
            st.f_files = u.files;
            st.f_ffree = u.files_free;
            st.f_favail = u.files_free;
            st.f_namemax = 255;
            Ok(st)
        })
    }

    fn setxattr(
        &self,
        _ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.op(Op::Setxattr, || {
            self.check_writable()?;
            self.forget_changed_dir(inode);
            if name == FILE_CAPABILITIES {
                return Err(errno(libc::EOPNOTSUPP));
            }
            let mode = match flags as i32 {
                0 => XattrMode::Any,
                libc::XATTR_CREATE => XattrMode::Create,
                libc::XATTR_REPLACE => XattrMode::Replace,
                _ => return Err(errno(libc::EINVAL)),
            };
            let name = name_str(name)?;
            self.changing(inode, || self.dfs.setxattr(inode, name, value, mode))
                .map_err(err)
        })
    }

    fn getxattr(
        &self,
        _ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        self.op(Op::Getxattr, || {
            if name == FILE_CAPABILITIES {
                return Err(errno(libc::ENODATA));
            }
            let value = self.dfs.getxattr(inode, name_str(name)?).map_err(err)?;
            if size == 0 {
                Ok(GetxattrReply::Count(value.len() as u32))
            } else if value.len() > size as usize {
                Err(errno(libc::ERANGE))
            } else {
                Ok(GetxattrReply::Value(value))
            }
        })
    }

    fn listxattr(&self, _ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        self.op(Op::Listxattr, || {
            let mut names = Vec::new();
            for n in self.dfs.listxattr(inode).map_err(err)? {
                names.extend_from_slice(n.as_bytes());
                names.push(0);
            }
            if size == 0 {
                Ok(ListxattrReply::Count(names.len() as u32))
            } else if names.len() > size as usize {
                Err(errno(libc::ERANGE))
            } else {
                Ok(ListxattrReply::Names(names))
            }
        })
    }

    fn removexattr(&self, _ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        self.op(Op::Removexattr, || {
            self.check_writable()?;
            self.forget_changed_dir(inode);
            if name == FILE_CAPABILITIES {
                return Err(errno(libc::ENODATA));
            }
            let name = name_str(name)?;
            self.changing(inode, || self.dfs.removexattr(inode, name))
                .map_err(err)
        })
    }

    fn opendir(
        &self,
        _ctx: &Context,
        inode: u64,
        _flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions)> {
        // Only whether the backend still holds it, as for a file opened for reading (see
        // `open`): the kernel opens only an inode it knows is a directory, and handles are
        // stateless. On the engine a directory another mount removed since this kernel looked
        // it up fails at its first listing (ESTALE) instead of here, as on NFS; each `find`,
        // `ls -R` or `rm -r` saves a round trip per directory.
        self.op(Op::Opendir, || {
            self.dfs.holds(inode).map_err(err)?;
            Ok((None, OpenOptions::empty()))
        })
    }

    fn readdir(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.op(Op::Readdir, || {
            // A dirent takes 24 bytes plus the name, 8-aligned: ask for about what fits.
            let max = size as usize / 32;
            self.list(inode, offset, (max, false), &mut |e| {
                Ok(add_entry(dirent(e))? != 0)
            })
        })
    }

    fn readdirplus(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.op(Op::Readdirplus, || {
            // An entry_out (128 bytes) and a dirent with the name, 8-aligned.
            let max = size as usize / 200;
            self.list(inode, offset, (max, true), &mut |e| {
                let attr = match &e.attr {
                    Some(a) => self.remember(a).map(|()| a.clone()),
                    // A backend without attributes in listings: look each entry up.
                    None => self.lookup_attr(inode, &e.name),
                };
                let attr = match attr {
                    Ok(a) => a,
                    // Gone since it was listed: leave it out.
                    Err(e) if e.errno == Errno::NOENT || e.errno == Errno::STALE => {
                        return Ok(true);
                    }
                    Err(e) => return Err(err(e)),
                };
                let added = add_entry(dirent(e), self.entry(&attr))?;
                if added == 0 {
                    // Not sent: the kernel holds no reference from it.
                    self.forget_one(attr.oid, 1);
                }
                Ok(added != 0)
            })
        })
    }

    fn releasedir(&self, _ctx: &Context, _inode: u64, _flags: u32, _handle: u64) -> io::Result<()> {
        self.op(Op::Releasedir, || Ok(()))
    }
}
