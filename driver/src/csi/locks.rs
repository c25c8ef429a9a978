//! Per-volume serialization: one operation at a time per CSI name and per volume id. A
//! second operation on a busy key is refused at once (ABORTED; the caller retries with
//! back-off), as CSI asks, rather than queued behind the first.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The keys with an operation in progress.
#[derive(Debug, Clone, Default)]
pub(crate) struct VolumeLocks {
    held: Arc<Mutex<HashSet<String>>>,
}

/// An operation is already in progress on this key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an operation on {0} is already in progress; retry later")]
pub struct Busy(pub String);

/// Holds a key until dropped (also when the call is cancelled).
#[derive(Debug)]
pub(crate) struct VolumeGuard {
    locks: VolumeLocks,
    key: String,
}

impl VolumeLocks {
    /// Takes `key` (e.g. `volume name "pvc-1"`), or fails if it is held.
    pub(crate) fn try_lock(&self, key: String) -> Result<VolumeGuard, Busy> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(key.clone()) {
            return Err(Busy(key));
        }
        Ok(VolumeGuard {
            locks: self.clone(),
            key,
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        self.locks
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_per_key() {
        let locks = VolumeLocks::default();
        let a = locks.try_lock("a".into()).unwrap();
        assert_eq!(locks.try_lock("a".into()).unwrap_err(), Busy("a".into()));
        let _b = locks.try_lock("b".into()).unwrap();
        drop(a);
        let _a = locks.try_lock("a".into()).unwrap();
    }
}
