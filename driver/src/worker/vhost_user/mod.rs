//! The vhost-user-fs transport: the worker is the device side of a virtio-fs device whose
//! frontend — QEMU's `vhost-user-fs-pci`, or DOCA SNAP virtio-fs on a BlueField DPU — connects
//! to its unix socket, maps the guest's memory into the worker (shared memfd), and passes the
//! virtqueues' kick and call eventfds. The guest kernel's virtio-fs driver puts FUSE requests
//! on the queues; the worker answers them with the same `Server<DfsFs>` that serves
//! `/dev/fuse`, so stats, QoS throttle and file-system semantics are the same.
//!
//! - One frontend at a time. A connection is set up by rust-vmm's vhost-user-backend daemon,
//!   fresh per connection (its state — ownership, features, rings, memory — belongs to one
//!   frontend); when the frontend disconnects, the worker goes back to accept the next one on
//!   the same listening socket (QEMU reconnects with `-chardev socket,…,reconnect=N`).
//! - The guest's requests are taken off the queues by the daemon's queue thread and answered
//!   by `--threads` request threads (`requests.rs`), so a request waiting for the engine does
//!   not hold up the others.
//! - A stop takes no more requests and waits for those taken to be answered; the connection
//!   then ends with the process (the frontend sees the socket close).
//! - The listening socket is the worker's own (`--vhost-user-socket`, unlinked at stop) or the
//!   keeper's export, handed over like a FUSE connection, which stays after the worker.

mod backend;
mod requests;

use super::control::Shared;
use super::fs::DfsFs;
use crate::keeper::process::{Wake, poll_readable};
use anyhow::{Result, anyhow};
use backend::FsBackend;
use dpufs_node_api::control::Frontend;
use fuse_backend_rs::api::server::Server;
use requests::{Gate, Requests};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{VhostUserDaemon, VringRwLock};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

/// The guest's memory as mapped into the worker (no dirty-page bitmap: no live migration).
type Memory = GuestMemoryMmap<()>;
/// The guest's memory as the daemon updates it (`SET_MEM_TABLE`).
type GuestMemory = GuestMemoryAtomic<Memory>;
/// One virtqueue.
type Vring = VringRwLock<GuestMemory>;
/// A request: a chain of descriptors in the guest's memory.
type Chain = virtio_queue::DescriptorChain<Arc<Memory>>;

/// The frontend connections, for `health`.
#[derive(Debug, Default)]
pub struct Frontends {
    connected: AtomicBool,
    connections: AtomicU64,
}

impl Frontends {
    /// What `health` reports.
    pub fn status(&self) -> Frontend {
        Frontend {
            connected: self.connected.load(Ordering::Acquire),
            connections: self.connections.load(Ordering::Acquire),
        }
    }

    fn set_connected(&self, connected: bool) {
        if connected {
            self.connections.fetch_add(1, Ordering::AcqRel);
        }
        self.connected.store(connected, Ordering::Release);
    }
}

/// A worker serving a vhost-user-fs socket.
#[derive(Debug)]
pub struct VhostUserServer {
    gate: Arc<Gate>,
    /// Wakes the acceptor to stop.
    stop: Arc<Wake>,
    /// Why the acceptor ended on its own (the listening socket failed).
    failed: Arc<Mutex<Option<String>>>,
    /// The socket file to unlink at stop (when the worker bound it).
    owned_socket: Option<PathBuf>,
}

impl VhostUserServer {
    /// Starts the request threads and the acceptor on `listener`.
    pub(super) fn start(
        listener: UnixListener,
        owned_socket: Option<PathBuf>,
        server: Arc<Server<Arc<DfsFs>>>,
        threads: usize,
        shared: &Arc<Shared>,
        frontends: Arc<Frontends>,
    ) -> io::Result<VhostUserServer> {
        let gate = Arc::new(Gate::default());
        let requests = Requests::start(threads, server, shared)?;
        let stop = Arc::new(Wake::new()?);
        let failed = Arc::new(Mutex::new(None));
        let acceptor = Acceptor {
            listener,
            stop: stop.clone(),
            gate: gate.clone(),
            requests,
            frontends,
        };
        {
            let (shared, failed) = (shared.clone(), failed.clone());
            std::thread::Builder::new()
                .name("vhost-user-accept".into())
                .spawn(move || {
                    if let Err(e) = acceptor.run() {
                        tracing::error!("vhost-user socket: {e}");
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                        shared.request_stop();
                    }
                })?;
        }
        Ok(VhostUserServer {
            gate,
            stop,
            failed,
            owned_socket,
        })
    }

    /// Serves until stopped, then answers the requests taken and takes no more. The
    /// acceptor and a connected frontend's daemon are left to end with the process.
    pub(super) fn wait(self, shared: &Shared) -> Result<()> {
        shared.wait_for_stop();
        self.stop.wake();
        self.gate.close_and_drain();
        if let Some(socket) = &self.owned_socket {
            let _ = std::fs::remove_file(socket);
        }
        match self.failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(e) => Err(anyhow!("the vhost-user socket failed: {e}")),
            None => Ok(()),
        }
    }
}

/// Accepts frontends, one at a time, until the worker stops.
struct Acceptor {
    listener: UnixListener,
    stop: Arc<Wake>,
    gate: Arc<Gate>,
    requests: Requests,
    frontends: Arc<Frontends>,
}

impl Acceptor {
    fn run(self) -> io::Result<()> {
        // The crate's listener accepts on a duplicate: its path is unknown to it, so
        // dropping it unlinks nothing. The socket stays blocking (the mode belongs to the
        // open file the keeper shares), so a connection is waited for with poll(2), where a
        // stop can wake the acceptor.
        let mut accepting = Listener::from(self.listener.try_clone()?);
        loop {
            let ready = poll_readable(&[self.listener.as_fd(), self.stop.fd()], None)?;
            if ready[1] {
                return Ok(());
            }
            self.serve_one(&mut accepting)?;
        }
    }

    /// Accepts one frontend and serves it until it disconnects. Only a failure of the
    /// listening socket is an error; whatever ends a connection ends only that connection.
    fn serve_one(&self, accepting: &mut Listener) -> io::Result<()> {
        let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let backend = Arc::new(FsBackend::new(
            memory.clone(),
            self.gate.clone(),
            self.requests.clone(),
        ));
        let mut daemon = VhostUserDaemon::new("vhost-user-fs".into(), backend, memory)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let accepted = daemon.start(accepting);
        if accepted.is_ok() {
            self.frontends.set_connected(true);
            tracing::info!("vhost-user frontend connected");
            match daemon.wait() {
                Ok(())
                | Err(vhost_user_backend::Error::HandleRequest(
                    VhostUserError::Disconnected | VhostUserError::PartialMessage,
                )) => tracing::info!("vhost-user frontend disconnected"),
                Err(e) => tracing::warn!("vhost-user frontend connection ended: {e}"),
            }
            self.frontends.set_connected(false);
        }
        for queues in daemon.get_epoll_handlers() {
            queues.send_exit_event();
        }
        accepted.map_err(|e| io::Error::other(e.to_string()))
    }
}
