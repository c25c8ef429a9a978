//! Registered memory: page-aligned, file-backed shared mappings under the device directory.
//!
//! A NIC's DMA engine reaches any registered page on its node, whichever process registered it.
//! To model that, every MR's memory is a file `<device>.mem/<mem id>` that the owner maps and
//! that any responder of the same device can map too. Only the checks stop a responder from
//! touching another context's memory, exactly as on hardware; with a check switched off the
//! software device really does write into another tenant's buffer, which is what the
//! check-switch tests demonstrate.
//!
//! Aliasing rules: the memory is written by the kernel (socket receives into it) and by other
//! processes, like DMA memory. It is therefore never turned into a Rust reference. It is only
//! touched through raw pointers: copies in and out ([`Memory::copy_in`], [`Memory::copy_out`])
//! and the socket system calls of the data path. Contents changed by a remote WRITE or a local
//! READ are defined once that operation's completion has been polled; reading earlier gives
//! unspecified bytes (never undefined behaviour for the reader's own memory). Copies by two
//! threads of one process are Rust accesses and must not race: the copies are `unsafe`, with
//! the rule of `MemoryRegion` (provider.rs).

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{FabricError, Result};

/// One registered buffer's mapping.
#[derive(Debug)]
pub(crate) struct Memory {
    map: MmapRaw,
    /// The backing file, kept open to hand it to a same-device peer (see `channel`).
    file: File,
    path: PathBuf,
}

impl Memory {
    /// Creates and maps a new zero-filled buffer of at least `len` bytes (rounded up to pages).
    pub fn create(dir: &Path, mem_id: u64, len: usize) -> Result<Memory> {
        let path = dir.join(mem_id.to_string());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| FabricError::io(format!("create {}", path.display()), e))?;
        let size = len.div_ceil(page_size()) * page_size();
        file.set_len(size as u64)
            .map_err(|e| FabricError::io("size registered memory", e))?;
        let map = MmapOptions::new()
            .map_raw(&file)
            .map_err(|e| FabricError::io("map registered memory", e))?;
        Ok(Memory { map, file, path })
    }

    /// Maps a buffer whose file a same-device peer handed over.
    pub fn from_fd(file: File) -> Result<Memory> {
        let map = MmapOptions::new()
            .map_raw(&file)
            .map_err(|e| FabricError::io("map a handed-over buffer", e))?;
        Ok(Memory {
            map,
            file,
            path: PathBuf::new(),
        })
    }

    /// The backing file's descriptor.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// False once the owner deregistered the buffer (its file is unlinked then).
    pub fn is_registered(&self) -> bool {
        self.file.metadata().is_ok_and(|m| m.nlink() > 0)
    }

    /// Maps the buffer another context registered as `mem_id`.
    pub fn open(dir: &Path, mem_id: u64) -> Result<Memory> {
        let path = dir.join(mem_id.to_string());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| FabricError::io(format!("open {}", path.display()), e))?;
        let map = MmapOptions::new()
            .map_raw(&file)
            .map_err(|e| FabricError::io("map registered memory", e))?;
        Ok(Memory { map, file, path })
    }

    /// Removes the backing file: the mapping stays valid for whoever holds it, but no other
    /// context can map the buffer any more.
    pub fn unlink(&self) {
        // A missing file only means a reaper got there first.
        let _ = std::fs::remove_file(&self.path);
    }

    /// Pointer to `len` bytes at `offset`, or `None` if the range leaves the mapping. This is
    /// the last guard of the data path (the IOMMU, so to speak): it holds whatever the NIC
    /// checks said, so even with checks switched off nothing outside registered memory is hit.
    pub fn range(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.map.len() as u64 {
            return None;
        }
        // SAFETY: offset + len <= mapping length, so the pointer stays inside the mapping.
        Some(unsafe { self.map.as_mut_ptr().add(offset as usize) })
    }

    /// Copies `data` into the buffer at `offset`.
    ///
    /// # Safety
    /// No other thread of this process reads or writes that range meanwhile
    /// (`MemoryRegion::write_at`).
    pub unsafe fn copy_in(&self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self
            .range(offset as u64, data.len() as u64)
            .ok_or_else(|| out_of_range(offset, data.len()))?;
        // SAFETY: `dst` is valid for data.len() bytes (checked by `range`); the source is a
        // distinct Rust slice, so the regions do not overlap; no thread of ours races the copy
        // (the caller's promise).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copies bytes at `offset` into `out`.
    ///
    /// # Safety
    /// No other thread of this process writes that range meanwhile (`MemoryRegion::read_at`).
    pub unsafe fn copy_out(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self
            .range(offset as u64, out.len() as u64)
            .ok_or_else(|| out_of_range(offset, out.len()))?;
        // SAFETY: `src` is valid for out.len() bytes (checked by `range`) and cannot overlap the
        // caller's exclusive slice; no thread of ours writes it meanwhile (the caller's promise).
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Runs `fill` on `len` bytes at `offset` as a slice.
    ///
    /// # Safety
    /// Nothing else may access the range while `fill` runs.
    pub unsafe fn fill(
        &self,
        offset: usize,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<()> {
        let dst = self
            .range(offset as u64, len as u64)
            .ok_or_else(|| out_of_range(offset, len))?;
        // SAFETY: `dst` is valid for len bytes (checked by `range`), and the caller guarantees
        // no other access to them while the slice lives.
        fill(unsafe { std::slice::from_raw_parts_mut(dst, len) });
        Ok(())
    }

    /// First byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}

fn out_of_range(offset: usize, len: usize) -> FabricError {
    FabricError::InvalidArgument(format!("range {offset}+{len} outside the memory region"))
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}
