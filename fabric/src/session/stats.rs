//! Observability of tenant sessions and the session server: counters, and a bounded ring buffer
//! of recent binds and invalidations (the audit trail Simpson et al. find missing in RDMA
//! stacks). Nothing here logs; callers log only access errors, quarantines and reconnects.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::keys::{key_byte, key_index};

macro_rules! counters {
    ($(#[$meta:meta])* $atomic:ident => $snapshot:ident { $($(#[$fmeta:meta])* $field:ident),* $(,)? }) => {
        #[derive(Debug, Default)]
        pub(crate) struct $atomic {
            $(pub $field: AtomicU64,)*
        }

        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $snapshot {
            $($(#[$fmeta])* pub $field: u64,)*
        }

        impl $atomic {
            pub fn snapshot(&self) -> $snapshot {
                $snapshot {
                    $($field: self.$field.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

/// Adds one.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n`.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

counters! {
    /// Counters of a [`TenantSession`](super::TenantSession) (all its connections).
    SessionCounters => SessionStats {
        /// Calls started.
        calls,
        /// Calls that failed (any error).
        failed_calls,
        /// Bulk bytes the servers pulled from write-staging buffers.
        bytes_to_server,
        /// Bulk bytes the servers pushed into read-landing buffers.
        bytes_from_server,
        /// Memory-window binds posted.
        binds,
        /// Windows invalidated by the server's SEND_WITH_INV.
        remote_invalidations,
        /// Windows invalidated by our LOCAL_INV.
        local_invalidations,
        /// Connections lost to an RDMA access error.
        access_errors,
        /// Access errors explained by a late RMA after one of our timeouts (not quarantined).
        late_rma_errors,
        /// Connections re-established after a failure.
        reconnects,
        /// Connections moved to a new QP to present a renewed capability.
        rotations,
        /// Peers quarantined.
        quarantines,
        /// Calls that timed out.
        timeouts,
        /// Replies that arrived after their call timed out.
        late_replies,
        /// Requests the server refused.
        refused,
    }
}

counters! {
    /// Counters of a [`SessionServer`](super::SessionServer).
    ServerCounters => ServerStats {
        /// Connections established.
        connections,
        /// Handshakes refused (capability, version, limits, quarantine).
        refused_handshakes,
        /// Requests handed to the handler.
        requests,
        /// Requests refused for a replayed or old request id (no RMA done).
        replays_refused,
        /// Requests refused for other reasons (rights, bulk size; no RMA done).
        requests_refused,
        /// Connections killed by an RDMA access error of their QP.
        access_errors,
        /// Connections killed by a malformed message.
        protocol_errors,
        /// Bytes pulled with RDMA READ.
        bytes_pulled,
        /// Bytes pushed with RDMA WRITE.
        bytes_pushed,
        /// Tenants quarantined.
        quarantines,
    }
}

/// What happened to a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEventKind {
    /// Bound for a call.
    Bind,
    /// Invalidated by the server's SEND_WITH_INV with the reply.
    RemoteInvalidate,
    /// Invalidated by our LOCAL_INV after the reply.
    LocalInvalidate,
    /// Revoked with LOCAL_INV after the call timed out.
    Revoke,
}

/// One entry of the lease log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseEvent {
    /// What happened.
    pub kind: LeaseEventKind,
    /// The window's rkey at that point (index and key byte).
    pub rkey: u32,
    /// The window's bind generation.
    pub generation: u64,
    /// The QP the window is bound to.
    pub qp_num: u32,
    /// When.
    pub at: Instant,
}

impl LeaseEvent {
    /// Key index of the window.
    pub fn key_index(&self) -> u32 {
        key_index(self.rkey)
    }

    /// Key byte of the binding.
    pub fn key_byte(&self) -> u8 {
        key_byte(self.rkey)
    }
}

/// Bounded ring buffer of recent lease events; the oldest fall off.
#[derive(Debug)]
pub(crate) struct LeaseLog {
    events: Mutex<VecDeque<LeaseEvent>>,
    capacity: usize,
}

impl LeaseLog {
    pub fn new(capacity: usize) -> LeaseLog {
        LeaseLog {
            events: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
        }
    }

    pub fn record(&self, event: LeaseEvent) {
        if self.capacity == 0 {
            return;
        }
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if events.len() == self.capacity {
            events.pop_front();
        }
        events.push_back(event);
    }

    pub fn recent(&self) -> Vec<LeaseEvent> {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        events.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_log_keeps_the_most_recent() {
        let log = LeaseLog::new(3);
        let at = Instant::now();
        for generation in 0..5 {
            log.record(LeaseEvent {
                kind: LeaseEventKind::Bind,
                rkey: 0x0000_0101 + generation as u32,
                generation,
                qp_num: 1,
                at,
            });
        }
        let gens: Vec<u64> = log.recent().iter().map(|e| e.generation).collect();
        assert_eq!(gens, [2, 3, 4]);
        assert_eq!(log.recent()[0].key_index(), 1);
        assert_eq!(log.recent()[0].key_byte(), 3);
    }
}
