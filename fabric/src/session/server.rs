//! [`SessionServer`]: the engine's side of tenant sessions.
//!
//! It owns its own PD and a pool of bounce buffers registered LOCAL_WRITE only: the server
//! grants no remote access at all, and its QPs serve no RDMA READ or WRITE, so nothing a worker
//! sends can reach server memory except its SENDs into receive buffers. It verifies each
//! worker's capability *before* creating a QP, accepts one QP per worker connection, and runs a
//! user [`Handler`] per request on a small pool of worker threads, several requests of one
//! connection at a time. A handler moves data only through the [`BulkAccess`] of its request.
//!
//! The engine calls [`SessionServer::serve`] from a dedicated thread (or [`SessionServer::spawn`]),
//! and stops it with a [`ShutdownHandle`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::accept::{accept, refuse};
use super::agent::{AgentPublicKey, TrustedAgents};
use super::bounce::BounceState;
use super::error::SessionError;
use super::handler::Handler;
use super::lock;
use super::policy::{Clock, QuarantinePolicy, SystemClock};
use super::pool::SlotPool;
use super::router::Router;
use super::server_conn::{Death, Jobs, ServerShared};
use super::stats::{ServerCounters, ServerStats};
use super::wire::Challenge;
use super::worker::{MAX_PUSHES, worker_loop};
use crate::provider::RdmaDevice;
use crate::verbs::Access;

/// Handshakes served at once; a connection beyond them is refused at once ("too many
/// handshakes at once; retry"). Each pending one holds a thread until its hello arrives or
/// `handshake_timeout` passes.
pub const MAX_HANDSHAKES: usize = 32;

/// How a server is sized and behaves.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Worker threads running handlers (and polling the CQ in turns).
    pub workers: usize,
    /// Bounce buffers (each `max_bulk` bytes); one is held per request moving bulk data.
    pub bounce_buffers: usize,
    /// Largest bulk transfer per request.
    pub max_bulk: usize,
    /// Most requests in flight per connection.
    pub max_depth: u16,
    /// Most connections.
    pub max_connections: usize,
    /// Most connections of one tenant.
    pub max_connections_per_tenant: usize,
    /// Clock skew allowed when checking capability expiry.
    pub clock_skew: Duration,
    /// The longest a capability may be valid for from the moment it is presented: a longer
    /// one is refused at the handshake (docs/fabric.md, "Capabilities").
    pub max_capability_lifetime: Duration,
    /// Bound on each handshake step.
    pub handshake_timeout: Duration,
    /// Bound on an RDMA READ a handler waits for.
    pub rma_timeout: Duration,
    /// When to quarantine a (tenant, volume) after access errors.
    pub quarantine: QuarantinePolicy,
    /// Time source of the quarantine policy.
    pub clock: Arc<dyn Clock>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 4,
            bounce_buffers: 16,
            max_bulk: 1 << 20,
            max_depth: 16,
            max_connections: 256,
            max_connections_per_tenant: 32,
            clock_skew: Duration::from_secs(30),
            // A day: the node agent signs for an hour by default and renews at a third.
            max_capability_lifetime: Duration::from_secs(24 * 3600),
            handshake_timeout: Duration::from_secs(5),
            rma_timeout: Duration::from_secs(30),
            quarantine: QuarantinePolicy::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

/// Stops a server: no new connections, workers finish their current request, then every
/// connection is closed.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    flag: Arc<AtomicBool>,
    addr: SocketAddr,
}

impl ShutdownHandle {
    /// Asks the server to stop; [`SessionServer::serve`] returns soon after.
    pub fn shutdown(&self) {
        if self.flag.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the accept loop.
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
    }
}

/// The server of tenant sessions.
pub struct SessionServer<D: RdmaDevice> {
    shared: Arc<ServerShared<D>>,
    listener: TcpListener,
    addr: SocketAddr,
    flag: Arc<AtomicBool>,
}

