//! Recycled chunk files. A chunk file that is no longer needed (its file was unlinked or cut
//! short) is emptied and moved to the `spares` subdirectory of its chunk directory instead of
//! being deleted, and the next new chunk in that directory takes it by a rename. Keeping them
//! apart means finding them again at start-up lists only the spares, not every chunk file.
//! Creating a file on ext4 allocates an inode, and right after many deletions that allocation
//! scans the inode table for inodes that were not recently freed: measured on the engine,
//! `open(O_CREAT)` of a chunk took about as long as the 1 MiB direct write into it. Renaming a
//! spare costs a directory update only. (Log-structured stores recycle their log files for the
//! same reason.)
//!
//! Only unshared files are recycled: a chunk file a snapshot links to keeps its bytes. Reads
//! and writes hold the data gate while they use a chunk file they took from the cache, and
//! whatever retires a chunk holds it exclusively, so no one still reads or writes a file after
//! it became a spare and maybe part of another file.

use crate::namespace::disk::{Disk, DiskFile};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The subdirectory of a chunk directory that holds its spares, named by number; chunk files
/// are named `<oid hex>.<index>`.
const SUBDIR: &str = "spares";
/// Spares kept per chunk directory; further retired chunks are deleted.
const MAX_PER_DIR: usize = 4096;

/// Whether `path`, listed in a chunk directory, is its spares subdirectory (not a chunk file).
pub(super) fn is_spares_dir(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == SUBDIR)
}

/// The spare files of a namespace's chunk directories.
#[derive(Debug, Default)]
pub(crate) struct Spares {
    by_dir: HashMap<PathBuf, Vec<PathBuf>>,
    /// Names new spares after the ones in use.
    next: u64,
}

impl Spares {
    /// Adopts the spares a previous run left in `dirs`.
    pub fn adopt(disk: &dyn Disk, dirs: &[PathBuf]) -> std::io::Result<Spares> {
        let mut spares = Spares::default();
        for dir in dirs {
            for path in disk.list(&dir.join(SUBDIR))? {
                let n = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.parse::<u64>().ok());
                let kept = spares.by_dir.get(dir).map_or(0, Vec::len);
                match n {
                    Some(n) if kept < MAX_PER_DIR => {
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
                Ok(()) => return emptied(disk.open(path, false)?),
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
        if let Some(spare) = self.detach(disk, path)? {
            // Emptied now, so its space is free at once; `create` checks again.
            file.set_len(0)?;
            self.keep(spare);
        }
        Ok(())
    }

    /// Takes the chunk file `path` out of its name, holding the data gate: renamed to a new
    /// spare, returned to be emptied (by [`Spares::retire`] at once, or by the reclaimer of a
    /// removed file outside the gate) and handed to [`Spares::keep`]; deleted (None) when a
    /// snapshot shares it or its directory has no room; None when it does not exist (a hole,
    /// or cut before a crash).
    pub fn detach(&mut self, disk: &dyn Disk, path: &Path) -> std::io::Result<Option<PathBuf>> {
        let shared = match disk.is_shared(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            shared => shared?,
        };
        let dir = path.parent().filter(|dir| !shared && self.has_room(dir));
        let Some(dir) = dir else {
            disk.remove(path)?;
            return Ok(None);
        };
        let spare = dir.join(SUBDIR).join(self.next.to_string());
        self.next += 1;
        disk.rename(path, &spare)?;
        Ok(Some(spare))
    }

    /// Keeps a detached spare, emptied, for the next new chunk of its directory.
    pub fn keep(&mut self, spare: PathBuf) {
        if let Some(dir) = spare.parent().and_then(Path::parent) {
            self.by_dir
                .entry(dir.to_path_buf())
                .or_default()
                .push(spare);
        }
    }

    fn has_room(&self, dir: &Path) -> bool {
        self.by_dir.get(dir).map_or(0, Vec::len) < MAX_PER_DIR
    }
}

/// A spare about to become a chunk, with no bytes: it was emptied when retired, but a crash
/// may have kept the rename and lost the truncation, and a chunk must never show another
/// file's bytes.
fn emptied(file: Arc<dyn DiskFile>) -> std::io::Result<Arc<dyn DiskFile>> {
    if file.size()? > 0 {
        file.set_len(0)?;
    }
    Ok(file)
}
