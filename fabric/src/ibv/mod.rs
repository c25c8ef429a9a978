// Over 600 lines: the verbs provider's device, PD, MR and window code over one unsafe boundary.
//! The verbs provider: real ibverbs behind cargo feature `rdma` (docs/architecture.md, "Fabric providers").
//!
//! [`IbvDevice`] implements [`RdmaDevice`] over libibverbs: raw `ibverbs-sys` calls, plus a small
//! C shim (`shim.c`, compiled by build.rs) for the verbs that are `static inline` in
//! `<infiniband/verbs.h>` and so have no binding: `ibv_alloc_mw`, `ibv_dealloc_mw`,
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_query_port` and
//! `ibv_inc_rkey` (bindgen emits no function for a `static inline` one).
//!
//! # Mapping
//!
//! | trait | here |
//! |---|---|
//! | [`IbvDevice::open`] | `ibv_get_device_list`, `ibv_open_device`, `ibv_query_device`, `ibv_query_port`, `ibv_query_gid`; no device → [`FabricError::NoDevice`] |
//! | `alloc_pd` | `ibv_alloc_pd` (freed with `ibv_dealloc_pd` once no MR, MW or QP uses it) |
//! | `reg_mr(pd, len, access)` | anonymous `mmap` owned by the MR, `ibv_reg_mr_iova2` with exactly `access` (iova 0 when `ZERO_BASED`) |
//! | `dereg_mr` | `ibv_dereg_mr`, then `munmap`; EBUSY while windows the provider saw bound are still bound |
//! | `alloc_mw` / `dealloc_mw` | `ibv_alloc_mw(pd, IBV_MW_TYPE_2)` / `ibv_dealloc_mw` |
//! | `create_cq`, `poll`, `wait` | `ibv_create_cq` with its own completion channel, `ibv_poll_cq`, `ibv_req_notify_cq` + `poll(2)` + `ibv_get_cq_event` |
//! | `create_qp` | `ibv_create_qp(IBV_QPT_RC)`, one SGE per work request, random 24-bit start PSN |
//! | `modify(Init/Rtr/Rts/Error/Reset)` | `ibv_modify_qp` with the usual RC attribute masks; `Rtr` takes the peer's [`Endpoint`](crate::Endpoint) |
//! | `state` | `ibv_query_qp(IBV_QP_STATE)` (SQD reads as RTS, SQE as ERROR) |
//! | `post_send(SendOp::…)` | `ibv_post_send` with `IBV_WR_SEND`, `SEND_WITH_INV`, `RDMA_WRITE`, `RDMA_READ`, `BIND_MW`, `LOCAL_INV` |
//! | `post_recv` | `ibv_post_recv` |
//! | `poll_async_event` | `ibv_get_async_event` on the context's async fd set `O_NONBLOCK`, acknowledged at once |
//! | `counters` | sysfs `hw_counters` of the port, else what this context observed |
//!
//! An [`Endpoint`](crate::Endpoint) is 31 bytes: the tag `ibv1`, then big-endian LID (2), GID
//! (16), QP number (4), start PSN (4) and the port's active MTU code (1). The path MTU is the
//! smaller of both sides'. RoCE ports (and peers without a LID) are addressed through the GRH with
//! the chosen GID index.
//!
//! # Work requests and completions
//!
//! Every work request gets a provider-chosen `wr_id`, mapped back to the caller's in the
//! completion, because on an error completion libibverbs leaves `opcode` undefined, while the
//! trait reports it. Send work requests are always posted signaled; successful completions of
//! requests the caller posted unsignaled are consumed by the provider (so size CQs for every
//! outstanding request; `create_qp` grows a CQ with `ibv_resize_cq` when the QPs attached to it
//! could overrun it). A zero-length SGE is posted as no SGE (mlx5 reads length 0 as 2 GiB).
//!
//! Type-2 windows: the consumer chooses the key byte in the bind work request, and the hardware
//! keeps the window's index. The provider tracks each window's binding from the completions it
//! polls (bind, local invalidate, and receives of SEND_WITH_INV), which gives
//! [`MemoryWindow::rkey`](crate::MemoryWindow::rkey) after a bind and the trait's EBUSY rule
//! for `dereg_mr`, whatever the kernel driver itself would allow (IBTA 10.6.7.2.6 leaves it to
//! the implementation; mlx5 lets the deregistration through).
//!
//! # Errors
//!
//! errno values map onto [`FabricError`]: `EBUSY` → `Busy`, `EINVAL` → `InvalidArgument` (or
//! `InvalidTransition` from `ibv_modify_qp`), `ENOMEM` from a post → `QueueFull`, everything
//! else → `Io` naming the verb. Completion statuses map one to one onto [`WcStatus`], except:
//! `LOC_QP_OP_ERR` on a bind or local invalidation is `MwBindErr` (some NICs report bind errors
//! so), otherwise `LocProtErr`, as is `LOC_ACCESS_ERR`; `RNR_RETRY_EXC_ERR` and the fatal or
//! transport statuses (`BAD_RESP_ERR`, `REM_ABORT_ERR`, `FATAL_ERR`, `GENERAL_ERR`, ...) are
//! `RetryExcErr`.
//!
//! # Counters
//!
//! Device counters come from `/sys/class/infiniband/<dev>/ports/<port>/hw_counters` (or the
//! device's `hw_counters`) where the driver has them: `resp_remote_access_errors` on mlx5.
//! Drivers without them (rxe, siw), and the fields no NIC counts (responder invalid requests,
//! bind errors, QPs gone to ERROR), report what this device context observed in its own
//! completions and async events. Per-QP counters are the requester-side bytes of this QP's
//! completed work requests and the access and invalid-request events of this QP; bytes peers
//! write into or read from this QP's memory never pass through software, so `bytes_served` is
//! always 0 and `bytes_received` counts only receives.
//!
//! # Memory
//!
//! An MR's buffer is shared with the device exactly as the software provider's is: read and
//! write it by copying ([`MemoryRegion::read_at`](crate::MemoryRegion::read_at) /
//! [`MemoryRegion::write_at`](crate::MemoryRegion::write_at)) and trust only bytes whose
//! operation has completed. After `ibv_dereg_mr` returns the device can no longer reach the
//! pages, so the MR unmaps them only then; if deregistration fails, the pages are leaked rather
//! than unmapped under the device.

mod cq;
mod ffi;
mod mr;
mod qp;

use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use ibverbs_sys as sys;

pub use cq::IbvCq;
pub use mr::{IbvMr, IbvMw, IbvPd};
pub use qp::IbvQp;

use crate::error::{DeregError, FabricError, Result};
use crate::keys::key_index;
use crate::provider::RdmaDevice;
use crate::verbs::{AsyncEvent, DeviceCounters, QpCaps, WcOpcode, WcStatus, WorkCompletion};
use mr::MwState;
use qp::QpStats;

/// Environment variable naming the RDMA device the verbs conformance suite runs on (e.g.
/// `mlx5_0`); unset, those tests are skipped.
pub const DEVICE_ENV: &str = crate::RDMA_DEVICE_ENV;
/// Environment variable overriding the port [`IbvOptions::from_env`] uses (default 1).
pub const PORT_ENV: &str = "DPUFS_RDMA_PORT";
/// Environment variable overriding the GID index [`IbvOptions::from_env`] uses (default: the
/// first RoCE v2 GID with an IPv4-mapped address, else the first RoCE v2 GID, else 0).
pub const GID_INDEX_ENV: &str = "DPUFS_RDMA_GID_INDEX";

/// Outstanding RDMA READs per QP, as initiator and as responder, at most.
const MAX_RD_ATOMIC: i32 = 16;

/// How to open a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbvOptions {
    /// Device name (`mlx5_0`, `rxe0`, ...); `None` takes the first device.
    pub name: Option<String>,
    /// Port QPs use (ports are numbered from 1).
    pub port: u8,
    /// GID index for RoCE and routed InfiniBand; `None` picks one (see [`GID_INDEX_ENV`]).
    pub gid_index: Option<u8>,
}

impl IbvOptions {
    /// Device `name` (or the first), port 1, GID index picked automatically.
    pub fn new(name: Option<&str>) -> IbvOptions {
        IbvOptions {
            name: name.map(str::to_owned),
            port: 1,
            gid_index: None,
        }
    }

    /// [`IbvOptions::new`] with [`PORT_ENV`] and [`GID_INDEX_ENV`] applied.
    pub fn from_env(name: Option<&str>) -> Result<IbvOptions> {
        let mut opts = IbvOptions::new(name);
        let var = |key: &str| -> Result<Option<u8>> {
            match std::env::var(key) {
                Ok(v) => v.trim().parse().map(Some).map_err(|_| {
                    FabricError::InvalidArgument(format!("{key}={v:?} is not a number 0..=255"))
                }),
                Err(_) => Ok(None),
            }
        };
        if let Some(port) = var(PORT_ENV)? {
            opts.port = port;
        }
        opts.gid_index = var(GID_INDEX_ENV)?;
        Ok(opts)
    }
}

/// An opened RDMA device context (`ibv_context`). Cloning shares the context.
#[derive(Clone, Debug)]
pub struct IbvDevice {
    ctx: Arc<Ctx>,
}

/// What a context knows about its port and tracks for its objects.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// Closes the context when dropped; every object holds the `Ctx`, so that is last.
    handle: ContextHandle,
    name: String,
    port: u8,
    gid_index: u8,
    gid: [u8; 16],
    lid: u16,
    /// RoCE: address peers through the GRH.
    ethernet: bool,
    mtu: sys::ibv_mtu,
    /// `max_rd_atomic` (initiator) and `max_dest_rd_atomic` (responder) of every QP.
    rd_atomic: u8,
    dest_rd_atomic: u8,
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B` is set in the device capabilities.
    mw_type2b: bool,
    page: usize,
    pending: Mutex<Pending>,
    /// Windows of this context by key index, to apply remote invalidations.
    windows: Mutex<HashMap<u32, Weak<MwState>>>,
    /// Counters of live QPs by QP number.
    qps: Mutex<HashMap<u32, Weak<QpStats>>>,
    events: Mutex<VecDeque<AsyncEvent>>,
    seen: Seen,
    /// sysfs directory of hardware counters, if the driver has one.
    hw_counters: Option<PathBuf>,
}

