//! Protection domains, memory regions over memory they own, and type-2 memory windows.

use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ibverbs_sys as sys;

use super::{Ctx, ffi, last_errno, lock, verbs_error};
use crate::error::{DeregError, FabricError, Result};
use crate::keys::key_index;
use crate::provider::{MemoryRegion, MemoryWindow};
use crate::verbs::Access;

/// A protection domain (`ibv_pd`). Deallocated once neither it nor any MR, MW or QP created in
/// it is left.
#[derive(Debug)]
pub struct IbvPd {
    pub(crate) inner: Arc<PdInner>,
}

#[derive(Debug)]
pub(crate) struct PdInner {
    pub ctx: Arc<Ctx>,
    pub raw: *mut sys::ibv_pd,
}

// SAFETY: the PD pointer is only passed to thread-safe verbs, and freed by Drop alone.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl IbvPd {
    pub(crate) fn allocate(ctx: &Arc<Ctx>) -> Result<IbvPd> {
        // SAFETY: valid context.
        let raw = unsafe { sys::ibv_alloc_pd(ctx.raw()) };
        if raw.is_null() {
            return Err(verbs_error("ibv_alloc_pd", last_errno()));
        }
        Ok(IbvPd {
            inner: Arc::new(PdInner {
                ctx: ctx.clone(),
                raw,
            }),
        })
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: the PD came from ibv_alloc_pd; every object in it holds this PdInner, so none
        // is left.
        let rc = unsafe { sys::ibv_dealloc_pd(self.raw) };
        if rc != 0 {
            tracing::error!(errno = rc, "ibv_dealloc_pd failed");
        }
    }
}

/// A memory region registered over page-aligned anonymous memory it owns (`mmap`), with exactly
/// the access flags asked for. Dropping it deregisters it (even with windows bound, which then
/// fail every access); [`RdmaDevice::dereg_mr`](crate::RdmaDevice::dereg_mr) refuses that.
#[derive(Debug)]
pub struct IbvMr {
    ctx: Arc<Ctx>,
    /// Keeps the PD allocated while the region is.
    _pd: Arc<PdInner>,
    /// Null once deregistered.
    raw: *mut sys::ibv_mr,
    buf: *mut u8,
    len: usize,
    map_len: usize,
    iova: u64,
    access: Access,
    lkey: u32,
    rkey: u32,
    /// Windows the provider saw bound over this region and not invalidated yet.
    pub(crate) bound: Arc<AtomicU32>,
}

// SAFETY: the MR and its mapping are only reached through raw-pointer copies and thread-safe
// verbs; they are released by `release`, which needs exclusive access.
unsafe impl Send for IbvMr {}
// SAFETY: as above; shared access never forms references into the device-shared buffer.
unsafe impl Sync for IbvMr {}

impl IbvMr {
    pub(crate) fn register(
        ctx: &Arc<Ctx>,
        pd: &Arc<PdInner>,
        len: usize,
        access: Access,
    ) -> Result<IbvMr> {
        if len == 0 {
            return Err(FabricError::InvalidArgument(
                "zero-length memory region".into(),
            ));
        }
        let map_len = len
            .checked_next_multiple_of(ctx.page)
            .ok_or_else(|| FabricError::InvalidArgument(format!("MR of {len} bytes")))?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let buf = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if buf == libc::MAP_FAILED {
            return Err(FabricError::io(
                format!("mmap {map_len} bytes for an MR"),
                io::Error::last_os_error(),
            ));
        }
        let iova = if access.contains(Access::ZERO_BASED) {
            0
        } else {
            buf as u64
        };
        // SAFETY: valid PD; [buf, buf+len) is mapped and owned by this MR until it is
        // deregistered (the pages are unmapped only after ibv_dereg_mr succeeds).
        let raw = unsafe { sys::ibv_reg_mr_iova2(pd.raw, buf, len, iova, access.bits()) };
        if raw.is_null() {
            let errno = last_errno();
            // SAFETY: the mapping was created above and nothing else refers to it.
            unsafe { libc::munmap(buf, map_len) };
            return Err(verbs_error(
                &format!("ibv_reg_mr({len} bytes, {access:?})"),
                errno,
            ));
        }
        // SAFETY: ibv_reg_mr returned a valid MR.
        let (lkey, rkey) = unsafe { ((*raw).lkey, (*raw).rkey) };
        tracing::debug!(
            rkey = format_args!("{rkey:#x}"),
            len,
            ?access,
            "registered MR"
        );
        Ok(IbvMr {
            ctx: ctx.clone(),
            _pd: pd.clone(),
            raw,
            buf: buf.cast(),
            len,
            map_len,
            iova,
            access,
            lkey,
            rkey,
            bound: Arc::new(AtomicU32::new(0)),
        })
    }

