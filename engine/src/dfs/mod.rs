//! DFS on the engine: a POSIX namespace per container with DAOS's DFS
//! semantics (directories as objects, entries as keys, files in chunks, no
//! hard links). Metadata lives in a per-container transactional store, file
//! data in chunk files spread over the pool's ranks.

mod ahead;
mod behind;
mod chunks;
mod dirents;
pub mod disk;
pub mod inode;
mod iobuf;
mod names;
pub mod namespace;
mod pool;
mod snapshot;
mod space;
mod spares;
mod xattrs;

pub use dirents::{DirEntry, DirPage, name_hash};
pub use disk::{Disk, RealDisk};
pub use inode::{Inode, Oid, ROOT, Time};
pub use iobuf::IoBuf;
pub use namespace::{NAME_MAX, Namespace, NamespaceConfig, SYMLINK_MAX, SetAttr};
pub use space::{SpaceBudget, StatFs};
pub use xattrs::{XATTR_VALUE_MAX, XattrSet};

/// POSIX error numbers DFS operations fail with (Linux values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Errno {
    Perm = 1,
    NoEnt = 2,
    Io = 5,
    TooBig = 7,
    Exist = 17,
    XDev = 18,
    NotDir = 20,
    IsDir = 21,
    Inval = 22,
    FBig = 27,
    NoSpc = 28,
    RoFs = 30,
    Range = 34,
    NameTooLong = 36,
    NotEmpty = 39,
    Loop = 40,
    NoData = 61,
    NoSys = 38,
    Proto = 71,
    OpNotSupp = 95,
    /// The object no longer exists (its oid was valid once).
    Stale = 116,
}

/// A failed DFS operation: the errno the caller sees, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{errno:?} ({}): {detail}", *errno as i32)]
pub struct DfsError {
    pub errno: Errno,
    pub detail: String,
}

pub type DfsResult<T> = Result<T, DfsError>;

pub(crate) fn err(errno: Errno, detail: impl Into<String>) -> DfsError {
    DfsError {
        errno,
        detail: detail.into(),
    }
}

macro_rules! io_errors {
    ($($t:ty),*) => {$(
        impl From<$t> for DfsError {
            fn from(e: $t) -> Self { err(Errno::Io, e.to_string()) }
        }
    )*};
}
io_errors!(
    redb::Error,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::DatabaseError,
    redb::SetDurabilityError
);

impl From<std::io::Error> for DfsError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                err(Errno::NoSpc, e.to_string())
            }
            _ => err(Errno::Io, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_ahead;
#[cfg(test)]
mod tests_behind;
#[cfg(test)]
mod tests_space;
#[cfg(test)]
mod tests_spares;