/// The `ibv_context` pointer, closed on drop.
#[derive(Debug)]
struct ContextHandle(*mut sys::ibv_context);

// SAFETY: libibverbs verbs are thread-safe on a context, and the pointer itself is only freed
// by `Drop`, which has exclusive access.
unsafe impl Send for ContextHandle {}
// SAFETY: as above; shared access only passes the pointer to thread-safe verbs.
unsafe impl Sync for ContextHandle {}

impl Drop for ContextHandle {
    fn drop(&mut self) {
        // SAFETY: the context was opened by ibv_open_device and every object created in it holds
        // the `Ctx` owning this handle, so none is left.
        let rc = unsafe { sys::ibv_close_device(self.0) };
        if rc != 0 {
            tracing::error!(errno = rc, "ibv_close_device failed");
        }
    }
}

/// What this context observed (for counters no hardware keeps).
#[derive(Debug, Default)]
struct Seen {
    remote_access_errors: AtomicU64,
    invalid_requests: AtomicU64,
    bind_errors: AtomicU64,
    qp_errors: AtomicU64,
}

/// Work requests posted and not completed yet, by the provider's `wr_id`.
#[derive(Debug, Default)]
struct Pending {
    next: u64,
    map: HashMap<u64, Posted>,
}

/// A posted work request.
#[derive(Debug)]
pub(crate) struct Posted {
    /// The caller's id.
    pub wr_id: u64,
    pub qp_num: u32,
    pub opcode: WcOpcode,
    /// Payload length (send queue).
    pub len: u32,
    /// Whether the caller wants a successful completion.
    pub signaled: bool,
    pub effect: Effect,
}

