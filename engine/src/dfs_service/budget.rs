//! A pool's data space, shared by its containers' namespaces.

use crate::namespace::{DfsError, DfsResult, Errno, SpaceBudget};
use crate::records::PoolRecord;
use std::sync::Mutex;

/// The data bytes a pool may hold and holds. Capacity is the tier PoolQuery reports data
/// on: NVMe when the pool has it, else SCM (DAOS puts data on SCM when there is no NVMe).
#[derive(Debug)]
pub struct PoolBudget {
    capacity: u64,
    used: Mutex<u64>,
}

/// Index of the tier holding a pool's data.
pub fn data_tier(pool: &PoolRecord) -> usize {
    if pool.tier_bytes[1] > 0 { 1 } else { 0 }
}

impl PoolBudget {
    /// An empty budget for `pool`.
    pub fn new(pool: &PoolRecord) -> PoolBudget {
        let per_rank = pool.tier_bytes[data_tier(pool)];
        PoolBudget {
            capacity: per_rank.saturating_mul(pool.ranks.len() as u64),
            used: Mutex::new(0),
        }
    }

    /// Counts bytes already held (by a namespace found on disk), even beyond capacity.
    pub fn add_existing(&self, bytes: u64) {
        let mut used = self.used.lock().expect("budget");
        *used = used.saturating_add(bytes);
    }

    /// Bytes the pool may hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        *self.used.lock().expect("budget")
    }
}

impl SpaceBudget for PoolBudget {
    fn reserve(&self, bytes: u64) -> DfsResult<()> {
        let mut used = self.used.lock().expect("budget");
        if used.saturating_add(bytes) > self.capacity {
            return Err(DfsError {
                errno: Errno::NOSPC,
                detail: format!(
                    "pool full: {} of {} bytes used, {bytes} more asked",
                    *used, self.capacity
                ),
            });
        }
        *used += bytes;
        Ok(())
    }

    fn release(&self, bytes: u64) {
        let mut used = self.used.lock().expect("budget");
        *used = used.saturating_sub(bytes);
    }
}
