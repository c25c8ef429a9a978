//! How namespace operations fail: the POSIX errno a DFS client sees, and why.

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
