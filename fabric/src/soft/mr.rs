//! Memory regions and type-2 memory windows of the software device, with the bind and
//! invalidate rules of docs/fabric.md, "Type-2 memory windows" (rxe's `rxe_check_bind_mw`, IBTA
//! C10-72..75, o10-37.2.x).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Context;
use super::memory::Memory;
use super::table::{DeviceTable, Fields};
use crate::checks::{ObjectKind, ObjectState};
use crate::error::{DeregError, FabricError, Result};
use crate::keys::{key_byte, key_index, make_key};
use crate::provider::{MemoryRegion, MemoryWindow};
use crate::verbs::{Access, MwBind};

/// A registered memory region owning its page-aligned memory.
///
/// Peers write into it like DMA (see the aliasing rules in the memory module docs): use
/// [`MemoryRegion::write_at`] / [`MemoryRegion::read_at`], or [`SoftMr::as_ptr`] for zero-copy
/// access under the same rules. Dropping it deregisters it, even with windows bound (they then
/// fail every access); [`RdmaDevice::dereg_mr`](crate::RdmaDevice::dereg_mr) refuses that.
#[derive(Debug)]
pub struct SoftMr {
    pub(crate) inner: Arc<MrInner>,
}

#[derive(Debug)]
pub(crate) struct MrInner {
    pub ctx: Arc<Context>,
    pub index: u32,
    pub key: u32,
    pub pd: u32,
    pub access: Access,
    /// First address in the rkey's address space.
    pub iova: u64,
    pub len: usize,
    pub mem_id: u64,
    pub mem: Arc<Memory>,
    registered: AtomicBool,
}

impl SoftMr {
    pub(crate) fn register(
        ctx: &Arc<Context>,
        pd: u32,
        len: usize,
        access: Access,
    ) -> Result<SoftMr> {
        if len == 0 {
            return Err(FabricError::InvalidArgument(
                "zero-length memory region".into(),
            ));
        }
        // verbs: remote write or atomic access requires local write (EINVAL otherwise).
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(FabricError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE".into(),
            ));
        }
        let (index, key) = ctx.table.alloc(ctx.id, ctx.key_gen)?;
        let mem_id = ctx.table.new_mem_id();
        let mem = match Memory::create(&ctx.mem_dir, mem_id, len) {
            Ok(mem) => Arc::new(mem),
            Err(e) => {
                ctx.table.free(index);
                return Err(e);
            }
        };
        let iova = if access.contains(Access::ZERO_BASED) {
            0
        } else {
            mem.as_ptr() as u64
        };
        ctx.add_memory(mem_id, mem.clone());
        ctx.table.update(index, |f| {
            *f = Fields {
                kind: Some(ObjectKind::Mr),
                state: Some(ObjectState::Valid),
                access,
                key,
                pd,
                base: iova,
                len: len as u64,
                mem_id,
                ..Fields::default()
            }
        });
        tracing::debug!(
            key = format_args!("{key:#x}"),
            pd,
            len,
            ?access,
            "registered MR"
        );
        Ok(SoftMr {
            inner: Arc::new(MrInner {
                ctx: ctx.clone(),
                index,
                key,
                pd,
                access,
                iova,
                len,
                mem_id,
                mem,
                registered: AtomicBool::new(true),
            }),
        })
    }

    /// `ibv_dereg_mr`: EBUSY while windows are bound over the region.
    pub(crate) fn deregister(self) -> std::result::Result<(), DeregError<SoftMr>> {
        let table = &self.inner.ctx.table;
        let busy = table
            .update(self.inner.index, |f| {
                if f.bound > 0 {
                    return true;
                }
                f.state = Some(ObjectState::Invalid);
                false
            })
            .unwrap_or(false);
        if busy {
            return Err(DeregError {
                mr: self,
                error: FabricError::Busy("memory windows are bound to the region"),
            });
        }
        self.inner.teardown();
        Ok(())
    }

    /// First byte of the region's memory in this process.
    ///
    /// The memory is shared with the device (remote WRITEs, READ responses and receives land in
    /// it from other threads and processes), so never form a Rust reference to it while such an
    /// operation may be in flight; copy through the pointer, and only rely on bytes an operation
    /// delivered after its completion was polled.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.mem.as_ptr()
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        if offset
            .checked_add(len)
            .is_some_and(|end| end <= self.inner.len)
        {
            Ok(())
        } else {
            Err(FabricError::InvalidArgument(format!(
                "range {offset}+{len} outside the {}-byte region",
                self.inner.len
            )))
        }
    }
}

