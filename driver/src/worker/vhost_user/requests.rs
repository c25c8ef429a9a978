//! The requests a vhost-user-fs frontend's guest puts on the virtqueues: taken off a queue
//! under the [`Gate`] (which a stop closes), answered on the request threads by the same
//! fuse-backend-rs `Server` over [`DfsFs`] that serves `/dev/fuse` (with its stats and QoS
//! throttle), and given back to the guest on the used ring.

use super::super::control::Shared;
use super::super::fs::DfsFs;
use super::super::stats::Stats;
use super::{Chain, Memory, Vring};
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter};
use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use vhost_user_backend::VringT;

/// Which requests may still be taken off the queues, and how many taken are unanswered: a
/// stop closes the gate and waits for those.
#[derive(Debug, Default)]
pub(super) struct Gate {
    state: Mutex<GateState>,
    drained: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    stopping: bool,
    in_flight: usize,
}

/// What [`Gate::take`] found.
pub(super) enum Taken<T> {
    /// A request, counted in flight until its [`InFlight`] is dropped.
    Request(T, InFlight),
    /// The queue is empty.
    Empty,
    /// The worker stops: requests stay on the queue.
    Stopping,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the next request with `pop` unless the worker stops. Under the gate's lock, so a
    /// stop either comes first (nothing is taken) or waits for this request.
    pub fn take<T>(self: &Arc<Self>, pop: impl FnOnce() -> Option<T>) -> Taken<T> {
        let mut state = self.lock();
        if state.stopping {
            return Taken::Stopping;
        }
        match pop() {
            Some(request) => {
                state.in_flight += 1;
                Taken::Request(request, InFlight(self.clone()))
            }
            None => Taken::Empty,
        }
    }

    /// Closes the gate and waits until every request taken was answered.
    pub fn close_and_drain(&self) {
        let mut state = self.lock();
        state.stopping = true;
        let _drained = self
            .drained
            .wait_while(state, |s| s.in_flight > 0)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// One request taken and not answered yet (also when its thread panics: dropped then too).
#[derive(Debug)]
pub(super) struct InFlight(Arc<Gate>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            self.0.drained.notify_all();
        }
    }
}

/// A request taken off a queue: its descriptor chain in the guest's memory, and the queue to
/// answer on.
pub(super) struct Request {
    pub chain: Chain,
    pub memory: Arc<Memory>,
    pub vring: Vring,
    pub in_flight: InFlight,
}

/// The request threads: any of them answers any request of any queue.
#[derive(Clone, Debug)]
pub(super) struct Requests {
    queue: Sender<Request>,
}

impl Requests {
    /// Starts `threads` request threads; each counts in the worker's live threads.
    pub fn start(
        threads: usize,
        server: Arc<Server<Arc<DfsFs>>>,
        shared: &Arc<Shared>,
    ) -> io::Result<Requests> {
        let (queue, taken) = mpsc::channel::<Request>();
        let taken = Arc::new(Mutex::new(taken));
        for i in 0..threads {
            let (server, shared, taken) = (server.clone(), shared.clone(), taken.clone());
            std::thread::Builder::new()
                .name(format!("virtio-fs-{i}"))
                .spawn(move || {
                    let _alive = Alive(&shared);
                    while let Some(request) = next(&taken) {
                        answer(&server, &shared.stats, request);
                    }
                })?;
        }
        Ok(Requests { queue })
    }

    /// Hands `request` to a request thread.
    pub fn submit(&self, request: Request) {
        // The threads live as long as the process: a send fails only after they all
        // panicked, and the dropped request then counts as answered.
        let _ = self.queue.send(request);
    }
}

/// Tells the worker when a request thread ends (it never does unless it panics).
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.thread_ended();
    }
}

fn next(taken: &Mutex<Receiver<Request>>) -> Option<Request> {
    taken.lock().unwrap_or_else(|e| e.into_inner()).recv().ok()
}

/// Answers one request and puts it on the used ring, with the length of the reply (0 for a
/// request that has none, such as FORGET, or that could not be decoded), then interrupts the
/// guest unless it asked not to be (EVENT_IDX).
fn answer(server: &Server<Arc<DfsFs>>, stats: &Stats, request: Request) {
    let Request {
        chain,
        memory,
        vring,
        in_flight: _in_flight,
    } = request;
    let head = chain.head_index();
    let written = handle(server, &memory, chain).unwrap_or_else(|e| {
        tracing::debug!("virtio-fs request not answered: {e}");
        stats.transport_error();
        0
    });
    let mut state = vring.get_mut();
    if let Err(e) = state.add_used(head, written as u32) {
        tracing::warn!("virtio-fs: cannot return descriptor {head} to the guest: {e}");
        return;
    }
    match state.needs_notification() {
        Ok(false) => {}
        Ok(true) | Err(_) => {
            if let Err(e) = state.signal_used_queue() {
                tracing::warn!("virtio-fs: cannot interrupt the guest: {e}");
            }
        }
    }
}

/// The FUSE request in the chain's readable descriptors, answered into its writable ones.
fn handle(server: &Server<Arc<DfsFs>>, memory: &Memory, chain: Chain) -> Result<usize, String> {
    let reader = Reader::from_descriptor_chain(memory, chain.clone())
        .map_err(|e| format!("request: {e}"))?;
    let writer = VirtioFsWriter::new(memory, chain).map_err(|e| format!("reply: {e}"))?;
    server
        .handle_message(reader, writer.into(), None, None)
        .map_err(|e| e.to_string())
}
