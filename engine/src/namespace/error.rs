//! How namespace operations fail: the errno a DFS client sees (the vocabulary both ends share,
//! `dpufs_proto::dfs`), and how the engine's own storage failures become one.

pub use dpufs_proto::dfs::{DfsError, DfsResult, Errno};

pub(crate) fn err(errno: Errno, detail: impl Into<String>) -> DfsError {
    DfsError::new(errno, detail)
}

/// A failure of the engine's own storage (metadata database, chunk files) as a client sees it:
/// ENOSPC when the disk or its quota is full, EIO otherwise. The disk's own errno (a missing
/// chunk file's ENOENT, say) means nothing about the client's file and is never passed on.
pub(crate) trait StorageResult<T> {
    /// The result with a storage error mapped as above.
    fn storage(self) -> DfsResult<T>;
}

impl<T> StorageResult<T> for std::io::Result<T> {
    fn storage(self) -> DfsResult<T> {
        self.map_err(|e| match e.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                err(Errno::NOSPC, e.to_string())
            }
            _ => err(Errno::IO, e.to_string()),
        })
    }
}

/// The metadata database's errors: all of them are EIO to a client.
macro_rules! database_errors {
    ($($t:ty),*) => {$(
        impl<T> StorageResult<T> for Result<T, $t> {
            fn storage(self) -> DfsResult<T> {
                self.map_err(|e| err(Errno::IO, e.to_string()))
            }
        }
    )*};
}
database_errors!(
    redb::Error,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::DatabaseError,
    redb::SetDurabilityError
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_errors_are_eio_or_enospc() {
        let full: std::io::Result<()> = Err(std::io::Error::from_raw_os_error(Errno::NOSPC.0));
        assert_eq!(full.storage().unwrap_err().errno, Errno::NOSPC);
        let missing: std::io::Result<()> = Err(std::io::Error::from_raw_os_error(Errno::NOENT.0));
        assert_eq!(missing.storage().unwrap_err().errno, Errno::IO);
    }
}