impl MrInner {
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Acquire)
    }

    /// Frees the key index and the buffer's name. Buffers still referenced by work requests in
    /// flight stay mapped until those finish.
    fn teardown(&self) {
        if self.registered.swap(false, Ordering::AcqRel) {
            self.ctx.remove_memory(self.mem_id);
            self.mem.unlink();
            self.ctx.table.free(self.index);
        }
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.inner.teardown();
    }
}

impl MemoryRegion for SoftMr {
    fn len(&self) -> usize {
        self.inner.len
    }

    fn lkey(&self) -> u32 {
        self.inner.key
    }

    fn rkey(&self) -> u32 {
        self.inner.key
    }

    fn addr(&self) -> u64 {
        self.inner.iova
    }

    fn access(&self) -> Access {
        self.inner.access
    }

    unsafe fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        // SAFETY: the caller keeps this process's other threads off the range.
        unsafe { self.inner.mem.copy_in(offset, data) }
    }

    unsafe fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        // SAFETY: the caller keeps this process's other writers off the range.
        unsafe { self.inner.mem.copy_out(offset, out) }
    }

    unsafe fn fill_at(
        &self,
        offset: usize,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<()> {
        self.check_range(offset, len)?;
        // SAFETY: the caller keeps every other access off the range while `fill` runs.
        unsafe { self.inner.mem.fill(offset, len, fill) }
    }
}

/// A type-2 memory window. It starts FREE; a BIND_MW work request on a QP of its PD binds it
/// to that QP; LOCAL_INV on the same QP or an incoming SEND_WITH_INV makes it FREE again.
/// Dropping it deallocates it.
#[derive(Debug)]
pub struct SoftMw {
    ctx: Arc<Context>,
    index: u32,
    pd: u32,
}

/// The QP a bind or invalidation is executed on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BindingQp {
    pub ctx_uid: u64,
    pub pd: u32,
    pub qp_id: u32,
}

/// Rights a window can carry.
const WINDOW_RIGHTS: Access = Access::from_bits_truncate(
    Access::REMOTE_READ.bits()
        | Access::REMOTE_WRITE.bits()
        | Access::REMOTE_ATOMIC.bits()
        | Access::ZERO_BASED.bits(),
);

impl SoftMw {
    pub(crate) fn allocate(ctx: &Arc<Context>, pd: u32) -> Result<SoftMw> {
        let (index, key) = ctx.table.alloc(ctx.id, ctx.key_gen)?;
        ctx.table.update(index, |f| {
            *f = Fields {
                kind: Some(ObjectKind::Mw),
                state: Some(ObjectState::Free),
                key,
                pd,
                ..Fields::default()
            }
        });
        Ok(SoftMw {
            ctx: ctx.clone(),
            index,
            pd,
        })
    }