    /// `ibv_dereg_mr`: EBUSY while windows are bound over the region.
    #[allow(clippy::result_large_err)] // the shape of `RdmaDevice::dereg_mr`
    pub(crate) fn deregister(mut self) -> std::result::Result<(), DeregError<IbvMr>> {
        if self.bound.load(Ordering::Acquire) > 0 {
            return Err(DeregError {
                mr: self,
                error: FabricError::Busy("memory windows are bound to the region"),
            });
        }
        match self.release() {
            Ok(()) => Ok(()),
            Err(error) => Err(DeregError { mr: self, error }),
        }
    }

    /// Deregisters, then unmaps. On failure the region stays registered and mapped.
    fn release(&mut self) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        // SAFETY: the MR came from ibv_reg_mr and is deregistered once (raw is nulled below).
        let rc = unsafe { sys::ibv_dereg_mr(self.raw) };
        if rc != 0 {
            return Err(match rc.abs() {
                libc::EBUSY => FabricError::Busy("memory windows are bound to the region"),
                errno => verbs_error("ibv_dereg_mr", errno),
            });
        }
        self.raw = ptr::null_mut();
        // SAFETY: the device can no longer reach the pages; the mapping is ours and unmapped once.
        unsafe { libc::munmap(self.buf.cast(), self.map_len) };
        Ok(())
    }

    /// First byte of the region's memory in this process. The same rules as
    /// [`SoftMr::as_ptr`](crate::soft::SoftMr::as_ptr): the device writes into it, so never form
    /// a Rust reference to it while an operation may be in flight.
    pub fn as_ptr(&self) -> *mut u8 {
        self.buf
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_mr {
        self.raw
    }

    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_some_and(|end| end <= self.len) {
            Ok(())
        } else {
            Err(FabricError::InvalidArgument(format!(
                "range {offset}+{len} outside the {}-byte region",
                self.len
            )))
        }
    }
}

impl Drop for IbvMr {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            // Unmapping memory the device may still reach would be unsound: leak it instead.
            tracing::error!(error = %e, len = self.map_len, "ibv_dereg_mr failed; leaking the pages");
        }
    }
}

impl MemoryRegion for IbvMr {
    fn len(&self) -> usize {
        self.len
    }

    fn lkey(&self) -> u32 {
        self.lkey
    }

    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn addr(&self) -> u64 {
        self.iova
    }

    fn access(&self) -> Access {
        self.access
    }

