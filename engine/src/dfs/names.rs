//! Removing and renaming entries. A removed object goes with its only entry (DFS has no
//! hard links): its inode, symlink target, attributes and data, in the same transaction.

use super::dirents::{entry_key, has_entries};
use super::inode::{Inode, Oid, ROOT, Time};
use super::namespace::{
    ENTRIES, INODES, Namespace, SYMLINKS, WriteState, get_dir, get_inode, name_ok, put_inode,
};
use super::{DfsResult, Errno, err};
use redb::{ReadableTable, WriteTransaction};

impl Namespace {
    /// Removes a file or symlink entry and its data.
    pub fn unlink(&self, dir: Oid, name: &str) -> DfsResult<()> {
        self.remove_entry(dir, name, false)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, dir: Oid, name: &str) -> DfsResult<()> {
        self.remove_entry(dir, name, true)
    }

    fn remove_entry(&self, dir: Oid, name: &str, want_dir: bool) -> DfsResult<()> {
        name_ok(name)?;
        let (_gate, mut st) = self.quiesce();
        let freed = self.update(|tx| {
            let victim = self.entry(tx, dir, name)?;
            match (want_dir, victim.is_dir()) {
                (true, false) => {
                    return Err(err(Errno::NotDir, format!("{name:?} is not a directory")));
                }
                (false, true) => return Err(err(Errno::IsDir, format!("{name:?} is a directory"))),
                _ => {}
            }
            let freed = self.drop_object(tx, &mut st, &victim)?;
            tx.open_table(ENTRIES)?.remove(entry_key(dir, name))?;
            self.touch(tx, dir)?;
            Ok(freed)
        })?;
        self.release(freed);
        Ok(())
    }

    /// The inode an entry names, within a transaction.
    fn entry(&self, tx: &WriteTransaction, dir: Oid, name: &str) -> DfsResult<Inode> {
        let inodes = tx.open_table(INODES)?;
        get_dir(&inodes, dir)?;
        let oid = tx
            .open_table(ENTRIES)?
            .get(entry_key(dir, name))?
            .map(|v| v.value());
        let oid = oid.ok_or_else(|| err(Errno::NoEnt, format!("{name:?} not found")))?;
        get_inode(&inodes, oid)
    }

    /// Deletes an object that is about to lose its only entry: its inode,
    /// symlink target, xattrs and data. Directories must be empty. Returns the
    /// data bytes freed.
    fn drop_object(
        &self,
        tx: &WriteTransaction,
        st: &mut WriteState,
        ino: &Inode,
    ) -> DfsResult<u64> {
        if ino.is_dir() && has_entries(tx, ino.oid)? {
            return Err(err(
                Errno::NotEmpty,
                format!("directory {:#x} is not empty", ino.oid),
            ));
        }
        let mut freed = 0;
        if ino.is_file() {
            freed = self.cut_chunks(st, ino.oid, 0, ino.size)?;
            super::space::adjust_used(tx, -(freed as i64))?;
        }
        tx.open_table(INODES)?.remove(ino.oid)?;
        tx.open_table(SYMLINKS)?.remove(ino.oid)?;
        super::xattrs::drop_all(tx, ino.oid)?;
        Ok(freed)
    }

    fn touch(&self, tx: &WriteTransaction, oid: Oid) -> DfsResult<()> {
        let mut ino = get_inode(&tx.open_table(INODES)?, oid)?;
        let now = Time::now();
        ino.mtime = now;
        ino.ctime = now;
        put_inode(tx, &ino)
    }

    /// Renames atomically, replacing the target as rename(2) does;
    /// `noreplace` gives EEXIST instead.
    pub fn rename(
        &self,
        from_dir: Oid,
        from: &str,
        to_dir: Oid,
        to: &str,
        noreplace: bool,
    ) -> DfsResult<()> {
        name_ok(from)?;
        name_ok(to)?;
        let (_gate, mut st) = self.quiesce();
        let freed = self.update(|tx| {
            let mut moving = self.entry(tx, from_dir, from)?;
            get_dir(&tx.open_table(INODES)?, to_dir)?;
            if moving.is_dir() && self.is_ancestor(tx, moving.oid, to_dir)? {
                return Err(err(Errno::Inval, "cannot move a directory into itself"));
            }
            let mut freed = 0;
            match self.entry(tx, to_dir, to) {
                // As renameat2: NOREPLACE refuses any existing target, itself included.
                Ok(_) if noreplace => return Err(err(Errno::Exist, format!("{to:?} exists"))),
                Ok(existing) if existing.oid == moving.oid => return Ok(0),
                Ok(existing) => {
                    match (moving.is_dir(), existing.is_dir()) {
                        (true, false) => {
                            return Err(err(Errno::NotDir, format!("{to:?} is not a directory")));
                        }
                        (false, true) => {
                            return Err(err(Errno::IsDir, format!("{to:?} is a directory")));
                        }
                        _ => {}
                    }
                    freed = self.drop_object(tx, &mut st, &existing)?;
                }
                Err(e) if e.errno == Errno::NoEnt => {}
                Err(e) => return Err(e),
            }
            let mut entries = tx.open_table(ENTRIES)?;
            entries.remove(entry_key(from_dir, from))?;
            entries.insert(entry_key(to_dir, to), moving.oid)?;
            drop(entries);
            moving.parent = to_dir;
            moving.ctime = Time::now();
            put_inode(tx, &moving)?;
            self.touch(tx, from_dir)?;
            if to_dir != from_dir {
                self.touch(tx, to_dir)?;
            }
            Ok(freed)
        })?;
        self.release(freed);
        Ok(())
    }

    /// Whether `dir` is `ancestor` or lies below it.
    fn is_ancestor(&self, tx: &WriteTransaction, ancestor: Oid, mut dir: Oid) -> DfsResult<bool> {
        let inodes = tx.open_table(INODES)?;
        loop {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT {
                return Ok(false);
            }
            dir = get_inode(&inodes, dir)?.parent;
        }
    }
}
