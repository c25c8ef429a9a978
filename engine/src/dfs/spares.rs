//! Recycled chunk files. A chunk file that is no longer needed (its file was unlinked or cut
//! short) is emptied and renamed to a spare name in its directory instead of being deleted,
//! and the next new chunk in that directory takes it by a rename. Creating a file on ext4
//! allocates an inode, and right after many deletions that allocation scans the inode table
//! for inodes that were not recently freed: measured on the engine, `open(O_CREAT)` of a chunk
//! took about as long as the 1 MiB direct write into it. Renaming a spare costs a directory
//! update only. (Log-structured stores recycle their log files for the same reason.)
//!
//! Only unshared files are recycled: a chunk file a snapshot links to keeps its bytes. Reads
//! and writes hold the data gate while they use a chunk file they took from the cache, and
//! whatever retires a chunk holds it exclusively, so no one still reads or writes a file after
//! it became a spare and maybe part of another file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::disk::{Disk, DiskFile};

/// Names of spare files start with this; chunk files are named `<oid hex>.<index>`.
const PREFIX: &str = "spare.";
/// Spares kept per chunk directory; further retired chunks are deleted.
const MAX_PER_DIR: usize = 4096;

/// Whether `path` names a spare (not a chunk file).
pub(super) fn is_spare(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(PREFIX))
}

/// The spare files of a namespace's chunk directories.
#[derive(Debug, Default)]
pub(super) struct Spares {
    by_dir: HashMap<PathBuf, Vec<PathBuf>>,
    /// Names new spares after the ones in use.
    next: u64,
}

impl Spares {
    /// Adopts the spares a previous run left in `dirs`, emptying any that a crash caught
    /// half-recycled.
    pub fn adopt(disk: &dyn Disk, dirs: &[PathBuf]) -> std::io::Result<Spares> {
        let mut spares = Spares::default();
        for dir in dirs {
            for path in disk.list(dir)?.into_iter().filter(|p| is_spare(p)) {
                let n = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n[PREFIX.len()..].parse::<u64>().ok());
                let kept = spares.by_dir.get(dir).map_or(0, Vec::len);
                match n {
                    Some(n) if kept < MAX_PER_DIR => {
                        disk.open(&path, false)?.set_len(0)?;
                        spares.next = spares.next.max(n + 1);
                        spares.by_dir.entry(dir.clone()).or_default().push(path);
                    }
                    _ => disk.remove(&path)?,
                }
            }
        }
        Ok(spares)
    }

    /// Creates the chunk file `path`, from a spare of its directory when there is one.
    pub fn create(&mut self, disk: &dyn Disk, path: &Path) -> std::io::Result<Arc<dyn DiskFile>> {
        let spare = path
            .parent()
            .and_then(|dir| self.by_dir.get_mut(dir))
            .and_then(Vec::pop);
        if let Some(spare) = spare {
            match disk.rename(&spare, path) {
                Ok(()) => return disk.open(path, false),
                // Gone behind our back: forget it and create the file.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        disk.open(path, true)
    }

    /// Retires the chunk file `path` (open as `file`): emptied and kept as a spare when no
    /// snapshot shares it and its directory has room, deleted otherwise.
    pub fn retire(
        &mut self,
        disk: &dyn Disk,
        path: &Path,
        file: &dyn DiskFile,
    ) -> std::io::Result<()> {
        let Some(dir) = path.parent() else {
            return disk.remove(path);
        };
        let room = self.by_dir.get(dir).map_or(0, Vec::len) < MAX_PER_DIR;
        if !room || disk.is_shared(path)? {
            return disk.remove(path);
        }
        // Emptied first: a crash before the rename leaves an empty chunk, never a spare with
        // another file's bytes.
        file.set_len(0)?;
        let spare = dir.join(format!("{PREFIX}{}", self.next));
        self.next += 1;
        disk.rename(path, &spare)?;
        self.by_dir
            .entry(dir.to_path_buf())
            .or_default()
            .push(spare);
        Ok(())
    }
}