/// What a successful completion changes in the provider's view of windows.
#[derive(Debug)]
pub(crate) enum Effect {
    None,
    /// The window is now bound with `rkey` over the MR whose binding count is `mr_bound`.
    Bind {
        mw: Arc<MwState>,
        rkey: u32,
        mr_bound: Arc<std::sync::atomic::AtomicU32>,
    },
    /// The window with `rkey` is now free.
    LocalInv {
        rkey: u32,
    },
}

/// Locks a mutex, ignoring poisoning: no critical section here can leave its data inconsistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The errno of the last failed call.
fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Maps an errno value from verb `op` onto a [`FabricError`].
pub(crate) fn verbs_error(op: &str, errno: i32) -> FabricError {
    let errno = errno.abs();
    match errno {
        libc::EBUSY => FabricError::Busy("the object is still in use (EBUSY)"),
        libc::EINVAL => FabricError::InvalidArgument(format!("{op}: EINVAL")),
        _ => FabricError::io(op, io::Error::from_raw_os_error(errno)),
    }
}

/// Maps an errno value from `ibv_post_send` / `ibv_post_recv`.
pub(crate) fn post_error(op: &str, errno: i32) -> FabricError {
    match errno.abs() {
        libc::ENOMEM => FabricError::QueueFull,
        errno => verbs_error(op, errno),
    }
}