    /// Executes a BIND_MW work request posted on `qp`. The error names the broken rule.
    pub(crate) fn bind(
        qp: BindingQp,
        b: &MwBind<'_, SoftMr, SoftMw>,
    ) -> std::result::Result<(), &'static str> {
        let mw = b.mw;
        let mr = &b.mr.inner;
        if mw.ctx.uid != qp.ctx_uid || mr.ctx.uid != qp.ctx_uid {
            return Err("window or region of another device context");
        }
        if mw.pd != qp.pd {
            return Err("C10-72: window and QP in different PDs");
        }
        if b.len == 0 {
            return Err("o10-37.2.40: zero-length bind of a type-2 window");
        }
        if !mr.is_registered() || mr.pd != mw.pd {
            return Err("region not registered in the window's PD");
        }
        if !mr.access.contains(Access::MW_BIND) {
            return Err("C10-73: region lacks MW_BIND");
        }
        if b.access
            .intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !mr.access.contains(Access::LOCAL_WRITE)
        {
            return Err("C10-74: remote write window over a region without LOCAL_WRITE");
        }
        if mr.access.contains(Access::ZERO_BASED) {
            return Err("window over a zero-based region");
        }
        let inside = b.addr >= mr.iova
            && b.addr
                .checked_add(b.len)
                .is_some_and(|end| end <= mr.iova + mr.len as u64);
        if !inside {
            return Err("C10-75: window outside the region");
        }
        let table = &mw.ctx.table;
        // Count the binding on the region first, so a concurrent dereg sees it (EBUSY).
        let counted = table
            .update(mr.index, |f| {
                let ok = f.kind == Some(ObjectKind::Mr)
                    && f.state == Some(ObjectState::Valid)
                    && f.mem_id == mr.mem_id;
                if ok {
                    f.bound += 1;
                }
                ok
            })
            .unwrap_or(false);
        if !counted {
            return Err("region not valid");
        }
        let access = Access::from_bits_truncate(b.access.bits() & WINDOW_RIGHTS.bits());
        let bound = table
            .update(mw.index, |f| {
                if f.kind != Some(ObjectKind::Mw) || f.state != Some(ObjectState::Free) {
                    return false;
                }
                f.state = Some(ObjectState::Valid);
                f.key = make_key(mw.index, key_byte(b.rkey));
                f.access = access;
                f.qp = qp.qp_id;
                f.mr_index = mr.index;
                f.base = if access.contains(Access::ZERO_BASED) {
                    0
                } else {
                    b.addr
                };
                f.len = b.len;
                f.mem_offset = b.addr - mr.iova;
                f.mem_id = mr.mem_id;
                true
            })
            .unwrap_or(false);
        if !bound {
            release_binding(table, mr.index, mr.mem_id);
            return Err("type-2 window already bound (rebind)");
        }
        tracing::debug!(
            rkey = format_args!("{:#x}", make_key(mw.index, key_byte(b.rkey))),
            qp = qp.qp_id,
            len = b.len,
            ?access,
            "bound memory window"
        );
        Ok(())
    }
}

/// Invalidates the type-2 window `rkey` on behalf of `qp`: LOCAL_INV, or an incoming
/// SEND_WITH_INV. Only the QP the window is bound to may do it (another QP gets MW_BIND_ERR).
/// The binding's fields are kept; only the state changes to FREE, so the responder's STATE
/// check alone is what refuses a late access through the same QP.
pub(crate) fn invalidate(
    table: &DeviceTable,
    qp: BindingQp,
    rkey: u32,
) -> std::result::Result<(), &'static str> {
    let outcome = table
        .update(key_index(rkey), |f| {
            if f.kind != Some(ObjectKind::Mw) {
                return Err("no memory window with this key");
            }
            if f.key != rkey {
                return Err("key byte does not match the window");
            }
            if f.pd != qp.pd {
                return Err("window of another PD");
            }
            if f.qp != qp.qp_id {
                return Err("window bound to another QP");
            }
            if f.state != Some(ObjectState::Valid) {
                return Err("window not bound");
            }
            f.state = Some(ObjectState::Free);
            Ok((f.mr_index, f.mem_id))
        })
        .unwrap_or(Err("no memory window with this key"));
    let (mr_index, mem_id) = outcome?;
    release_binding(table, mr_index, mem_id);
    tracing::debug!(
        rkey = format_args!("{rkey:#x}"),
        qp = qp.qp_id,
        "invalidated memory window"
    );
    Ok(())
}

/// Drops one binding from the region's count, if the index still holds that region.
fn release_binding(table: &DeviceTable, mr_index: u32, mem_id: u64) {
    table.update(mr_index, |f| {
        if f.kind == Some(ObjectKind::Mr) && f.mem_id == mem_id && f.bound > 0 {
            f.bound -= 1;
        }
    });
}

impl MemoryWindow for SoftMw {
    fn rkey(&self) -> u32 {
        self.ctx
            .table
            .read(self.index)
            .map_or(make_key(self.index, 0), |f| f.key)
    }
}

impl Drop for SoftMw {
    fn drop(&mut self) {
        let table = &self.ctx.table;
        let binding = table
            .update(self.index, |f| {
                let bound = f.state == Some(ObjectState::Valid);
                // INVALID first, so a racing SEND_WITH_INV cannot release the binding twice.
                f.state = Some(ObjectState::Invalid);
                bound.then_some((f.mr_index, f.mem_id))
            })
            .flatten();
        if let Some((mr_index, mem_id)) = binding {
            release_binding(table, mr_index, mem_id);
        }
        table.free(self.index);
    }
}
