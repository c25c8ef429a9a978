//! DFS, the POSIX namespace of a DAOS container, as the volume worker uses it.
//!
//! [`Dfs`] is object-based, like libdfs and like FUSE: every call names objects by [`Oid`],
//! the root is [`ROOT`], and there are no open-file handles to lose — a worker that restarts
//! (crash failover, hot upgrade) keeps serving the kernel's inode numbers. Semantics are DFS's
//! (docs/dfs.md, "Semantics"): directories are objects, entries are keys, files are chunked,
//! there are no hard links.
//!
//! Backends: the engine over a [`DfsTransport`] (`EngineDfs`; the fabric in production), and
//! a local directory (`LocalDfs`), the reference the differential POSIX suite
//! (`conformance`, with the cargo feature `testing` only: test code, not in shipped binaries)
//! compares every backend with. Layout, semantics and the allow-list of differences:
//! `docs/dfs.md`.

#[cfg(feature = "testing")]
pub mod conformance;
mod engine;
pub mod fabric;
mod local;
mod transport;

pub use engine::{DEFAULT_PIPELINE_DEPTH, EngineDfs, MountInfo};
pub use local::LocalDfs;
pub use transport::{Bulk, DfsTransport, TransportReply};

/// Object id. Stable for the object's life and never reused while a kernel may hold it.
pub type Oid = u64;

/// The root directory's object id.
pub const ROOT_OID: Oid = 1;

/// File type bits of [`Attr::mode`] (`S_IFMT`).
pub const S_IFMT: u32 = 0o170000;
/// Directory.
pub const S_IFDIR: u32 = 0o040000;
/// Regular file.
pub const S_IFREG: u32 = 0o100000;
/// Symbolic link.
pub const S_IFLNK: u32 = 0o120000;

pub use dpufs_proto::dfs::{
    DfsError, DfsResult, Errno, MAX_IO, NAME_MAX, READDIR_BATCH, SYMLINK_MAX, XATTR_LIST_MAX,
    XATTR_VALUE_MAX, check_name, owner_in_dir, without_set_id,
};

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    /// Seconds (negative before 1970).
    pub secs: i64,
    /// Nanoseconds, below 10⁹.
    pub nanos: u32,
}

/// What stat(2) reports about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The object.
    pub oid: Oid,
    /// File type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Bytes for files, target length for symlinks, 0 for directories (DFS).
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Links (always 1 on DFS, which has no hard links).
    pub nlink: u32,
    /// Last access.
    pub atime: Timespec,
    /// Last data change.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
}

impl Attr {
    /// File type bits.
    pub fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind() == S_IFDIR
    }
}

/// How to set a timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// To this time.
    At(Timespec),
    /// To the backend's clock (`UTIME_NOW`).
    Now,
}

/// Attribute changes; `None` leaves a field alone. A `size` truncates or extends (sparse).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (the type bits are ignored).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// New size.
    pub size: Option<u64>,
    /// Access time.
    pub atime: Option<TimeSet>,
    /// Modification time.
    pub mtime: Option<TimeSet>,
}

/// An entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Entry name.
    pub name: String,
    /// The object it names.
    pub oid: Oid,
    /// File type bits of the object.
    pub kind: u32,
    /// Pass to [`Dfs::readdir`] to resume after this entry. Valid while the entry exists and
    /// after it is removed: a listing resumed after concurrent changes neither repeats nor
    /// skips surviving entries (what a FUSE readdir offset must be across a worker restart).
    /// Never 0 (0 starts a listing). On the engine it is a hash of the name; on `LocalDfs`
    /// the directory stream's position after the entry.
    pub cookie: u64,
    /// The object's attributes, from [`Dfs::readdir_plus`] on a backend that has them.
    pub attr: Option<Attr>,
}

/// A page of a directory listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirPage {
    /// Entries in cookie order (no `.` or `..`).
    pub entries: Vec<DirEntry>,
    /// Nothing follows the last entry.
    pub end: bool,
}

/// File-system usage, as statfs(2) reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Capacity in bytes (the quota, where one applies).
    pub total_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Objects in use.
    pub files: u64,
}