/// Sets `O_NONBLOCK` on `fd`.
fn set_nonblocking(fd: i32, what: &str) -> Result<()> {
    // SAFETY: fcntl on a descriptor libibverbs owns; F_GETFL/F_SETFL touch only its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(FabricError::io(
            format!("set O_NONBLOCK on the {what} fd"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The list from `ibv_get_device_list`, freed on drop.
struct DeviceList {
    list: *mut *mut sys::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList> {
        let mut n: i32 = 0;
        // SAFETY: n is a valid out-pointer; the list is freed by Drop.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let errno = last_errno();
            let why = if errno == libc::ENOSYS {
                "ibv_get_device_list failed with ENOSYS (no /sys/class/infiniband); \
                 use the software provider"
                    .to_owned()
            } else {
                format!(
                    "ibv_get_device_list failed with {} ({}); use the software provider",
                    dpufs_proto::dfs::Errno(errno).name(),
                    io::Error::from_raw_os_error(errno)
                )
            };
            return Err(FabricError::NoDevice(why));
        }
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// (name, device) of each device.
    fn devices(&self) -> Vec<(String, *mut sys::ibv_device)> {
        (0..self.len)
            .filter_map(|i| {
                // SAFETY: the list holds `len` valid device pointers while it is not freed.
                let dev = unsafe { *self.list.add(i) };
                if dev.is_null() {
                    return None;
                }
                // SAFETY: dev is a valid device; the name is a NUL-terminated string it owns.
                let name = unsafe { sys::ibv_get_device_name(dev) };
                if name.is_null() {
                    return None;
                }
                // SAFETY: non-null NUL-terminated string valid while the list lives.
                let name = unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned();
                Some((name, dev))
            })
            .collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once; devices that were
        // opened stay valid (their contexts hold them).
        unsafe { sys::ibv_free_device_list(self.list) };
    }
}

/// Names of the RDMA devices present, or why there are none ([`FabricError::NoDevice`]).
pub fn device_names() -> Result<Vec<String>> {
    Ok(DeviceList::get()?
        .devices()
        .into_iter()
        .map(|(name, _)| name)
        .collect())
}

impl IbvDevice {
    /// Opens device `name` (or the first device) on port 1 with the environment overrides of
    /// [`IbvOptions::from_env`]. Without any RDMA device, or without one of that name, it fails
    /// with [`FabricError::NoDevice`] — it never panics.
    pub fn open(name: Option<&str>) -> Result<IbvDevice> {
        IbvDevice::open_with(&IbvOptions::from_env(name)?)
    }

    /// Opens a device with explicit options.
    pub fn open_with(opts: &IbvOptions) -> Result<IbvDevice> {
        let list = DeviceList::get()?;
        let devices = list.devices();
        let (name, dev) = match &opts.name {
            Some(want) => devices
                .iter()
                .find(|(name, _)| name == want)
                .cloned()
                .ok_or_else(|| {
                    let present: Vec<&str> = devices.iter().map(|(n, _)| n.as_str()).collect();
                    FabricError::NoDevice(format!(
                        "no device named {want:?} (present: {})",
                        if present.is_empty() {
                            "none".to_owned()
                        } else {
                            present.join(", ")
                        }
                    ))
                })?,
            None => devices.first().cloned().ok_or_else(|| {
                FabricError::NoDevice(
                    "ibv_get_device_list found no device; use the software provider".into(),
                )
            })?,
        };
        // SAFETY: dev is a valid device of the list, which is still alive.
        let raw = unsafe { sys::ibv_open_device(dev) };
        if raw.is_null() {
            return Err(FabricError::io(
                format!("ibv_open_device({name})"),
                io::Error::last_os_error(),
            ));
        }
        let handle = ContextHandle(raw);
        drop(list);

        let mut dattr = sys::ibv_device_attr {
            ..Default::default()
        };
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { sys::ibv_query_device(raw, &mut dattr) };
        if rc != 0 {
            return Err(verbs_error(&format!("ibv_query_device({name})"), rc));
        }
        if opts.port == 0 || opts.port > dattr.phys_port_cnt {
            return Err(FabricError::InvalidArgument(format!(
                "{name} has ports 1..={}, not {}",
                dattr.phys_port_cnt, opts.port
            )));
        }
        let mut pattr = sys::ibv_port_attr::default();
        // SAFETY: valid context and out-pointer; the shim writes at most the size of the
        // system header's struct, which is not larger than the bindings' (shim_self_check).
        let rc = unsafe { ffi::dpufs_ibv_query_port(raw, opts.port, &mut pattr) };
        if rc != 0 {
            return Err(verbs_error(
                &format!("ibv_query_port({name}, {})", opts.port),
                rc,
            ));
        }
        if pattr.state != sys::ibv_port_state::IBV_PORT_ACTIVE {
            tracing::warn!(device = %name, port = opts.port, state = pattr.state, "port is not active");
        }
        let ethernet = u32::from(pattr.link_layer) == sys::IBV_LINK_LAYER_ETHERNET;
        let gid_index = match opts.gid_index {
            Some(i) => i,
            None => pick_gid_index(raw, &name, opts.port, pattr.gid_tbl_len, ethernet),
        };
        let gid = query_gid(raw, opts.port, gid_index).ok_or_else(|| {
            FabricError::InvalidArgument(format!(
                "{name} port {}: no GID at index {gid_index}",
                opts.port
            ))
        })?;
        // SAFETY: the async fd belongs to the open context.
        set_nonblocking(unsafe { (*raw).async_fd }, "async event")?;
        let rd = |n: i32| n.clamp(0, MAX_RD_ATOMIC) as u8;
        let sysfs = PathBuf::from("/sys/class/infiniband").join(&name);
        let hw_counters = [
            sysfs.join(format!("ports/{}/hw_counters", opts.port)),
            sysfs.join("hw_counters"),
        ]
        .into_iter()
        .find(|p| p.is_dir());
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let ctx = Ctx {
            handle,
            name,
            port: opts.port,
            gid_index,
            gid,
            lid: pattr.lid,
            ethernet,
            mtu: pattr.active_mtu,
            rd_atomic: rd(dattr.max_qp_init_rd_atom),
            dest_rd_atomic: rd(dattr.max_qp_rd_atom),
            mw_type2b: dattr.device_cap_flags & sys::IBV_DEVICE_MEM_WINDOW_TYPE_2B != 0,
            page: page.max(1),
            pending: Mutex::default(),
            windows: Mutex::default(),
            qps: Mutex::default(),
            events: Mutex::default(),
            seen: Seen::default(),
            hw_counters,
        };
        tracing::info!(
            device = %ctx.name,
            port = ctx.port,
            gid_index = ctx.gid_index,
            lid = ctx.lid,
            ethernet = ctx.ethernet,
            mw_type2b = ctx.mw_type2b,
            "opened RDMA device"
        );
        Ok(IbvDevice { ctx: Arc::new(ctx) })
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.ctx.name
    }

    /// Port QPs use.
    pub fn port(&self) -> u8 {
        self.ctx.port
    }

    /// GID index QPs use.
    pub fn gid_index(&self) -> u8 {
        self.ctx.gid_index
    }

    /// Whether the device advertises type-2B memory windows (`IBV_DEVICE_MEM_WINDOW_TYPE_2B`).
    /// NVIDIA documents windows only on physical functions; whether BlueField-3 scalable
    /// functions have them is an open question (docs/fabric.md, "Lower-assurance notes").
    pub fn supports_type2_windows(&self) -> bool {
        self.ctx.mw_type2b
    }

    fn check_pd<'a>(&self, pd: &'a IbvPd) -> Result<&'a Arc<mr::PdInner>> {
        if Arc::ptr_eq(&pd.inner.ctx, &self.ctx) {
            Ok(&pd.inner)
        } else {
            Err(FabricError::InvalidArgument(
                "protection domain of another device context".into(),
            ))
        }
    }
}

