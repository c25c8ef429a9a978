//! Tenant sessions on the fabric (docs/architecture.md, "Tenant isolation"; docs/fabric.md).
//!
//! Each tenant worker (one per (tenant, volume) on a node) gets what a BlueField-3 gives it: its
//! own protection domain, its own QPs, buffers registered once with least rights, and rkeys
//! that are memory windows bound to one QP for one transfer. Why each piece:
//!
//! - **One PD per worker** ([`TenantSession`]): a window or region of another tenant's PD fails
//!   the NIC's PD check, so a bulk handle can never be replayed across tenants (the confused
//!   deputy of a shared PD).
//! - **Least-rights pools**: the read-landing pool allows peers only RDMA WRITE, the
//!   write-staging pool only RDMA READ, control buffers nothing remote. Registration happens at
//!   open, never on the I/O path.
//! - **Scoped rkeys** ([`ScopedRkey`]): per call, a type-2 window over exactly the call's bytes
//!   with exactly one right, bound to the connection's QP, invalidated after the reply, its key
//!   byte rotated on every bind. rkeys are names, not secrets (ReDMArk): a guessed or leaked one
//!   is useless on any other QP and after its call, and every wrong guess kills the guesser's QP.
//! - **Authenticated connections** ([`Capability`], [`AgentKey`], [`TrustedAgents`]): the
//!   handshake carries a capability signed by the node agent; the [`SessionServer`] checks it
//!   before creating a QP, and its handlers can move data only through their own request's
//!   lease ([`BulkAccess`]).
//! - **Error policy**: a QP with an access error is dead; the [`Connection`] reconnects
//!   with exponential backoff and quarantines a peer after K access errors per minute; caps bound
//!   QPs, MRs, windows and registered bytes per tenant ([`Limits`]).
//! - **Observability**: counters ([`SessionStats`], [`ServerStats`]) and a ring buffer of recent
//!   binds and invalidations ([`LeaseEvent`]); logs only for access errors, quarantines,
//!   reconnects and refused handshakes, never per I/O.
//!
//! Everything is generic over [`RdmaDevice`](crate::RdmaDevice), so the software provider and the
//! verbs provider run the same code. docs/fabric.md ("Tenant sessions") has the wire formats.

mod accept;
pub(crate) mod agent;
mod bounce;
mod capability;
mod connection;
mod error;
mod handler;
mod handshake;
mod lease;
mod link;
mod policy;
mod pool;
mod router;
mod server;
mod server_conn;
mod stats;
mod tenant;
#[cfg(feature = "testing")]
pub mod testing;
pub(crate) mod wire;
mod worker;

pub use agent::{AgentKey, AgentPublicKey, TrustedAgents};
pub use capability::{Capability, CapabilityError, Rights, SignedCapability, unix_now};
#[cfg(feature = "testing")]
pub use connection::Forgery;
pub use connection::{Bulk, Connection, Reply};
pub use error::SessionError;
pub use handler::{BulkAccess, Handler, Request};
pub use lease::ScopedRkey;
pub use policy::{Backoff, Clock, Limits, ManualClock, Quarantine, QuarantinePolicy, SystemClock};
pub use server::{MAX_HANDSHAKES, RunningServer, ServerConfig, SessionServer, ShutdownHandle};
pub use stats::{LeaseEvent, LeaseEventKind, ServerStats, SessionStats};
pub use tenant::{Invalidation, SessionConfig, TenantSession};
pub use wire::{LeaseClaim, LeaseRight, MAX_CONTROL_MESSAGE, PROTOCOL_VERSION};
pub use worker::MAX_PUSHES;

/// Unparks the thread `waiter` names in a locked state once the lock is released: the woken
/// thread, often run at once on this core, locks it first thing.
pub(crate) fn unpark_after<T>(
    guard: std::sync::MutexGuard<'_, T>,
    waiter: impl FnOnce(&T) -> Option<std::thread::Thread>,
) {
    let thread = waiter(&guard);
    drop(guard);
    if let Some(t) = thread {
        t.unpark();
    }
}

/// Locks a mutex, ignoring poisoning: critical sections here leave their data consistent.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