/// `setxattr` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Any,
    /// `XATTR_CREATE`: fail with EEXIST if it exists.
    Create,
    /// `XATTR_REPLACE`: fail with ENODATA if it does not exist.
    Replace,
}

/// The POSIX namespace of one container.
///
/// Calls are synchronous and safe to make from many threads at once; a backend pipelines
/// concurrent calls (the volume worker has one FUSE reader per thread). Names are single path
/// components. No call checks POSIX permissions: the FUSE mount does (`default_permissions`).
pub trait Dfs: Send + Sync {
    /// Looks `name` up in directory `parent`.
    fn lookup(&self, parent: Oid, name: &str) -> DfsResult<Attr>;
    /// Attributes of `oid`.
    fn getattr(&self, oid: Oid) -> DfsResult<Attr>;
    /// Changes attributes; returns the new ones.
    fn setattr(&self, oid: Oid, set: &SetAttr) -> DfsResult<Attr>;
    /// Up to `max` entries of `dir` after `cookie` (0 starts from the beginning).
    fn readdir(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage>;
    /// Creates an empty regular file; EEXIST if the name is taken.
    fn create(&self, parent: Oid, name: &str, mode: u32, uid: u32, gid: u32) -> DfsResult<Attr>;
    /// Checks that `oid` can be opened (for writing, if `write`): ENOENT/ESTALE if it is gone,
    /// EISDIR for a directory opened for writing, EROFS on a snapshot.
    fn open(&self, oid: Oid, write: bool) -> DfsResult<Attr>;
    /// Reads at `offset` into `buf`; returns the bytes read (short only at end of file).
    fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> DfsResult<usize>;
    /// Writes all of `data` at `offset`, extending the file as needed.
    fn write(&self, oid: Oid, offset: u64, data: &[u8]) -> DfsResult<()>;
    /// Takes the space of [`offset`, `offset + len`) now, as fallocate(2) does, so writes
    /// there cannot fail for lack of it; extends the size to the range's end unless
    /// `keep_size` (then only the part below the size is reserved). Reads as before.
    fn allocate(&self, oid: Oid, offset: u64, len: u64, keep_size: bool) -> DfsResult<()>;
    /// Makes [`offset`, `offset + len`) read as zeros and gives its space back, as
    /// fallocate(2)'s PUNCH_HOLE does; the size stays (a range past it punches nothing).
    fn punch(&self, oid: Oid, offset: u64, len: u64) -> DfsResult<()>;
    /// Makes the object's data (and, unless `datasync`, its metadata) durable.
    fn fsync(&self, oid: Oid, datasync: bool) -> DfsResult<()>;
    /// Renames, replacing an existing target as rename(2) does (`noreplace`: EEXIST instead).
    fn rename(
        &self,
        parent: Oid,
        name: &str,
        new_parent: Oid,
        new_name: &str,
        noreplace: bool,
    ) -> DfsResult<()>;
    /// Removes a non-directory entry.
    fn unlink(&self, parent: Oid, name: &str) -> DfsResult<()>;
    /// Creates a directory.
    fn mkdir(&self, parent: Oid, name: &str, mode: u32, uid: u32, gid: u32) -> DfsResult<Attr>;
    /// Removes an empty directory.
    fn rmdir(&self, parent: Oid, name: &str) -> DfsResult<()>;
    /// Creates a symbolic link to `target`.
    fn symlink(&self, parent: Oid, name: &str, target: &str, uid: u32, gid: u32)
    -> DfsResult<Attr>;
    /// Target of a symbolic link.
    fn readlink(&self, oid: Oid) -> DfsResult<String>;
    /// Sets an extended attribute.
    fn setxattr(&self, oid: Oid, name: &str, value: &[u8], mode: XattrMode) -> DfsResult<()>;
    /// Value of an extended attribute (ENODATA if absent).
    fn getxattr(&self, oid: Oid, name: &str) -> DfsResult<Vec<u8>>;
    /// Names of the object's extended attributes.
    fn listxattr(&self, oid: Oid) -> DfsResult<Vec<String>>;
    /// Removes an extended attribute (ENODATA if absent).
    fn removexattr(&self, oid: Oid, name: &str) -> DfsResult<()>;
    /// Usage of the container.
    fn statfs(&self) -> DfsResult<StatFs>;

    /// Truncates or extends (sparse) to `size`.
    fn truncate(&self, oid: Oid, size: u64) -> DfsResult<Attr> {
        self.setattr(
            oid,
            &SetAttr {
                size: Some(size),
                ..SetAttr::default()
            },
        )
    }

    /// Whether the backend still holds `oid` (ESTALE if not: a forget released it, and the
    /// name must be looked up again). A backend with a table of held objects answers from
    /// it; one without (the engine) answers Ok; the default asks for the attributes. The
    /// worker asks at a read-only open and at opendir, so it must cost no round trip where
    /// it can be answered locally.
    fn holds(&self, oid: Oid) -> DfsResult<()> {
        self.getattr(oid).map(drop)
    }

    /// The mode and group of a new object (type and permission bits `mode`) that a caller
    /// in group `gid` makes in `parent`: the directory's group in a set-group-ID directory
    /// (see [`owner_in_dir`]). The default reads the parent's attributes; a backend whose
    /// create, mkdir and symlink apply the rule themselves, in the same request, passes
    /// `mode` and `gid` through without asking.
    fn owner_in(&self, parent: Oid, mode: u32, gid: u32) -> DfsResult<(u32, u32)> {
        let p = self.getattr(parent)?;
        Ok(owner_in_dir(p.mode, p.gid, mode, gid))
    }

    /// The attributes of directory `dir` as a change of an entry there by this client left
    /// them, and when they arrived, if the backend reported them with the change; taken, so
    /// each is answered once. The kernel forgets a directory's attributes when it changes an
    /// entry there and asks again at its next permission check: the worker answers that
    /// from these within the attribute timeout. None by default.
    fn take_changed_dir(&self, _dir: Oid) -> Option<(Attr, std::time::Instant)> {
        None
    }

    /// [`Dfs::readdir`] with each entry's attributes where the backend has them at no
    /// extra cost (`DirEntry::attr`), so a listing needs no lookup per entry; a backend
    /// without that lists without them.
    fn readdir_plus(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage> {
        self.readdir(dir, cookie, max)
    }

    /// Makes every change to the container so far durable, as syncfs(2) does. A worker that
    /// takes over from a predecessor calls it first: the changes the predecessor answered
    /// but no fsync covered were tracked in its memory only (`dfs::engine::unstable`). A
    /// backend whose every answered change is durable has nothing to do.
    fn sync_all(&self) -> DfsResult<()> {
        Ok(())
    }

    /// [`Dfs::write`] by a writer without `CAP_FSETID` whose group is `gid`: the set-ID bits
    /// are cleared first, as write(2) clears them (see [`without_set_id`]). A backend that
    /// can do both in one request overrides this.
    fn write_unprivileged(&self, oid: Oid, offset: u64, data: &[u8], gid: u32) -> DfsResult<()> {
        drop_set_id(self, oid, gid)?;
        self.write(oid, offset, data)
    }
}

/// The permission bits `oid` keeps after a write by a caller without `CAP_FSETID` whose
/// group is `gid` (see [`without_set_id`]); `None` when it has no set-ID bit to clear.
pub fn mode_without_set_id<D: Dfs + ?Sized>(dfs: &D, oid: Oid, gid: u32) -> DfsResult<Option<u32>> {
    let attr = dfs.getattr(oid)?;
    let mode = without_set_id(attr.mode, attr.gid == gid);
    Ok((mode != attr.mode).then_some(mode & 0o7777))
}

/// Clears the set-ID bits a write by a caller without `CAP_FSETID` whose group is `gid`
/// clears from `oid`'s mode, if it has any.
pub fn drop_set_id<D: Dfs + ?Sized>(dfs: &D, oid: Oid, gid: u32) -> DfsResult<()> {
    if let Some(mode) = mode_without_set_id(dfs, oid, gid)? {
        let set = SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        dfs.setattr(oid, &set)?;
    }
    Ok(())
}
