//! Where a DFS namespace keeps its bytes. `RealDisk` is the local file
//! system; `SimDisk` (tests) is a simulated disk that remembers what was
//! synced, so a "crash" can throw away everything that was not — which is how
//! the durability tests prove every acknowledged fsync reaches the disk.

use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file on a [`Disk`].
pub trait DiskFile: Send + Sync + Debug {
    /// Reads at `offset`; short reads only at end of file.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Current length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Makes everything written so far durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
}

/// A file system: real or simulated.
pub trait Disk: Send + Sync + Debug {
    /// Opens a file, creating it (and its directory) when `create` is set.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory tree; missing is fine.
    fn remove_tree(&self, path: &Path) -> io::Result<()>;
    /// Links `from` at `to` (copy-on-write snapshots share chunk files).
    fn link(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Whether other names share this file (it must be copied before a write).
    fn is_shared(&self, path: &Path) -> io::Result<bool>;
    /// Files directly in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// Makes the entries of `dir` (files created, linked or removed in it) durable;
    /// a missing directory is fine.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The local file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

#[derive(Debug)]
struct RealFile(std::fs::File);

impl DiskFile for RealFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let mut done = 0;
        while done < buf.len() {
            match self.0.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        Ok(done)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, data, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

impl Disk for RealDisk {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        if create && let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        Ok(Arc::new(RealFile(file)))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
    fn remove_tree(&self, path: &Path) -> io::Result<()> {
        match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::hard_link(from, to)
    }
    fn is_shared(&self, path: &Path) -> io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(path)?.nlink() > 1)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        match std::fs::read_dir(dir) {
            Ok(entries) => entries.map(|e| e.map(|e| e.path())).collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        match std::fs::File::open(dir) {
            Ok(d) => d.sync_all(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Adapts a [`DiskFile`] to redb's storage backend, so metadata and data
/// share one notion of durability.
#[derive(Debug)]
pub struct RedbFile(pub Arc<dyn DiskFile>);

impl redb::StorageBackend for RedbFile {
    fn len(&self) -> io::Result<u64> {
        self.0.size()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        match self.0.read_at(offset, out)? {
            n if n == out.len() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the store",
            )),
        }
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_at(offset, data)
    }
}

#[cfg(test)]
pub use sim::SimDisk;

#[cfg(test)]
mod sim {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// Contents of one simulated file: what the page cache holds, and what
    /// the last sync made durable.
    #[derive(Debug, Default)]
    struct SimContents {
        volatile: Vec<u8>,
        durable: Vec<u8>,
    }

    /// A simulated disk. `crash()` returns the disk as it would be found
    /// after power loss: every file reverted to its last synced contents.
    #[derive(Debug, Default, Clone)]
    pub struct SimDisk {
        files: Arc<Mutex<BTreeMap<PathBuf, Arc<Mutex<SimContents>>>>>,
    }

    #[derive(Debug)]
    struct SimFile(Arc<Mutex<SimContents>>);

    impl DiskFile for SimFile {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
            let c = self.0.lock().expect("sim file");
            let start = (offset as usize).min(c.volatile.len());
            let n = buf.len().min(c.volatile.len() - start);
            buf[..n].copy_from_slice(&c.volatile[start..start + n]);
            Ok(n)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            let mut c = self.0.lock().expect("sim file");
            let end = offset as usize + data.len();
            if c.volatile.len() < end {
                c.volatile.resize(end, 0);
            }
            c.volatile[offset as usize..end].copy_from_slice(data);
            Ok(())
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.0
                .lock()
                .expect("sim file")
                .volatile
                .resize(len as usize, 0);
            Ok(())
        }
        fn size(&self) -> io::Result<u64> {
            Ok(self.0.lock().expect("sim file").volatile.len() as u64)
        }
        fn sync(&self) -> io::Result<()> {
            let mut c = self.0.lock().expect("sim file");
            c.durable = c.volatile.clone();
            Ok(())
        }
    }

    impl SimDisk {
        /// The disk after a power loss: unsynced bytes are gone.
        pub fn crash(&self) -> SimDisk {
            let files = self.files.lock().expect("sim disk");
            let survived = files
                .iter()
                .map(|(p, c)| {
                    let durable = c.lock().expect("sim file").durable.clone();
                    (
                        p.clone(),
                        Arc::new(Mutex::new(SimContents {
                            volatile: durable.clone(),
                            durable,
                        })),
                    )
                })
                .collect();
            SimDisk {
                files: Arc::new(Mutex::new(survived)),
            }
        }
    }

    impl Disk for SimDisk {
        fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
            let mut files = self.files.lock().expect("sim disk");
            match files.get(path) {
                Some(c) => Ok(Arc::new(SimFile(c.clone()))),
                None if create => {
                    let c = Arc::new(Mutex::new(SimContents::default()));
                    files.insert(path.to_path_buf(), c.clone());
                    Ok(Arc::new(SimFile(c)))
                }
                None => Err(io::ErrorKind::NotFound.into()),
            }
        }
        fn remove(&self, path: &Path) -> io::Result<()> {
            self.files.lock().expect("sim disk").remove(path);
            Ok(())
        }
        fn remove_tree(&self, path: &Path) -> io::Result<()> {
            self.files
                .lock()
                .expect("sim disk")
                .retain(|p, _| !p.starts_with(path));
            Ok(())
        }
        fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
            let mut files = self.files.lock().expect("sim disk");
            let c = files.get(from).cloned().ok_or(io::ErrorKind::NotFound)?;
            files.insert(to.to_path_buf(), c);
            Ok(())
        }
        fn is_shared(&self, path: &Path) -> io::Result<bool> {
            let files = self.files.lock().expect("sim disk");
            let c = files.get(path).ok_or(io::ErrorKind::NotFound)?;
            Ok(files.values().filter(|o| Arc::ptr_eq(o, c)).count() > 1)
        }
        fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
            let files = self.files.lock().expect("sim disk");
            Ok(files
                .keys()
                .filter(|p| p.parent() == Some(dir))
                .cloned()
                .collect())
        }
        /// The simulation keeps names durable from creation (it models file contents,
        /// not directory entries), so there is nothing to do.
        fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
            Ok(())
        }
    }
}
