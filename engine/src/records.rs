//! What the engine keeps about pools and containers.

use dpufs_proto::daos::props::PropValue;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A property value as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stored {
    Str(String),
    Num(u64),
}

impl From<PropValue> for Stored {
    fn from(v: PropValue) -> Stored {
        match v {
            PropValue::Str(s) => Stored::Str(s),
            PropValue::Num(n) => Stored::Num(n),
        }
    }
}

impl From<&Stored> for PropValue {
    fn from(v: &Stored) -> PropValue {
        match v {
            Stored::Str(s) => PropValue::Str(s.clone()),
            Stored::Num(n) => PropValue::Num(*n),
        }
    }
}

/// An access-control list with its owners.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclRecord {
    pub entries: Vec<String>,
    pub owner_user: String,
    pub owner_group: String,
}

/// A pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub uuid: String,
    pub label: String,
    pub acl: AclRecord,
    /// Property number → value; the label, owner and ACL live in their fields.
    pub props: BTreeMap<u32, Stored>,
    /// Ranks holding the pool.
    pub ranks: Vec<u32>,
    /// Bytes per rank per tier: [metadata/SCM, data/NVMe].
    pub tier_bytes: [u64; 2],
    /// Pool-service replica ranks; the first one leads.
    pub svc_reps: Vec<u32>,
    /// Bytes in use per tier, over all ranks.
    pub used_bytes: [u64; 2],
    pub created_unix: u64,
}

/// A container snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub epoch: u64,
    pub name: String,
    pub created_unix: u64,
}

/// A container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContRecord {
    pub pool_uuid: String,
    pub uuid: String,
    pub label: String,
    pub acl: AclRecord,
    pub props: BTreeMap<u32, Stored>,
    pub attrs: BTreeMap<String, Vec<u8>>,
    pub snapshots: Vec<SnapshotRecord>,
    pub created_unix: u64,
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn sample_pool(label: &str) -> PoolRecord {
        PoolRecord {
            uuid: uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, label.as_bytes()).to_string(),
            label: label.into(),
            acl: AclRecord {
                entries: vec!["A::OWNER@:rw".into()],
                owner_user: "alice@".into(),
                owner_group: "staff@".into(),
            },
            props: BTreeMap::from([(3, Stored::Num(5))]),
            ranks: vec![0],
            tier_bytes: [1 << 30, 0],
            svc_reps: vec![0],
            used_bytes: [0, 0],
            created_unix: 1,
        }
    }

    pub fn sample_container(pool: &PoolRecord, label: &str) -> ContRecord {
        ContRecord {
            pool_uuid: pool.uuid.clone(),
            uuid: uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, label.as_bytes()).to_string(),
            label: label.into(),
            acl: pool.acl.clone(),
            props: BTreeMap::new(),
            attrs: BTreeMap::new(),
            snapshots: Vec::new(),
            created_unix: 1,
        }
    }
}