    unsafe fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        // SAFETY: the range is inside the mapping, which lives as long as self; the buffer is
        // only ever accessed by copying, never through references; no thread of ours races the
        // copy (the caller's promise).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.buf.add(offset), data.len()) };
        Ok(())
    }

    unsafe fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        // SAFETY: as in write_at.
        unsafe { ptr::copy_nonoverlapping(self.buf.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    unsafe fn fill_at(
        &self,
        offset: usize,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<()> {
        self.check_range(offset, len)?;
        // SAFETY: the range is inside the mapping, which lives as long as self, and the caller
        // keeps every other access off it while the slice lives.
        fill(unsafe { std::slice::from_raw_parts_mut(self.buf.add(offset), len) });
        Ok(())
    }
}

/// The provider's view of a window: its current rkey and the region it is bound over.
#[derive(Debug)]
pub(crate) struct MwState {
    rkey: AtomicU32,
    /// Binding count of the region the window is bound over, while bound.
    binding: Mutex<Option<Arc<AtomicU32>>>,
    /// False once deallocated: a late bind completion changes nothing.
    alive: AtomicBool,
}

impl MwState {
    /// A bind completed successfully with `rkey` over the region counting `mr_bound`.
    pub fn bound(&self, rkey: u32, mr_bound: &Arc<AtomicU32>) {
        if !self.alive.load(Ordering::Acquire) {
            return;
        }
        let mut binding = lock(&self.binding);
        if binding.is_none() {
            mr_bound.fetch_add(1, Ordering::AcqRel);
            *binding = Some(mr_bound.clone());
        }
        self.rkey.store(rkey, Ordering::Release);
    }

    /// The window became free: invalidated with `rkey` (if it is the current one), or
    /// deallocated (`None`).
    pub fn unbind(&self, rkey: Option<u32>) {
        if rkey.is_some_and(|k| k != self.rkey.load(Ordering::Acquire)) {
            return;
        }
        if let Some(count) = lock(&self.binding).take() {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A type-2 memory window (`ibv_alloc_mw(pd, IBV_MW_TYPE_2)`). It starts FREE; a BIND_MW work
/// request binds it to the QP it was posted on. Dropping it deallocates it.
#[derive(Debug)]
pub struct IbvMw {
    ctx: Arc<Ctx>,
    _pd: Arc<PdInner>,
    /// Null once deallocated.
    raw: *mut sys::ibv_mw,
    index: u32,
    pub(crate) state: Arc<MwState>,
}

// SAFETY: the MW pointer is only passed to thread-safe verbs and freed by `release`, which needs
// exclusive access.
unsafe impl Send for IbvMw {}
// SAFETY: as above.
unsafe impl Sync for IbvMw {}

impl IbvMw {
    pub(crate) fn allocate(ctx: &Arc<Ctx>, pd: &Arc<PdInner>) -> Result<IbvMw> {
        // SAFETY: valid PD.
        let raw = unsafe { ffi::dpufs_ibv_alloc_mw(pd.raw, sys::IBV_MW_TYPE_2) };
        if raw.is_null() {
            let errno = last_errno();
            let op = format!(
                "ibv_alloc_mw(IBV_MW_TYPE_2) on {} (device {} type-2B windows; windows may be \
                 missing on virtual and scalable functions, docs/fabric.md, \"Lower-assurance notes\")",
                ctx.name,
                if ctx.mw_type2b {
                    "advertises"
                } else {
                    "does not advertise"
                }
            );
            return Err(verbs_error(&op, errno));
        }
        // SAFETY: ibv_alloc_mw returned a valid window.
        let rkey = unsafe { (*raw).rkey };
        let state = Arc::new(MwState {
            rkey: AtomicU32::new(rkey),
            binding: Mutex::new(None),
            alive: AtomicBool::new(true),
        });
        let index = key_index(rkey);
        ctx.add_window(index, &state);
        Ok(IbvMw {
            ctx: ctx.clone(),
            _pd: pd.clone(),
            raw,
            index,
            state,
        })
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_mw {
        self.raw
    }

    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// `ibv_dealloc_mw`.
    pub(crate) fn deallocate(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        self.state.alive.store(false, Ordering::Release);
        self.ctx.remove_window(self.index, &self.state);
        // SAFETY: the window came from ibv_alloc_mw and is deallocated once (raw is nulled).
        let rc = unsafe { ffi::dpufs_ibv_dealloc_mw(self.raw) };
        self.raw = ptr::null_mut();
        // Deallocation invalidates a bound window (or the window is gone with its binding).
        self.state.unbind(None);
        if rc != 0 {
            return Err(verbs_error("ibv_dealloc_mw", rc));
        }
        Ok(())
    }
}

impl Drop for IbvMw {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::error!(error = %e, "ibv_dealloc_mw failed");
        }
    }
}

impl MemoryWindow for IbvMw {
    fn rkey(&self) -> u32 {
        self.state.rkey.load(Ordering::Acquire)
    }
}
