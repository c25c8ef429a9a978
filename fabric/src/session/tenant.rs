//! [`TenantSession`]: everything one tenant worker (one (tenant, volume) on a node) holds on the
//! fabric: its own protection domain, its buffer pools registered once with least rights, and
//! its connections to engine endpoints.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::capability::SignedCapability;
use super::connection::Connection;
use super::error::SessionError;
use super::lock;
use super::policy::{Backoff, Budget, Clock, Limits, Quarantine, QuarantinePolicy, SystemClock};
use super::pool::SlotPool;
use super::stats::{LeaseEvent, LeaseLog, SessionCounters, SessionStats, bump};
use super::wire::CONTROL_SLOT;
use crate::provider::RdmaDevice;
use crate::verbs::{Access, AsyncEvent};

/// Who invalidates a call's window after the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// The server replies with SEND_WITH_INV naming the window: no extra work request on the
    /// worker (the default; the reply path NVMe-oF and iSER use).
    WithReply,
    /// The worker posts LOCAL_INV on the same QP after the reply and waits for it.
    Local,
}

/// How a session is sized and behaves.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Bytes per bulk buffer slot; the largest single bulk transfer.
    pub slot_size: usize,
    /// Slots of the read-landing pool (peers may only RDMA WRITE there).
    pub read_slots: usize,
    /// Slots of the write-staging pool (peers may only RDMA READ there).
    pub write_slots: usize,
    /// Calls in flight per connection (windows, control buffers and receives per QP).
    pub depth: u16,
    /// Connections whose control buffers are registered at open (at most `limits.max_qps`).
    pub max_connections: usize,
    /// Default bound on a call.
    pub call_timeout: Duration,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Who invalidates windows after the reply.
    pub invalidation: Invalidation,
    /// Per-tenant caps.
    pub limits: Limits,
    /// When to quarantine a server after access errors.
    pub quarantine: QuarantinePolicy,
    /// Reconnect backoff.
    pub backoff: Backoff,
    /// Entries of the bind/invalidate ring buffer.
    pub lease_log: usize,
    /// Time source of the quarantine policy.
    pub clock: Arc<dyn Clock>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            slot_size: 1 << 20,
            read_slots: 8,
            write_slots: 8,
            depth: 16,
            max_connections: 4,
            call_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            invalidation: Invalidation::WithReply,
            limits: Limits::default(),
            quarantine: QuarantinePolicy::default(),
            backoff: Backoff::default(),
            lease_log: 256,
            clock: Arc::new(SystemClock),
        }
    }
}

/// Async events kept for classifying QP failures.
const EVENTS_KEPT: usize = 64;

/// State shared by a session and its connections. Field order is drop order: buffers go before
/// the PD and the device.
pub(crate) struct SessionShared<D: RdmaDevice> {
    pub config: SessionConfig,
    pub tenant: Mutex<String>,
    pub read_pool: Arc<SlotPool<D::Mr>>,
    pub write_pool: Arc<SlotPool<D::Mr>>,
    /// One block per connection: `depth` receive buffers, then `depth` send buffers.
    pub control: Arc<SlotPool<D::Mr>>,
    pub windows: Budget,
    pub counters: SessionCounters,
    pub leases: LeaseLog,
    events: Mutex<VecDeque<AsyncEvent>>,
    quarantine: Mutex<HashMap<SocketAddr, Quarantine>>,
    pub pd: D::Pd,
    pub device: D,
}

impl<D: RdmaDevice> SessionShared<D> {
    /// The last async event of QP `qp_num`, draining the device's queue.
    pub fn qp_event(&self, qp_num: u32) -> Option<AsyncEvent> {
        let mut events = lock(&self.events);
        while let Some(e) = self.device.poll_async_event() {
            if events.len() == EVENTS_KEPT {
                events.pop_front();
            }
            events.push_back(e);
        }
        events.iter().rev().copied().find(|e| match *e {
            AsyncEvent::QpFatal { qp_num: q }
            | AsyncEvent::QpAccessErr { qp_num: q }
            | AsyncEvent::QpReqErr { qp_num: q } => q == qp_num,
        })
    }

    /// Time left and error count, if `peer` is quarantined.
    pub fn quarantined(&self, peer: SocketAddr) -> Option<(Duration, u32)> {
        let now = self.config.clock.now();
        lock(&self.quarantine).get(&peer)?.active(now)
    }

    /// Records an access error of a connection to `peer`; logs and counts a new quarantine.
    pub fn record_access_error(&self, peer: SocketAddr) {
        let now = self.config.clock.now();
        let mut q = lock(&self.quarantine);
        let entry = q.entry(peer).or_default();
        if entry.record(&self.config.quarantine, now) {
            bump(&self.counters.quarantines);
            tracing::warn!(
                tenant = %lock(&self.tenant),
                %peer,
                duration = ?self.config.quarantine.duration,
                "peer quarantined after repeated RDMA access errors"
            );
        }
    }
}