/// The GID at `index` of `port`, if any.
fn query_gid(raw: *mut sys::ibv_context, port: u8, index: u8) -> Option<[u8; 16]> {
    let mut gid = sys::ibv_gid::default();
    // SAFETY: valid context and out-pointer.
    let rc = unsafe { sys::ibv_query_gid(raw, port, i32::from(index), &mut gid) };
    // SAFETY: every bit pattern is a valid [u8; 16]; `raw` is the union's byte view.
    (rc == 0).then_some(unsafe { gid.raw })
}

/// On RoCE, the first RoCE v2 GID with an IPv4-mapped address, else the first RoCE v2 GID, else
/// index 0 (RoCE v1 or InfiniBand).
fn pick_gid_index(
    raw: *mut sys::ibv_context,
    name: &str,
    port: u8,
    table_len: i32,
    ethernet: bool,
) -> u8 {
    if !ethernet {
        return 0;
    }
    let mut best: Option<(u8, u8)> = None;
    for index in 0..table_len.clamp(0, 256) {
        let index = index as u8;
        let Some(gid) = query_gid(raw, port, index) else {
            continue;
        };
        if gid == [0; 16] {
            continue;
        }
        let kind = std::fs::read_to_string(format!(
            "/sys/class/infiniband/{name}/ports/{port}/gid_attrs/types/{index}"
        ))
        .unwrap_or_default();
        let v2 = kind.trim().eq_ignore_ascii_case("RoCE v2");
        let ipv4 = gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff];
        let score = u8::from(v2) * 2 + u8::from(ipv4 && v2);
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, index));
        }
    }
    best.map_or(0, |(_, index)| index)
}