impl<D: RdmaDevice> std::fmt::Debug for SessionServer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionServer")
            .field("addr", &self.addr)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<D: RdmaDevice> SessionServer<D> {
    /// Binds the handshake listener on `listen` and registers the server's buffers on
    /// `device`. Capabilities are accepted from `trusted` agents only.
    pub fn bind(
        device: D,
        listen: SocketAddr,
        trusted: TrustedAgents,
        handler: impl Handler,
        config: ServerConfig,
    ) -> Result<SessionServer<D>, SessionError> {
        if config.workers == 0 || config.bounce_buffers == 0 || config.max_depth == 0 {
            return Err(SessionError::Config(
                "workers, bounce_buffers and max_depth must be positive".into(),
            ));
        }
        if config.max_bulk == 0 || config.bounce_buffers >= usize::from(u16::MAX) {
            return Err(SessionError::Config(
                "max_bulk must be positive and bounce_buffers below 65535".into(),
            ));
        }
        let pd = device.alloc_pd()?;
        // Every connection's send queue (pushes, a read, the reply per request) and receives.
        let per_conn = usize::from(config.max_depth) * (MAX_PUSHES as usize + 3) + 16;
        let cq_depth = (config.max_connections * per_conn).min(1 << 20);
        let cq = device.create_cq(cq_depth as u32)?;
        // LOCAL_WRITE only: READ responses land here; no peer may touch it.
        let bounce_mr = device.reg_mr(
            &pd,
            config.bounce_buffers * config.max_bulk,
            Access::LOCAL_WRITE,
        )?;
        let bounce = SlotPool::new(bounce_mr, config.max_bulk, config.bounce_buffers);
        let bounce_state = (0..config.bounce_buffers)
            .map(|_| {
                Mutex::new(BounceState {
                    epoch: 0,
                    owner: 0,
                    read_done: None,
                    waiter: None,
                    held: None,
                })
            })
            .collect();
        let listener = TcpListener::bind(listen)
            .map_err(|e| SessionError::io(format!("listen on {listen}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| SessionError::io("listener address", e))?;
        let flag = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(ServerShared {
            handler: Box::new(handler),
            trusted: RwLock::new(trusted),
            conns: RwLock::new(HashMap::new()),
            admitting: Mutex::new(Vec::new()),
            next_conn: AtomicU32::new(1),
            jobs: Mutex::new(Jobs {
                queue: Default::default(),
                idle: Vec::new(),
            }),
            queued: AtomicUsize::new(0),
            router: Router::new(cq.clone()),
            bounce,
            bounce_state,
            bounce_waiters: AtomicUsize::new(0),
            bodies: Mutex::new(Vec::new()),
            counters: ServerCounters::default(),
            quarantine: Mutex::new(HashMap::new()),
            shutdown: flag.clone(),
            handshakes: AtomicUsize::new(0),
            #[cfg(feature = "testing")]
            duplicate_replies: AtomicBool::new(false),
            cq,
            pd,
            device,
            config,
        });
        Ok(SessionServer {
            shared,
            listener,
            addr,
            flag,
        })
    }

    /// The handshake listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        self.shared.counters.snapshot()
    }

    /// Test hook: from now on every reply is sent twice, as a broken or hostile server
    /// might; a client must not lose a receive slot to the second.
    #[cfg(feature = "testing")]
    pub fn duplicate_replies(&self) {
        self.shared.duplicate_replies.store(true, Ordering::Release);
    }

    /// Connections currently established.
    pub fn connections(&self) -> usize {
        self.shared
            .conns
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Trusts another agent key from now on.
    pub fn trust(&self, key: AgentPublicKey) {
        self.shared
            .trusted
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .add(key);
    }

    /// A handle that stops [`SessionServer::serve`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            flag: self.flag.clone(),
            addr: self.addr,
        }
    }

    /// Serves until shut down: starts the workers, accepts handshakes, then closes everything.
    pub fn serve(&self) -> Result<(), SessionError> {
        let mut workers: Vec<JoinHandle<()>> = Vec::new();
        for i in 0..self.shared.config.workers {
            let shared = self.shared.clone();
            let handle = thread::Builder::new()
                .name(format!("session-worker-{i}"))
                .spawn(move || worker_loop(&shared))
                .map_err(|e| SessionError::io("spawn worker", e))?;
            workers.push(handle);
        }
        for stream in self.listener.incoming() {
            if self.flag.load(Ordering::Acquire) {
                break;
            }
            let Ok(stream) = stream else { continue };
            let shared = self.shared.clone();
            if shared.handshakes.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
                shared.handshakes.fetch_sub(1, Ordering::AcqRel);
                let mut stream = stream;
                // Every handshake opens with a challenge; the refusal is the answer.
                let _ = Challenge(rand::random()).write(&mut stream);
                let _ = refuse(&shared, &mut stream, "too many handshakes at once; retry");
                continue;
            }
            let spawned = thread::Builder::new()
                .name("session-handshake".into())
                .spawn(move || {
                    accept(&shared, stream);
                    shared.handshakes.fetch_sub(1, Ordering::AcqRel);
                });
            if spawned.is_err() {
                self.shared.handshakes.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.shared.router.wake_all();
        for t in lock(&self.shared.jobs).idle.drain(..) {
            t.unpark();
        }
        for w in workers {
            let _ = w.join();
        }
        let conns: Vec<_> = self
            .shared
            .conns
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, c)| c)
            .collect();
        for conn in conns {
            self.shared
                .conn_failed(&conn, Death::Transport(crate::WcStatus::WrFlushErr));
        }
        Ok(())
    }

    /// Serves on a thread of its own.
    pub fn spawn(self) -> Result<RunningServer<D>, SessionError> {
        let handle = self.shutdown_handle();
        let server = Arc::new(self);
        let s = server.clone();
        let thread = thread::Builder::new()
            .name("session-server".into())
            .spawn(move || s.serve())
            .map_err(|e| SessionError::io("spawn server", e))?;
        Ok(RunningServer {
            server,
            handle,
            thread: Some(thread),
        })
    }
}

/// A server serving on its own thread; dropping it shuts it down.
#[derive(Debug)]
pub struct RunningServer<D: RdmaDevice> {
    server: Arc<SessionServer<D>>,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<Result<(), SessionError>>>,
}

impl<D: RdmaDevice> RunningServer<D> {
    /// The server (address, counters, trust).
    pub fn server(&self) -> &SessionServer<D> {
        &self.server
    }

    /// Stops the server and waits for it.
    pub fn shutdown(mut self) -> Result<(), SessionError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), SessionError> {
        self.handle.shutdown();
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(SessionError::Shutdown),
            None => Ok(()),
        }
    }
}

impl<D: RdmaDevice> Drop for RunningServer<D> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
