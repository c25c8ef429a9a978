//! Where a DFS namespace keeps its bytes: the [`Disk`] seam, so the same namespace runs on
//! the local file system ([`RealDisk`]) and, in tests, on a simulated disk that can lose
//! what was not synced (`sim_disk.rs`).

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
    /// Reserves blocks for [offset, offset + len) and extends the length to its end at least;
    /// where the file system cannot reserve, it only extends.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
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
    /// Renames `from` to `to`, creating `to`'s directory (recycled chunk files).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Whether other names share this file (it must be copied before a write).
    fn is_shared(&self, path: &Path) -> io::Result<bool>;
    /// The file's length; None when it does not exist.
    fn size_of(&self, path: &Path) -> io::Result<Option<u64>>;
    /// Files directly in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// Makes the entries of `dir` (files created, linked or removed in it) durable;
    /// a missing directory is fine.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The local file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

/// What direct I/O needs of the offset, the length and the buffer's address (the logical
/// block size of every device we run on is at most this).
pub const DIRECT_IO_ALIGN: usize = 4096;

#[derive(Debug)]
struct RealFile {
    file: std::fs::File,
    /// The same file opened with O_DIRECT, for whole-block transfers: they go between the
    /// caller's buffer and the device without a page-cache copy (the way DAOS moves bulk
    /// data to NVMe), so a large write costs no page allocation and evicts nothing.
    /// `None` where the file system refuses O_DIRECT (tmpfs).
    direct: Option<std::fs::File>,
}

fn is_block_aligned(offset: u64, addr: usize, len: usize) -> bool {
    offset.is_multiple_of(DIRECT_IO_ALIGN as u64)
        && addr.is_multiple_of(DIRECT_IO_ALIGN)
        && len.is_multiple_of(DIRECT_IO_ALIGN)
        && len > 0
}

impl RealFile {
    fn open(path: &Path, create: bool) -> io::Result<RealFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(true).create(create).truncate(false);
        let file = opts.open(path)?;
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        Ok(RealFile { file, direct })
    }

    /// The descriptor for a transfer of `len` bytes at `offset` from or to `addr`: the
    /// direct one when everything is block-aligned.
    fn for_transfer(&self, offset: u64, addr: usize, len: usize) -> Option<&std::fs::File> {
        self.direct
            .as_ref()
            .filter(|_| is_block_aligned(offset, addr, len))
    }
}

/// Whether a direct transfer was refused for its alignment after all (a device with larger
/// blocks): the buffered path then does it.
fn refused_direct(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

fn read_full(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(done)
}

impl DiskFile for RealFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(direct) = self.for_transfer(offset, buf.as_ptr() as usize, buf.len()) {
            // A direct read ends early only at the end of the file (which need not be
            // block-aligned); the rest reads as usual.
            match std::os::unix::fs::FileExt::read_at(direct, buf, offset) {
                Ok(n) if n == buf.len() => return Ok(n),
                Ok(n) => return Ok(n + read_full(&self.file, offset + n as u64, &mut buf[n..])?),
                Err(e) if refused_direct(&e) => {}
                Err(e) => return Err(e),
            }
        }
        read_full(&self.file, offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        if let Some(direct) = self.for_transfer(offset, data.as_ptr() as usize, data.len()) {
            match direct.write_all_at(data, offset) {
                Err(e) if refused_direct(&e) => {}
                done => return done,
            }
        }
        self.file.write_all_at(data, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: plain syscall on an open descriptor; both values fit off_t (checked above).
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, offset as i64, len as i64) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
        // The namespace has counted the space already: the length is what it counts.
        if self.size()? < end {
            self.set_len(end)?;
        }
        Ok(())
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn sync(&self) -> io::Result<()> {
        // Direct writes may still sit in the device's volatile cache: fdatasync flushes it.
        self.file.sync_data()
    }
}

/// Runs `op`, which makes an entry at `path`; if that finds the directory `path` goes in
/// missing (ENOENT), creates the directory and runs `op` again. The directory nearly always
/// exists: making sure of it first cost a failing mkdir and a stat per chunk file created,
/// linked or recycled (two of an unlink's dozen system calls in the engine).
fn in_parent<T>(path: &Path, op: impl Fn() -> io::Result<T>) -> io::Result<T> {
    match op() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => match path.parent() {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                op()
            }
            None => Err(e),
        },
        other => other,
    }
}

