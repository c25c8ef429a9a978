//! Registered buffer pools: one memory region cut into equal slots, registered once when the
//! session (or server) starts, so no registration ever happens on the I/O path (`ibv_reg_mr`
//! pins pages and costs a syscall per call).

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use crate::provider::MemoryRegion;

/// A memory region cut into `slots` slots of `slot_size` bytes.
#[derive(Debug)]
pub(crate) struct SlotPool<M> {
    mr: M,
    slot_size: usize,
    free: Mutex<Vec<u32>>,
    available: Condvar,
}

impl<M: MemoryRegion> SlotPool<M> {
    /// A pool over `mr`, which must hold `slots * slot_size` bytes.
    pub fn new(mr: M, slot_size: usize, slots: usize) -> Arc<SlotPool<M>> {
        debug_assert!(mr.len() >= slots * slot_size);
        // Reversed so slot 0 goes first; the free list is LIFO, which keeps hot slots in cache.
        let free = (0..slots as u32).rev().collect();
        Arc::new(SlotPool {
            mr,
            slot_size,
            free: Mutex::new(free),
            available: Condvar::new(),
        })
    }

    /// Takes a free slot, waiting until `deadline`; `None` if none became free.
    pub fn acquire(self: &Arc<Self>, deadline: Instant) -> Option<Slot<M>> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(index) = free.pop() {
                return Some(Slot {
                    pool: self.clone(),
                    index,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            free = self
                .available
                .wait_timeout(free, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Takes a free slot if there is one.
    pub fn try_acquire(self: &Arc<Self>) -> Option<Slot<M>> {
        let index = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        Some(Slot {
            pool: self.clone(),
            index,
        })
    }

    /// Whether a slot is free.
    pub fn has_free(&self) -> bool {
        !self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    fn release(&self, index: u32) {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(index);
        self.available.notify_one();
    }
}

/// A slot taken from a pool; returned when dropped.
#[derive(Debug)]
pub(crate) struct Slot<M: MemoryRegion> {
    pool: Arc<SlotPool<M>>,
    index: u32,
}

impl<M: MemoryRegion> Slot<M> {
    /// Slot number.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Byte offset of the slot in the region.
    pub fn offset(&self) -> usize {
        self.index as usize * self.pool.slot_size
    }

    /// The pool's region.
    pub fn mr(&self) -> &M {
        &self.pool.mr
    }
}

impl<M: MemoryRegion> Drop for Slot<M> {
    fn drop(&mut self) {
        self.pool.release(self.index);
    }
}