impl Ctx {
    pub(crate) fn raw(&self) -> *mut sys::ibv_context {
        self.handle.0
    }

    /// Records a work request about to be posted; returns the `wr_id` to post it with.
    pub(crate) fn track(&self, posted: Posted) -> u64 {
        let mut p = lock(&self.pending);
        p.next = p.next.wrapping_add(1);
        let id = p.next;
        p.map.insert(id, posted);
        id
    }

    /// Forgets a work request whose post failed.
    pub(crate) fn untrack(&self, id: u64) {
        lock(&self.pending).map.remove(&id);
    }

    /// Forgets every work request of a QP that was reset or destroyed (no completions follow).
    pub(crate) fn forget_qp_work(&self, qp_num: u32) {
        lock(&self.pending).map.retain(|_, p| p.qp_num != qp_num);
    }

    pub(crate) fn add_qp(&self, qp_num: u32, stats: &Arc<QpStats>) {
        lock(&self.qps).insert(qp_num, Arc::downgrade(stats));
    }

    pub(crate) fn remove_qp(&self, qp_num: u32, stats: &Arc<QpStats>) {
        let mut qps = lock(&self.qps);
        if qps
            .get(&qp_num)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(stats)))
        {
            qps.remove(&qp_num);
        }
    }

    fn qp_stats(&self, qp_num: u32) -> Option<Arc<QpStats>> {
        lock(&self.qps).get(&qp_num).and_then(Weak::upgrade)
    }

    pub(crate) fn add_window(&self, index: u32, state: &Arc<MwState>) {
        lock(&self.windows).insert(index, Arc::downgrade(state));
    }

    pub(crate) fn remove_window(&self, index: u32, state: &Arc<MwState>) {
        let mut windows = lock(&self.windows);
        if windows
            .get(&index)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(state)))
        {
            windows.remove(&index);
        }
    }

    /// The window with `rkey` was invalidated (LOCAL_INV or an incoming SEND_WITH_INV).
    fn invalidated(&self, rkey: u32) {
        let mw = lock(&self.windows)
            .get(&key_index(rkey))
            .and_then(Weak::upgrade);
        if let Some(mw) = mw {
            mw.unbind(Some(rkey));
        }
    }

    /// Translates one completion from `ibv_poll_cq`; `None` for a successful completion of an
    /// unsignaled request (or of one the provider no longer tracks).
    pub(crate) fn complete(&self, wc: &sys::ibv_wc) -> Option<WorkCompletion> {
        let Some(posted) = lock(&self.pending).map.remove(&wc.wr_id()) else {
            tracing::warn!(
                wr_id = wc.wr_id(),
                "completion of an untracked work request"
            );
            return None;
        };
        let status = match wc.error() {
            None => WcStatus::Success,
            Some((status, vendor_err)) => {
                let mapped = map_status(status, posted.opcode);
                tracing::debug!(
                    status,
                    vendor_err,
                    ?mapped,
                    qp = posted.qp_num,
                    "error completion"
                );
                mapped
            }
        };
        let success = status == WcStatus::Success;
        let mut invalidated_rkey = None;
        match &posted.effect {
            Effect::Bind { mw, rkey, mr_bound } if success => mw.bound(*rkey, mr_bound),
            Effect::LocalInv { rkey } if success => self.invalidated(*rkey),
            _ => {}
        }
        let with_inv = wc.wc_flags.0 & sys::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0;
        if posted.opcode == WcOpcode::Recv && success && with_inv {
            self.invalidated(wc.imm_data);
            invalidated_rkey = Some(wc.imm_data);
        }
        let byte_len = match posted.opcode {
            WcOpcode::Recv if success => u32::try_from(wc.len()).unwrap_or(u32::MAX),
            WcOpcode::Recv => 0,
            _ => posted.len,
        };
        if status == WcStatus::MwBindErr {
            self.seen.bind_errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(stats) = self.qp_stats(posted.qp_num) {
            stats.completed(posted.opcode, status, u64::from(byte_len));
        }
        if success && !posted.signaled {
            return None;
        }
        Some(WorkCompletion {
            wr_id: posted.wr_id,
            status,
            opcode: posted.opcode,
            byte_len,
            qp_num: posted.qp_num,
            invalidated_rkey,
        })
    }

    /// Moves every pending async event into the queue (the fd is non-blocking).
    pub(crate) fn drain_events(&self) {
        loop {
            let mut ev = sys::ibv_async_event::default();
            // SAFETY: valid context and out-pointer; the fd is non-blocking, so this returns -1
            // (EAGAIN) when nothing is pending.
            if unsafe { sys::ibv_get_async_event(self.raw(), &mut ev) } != 0 {
                break;
            }
            let qp_event = matches!(
                ev.event_type,
                sys::IBV_EVENT_QP_FATAL | sys::IBV_EVENT_QP_REQ_ERR | sys::IBV_EVENT_QP_ACCESS_ERR
            );
            let qp_num = if qp_event {
                // SAFETY: for QP events the union holds the QP, which cannot be destroyed before
                // the event is acknowledged (below).
                let qp = unsafe { ev.element.qp };
                // SAFETY: as above, the QP is alive.
                (!qp.is_null()).then(|| unsafe { (*qp).qp_num })
            } else {
                None
            };
            let event_type = ev.event_type;
            // SAFETY: the event came from ibv_get_async_event and is acknowledged exactly once.
            unsafe { sys::ibv_ack_async_event(&mut ev) };
            let Some(qp_num) = qp_num else {
                tracing::debug!(event_type, "async event");
                continue;
            };
            let stats = self.qp_stats(qp_num);
            let event = match event_type {
                sys::IBV_EVENT_QP_ACCESS_ERR => {
                    self.seen
                        .remote_access_errors
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some(s) = &stats {
                        s.remote_access_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    AsyncEvent::QpAccessErr { qp_num }
                }
                sys::IBV_EVENT_QP_REQ_ERR => {
                    self.seen.invalid_requests.fetch_add(1, Ordering::Relaxed);
                    if let Some(s) = &stats {
                        s.invalid_requests.fetch_add(1, Ordering::Relaxed);
                    }
                    AsyncEvent::QpReqErr { qp_num }
                }
                _ => AsyncEvent::QpFatal { qp_num },
            };
            self.seen.qp_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(?event, device = %self.name, "QP error event");
            lock(&self.events).push_back(event);
        }
    }

    /// A counter from the driver's sysfs `hw_counters`, if it has that one.
    fn hw_counter(&self, name: &str) -> Option<u64> {
        let dir = self.hw_counters.as_ref()?;
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// Maps a completion status of a work request of kind `opcode`.
fn map_status(status: sys::ibv_wc_status::Type, opcode: WcOpcode) -> WcStatus {
    use sys::ibv_wc_status as s;
    match status {
        s::IBV_WC_SUCCESS => WcStatus::Success,
        s::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        s::IBV_WC_LOC_PROT_ERR | s::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocProtErr,
        s::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        s::IBV_WC_MW_BIND_ERR => WcStatus::MwBindErr,
        s::IBV_WC_LOC_QP_OP_ERR if matches!(opcode, WcOpcode::BindMw | WcOpcode::LocalInv) => {
            WcStatus::MwBindErr
        }
        s::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocProtErr,
        s::IBV_WC_REM_INV_REQ_ERR | s::IBV_WC_REM_INV_RD_REQ_ERR => WcStatus::RemInvReqErr,
        s::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        s::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        _ => WcStatus::RetryExcErr,
    }
}

impl RdmaDevice for IbvDevice {
    type Pd = IbvPd;
    type Mr = IbvMr;
    type Mw = IbvMw;
    type Cq = IbvCq;
    type Qp = IbvQp;

    fn alloc_pd(&self) -> Result<IbvPd> {
        IbvPd::allocate(&self.ctx)
    }

    fn reg_mr(&self, pd: &IbvPd, len: usize, access: crate::Access) -> Result<IbvMr> {
        let pd = self.check_pd(pd)?;
        IbvMr::register(&self.ctx, pd, len, access)
    }

    fn dereg_mr(&self, mr: IbvMr) -> std::result::Result<(), DeregError<IbvMr>> {
        mr.deregister()
    }

    fn alloc_mw(&self, pd: &IbvPd) -> Result<IbvMw> {
        let pd = self.check_pd(pd)?;
        IbvMw::allocate(&self.ctx, pd)
    }

    fn dealloc_mw(&self, mw: IbvMw) -> Result<()> {
        mw.deallocate()
    }

    fn create_cq(&self, depth: u32) -> Result<IbvCq> {
        IbvCq::create(&self.ctx, depth)
    }

    fn create_qp(
        &self,
        pd: &IbvPd,
        send_cq: &IbvCq,
        recv_cq: &IbvCq,
        caps: QpCaps,
    ) -> Result<IbvQp> {
        let pd = self.check_pd(pd)?;
        IbvQp::create(&self.ctx, pd, send_cq, recv_cq, caps)
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.ctx.drain_events();
        lock(&self.ctx.events).pop_front()
    }

    fn counters(&self) -> DeviceCounters {
        self.ctx.drain_events();
        let seen = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = &self.ctx.seen;
        DeviceCounters {
            remote_access_errors: self
                .ctx
                .hw_counter("resp_remote_access_errors")
                .unwrap_or_else(|| seen(&s.remote_access_errors)),
            invalid_requests: seen(&s.invalid_requests),
            bind_errors: seen(&s.bind_errors),
            qp_errors: seen(&s.qp_errors),
        }
    }
}

/// Checks, without any RDMA device, that the C shim and the Rust bindings agree: the sizes and
/// field offsets of the structs passed across (`ibv_send_wr`, `ibv_wc`, ...), compiled from the
/// system's libibverbs headers on one side and from ibverbs-sys' vendored rdma-core on the
/// other, and `ibv_inc_rkey` against [`crate::inc_rkey`].
pub fn shim_self_check() -> std::result::Result<(), String> {
    let mut wrong = Vec::new();
    for what in ffi::LAYOUTS {
        let (c, rust) = (ffi::layout(what), ffi::rust_layout(what));
        if c != rust {
            wrong.push(format!("{what:?}: C {c}, Rust {rust}"));
        }
    }
    // ibv_query_port writes C's struct into the bindings' one: C's may only be smaller.
    let (c, rust) = (
        ffi::layout(ffi::Layout::SizeofPortAttr),
        ffi::rust_layout(ffi::Layout::SizeofPortAttr),
    );
    if c > rust {
        wrong.push(format!("SizeofPortAttr: C {c} > Rust {rust}"));
    }
    for rkey in [0u32, 0x1234_56ff, 0xffff_ff00, 0xabcd_ef12] {
        // SAFETY: a pure function of its argument.
        let c = unsafe { ffi::dpufs_ibv_inc_rkey(rkey) };
        if c != crate::inc_rkey(rkey) {
            wrong.push(format!(
                "ibv_inc_rkey({rkey:#x}) = {c:#x}, inc_rkey gives {:#x}",
                crate::inc_rkey(rkey)
            ));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

impl fmt::Display for IbvDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} port {}", self.ctx.name, self.ctx.port)
    }
}
