//! Scoped rkeys: a type-2 memory window bound, for one call, over exactly the buffer slot the
//! call uses, with exactly one right, to exactly the connection's QP (docs/fabric.md, "Scoped
//! rkeys: lease, rotation, timeout rules").
//!
//! Why per call: a window bound to one QP is useless on any other QP (a leaked or guessed rkey
//! gets the prober's QP killed), and invalidating it after the reply means a late or replayed
//! handle finds nothing. Every bind takes the next key byte of the window's index
//! ([`inc_rkey`]), starting from a random byte, so a stale handle never matches within 256 binds
//! of the same window; a generation counter per window, carried in work-request ids, tells a
//! late completion of an older binding from one of the current binding.

use crate::keys::{inc_rkey, key_index, make_key};

use super::wire::{LeaseClaim, LeaseRight};

/// A lease: what one call lets the server touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopedRkey {
    /// The window's rkey for this binding.
    pub rkey: u32,
    /// First address as the server names it (windows are zero-based: 0).
    pub addr: u64,
    /// Length of the window: exactly the bytes of the call.
    pub len: u32,
    /// The one right granted.
    pub right: LeaseRight,
    /// Bind generation of the window.
    pub generation: u64,
    /// The QP the window is bound to.
    pub qp_num: u32,
}

impl ScopedRkey {
    /// What the request header names.
    pub fn claim(&self) -> LeaseClaim {
        LeaseClaim {
            rkey: self.rkey,
            addr: self.addr,
            len: self.len,
            right: self.right,
        }
    }
}

/// Key byte and generation of one window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyRotation {
    rkey: u32,
    generation: u64,
}

impl KeyRotation {
    /// Rotation of a window whose rkey is `rkey`, continuing from a random key byte (a random
    /// start, then `inc_rkey` on every bind).
    pub fn new(rkey: u32) -> KeyRotation {
        KeyRotation {
            rkey: make_key(key_index(rkey), rand::random()),
            generation: 0,
        }
    }

    /// The rkey and generation of the next binding.
    pub fn next_bind(&mut self) -> (u32, u64) {
        self.rkey = inc_rkey(self.rkey);
        self.generation += 1;
        (self.rkey, self.generation)
    }

    /// rkey of the current (or last) binding.
    #[cfg(test)]
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Generation of the current (or last) binding.
    #[cfg(test)]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether an event tagged with `generation` belongs to the current binding (a mismatch
    /// is a late completion of an older one).
    pub fn is_current(&self, generation: u64) -> bool {
        generation == self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::key_byte;
    use std::collections::HashSet;

    #[test]
    fn every_bind_rotates_the_key_byte_and_keeps_the_index() {
        let mut rot = KeyRotation::new(make_key(0x42, 0));
        let mut bytes = HashSet::new();
        let mut last_gen = rot.generation();
        let mut first = None;
        for _ in 0..256 {
            let (rkey, generation) = rot.next_bind();
            first.get_or_insert(key_byte(rkey));
            assert_eq!(key_index(rkey), 0x42);
            assert!(
                bytes.insert(key_byte(rkey)),
                "key byte repeated within 256 binds"
            );
            assert_eq!(generation, last_gen + 1);
            last_gen = generation;
        }
        // The 257th bind wraps to the first byte again, with a new generation.
        let (rkey, generation) = rot.next_bind();
        assert_eq!(Some(key_byte(rkey)), first);
        assert_eq!(generation, 257);
    }

    #[test]
    fn generations_spot_late_completions() {
        let mut rot = KeyRotation::new(make_key(9, 0xff));
        let (old_key, old) = rot.next_bind();
        assert!(rot.is_current(old));
        let (new_key, new) = rot.next_bind();
        assert_ne!(old_key, new_key);
        assert!(!rot.is_current(old), "completion of the previous binding");
        assert!(rot.is_current(new));
        assert_eq!(rot.rkey(), new_key);
    }

    #[test]
    fn lease_claim_names_the_binding() {
        let lease = ScopedRkey {
            rkey: 0x101,
            addr: 0,
            len: 4096,
            right: LeaseRight::RemoteWrite,
            generation: 3,
            qp_num: 7,
        };
        let claim = lease.claim();
        assert_eq!((claim.rkey, claim.addr, claim.len), (0x101, 0, 4096));
        assert_eq!(claim.right, LeaseRight::RemoteWrite);
    }
}
