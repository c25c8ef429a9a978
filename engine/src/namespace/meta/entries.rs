//! Directory entries: looking names up, and listings with stable cookies.
//!
//! Entries are keyed by (directory, hash of the name, name), so a directory lists in hash
//! order and an entry's cookie is the hash of its own name: a value that depends on nothing
//! but the entry, so it stays valid however the directory changes around it. A listing
//! resumes strictly after the cookie's hash. Two names with the same 63-bit hash would share
//! a cookie, so a page never ends inside a run of equal hashes (it runs over `max` instead):
//! resuming after that hash can then skip nothing.

use super::names::name_ok;
use super::{ENTRIES, INODES, MetaStore, get_dir, get_inode};
use crate::namespace::error::StorageResult;
use crate::namespace::error::{DfsResult, Errno, err};
use crate::namespace::inode::{Inode, Oid, S_IFMT};
pub use dpufs_proto::dfs::name_hash;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

/// An entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    /// Resume after this entry with this value: the hash of its name.
    pub cookie: u64,
    /// The object it names (read anyway for its type), for listings with attributes.
    pub inode: Inode,
}

impl DirEntry {
    /// File type bits (`S_IFDIR`, `S_IFREG`, `S_IFLNK`).
    pub fn kind(&self) -> u32 {
        self.inode.mode & S_IFMT
    }
}

/// A page of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirPage {
    pub entries: Vec<DirEntry>,
    /// Nothing follows the last entry.
    pub end: bool,
}

/// The key of entry `name` of `dir`.
pub(super) fn entry_key(dir: Oid, name: &str) -> (u64, u64, &str) {
    (dir, name_hash(name), name)
}

/// Whether directory `dir` has any entry.
pub(super) fn has_entries(tx: &WriteTransaction, dir: Oid) -> DfsResult<bool> {
    let entries = tx.open_table(ENTRIES).storage()?;
    let mut range = entries.range((dir, 0, "")..(dir + 1, 0, "")).storage()?;
    Ok(range.next().is_some())
}

impl MetaStore {
    /// The object an entry names.
    pub fn lookup(&self, dir: Oid, name: &str) -> DfsResult<Inode> {
        name_ok(name)?;
        let pending = self.pending();
        let tx = self.db.begin_read().storage()?;
        let inodes = tx.open_table(INODES).storage()?;
        get_dir(&inodes, dir)?;
        let oid = tx
            .open_table(ENTRIES)
            .storage()?
            .get(entry_key(dir, name))
            .storage()?
            .map(|v| v.value())
            .ok_or_else(|| err(Errno::NOENT, format!("{name:?} not found")))?;
        Ok(pending.apply(get_inode(&inodes, oid)?))
    }

    /// Up to `max` entries of `dir` after `cookie` (0 starts at the beginning), more only
    /// to finish a run of equal hashes.
    pub fn readdir(&self, dir: Oid, cookie: u64, max: usize) -> DfsResult<DirPage> {
        let pending = self.pending();
        let tx = self.db.begin_read().storage()?;
        let inodes = tx.open_table(INODES).storage()?;
        get_dir(&inodes, dir)?;
        let entries = tx.open_table(ENTRIES).storage()?;
        let start = if cookie == 0 {
            0
        } else {
            cookie.saturating_add(1)
        };
        let mut page = DirPage::default();
        for entry in entries
            .range((dir, start, "")..(dir + 1, 0, ""))
            .storage()?
        {
            let (key, oid) = entry.storage()?;
            let (_, hash, name) = key.value();
            if page.entries.len() >= max.max(1)
                && page.entries.last().is_none_or(|last| last.cookie != hash)
            {
                return Ok(page);
            }
            page.entries.push(DirEntry {
                name: name.to_string(),
                cookie: hash,
                inode: pending.apply(get_inode(&inodes, oid.value())?),
            });
        }
        page.end = true;
        Ok(page)
    }
}
