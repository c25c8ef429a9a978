//! Space: every namespace counts the data bytes it holds (in its superblock, in the same
//! transaction as the change), checks growth against its own quota, and takes it from a
//! pool-wide [`SpaceBudget`] shared with the pool's other containers.

use super::namespace::{Namespace, SUPER, USED_BYTES};
use super::{DfsResult, Errno, err};
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use std::fmt::Debug;
use std::sync::atomic::Ordering;

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

/// Adds `delta` to the namespace's count of data bytes.
pub(super) fn adjust_used(tx: &WriteTransaction, delta: i64) -> DfsResult<()> {
    let mut sup = tx.open_table(SUPER)?;
    let used = sup.get(USED_BYTES)?.map_or(0, |v| v.value());
    sup.insert(USED_BYTES, used.saturating_add_signed(delta))?;
    Ok(())
}

impl Namespace {
    /// Data bytes held by the namespace's files.
    pub fn used(&self) -> DfsResult<u64> {
        let tx = self.db.begin_read()?;
        Ok(tx
            .open_table(SUPER)?
            .get(USED_BYTES)?
            .map_or(0, |v| v.value()))
    }

    /// The container's quota, if it has one.
    pub fn quota(&self) -> Option<u64> {
        match self.quota.load(Ordering::Relaxed) {
            0 => None,
            q => Some(q),
        }
    }

    /// Changes the quota (a container property) of an open namespace. Lowering it below
    /// what is used refuses further growth; nothing is removed.
    pub fn set_quota(&self, quota: Option<u64>) {
        self.quota.store(quota.unwrap_or(0), Ordering::Relaxed);
    }

    /// Takes `growth` bytes: ENOSPC if the quota or the pool has no room, and then
    /// nothing is taken. `pending`: bytes reserved by writes in flight and not yet in the
    /// recorded use. Callers hold the writes lock, so neither can move meanwhile.
    pub(super) fn reserve(&self, growth: u64, pending: u64) -> DfsResult<()> {
        if growth == 0 {
            return Ok(());
        }
        if let Some(quota) = self.quota() {
            let used = self.used()?.saturating_add(pending);
            if used.saturating_add(growth) > quota {
                return Err(err(
                    Errno::NoSpc,
                    format!("container quota of {quota} bytes reached ({used} used)"),
                ));
            }
        }
        match &self.cfg.budget {
            Some(budget) => budget.reserve(growth),
            None => Ok(()),
        }
    }

    /// Gives freed bytes back to the pool.
    pub(super) fn release(&self, freed: u64) {
        if freed > 0
            && let Some(budget) = &self.cfg.budget
        {
            budget.release(freed);
        }
    }

    /// Usage against `capacity` (the pool's) or the quota, whichever is smaller.
    pub fn statfs(&self, capacity: u64) -> DfsResult<StatFs> {
        let total = self.quota().map_or(capacity, |q| q.min(capacity));
        Ok(StatFs {
            total_bytes: total,
            free_bytes: total.saturating_sub(self.used()?),
            files: self.objects()?,
        })
    }
}
