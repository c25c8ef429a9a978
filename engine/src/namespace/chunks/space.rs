//! Space: every namespace counts the data bytes it holds (in its superblock, in the same
//! transaction as the change), checks growth against its own quota, and takes it from a
//! pool-wide [`SpaceBudget`] shared with the pool's other containers. Growth is taken before
//! anything is written, so a full container or pool loses nothing it had.

use crate::namespace::error::{DfsResult, Errno, err};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Space shared by the containers of one pool.
pub trait SpaceBudget: Send + Sync + Debug {
    /// Takes `bytes` more, or fails with ENOSPC and takes nothing.
    fn reserve(&self, bytes: u64) -> DfsResult<()>;
    /// Gives `bytes` back.
    fn release(&self, bytes: u64);
}

/// File-system usage, as statfs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub files: u64,
}

/// The limits on a namespace's growth.
#[derive(Debug)]
pub(super) struct Space {
    /// Current quota in bytes, 0 for none (changes while the namespace is open).
    quota: AtomicU64,
    /// Shared with the pool's other containers; None when only the quota limits.
    budget: Option<Arc<dyn SpaceBudget>>,
}

impl Space {
    pub(super) fn new(quota: Option<u64>, budget: Option<Arc<dyn SpaceBudget>>) -> Space {
        Space {
            quota: AtomicU64::new(quota.unwrap_or(0)),
            budget,
        }
    }

    /// The container's quota, if it has one.
    pub(super) fn quota(&self) -> Option<u64> {
        match self.quota.load(Ordering::Relaxed) {
            0 => None,
            q => Some(q),
        }
    }

    /// Changes the quota. Lowering it below what is used refuses further growth; nothing is
    /// removed.
    pub(super) fn set_quota(&self, quota: Option<u64>) {
        self.quota.store(quota.unwrap_or(0), Ordering::Relaxed);
    }

    /// Takes `growth` bytes: ENOSPC if the quota or the pool has no room, and then nothing
    /// is taken. `recorded` reads the use the superblock records (only asked when there is a
    /// quota); `pending` is what writes in flight reserved and have not recorded yet. Callers
    /// hold the writes lock, so neither can move meanwhile.
    pub(super) fn reserve(
        &self,
        growth: u64,
        pending: u64,
        recorded: impl FnOnce() -> DfsResult<u64>,
    ) -> DfsResult<()> {
        if growth == 0 {
            return Ok(());
        }
        if let Some(quota) = self.quota() {
            let used = recorded()?.saturating_add(pending);
            if used.saturating_add(growth) > quota {
                return Err(err(
                    Errno::NOSPC,
                    format!("container quota of {quota} bytes reached ({used} used)"),
                ));
            }
        }
        match &self.budget {
            Some(budget) => budget.reserve(growth),
            None => Ok(()),
        }
    }

    /// Gives freed bytes back to the pool.
    pub(super) fn release(&self, freed: u64) {
        if freed > 0
            && let Some(budget) = &self.budget
        {
            budget.release(freed);
        }
    }
}
