//! The provider trait: exactly the verbs dpufs uses (docs/fabric.md, "The verbs rules every
//! provider keeps"; "What maps to what" gives the libibverbs call behind each).
//!
//! One [`RdmaDevice`] value is one opened device context (`ibv_context`); its associated types
//! are the verbs objects. Work requests name MRs and windows by reference, so they are generic
//! over the provider's [`RdmaDevice::Mr`] and [`RdmaDevice::Mw`].

use std::fmt::Debug;
use std::time::Duration;

use crate::error::{DeregError, Result};
use crate::verbs::{
    Access, AsyncEvent, DeviceCounters, Endpoint, QpCaps, QpCounters, QpState, QpTransition,
    RecvWr, SendWr, WorkCompletion,
};

/// A send work request of device `D`.
pub type SendWrOf<'a, D> = SendWr<'a, <D as RdmaDevice>::Mr, <D as RdmaDevice>::Mw>;

/// A receive work request of device `D`.
pub type RecvWrOf<'a, D> = RecvWr<'a, <D as RdmaDevice>::Mr>;

/// An opened RDMA device context.
pub trait RdmaDevice: Send + Sync + Debug + Sized + 'static {
    /// Protection domain (`ibv_pd`).
    type Pd: Send + Sync + Debug;
    /// Memory region with the memory it registers (`ibv_mr` plus its buffer).
    type Mr: MemoryRegion;
    /// Type-2 memory window (`ibv_mw`).
    type Mw: MemoryWindow;
    /// Completion queue (`ibv_cq`).
    type Cq: CompletionQueue + Clone;
    /// Reliable-connected queue pair (`ibv_qp` of type `IBV_QPT_RC`).
    type Qp: QueuePair<Self>;

    /// `ibv_alloc_pd`.
    fn alloc_pd(&self) -> Result<Self::Pd>;

    /// Allocates `len` bytes of page-aligned memory and registers it in `pd` with `access`
    /// (`ibv_reg_mr`). Remote write or atomic requires LOCAL_WRITE, as on verbs.
    fn reg_mr(&self, pd: &Self::Pd, len: usize, access: Access) -> Result<Self::Mr>;

    /// `ibv_dereg_mr`. Fails with [`FabricError::Busy`](crate::FabricError::Busy) while windows
    /// are bound over the region, and hands the region back.
    fn dereg_mr(&self, mr: Self::Mr) -> std::result::Result<(), DeregError<Self::Mr>>;

    /// Allocates a type-2 window in `pd` (`ibv_alloc_mw(pd, IBV_MW_TYPE_2)`); it starts FREE.
    fn alloc_mw(&self, pd: &Self::Pd) -> Result<Self::Mw>;

    /// `ibv_dealloc_mw`; a bound window is invalidated first.
    fn dealloc_mw(&self, mw: Self::Mw) -> Result<()>;

    /// `ibv_create_cq`.
    fn create_cq(&self, depth: u32) -> Result<Self::Cq>;

    /// `ibv_create_qp` (RC) in `pd`; the QP starts in RESET.
    fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        caps: QpCaps,
    ) -> Result<Self::Qp>;

    /// Next asynchronous event, if any (`ibv_get_async_event`, non-blocking).
    fn poll_async_event(&self) -> Option<AsyncEvent>;

    /// Device-wide counters.
    fn counters(&self) -> DeviceCounters;
}

/// A registered memory region. The region owns its memory because peers write into it like
/// DMA: its contents may change whenever a remote WRITE or a local READ/receive is in flight,
/// so it is read and written by copying, and only defined once the completion that ended such
/// an operation has been polled.
///
/// What may touch a range at once: DMA (peers, posted work requests, the kernel's socket
/// receives, other processes of the device) is outside Rust's memory model, as it is for a NIC;
/// bytes it changes are unspecified until its completion, never undefined behaviour. Threads of
/// this process are inside it: two copies of one range, one of them a write, must not overlap
/// in time (a data race). The region is `Sync`, so the copies are `unsafe` and their callers
/// say why the range is theirs: the session layer gives every range one owner at a time (a
/// call's send slot, the receive slot being dispatched, a pool slot a call holds).
pub trait MemoryRegion: Send + Sync + Debug {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Local key (only used in SGEs).
    fn lkey(&self) -> u32;
    /// Remote key of the whole region.
    fn rkey(&self) -> u32;
    /// First address of the region in the rkey's address space (0 when zero-based).
    fn addr(&self) -> u64;
    /// Access flags it was registered with.
    fn access(&self) -> Access;
    /// Copies `data` into the region at `offset`.
    ///
    /// # Safety
    /// No other thread of this process reads or writes that range while the copy runs.
    unsafe fn write_at(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies bytes of the region at `offset` into `out`.
    ///
    /// # Safety
    /// No other thread of this process writes that range while the copy runs.
    unsafe fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Lets `fill` write bytes `offset..offset + len` of the region in place: an owner that
    /// produces the data (a server reading a file into its bounce slot) saves the copy
    /// [`write_at`](Self::write_at) would make from a buffer of its own. Fails, without calling
    /// `fill`, when the range is outside the region.
    ///
    /// # Safety
    /// Nothing else may read or write that range — locally, through a posted work request, or
    /// remotely through a key with rights over it — until `fill` returns.
    unsafe fn fill_at(
        &self,
        offset: usize,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<()>;
}

/// A type-2 memory window.
pub trait MemoryWindow: Send + Sync + Debug {
    /// The window's current rkey: after a bind, the window's index with the key byte that bind
    /// supplied.
    fn rkey(&self) -> u32;
}

/// A completion queue. Cloning yields another handle to the same queue.
pub trait CompletionQueue: Send + Sync + Debug {
    /// Moves up to `out.len()` completions into `out`; returns how many (`ibv_poll_cq`).
    fn poll(&self, out: &mut [WorkCompletion]) -> usize;

    /// Waits up to `timeout` for one completion (a completion channel plus poll on verbs).
    fn wait(&self, timeout: Duration) -> Option<WorkCompletion>;
}

/// An RC queue pair of device `D`.
pub trait QueuePair<D: RdmaDevice>: Send + Sync + Debug {
    /// QP number.
    fn qp_num(&self) -> u32;

    /// Current state.
    fn state(&self) -> QpState;

    /// What the peer needs to connect to this QP (exchange it out of band).
    fn endpoint(&self) -> Endpoint;

    /// `ibv_modify_qp`. Go RTR on both sides before either goes RTS.
    fn modify(&self, transition: QpTransition) -> Result<()>;

    /// `ibv_post_send`. In ERROR the request is accepted and completes with `WrFlushErr`.
    fn post_send(&self, wr: SendWrOf<'_, D>) -> Result<()>;

    /// `ibv_post_recv`.
    fn post_recv(&self, wr: RecvWrOf<'_, D>) -> Result<()>;

    /// Counters of this QP.
    fn counters(&self) -> QpCounters;
}
