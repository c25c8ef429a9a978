//! [`Connection`]: a tenant session's link to one engine endpoint, and the reconnect policy
//! around it (docs/fabric.md, "Error policy, caps": a failed QP is never repaired; it is
//! replaced, after an exponential backoff, unless the peer is quarantined).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::capability::SignedCapability;
use super::error::SessionError;
use super::handshake;
use super::link::Link;
use super::lock;
use super::stats::bump;
use super::tenant::SessionShared;
#[cfg(feature = "testing")]
use super::wire::LeaseClaim;
use crate::provider::RdmaDevice;

/// The bulk part of a call: where the payload moves by one-sided RMA.
#[derive(Debug)]
pub enum Bulk<'a> {
    /// No payload.
    None,
    /// Data the server pulls with RDMA READ (a write to storage). Copied into a write-staging
    /// slot first.
    ToServer(&'a [u8]),
    /// Room for data the server pushes with RDMA WRITE (a read from storage). It lands in a
    /// read-landing slot and is copied out; the reply says how many bytes.
    FromServer(&'a mut [u8]),
}

impl Bulk<'_> {
    /// Bytes the call leases.
    pub fn len(&self) -> usize {
        match self {
            Bulk::None => 0,
            Bulk::ToServer(d) => d.len(),
            Bulk::FromServer(b) => b.len(),
        }
    }

    /// Whether no bytes are leased.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The answer to a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The server's reply message.
    pub message: Vec<u8>,
    /// Bytes the server pushed into the [`Bulk::FromServer`] buffer (from its start).
    pub bulk_len: usize,
}

/// **Test facility** (feature `testing` only): what a compromised worker could put in its own
/// request header instead of the truth. It gives no power the worker process does not already
/// have (the header is the worker's to write); the attack tests use it to show the server and
/// the NIC checks hold. A build without the feature has no way to send anything but the truth.
#[cfg(feature = "testing")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Forgery {
    /// Request id to send instead of the next one (replays).
    pub request_id: Option<u64>,
    /// Lease to name instead of the call's own (guessed, stale or foreign rkeys).
    pub lease: Option<LeaseClaim>,
    /// Tag to name instead of the call's own (a second request on a tag whose reply the
    /// server has not sent).
    pub tag: Option<u16>,
}

#[derive(Debug, Default)]
struct Reconnect {
    failures: u32,
    next_attempt: Option<Instant>,
    /// After a failed rotation, when to try the next one.
    next_rotation: Option<Instant>,
}

/// A connection to one engine endpoint: one QP at a time, replaced after failures.
///
/// Calls are blocking and may be made from many threads at once; they are pipelined on the QP
/// (up to the session's `depth` in flight) and their replies matched by request id.
pub struct Connection<D: RdmaDevice> {
    shared: Arc<SessionShared<D>>,
    peer: SocketAddr,
    capability: Mutex<SignedCapability>,
    /// A renewed capability waits to be presented: the next call moves the connection to a
    /// new link that presents it ([`Connection::renew`]).
    rotation_due: AtomicBool,
    link: RwLock<Option<Arc<Link<D>>>>,
    reconnect: Mutex<Reconnect>,
}

impl<D: RdmaDevice> std::fmt::Debug for Connection<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer)
            .field("link", &self.current())
            .finish_non_exhaustive()
    }
}

impl<D: RdmaDevice> Connection<D> {
    pub(crate) fn establish(
        shared: Arc<SessionShared<D>>,
        peer: SocketAddr,
        capability: SignedCapability,
        deadline: Instant,
    ) -> Result<Connection<D>, SessionError> {
        let link = handshake::connect(&shared, peer, &capability, deadline)?;
        Ok(Connection {
            shared,
            peer,
            capability: Mutex::new(capability),
            rotation_due: AtomicBool::new(false),
            link: RwLock::new(Some(Arc::new(link))),
            reconnect: Mutex::new(Reconnect::default()),
        })
    }

    /// The server.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Our current QP number, if connected.
    pub fn qp_num(&self) -> Option<u32> {
        self.current().map(|l| l.qp_num())
    }

    /// Whether the current QP is usable (a dead one is replaced by the next call).
    pub fn is_connected(&self) -> bool {
        self.current().is_some_and(|l| l.alive())
    }

    /// Presents `capability` from now on: the next call moves the connection to a new link
    /// that presents it (calls in flight finish on the old one), well before the server
    /// refuses the old link's requests at its capability's expiry. If that link cannot be
    /// made, the old one serves on and the move is tried again after a backoff.
    pub fn renew(&self, capability: SignedCapability) {
        let mut current = lock(&self.capability);
        if *current != capability {
            *current = capability;
            self.rotation_due.store(true, Ordering::Release);
        }
    }

    /// Sends `request` (at most [`MAX_CONTROL_MESSAGE`](super::MAX_CONTROL_MESSAGE) bytes) with
    /// `bulk` and waits for the reply, up to the session's call timeout.
    pub fn call(&self, request: &[u8], bulk: Bulk<'_>) -> Result<Reply, SessionError> {
        self.call_timeout(request, bulk, self.shared.config.call_timeout)
    }

    /// [`Connection::call`] with its own timeout.
    pub fn call_timeout(
        &self,
        request: &[u8],
        bulk: Bulk<'_>,
        timeout: Duration,
    ) -> Result<Reply, SessionError> {
        let mut message = Vec::new();
        let bulk_len = self.call_into(request, bulk, &mut message, timeout)?;
        Ok(Reply { message, bulk_len })
    }

