//! Snapshots and clones: a point-in-time copy of the metadata store plus hard links to
//! every chunk file. Data is shared until either side writes a chunk, which then copies it
//! first (copy-on-write, `chunks.rs`).

use super::namespace::{Namespace, NamespaceConfig};
use super::{DfsResult, Errno, err};
use redb::Durability;

impl Namespace {
    /// Writes a point-in-time copy of this namespace to `target` (same number
    /// of chunk directories), durably. Open it with `read_only` for a snapshot,
    /// without for a clone.
    pub fn snapshot_to(&self, target: &NamespaceConfig) -> DfsResult<()> {
        if target.chunk_dirs.len() != self.cfg.chunk_dirs.len() {
            return Err(err(
                Errno::Inval,
                "a snapshot needs as many chunk directories as its source",
            ));
        }
        // Every data change stays out until the chunks are linked.
        let (_gate, mut st) = self.quiesce();
        self.sync_dirty(&mut st, None)?;
        self.sync_dirs(&mut st)?;
        let mut flush = self.db.begin_write()?;
        flush.set_durability(Durability::Immediate)?;
        flush.commit()?;
        // An open write transaction holds every metadata writer off while the
        // store is copied; it is aborted, never committed.
        let hold = self.db.begin_write()?;
        let src = self.disk.open(&self.cfg.meta_path, false)?;
        let mut bytes = vec![0; src.size()? as usize];
        src.read_at(0, &mut bytes)?;
        let dst = self.disk.open(&target.meta_path, true)?;
        dst.set_len(0)?;
        dst.write_at(0, &bytes)?;
        dst.sync()?;
        hold.abort()?;
        for (from, to) in self.cfg.chunk_dirs.iter().zip(&target.chunk_dirs) {
            for path in self.disk.list(from)? {
                if path != self.cfg.meta_path
                    && !super::spares::is_spares_dir(&path)
                    && let Some(name) = path.file_name()
                {
                    self.disk.link(&path, &to.join(name))?;
                }
            }
        }
        for dir in target
            .chunk_dirs
            .iter()
            .map(|d| d.as_path())
            .chain(target.meta_path.parent())
        {
            self.disk.sync_dir(dir)?;
            if let Some(up) = dir.parent() {
                self.disk.sync_dir(up)?;
            }
        }
        Ok(())
    }
}
