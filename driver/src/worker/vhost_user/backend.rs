//! The device side of one frontend connection: what the vhost-user-backend crate asks a
//! backend (features, queues, memory) and what it calls when the guest kicks a queue.

use super::requests::{Gate, Request, Requests, Taken};
use super::{GuestMemory, Vring};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};

/// virtio-fs's queues: the high-priority queue (FORGET, INTERRUPT), then the request queues.
/// One request queue: what QEMU's `vhost-user-fs-pci` has by default (`num-request-queues`),
/// and all the Linux driver used before it learnt multiqueue (6.11).
const QUEUES: usize = 2;
/// The longest queue a frontend may set up (QEMU's `queue-size` goes up to 1024).
const MAX_QUEUE_SIZE: usize = 1024;

/// `VIRTIO_F_VERSION_1` (bit 32): a modern (virtio 1.0) device, which virtio-fs requires.
const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// `VIRTIO_RING_F_INDIRECT_DESC` (bit 28): a request may be one indirect descriptor table.
const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
/// `VIRTIO_RING_F_EVENT_IDX` (bit 29): the guest and the device say when they want to be
/// woken, instead of at every request and every reply.
const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;

/// The backend of one frontend connection.
pub(super) struct FsBackend {
    /// The guest's memory as the frontend maps it to us (`SET_MEM_TABLE` replaces its
    /// content; it is the same object the daemon was given).
    memory: GuestMemory,
    event_idx: AtomicBool,
    gate: Arc<Gate>,
    requests: Requests,
}

impl FsBackend {
    pub fn new(memory: GuestMemory, gate: Arc<Gate>, requests: Requests) -> FsBackend {
        FsBackend {
            memory,
            event_idx: AtomicBool::new(false),
            gate,
            requests,
        }
    }

    /// Takes every request on `vring` and hands it to the request threads. With EVENT_IDX the
    /// guest kicks only when asked to, so the queue is looked at again after asking (a request
    /// added meanwhile would otherwise wait for the next kick).
    fn take_requests(&self, vring: &Vring) -> io::Result<()> {
        let memory = self.memory.memory().into_inner();
        loop {
            let event_idx = self.event_idx.load(Ordering::Acquire);
            if event_idx {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            loop {
                let pop = || {
                    vring
                        .get_mut()
                        .get_queue_mut()
                        .pop_descriptor_chain(memory.clone())
                };
                match self.gate.take(pop) {
                    Taken::Request(chain, in_flight) => self.requests.submit(Request {
                        chain,
                        memory: memory.clone(),
                        vring: vring.clone(),
                        in_flight,
                    }),
                    Taken::Empty => break,
                    Taken::Stopping => return Ok(()),
                }
            }
            if !event_idx || !vring.enable_notification().map_err(io::Error::other)? {
                return Ok(());
            }
        }
    }
}

impl VhostUserBackend for FsBackend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
            | VIRTIO_RING_F_INDIRECT_DESC
            | VIRTIO_RING_F_EVENT_IDX
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn update_memory(&self, _memory: GuestMemory) -> io::Result<()> {
        // `memory` is ours, already updated by the daemon.
        Ok(())
    }

    /// Lets the acceptor end the queue thread of a connection that is gone.
    fn exit_event(&self, _thread: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK)
            .inspect_err(|e| tracing::warn!("virtio-fs: exit event: {e}"))
            .ok()
    }

    fn handle_event(
        &self,
        queue: u16,
        events: EventSet,
        vrings: &[Vring],
        _thread: usize,
    ) -> io::Result<()> {
        if events != EventSet::IN {
            return Err(io::Error::other(format!(
                "unexpected events {events:?} on queue {queue}"
            )));
        }
        let vring = vrings
            .get(usize::from(queue))
            .ok_or_else(|| io::Error::other(format!("no queue {queue}")))?;
        self.take_requests(vring)
    }
}
