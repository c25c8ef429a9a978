//! The RDMA-first transport of dpufs (docs/architecture.md, "Fabric providers" and "Tenant isolation").
//!
//! The data plane moves file data only by one-sided RMA into registered memory, and tenant
//! isolation rests on the checks the NIC makes on every incoming RDMA READ/WRITE. This crate has:
//!
//! - [`RdmaDevice`] and its object traits: exactly the verbs dpufs uses — protection domains,
//!   memory regions with access flags, type-2 memory windows (bind, invalidate), RC queue pairs
//!   with the verbs state machine, SEND / RDMA READ / RDMA WRITE / BIND_MW / LOCAL_INV /
//!   SEND_WITH_INV, completion queues, async events and counters.
//! - [`soft`]: the software provider, always built. One device per node whose key table lives
//!   in shared memory, so every process on the node shares one key index space as they share an
//!   HCA; QPs carried over TCP; a responder that makes the NIC's checks in the NIC's order
//!   ([`NicChecks`]) with the NIC's failure semantics.
//! - `conformance` (feature `testing`): one suite of isolation cases, run across real processes
//!   against every provider present, plus the peer process protocol it drives.
//!
//! # The `testing` feature
//!
//! Everything that exists only to test the isolation is behind the cargo feature `testing`,
//! off by default, so a shipped binary has none of it: the `DPUFS_FABRIC_DISABLE_CHECKS` switch
//! and `soft::DeviceOptions::disabled_checks` (without the feature every responder makes every
//! check, whatever the environment or the device file say), `session::Forgery` with
//! `session::Connection::call_forged`, `session::testing`, `conformance`, and the peer binaries
//! of the tests. Tests get it from `[dev-dependencies]` (this crate's own from a dependency on
//! itself); docs/fabric.md says why.
//!
//! # Mapping onto verbs
//!
//! The trait is shaped so the verbs provider (module `ibv`, cargo feature `rdma`) is a thin layer:
//!
//! | trait | libibverbs |
//! |---|---|
//! | `RdmaDevice` value | `ibv_context` from `ibv_open_device` |
//! | `alloc_pd` / `Pd` | `ibv_alloc_pd` |
//! | `reg_mr(pd, len, access)` | allocate page-aligned memory, `ibv_reg_mr` (`Access` bits = `IBV_ACCESS_*`) |
//! | `dereg_mr` (EBUSY hands the MR back) | `ibv_dereg_mr` |
//! | `alloc_mw` / `dealloc_mw` | `ibv_alloc_mw(pd, IBV_MW_TYPE_2)` / `ibv_dealloc_mw` |
//! | `create_cq`, `CompletionQueue::poll` / `wait` | `ibv_create_cq`, `ibv_poll_cq` (+ completion channel) |
//! | `create_qp` | `ibv_create_qp` (`IBV_QPT_RC`) |
//! | `QueuePair::endpoint` + `modify(Rtr { remote })` | out-of-band exchange of LID/GID, QPN, PSN; `ibv_modify_qp` |
//! | `post_send(SendOp::…)` | `ibv_post_send` with `IBV_WR_SEND`, `SEND_WITH_INV`, `RDMA_WRITE`, `RDMA_READ`, `BIND_MW`, `LOCAL_INV` |
//! | `Sge { mr, offset, len }` | `ibv_sge { addr: mr.addr + offset, length, lkey }` |
//! | `MwBind { rkey, .. }` | `ibv_mw_bind_info` + the WR's rkey (see [`inc_rkey`]) |
//! | `poll_async_event` | `ibv_get_async_event` (non-blocking fd) |
//! | counters | `rdma statistic` / sysfs port and hw counters |
//!
//! MW bind, local invalidate and `ibv_inc_rkey` are inline functions in `verbs.h`, so the verbs
//! provider reaches them through the context's ops pointers or a small C shim: bindgen emits no
//! function for a `static inline` one (docs/fabric.md, "Verbs provider").

pub mod checks;
mod choice;
#[cfg(feature = "testing")]
pub mod conformance;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
#[cfg(feature = "rdma")]
pub mod ibv;
mod keys;
mod provider;
pub mod session;
pub mod soft;
mod verbs;

pub use checks::NicChecks;
pub use choice::{Provider, ProviderKind, RDMA_DEVICE_ENV, UseDevice};
pub use error::{DeregError, FabricError, Result};
pub use keys::{KeyGen, MAX_TABLE_ENTRIES, inc_rkey, key_byte, key_index, make_key};
pub use provider::{
    CompletionQueue, MemoryRegion, MemoryWindow, QueuePair, RdmaDevice, RecvWrOf, SendWrOf,
};
pub use verbs::{
    Access, AsyncEvent, DeviceCounters, Endpoint, MwBind, QpCaps, QpCounters, QpState,
    QpTransition, RecvWr, RemoteAddr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