impl<D: RdmaDevice> std::fmt::Debug for SessionShared<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionShared")
            .field("tenant", &*lock(&self.tenant))
            .field("pd", &self.pd)
            .field("counters", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

/// One tenant worker's presence on the fabric: its own PD (never shared), buffer pools
/// registered once, and one connection (one QP) per engine endpoint.
#[derive(Debug)]
pub struct TenantSession<D: RdmaDevice> {
    shared: Arc<SessionShared<D>>,
    connections: Mutex<HashMap<SocketAddr, Weak<Connection<D>>>>,
}

impl<D: RdmaDevice> TenantSession<D> {
    /// Opens a session on `device` (an open of the node's device owned by this worker):
    /// allocates its PD and registers its pools, checking the caps.
    pub fn open(device: D, config: SessionConfig) -> Result<TenantSession<D>, SessionError> {
        let depth = config.depth as usize;
        if depth == 0 || config.slot_size == 0 || config.slot_size > u32::MAX as usize {
            return Err(SessionError::Config(
                "depth and slot_size must be positive (slot_size below 4 GiB)".into(),
            ));
        }
        if config.read_slots == 0 || config.write_slots == 0 || config.max_connections == 0 {
            return Err(SessionError::Config(
                "read_slots, write_slots and max_connections must be positive".into(),
            ));
        }
        let limits = config.limits;
        let over = |resource, requested: u64, limit: u64| {
            (requested > limit).then_some(SessionError::LimitExceeded {
                resource,
                requested,
                limit,
            })
        };
        let block = 2 * depth * CONTROL_SLOT;
        let bytes = (config.read_slots + config.write_slots) as u64 * config.slot_size as u64
            + (config.max_connections * block) as u64;
        if let Some(e) = over("mrs", 3, limits.max_mrs)
            .or_else(|| over("registered_bytes", bytes, limits.max_registered_bytes))
            .or_else(|| over("qps", config.max_connections as u64, limits.max_qps))
        {
            return Err(e);
        }
        let pd = device.alloc_pd()?;
        let region = |slots: usize, size: usize, access: Access| {
            let mr = device.reg_mr(&pd, slots * size, access)?;
            Ok::<_, SessionError>(SlotPool::new(mr, size, slots))
        };
        let landing = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
        let staging = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::MW_BIND;
        let read_pool = region(config.read_slots, config.slot_size, landing)?;
        let write_pool = region(config.write_slots, config.slot_size, staging)?;
        let control = region(config.max_connections, block, Access::LOCAL_WRITE)?;
        Ok(TenantSession {
            shared: Arc::new(SessionShared {
                windows: Budget::new("windows", limits.max_windows),
                counters: SessionCounters::default(),
                leases: LeaseLog::new(config.lease_log),
                events: Mutex::new(VecDeque::new()),
                quarantine: Mutex::new(HashMap::new()),
                tenant: Mutex::new(String::new()),
                read_pool,
                write_pool,
                control,
                pd,
                device,
                config,
            }),
            connections: Mutex::new(HashMap::new()),
        })
    }

    /// The connection to the engine endpoint `server` (one QP per endpoint), established now
    /// with `capability`. If one exists, it is returned and presents `capability` from its
    /// next call on ([`Connection::renew`]).
    pub fn connect(
        &self,
        server: SocketAddr,
        capability: SignedCapability,
    ) -> Result<Arc<Connection<D>>, SessionError> {
        if let Ok(claims) = capability.claims() {
            *lock(&self.shared.tenant) = format!("{}/{}", claims.tenant, claims.volume);
        }
        let mut conns = lock(&self.connections);
        conns.retain(|_, c| c.strong_count() > 0);
        if let Some(existing) = conns.get(&server).and_then(Weak::upgrade) {
            existing.renew(capability);
            return Ok(existing);
        }
        let deadline = Instant::now() + self.shared.config.connect_timeout;
        let conn = Arc::new(Connection::establish(
            self.shared.clone(),
            server,
            capability,
            deadline,
        )?);
        conns.insert(server, Arc::downgrade(&conn));
        Ok(conn)
    }

    /// Counters of the session and all its connections.
    pub fn stats(&self) -> SessionStats {
        self.shared.counters.snapshot()
    }

    /// Recent binds and invalidations, oldest first.
    pub fn recent_leases(&self) -> Vec<LeaseEvent> {
        self.shared.leases.recent()
    }

    /// Whether `server` is quarantined: time left and the error count that caused it.
    pub fn quarantined(&self, server: SocketAddr) -> Option<(Duration, u32)> {
        self.shared.quarantined(server)
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.shared.config
    }

    /// The device context.
    pub fn device(&self) -> &D {
        &self.shared.device
    }
}