    /// [`Connection::call`] writing the reply message into `reply` (reused, no allocation once
    /// it has grown); returns the bulk length.
    pub fn call_into(
        &self,
        request: &[u8],
        bulk: Bulk<'_>,
        reply: &mut Vec<u8>,
        timeout: Duration,
    ) -> Result<usize, SessionError> {
        self.run(timeout, |link, deadline| {
            link.call(request, bulk, reply, deadline)
        })
    }

    /// **Test facility** (feature `testing`, see [`Forgery`]): a call whose header names what
    /// `forgery` says.
    #[cfg(feature = "testing")]
    pub fn call_forged(
        &self,
        request: &[u8],
        bulk: Bulk<'_>,
        forgery: Forgery,
        timeout: Duration,
    ) -> Result<Reply, SessionError> {
        let mut message = Vec::new();
        let bulk_len = self.run(timeout, |link, deadline| {
            link.call_forged(request, bulk, &mut message, deadline, &forgery)
        })?;
        Ok(Reply { message, bulk_len })
    }

    /// Runs `call` on the live link (reconnecting first if needed) and counts it.
    fn run(
        &self,
        timeout: Duration,
        call: impl FnOnce(&Link<D>, Instant) -> Result<usize, SessionError>,
    ) -> Result<usize, SessionError> {
        let deadline = Instant::now() + timeout;
        bump(&self.shared.counters.calls);
        let result = self
            .usable_link(deadline)
            .and_then(|link| call(&link, deadline));
        if result.is_err() {
            bump(&self.shared.counters.failed_calls);
        }
        result
    }

    fn current(&self) -> Option<Arc<Link<D>>> {
        self.link
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The live link, reconnecting first if the current one died, or moving to a new one
    /// when a renewed capability waits.
    fn usable_link(&self, deadline: Instant) -> Result<Arc<Link<D>>, SessionError> {
        if let Some(link) = self.current().filter(|l| l.alive()) {
            if self.rotation_due.load(Ordering::Acquire) {
                return Ok(self.rotate(link, deadline));
            }
            return Ok(link);
        }
        let mut rc = lock(&self.reconnect);
        if let Some(link) = self.current().filter(|l| l.alive()) {
            return Ok(link);
        }
        let old = self
            .link
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(old) = old {
            // Count and log its failure if no call did (it may have died idle), then let it go:
            // its QP is destroyed once the calls still holding it return.
            old.report_if_dead();
            rc.failures += 1;
            rc.next_attempt = Some(Instant::now() + self.shared.config.backoff.delay(rc.failures));
        }
        if let Some((remaining, errors)) = self.shared.quarantined(self.peer) {
            return Err(SessionError::Quarantined {
                peer: self.peer,
                errors,
                remaining,
            });
        }
        if let Some(at) = rc.next_attempt {
            let now = Instant::now();
            if at > deadline {
                return Err(SessionError::ConnectionLost {
                    peer: self.peer,
                    detail: format!(
                        "reconnecting after {} failures; next attempt in {:?}, after this \
                         call's deadline",
                        rc.failures,
                        at - now
                    ),
                });
            }
            if at > now {
                std::thread::sleep(at - now);
            }
        }
        // A reconnect presents the newest capability: no rotation is left to do.
        self.rotation_due.store(false, Ordering::Release);
        match self.install_new_link(deadline) {
            Ok(link) => {
                rc.failures = 0;
                rc.next_attempt = None;
                bump(&self.shared.counters.reconnects);
                tracing::info!(peer = %self.peer, qp = link.qp_num(), "reconnected");
                Ok(link)
            }
            Err(e) => {
                rc.failures += 1;
                rc.next_attempt =
                    Some(Instant::now() + self.shared.config.backoff.delay(rc.failures));
                Err(e)
            }
        }
    }

    /// Makes a new link presenting the current capability (within the connect timeout and
    /// `deadline`) and makes it the connection's; the caller holds the reconnect lock.
    fn install_new_link(&self, deadline: Instant) -> Result<Arc<Link<D>>, SessionError> {
        let capability = lock(&self.capability).clone();
        let connect_deadline = deadline.min(Instant::now() + self.shared.config.connect_timeout);
        let link = Arc::new(handshake::connect(
            &self.shared,
            self.peer,
            &capability,
            connect_deadline,
        )?);
        *self
            .link
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(link.clone());
        Ok(link)
    }

    /// Moves the connection from `old`, still alive, to a new link presenting the renewed
    /// capability; returns the link this call uses. A failure keeps `old` (its capability
    /// may have a while to run) and retries the move after a backoff.
    fn rotate(&self, old: Arc<Link<D>>, deadline: Instant) -> Arc<Link<D>> {
        let mut rc = lock(&self.reconnect);
        if rc.next_rotation.is_some_and(|at| at > Instant::now()) {
            return old;
        }
        // Cleared before the capability is read: a renewal after this asks again.
        if !self.rotation_due.swap(false, Ordering::AcqRel) {
            // Another call moved first.
            return self.current().filter(|l| l.alive()).unwrap_or(old);
        }
        match self.install_new_link(deadline) {
            Ok(link) => {
                rc.next_rotation = None;
                bump(&self.shared.counters.rotations);
                tracing::info!(
                    peer = %self.peer,
                    qp = link.qp_num(),
                    old_qp = old.qp_num(),
                    "presenting the renewed capability on a new QP"
                );
                link
            }
            Err(e) => {
                self.rotation_due.store(true, Ordering::Release);
                rc.next_rotation = Some(Instant::now() + self.shared.config.backoff.delay(1));
                tracing::warn!(
                    peer = %self.peer,
                    "cannot present the renewed capability yet ({e}); the current QP serves on"
                );
                old
            }
        }
    }
}
