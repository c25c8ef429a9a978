//! Bounce buffers of the server: where RDMA READ data lands and RDMA WRITE data is sent from.
//! Each carries an epoch and an owner so a late completion never touches a buffer that moved on
//! to another request, and a buffer an RMA may still use is freed only with its QP.

use std::sync::{Arc, Mutex};
use std::thread::Thread;

use super::lock;
use super::pool::Slot;
use crate::provider::MemoryRegion;
use crate::verbs::WcStatus;

/// State of one bounce buffer.
#[derive(Debug)]
pub(crate) struct BounceState<M: MemoryRegion> {
    pub epoch: u16,
    pub owner: u32,
    /// Outcome of the RDMA READ in flight into it.
    pub read_done: Option<WcStatus>,
    pub waiter: Option<Thread>,
    /// Held until the reply that follows its RDMA WRITEs completes.
    pub held: Option<Slot<M>>,
}

/// Frees, once a connection's QP is destroyed, the bounce buffers still held for it (RMAs
/// whose completion never came: nothing can land in them any more).
#[derive(Debug)]
pub(crate) struct BounceReleaser<M: MemoryRegion> {
    pub states: BounceStates<M>,
    pub conn: u32,
}

impl<M: MemoryRegion> Drop for BounceReleaser<M> {
    fn drop(&mut self) {
        for state in self.states.iter() {
            let slot = {
                let mut st = lock(state);
                if st.owner != self.conn {
                    continue;
                }
                st.held.take()
            };
            drop(slot);
        }
    }
}

/// Per-bounce-buffer states, shared by the server and its connections.
pub(crate) type BounceStates<M> = Arc<[Mutex<BounceState<M>>]>;
