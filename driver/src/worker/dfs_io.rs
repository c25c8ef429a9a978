//! Reads and writes of one object, between the transport's buffers and one Dfs call.
//!
//! A `/dev/fuse` request is one buffer of the worker's own. A virtio-fs request is a list of
//! buffers in the guest's memory — often one per page of the guest's page cache — that
//! fuse-backend-rs passes as a vector of slices. Slices that follow one another in the
//! worker's mapping of guest memory are one buffer; scattered ones go through a scratch buffer
//! so that the request is still one Dfs call (one engine round trip), not one per page.

use super::fs::err;
use dpufs_daos::dfs::{Dfs, Oid};
use fuse_backend_rs::file_buf::FileVolatileSlice;
use fuse_backend_rs::file_traits::FileReadWriteVolatile;
use std::cell::RefCell;
use std::io;

/// One object of the backend, read and written at offsets.
pub(super) struct DfsIo<'a> {
    pub dfs: &'a dyn Dfs,
    pub oid: Oid,
    /// The group of a writer without CAP_FSETID: the kernel asks us to clear set-ID bits.
    pub unprivileged: Option<u32>,
}

impl DfsIo<'_> {
    fn read_into(&mut self, bufs: &[FileVolatileSlice], offset: u64) -> io::Result<usize> {
        if let Some(buf) = contiguous(bufs) {
            return self.dfs.read(self.oid, offset, buf).map_err(err);
        }
        with_scratch(total_len(bufs), |scratch| {
            let n = self.dfs.read(self.oid, offset, scratch).map_err(err)?;
            scatter(&scratch[..n], bufs);
            Ok(n)
        })
    }

    fn write_from(&mut self, bufs: &[FileVolatileSlice], offset: u64) -> io::Result<usize> {
        if let Some(data) = contiguous(bufs) {
            self.write(offset, data)?;
            return Ok(data.len());
        }
        with_scratch(total_len(bufs), |scratch| {
            gather(bufs, scratch);
            self.write(offset, scratch)?;
            Ok(scratch.len())
        })
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        match self.unprivileged {
            Some(gid) => self.dfs.write_unprivileged(self.oid, offset, data, gid),
            None => self.dfs.write(self.oid, offset, data),
        }
        .map_err(err)
    }
}

impl FileReadWriteVolatile for DfsIo<'_> {
    fn read_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::ESPIPE))
    }

    fn write_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::ESPIPE))
    }

    fn read_at_volatile(&mut self, slice: FileVolatileSlice, offset: u64) -> io::Result<usize> {
        self.read_into(&[slice], offset)
    }

    fn read_vectored_at_volatile(
        &mut self,
        bufs: &[FileVolatileSlice],
        offset: u64,
    ) -> io::Result<usize> {
        self.read_into(bufs, offset)
    }

    fn write_at_volatile(&mut self, slice: FileVolatileSlice, offset: u64) -> io::Result<usize> {
        self.write_from(&[slice], offset)
    }

    fn write_vectored_at_volatile(
        &mut self,
        bufs: &[FileVolatileSlice],
        offset: u64,
    ) -> io::Result<usize> {
        self.write_from(bufs, offset)
    }
}

fn total_len(bufs: &[FileVolatileSlice]) -> usize {
    bufs.iter().map(FileVolatileSlice::len).sum()
}

/// The slices as one buffer, if each starts where the one before ends.
fn contiguous<'a>(bufs: &[FileVolatileSlice<'a>]) -> Option<&'a mut [u8]> {
    let first = bufs.first()?;
    let mut end = first.as_ptr().wrapping_add(first.len());
    for s in &bufs[1..] {
        if s.as_ptr() != end {
            return None;
        }
        end = end.wrapping_add(s.len());
    }
    // SAFETY: the slices are the request's buffers — the worker's own, or the guest's memory
    // mapped for this request — valid for their lengths while it is served, and they were just
    // checked to follow one another. Guest memory can change under us while it is read or
    // written; the guest only loses its own data if it does that to a request in flight.
    Some(unsafe { std::slice::from_raw_parts_mut(first.as_ptr(), total_len(bufs)) })
}

/// Copies `data` into the slices, in order.
fn scatter(mut data: &[u8], bufs: &[FileVolatileSlice]) {
    for s in bufs {
        let n = s.len().min(data.len());
        // SAFETY: as in `contiguous`; `n` is within the slice and within `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.as_ptr(), n) };
        data = &data[n..];
        if data.is_empty() {
            break;
        }
    }
}

/// Copies the slices, in order, into `out` (as long as all of them).
fn gather(bufs: &[FileVolatileSlice], out: &mut [u8]) {
    let mut at = 0;
    for s in bufs {
        // SAFETY: as in `contiguous`; `out` is as long as the slices together.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), out[at..].as_mut_ptr(), s.len()) };
        at += s.len();
    }
}

/// Runs `f` on this thread's scratch buffer, `len` bytes long (kept between requests: a
/// request thread reuses one buffer of the largest request it has seen, at most 1 MiB and a
/// page).
fn with_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    thread_local! {
        static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|scratch| {
        if scratch.len() < len {
            scratch.resize(len, 0);
        }
        f(&mut scratch[..len])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_daos::dfs::LocalDfs;

    fn slice(buf: &mut [u8]) -> FileVolatileSlice<'_> {
        // SAFETY: the buffer outlives the slice and nothing else uses it meanwhile.
        unsafe { FileVolatileSlice::from_raw_ptr(buf.as_mut_ptr(), buf.len()) }
    }

    /// A file of 10 000 bytes, read and written through scattered and adjacent slices.
    #[test]
    fn scattered_and_adjacent_slices_are_one_read_or_write() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let dfs = LocalDfs::open(dir.path()).unwrap();
        let oid = dfs.lookup(dpufs_daos::dfs::ROOT_OID, "f").unwrap().oid;
        let mut io = DfsIo {
            dfs: &dfs,
            oid,
            unprivileged: None,
        };

        // Scattered: three buffers that are not next to each other.
        let (mut a, mut b, mut c) = (vec![0u8; 4096], vec![0u8; 100], vec![0u8; 8000]);
        let n = io
            .read_vectored_at_volatile(&[slice(&mut a), slice(&mut b), slice(&mut c)], 10)
            .unwrap();
        assert_eq!(n, 9990, "up to the end of the file");
        let got: Vec<u8> = [&a[..], &b[..], &c[..9990 - 4196]].concat();
        assert_eq!(got, data[10..]);

        // Adjacent: two halves of one buffer, written back changed.
        let mut whole: Vec<u8> = data[..6000].iter().map(|x| x ^ 0xff).collect();
        let (left, right) = whole.split_at_mut(2500);
        let n = io
            .write_vectored_at_volatile(&[slice(left), slice(right)], 4000)
            .unwrap();
        assert_eq!(n, 6000);
        let on_disk = std::fs::read(dir.path().join("f")).unwrap();
        assert_eq!(&on_disk[..4000], &data[..4000]);
        assert_eq!(&on_disk[4000..], &whole[..]);

        // Scattered writes land in order too.
        let (mut x, mut y) = (vec![1u8; 3], vec![2u8; 5]);
        io.write_vectored_at_volatile(&[slice(&mut x), slice(&mut y)], 0)
            .unwrap();
        let on_disk = std::fs::read(dir.path().join("f")).unwrap();
        assert_eq!(&on_disk[..8], &[1, 1, 1, 2, 2, 2, 2, 2]);
    }
}