impl Disk for RealDisk {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        let file = if create {
            in_parent(path, || RealFile::open(path, true))?
        } else {
            RealFile::open(path, false)?
        };
        Ok(Arc::new(file))
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
        in_parent(to, || std::fs::hard_link(from, to))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        in_parent(to, || std::fs::rename(from, to))
    }
    fn is_shared(&self, path: &Path) -> io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(path)?.nlink() > 1)
    }
    fn size_of(&self, path: &Path) -> io::Result<Option<u64>> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
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
mod real_file_tests {
    use super::*;

    #[test]
    fn entries_are_made_in_directories_that_do_not_exist_yet() {
        let dir = tempfile::tempdir().unwrap();
        let at = |p: &str| dir.path().join(p);
        RealDisk
            .open(&at("a/b/c"), true)
            .unwrap()
            .write_at(0, b"x")
            .unwrap();
        RealDisk.link(&at("a/b/c"), &at("d/e/c")).unwrap();
        RealDisk.rename(&at("d/e/c"), &at("f/g/c")).unwrap();
        assert_eq!(std::fs::read(at("a/b/c")).unwrap(), b"x");
        assert_eq!(std::fs::read(at("f/g/c")).unwrap(), b"x");
        assert!(!at("d/e/c").exists());
        // A missing source is still an error, whatever the target's directory.
        let gone = RealDisk.rename(&at("nothing"), &at("h/c")).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::NotFound);
        let Err(gone) = RealDisk.open(&at("i/c"), false) else {
            panic!("opened a missing file");
        };
        assert_eq!(gone.kind(), io::ErrorKind::NotFound);
        assert!(!at("i").exists(), "an open without create made a directory");
    }

    /// `len` bytes starting on a block boundary inside `backing`.
    fn aligned(backing: &mut Vec<u8>, len: usize) -> &mut [u8] {
        backing.resize(len + DIRECT_IO_ALIGN, 0);
        let start = backing.as_ptr().align_offset(DIRECT_IO_ALIGN);
        &mut backing[start..start + len]
    }

    #[test]
    fn block_aligned_and_unaligned_transfers_see_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let f = RealDisk.open(&dir.path().join("c"), true).unwrap();
        let mut wbuf = Vec::new();
        let block = aligned(&mut wbuf, 3 * DIRECT_IO_ALIGN);
        for (i, b) in block.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        f.write_at(DIRECT_IO_ALIGN as u64, block).unwrap();
        // An unaligned overwrite inside the blocks, then a tail that ends mid-block.
        f.write_at(5000, b"middle").unwrap();
        f.write_at(4 * DIRECT_IO_ALIGN as u64, b"tail").unwrap();
        assert_eq!(f.size().unwrap(), 4 * DIRECT_IO_ALIGN as u64 + 4);

        let mut expect = vec![0u8; 4 * DIRECT_IO_ALIGN + 4];
        expect[DIRECT_IO_ALIGN..4 * DIRECT_IO_ALIGN].copy_from_slice(block);
        expect[5000..5006].copy_from_slice(b"middle");
        expect[4 * DIRECT_IO_ALIGN..].copy_from_slice(b"tail");

        // A whole-block read that runs past the end of the file returns what is there.
        let mut rbuf = Vec::new();
        let whole = aligned(&mut rbuf, 5 * DIRECT_IO_ALIGN);
        let n = f.read_at(0, whole).unwrap();
        assert_eq!(n, expect.len());
        assert_eq!(&whole[..n], &expect[..]);
        // And unaligned reads agree.
        let mut some = vec![0u8; 100];
        assert_eq!(f.read_at(4990, &mut some).unwrap(), 100);
        assert_eq!(&some[..], &expect[4990..5090]);
    }

    #[test]
    fn a_block_write_replaces_what_the_page_cache_held() {
        let dir = tempfile::tempdir().unwrap();
        let f = RealDisk.open(&dir.path().join("c"), true).unwrap();
        f.write_at(0, &vec![1u8; 2 * DIRECT_IO_ALIGN]).unwrap();
        let mut wbuf = Vec::new();
        let block = aligned(&mut wbuf, DIRECT_IO_ALIGN);
        block.fill(9);
        f.write_at(DIRECT_IO_ALIGN as u64, block).unwrap();
        let mut back = vec![0u8; 2 * DIRECT_IO_ALIGN];
        assert_eq!(f.read_at(0, &mut back).unwrap(), back.len());
        assert!(back[..DIRECT_IO_ALIGN].iter().all(|&b| b == 1));
        assert!(back[DIRECT_IO_ALIGN..].iter().all(|&b| b == 9));
    }
}
