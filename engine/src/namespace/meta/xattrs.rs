//! Extended attributes, kept as keys of their object as DFS keeps them (akeys `x:<name>`).
//! Names and flags follow Linux: a namespace prefix is required, `user.` attributes exist
//! only on files and directories, XATTR_CREATE/XATTR_REPLACE as setxattr(2).

use super::{INODES, MetaStore, XATTRS, get_inode};
use crate::namespace::error::StorageResult;
use crate::namespace::error::{DfsResult, Errno, err};
use crate::namespace::inode::{Inode, Oid, S_IFMT};
use dpufs_proto::dfs::{check_xattr_name as check_name, xattr_allowed_on};
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

/// Largest value. Linux allows 64 KiB; DFS takes a little less so that a SetXattr request,
/// name and all, stays within the data service's 64 KiB message limit.
pub use dpufs_proto::dfs::XATTR_VALUE_MAX;

/// How setxattr treats an existing attribute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XattrSet {
    /// Create or replace.
    #[default]
    Any,
    /// XATTR_CREATE: EEXIST if it exists.
    Create,
    /// XATTR_REPLACE: ENODATA if it does not.
    Replace,
}

/// Whether `name` may exist on `ino`: as Linux, `user.` attributes only on files and
/// directories (others: EPERM to change, ENODATA to read).
fn allowed(ino: &Inode, name: &str) -> bool {
    xattr_allowed_on(ino.mode & S_IFMT, name)
}

/// EPERM unless `name` may be set on or removed from `ino` (see [`allowed`]).
fn may_change(ino: &Inode, name: &str) -> DfsResult<()> {
    if !allowed(ino, name) {
        return Err(err(
            Errno::PERM,
            "user attributes only on files and directories",
        ));
    }
    Ok(())
}

/// Removes every attribute of an object that is going away.
pub(super) fn drop_all(tx: &WriteTransaction, oid: Oid) -> DfsResult<()> {
    let mut xattrs = tx.open_table(XATTRS).storage()?;
    let names: Vec<String> = xattrs
        .range((oid, "")..(oid + 1, ""))
        .storage()?
        .map(|e| e.map(|(k, _)| k.value().1.to_string()))
        .collect::<Result<_, _>>()
        .storage()?;
    for n in names {
        xattrs.remove((oid, n.as_str())).storage()?;
    }
    Ok(())
}

impl MetaStore {
    pub fn setxattr(&self, oid: Oid, name: &str, value: &[u8], how: XattrSet) -> DfsResult<()> {
        check_name(name)?;
        if value.len() > XATTR_VALUE_MAX {
            return Err(err(
                Errno::TOOBIG,
                format!("attribute value of {} bytes", value.len()),
            ));
        }
        self.transact(|tx| {
            may_change(&get_inode(&tx.open_table(INODES).storage()?, oid)?, name)?;
            let mut xattrs = tx.open_table(XATTRS).storage()?;
            let exists = xattrs.get((oid, name)).storage()?.is_some();
            match how {
                XattrSet::Create if exists => {
                    return Err(err(Errno::EXIST, format!("attribute {name:?} exists")));
                }
                XattrSet::Replace if !exists => {
                    return Err(err(Errno::NODATA, format!("no attribute {name:?}")));
                }
                _ => {}
            }
            xattrs.insert((oid, name), value).storage()?;
            Ok(())
        })
    }

    pub fn getxattr(&self, oid: Oid, name: &str) -> DfsResult<Vec<u8>> {
        check_name(name)?;
        let tx = self.db.begin_read().storage()?;
        let ino = get_inode(&tx.open_table(INODES).storage()?, oid)?;
        let v = tx
            .open_table(XATTRS)
            .storage()?
            .get((oid, name))
            .storage()?
            .map(|v| v.value().to_vec())
            .filter(|_| allowed(&ino, name));
        v.ok_or_else(|| err(Errno::NODATA, format!("no attribute {name:?}")))
    }

    pub fn listxattr(&self, oid: Oid) -> DfsResult<Vec<String>> {
        let tx = self.db.begin_read().storage()?;
        get_inode(&tx.open_table(INODES).storage()?, oid)?;
        let t = tx.open_table(XATTRS).storage()?;
        let names = t
            .range((oid, "")..(oid + 1, ""))
            .storage()?
            .map(|e| e.map(|(k, _)| k.value().1.to_string()));
        names.collect::<Result<_, _>>().storage()
    }

    pub fn removexattr(&self, oid: Oid, name: &str) -> DfsResult<()> {
        check_name(name)?;
        self.transact(|tx| {
            may_change(&get_inode(&tx.open_table(INODES).storage()?, oid)?, name)?;
            if tx
                .open_table(XATTRS)
                .storage()?
                .remove((oid, name))
                .storage()?
                .is_some()
            {
                Ok(())
            } else {
                Err(err(Errno::NODATA, format!("no attribute {name:?}")))
            }
        })
    }
}
