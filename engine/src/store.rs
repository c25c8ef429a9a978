//! The engine's embedded transactional store (redb): pools, containers and
//! their label indexes. Every mutation is one ACID transaction that is durable
//! when it returns, so a crash never leaves a half-created pool behind.

use crate::error::{EngineError, Result};
use crate::records::{ContRecord, PoolRecord};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Serialize, de::DeserializeOwned};
use std::path::Path;

type Table = TableDefinition<'static, &'static str, &'static [u8]>;

const POOLS: Table = TableDefinition::new("pools");
const POOL_LABELS: Table = TableDefinition::new("pool_labels");
/// Key `<pool uuid>/<container uuid>`.
const CONTAINERS: Table = TableDefinition::new("containers");
/// Key `<pool uuid>/<label>`, value the container UUID.
const CONT_LABELS: Table = TableDefinition::new("container_labels");
const META: Table = TableDefinition::new("meta");
const DATA_VERSION: &str = "data_version";

/// The store. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Store {
    db: redb::Database,
}

impl Store {
    /// Opens (or creates) the store file.
    pub fn open(path: &Path) -> Result<Store> {
        let db = redb::Database::create(path)?;
        let store = Store { db };
        // Create every table up front so read transactions never miss one.
        store.write(|_| Ok(()))?;
        Ok(store)
    }

    /// Runs `f` in a write transaction; commits when it returns Ok.
    pub fn write<T>(&self, f: impl FnOnce(&mut Txn<'_>) -> Result<T>) -> Result<T> {
        let tx = self.db.begin_write()?;
        let out = {
            let mut txn = Txn { tx: &tx };
            for table in [POOLS, POOL_LABELS, CONTAINERS, CONT_LABELS, META] {
                txn.tx.open_table(table)?;
            }
            f(&mut txn)
        };
        match out {
            Ok(v) => {
                tx.commit()?;
                Ok(v)
            }
            Err(e) => {
                tx.abort()?;
                Err(e)
            }
        }
    }

    /// Runs `f` against a consistent read-only snapshot.
    pub fn read<T>(&self, f: impl FnOnce(&View) -> Result<T>) -> Result<T> {
        let tx = self.db.begin_read()?;
        f(&View { tx })
    }
}

/// A read-only snapshot of the store.
#[allow(missing_debug_implementations)] // wraps redb transactions, which have no Debug
pub struct View {
    tx: redb::ReadTransaction,
}

/// An open write transaction.
#[allow(missing_debug_implementations)] // wraps redb transactions, which have no Debug
pub struct Txn<'a> {
    tx: &'a redb::WriteTransaction,
}

/// Reading, shared by snapshots and write transactions.
pub trait Reader {
    /// The raw value under `key`.
    fn raw(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>>;
    /// Every value whose key starts with `prefix`, in key order.
    fn raw_prefix(&self, table: Table, prefix: &str) -> Result<Vec<Vec<u8>>>;

    fn get<T: DeserializeOwned>(&self, table: Table, key: &str) -> Result<Option<T>> {
        self.raw(table, key)?
            .map(|bytes| serde_json::from_slice(&bytes).map_err(EngineError::from))
            .transpose()
    }

    fn scan<T: DeserializeOwned>(&self, table: Table, prefix: &str) -> Result<Vec<T>> {
        self.raw_prefix(table, prefix)?
            .iter()
            .map(|bytes| serde_json::from_slice(bytes).map_err(EngineError::from))
            .collect()
    }

    /// The pool with this UUID.
    fn pool(&self, uuid: &str) -> Result<Option<PoolRecord>> {
        self.get(POOLS, uuid)
    }

    /// Resolves a pool UUID or label, as DAOS's `resolvePoolID` does.
    fn resolve_pool(&self, id: &str) -> Result<PoolRecord> {
        let by_label = || -> Result<Option<PoolRecord>> {
            match self.get::<String>(POOL_LABELS, id)? {
                Some(uuid) => self.pool(&uuid),
                None => Ok(None),
            }
        };
        let found = match uuid::Uuid::parse_str(id) {
            Ok(u) => self.pool(&u.to_string())?,
            Err(_) => by_label()?,
        };
        found.ok_or_else(|| EngineError::PoolNotFound { id: id.to_string() })
    }

    /// The UUID of the pool holding `label`, if any.
    fn pool_with_label(&self, label: &str) -> Result<Option<String>> {
        self.get(POOL_LABELS, label)
    }

    /// Every pool, in UUID order.
    fn pools(&self) -> Result<Vec<PoolRecord>> {
        self.scan(POOLS, "")
    }

    /// Every container of a pool, in UUID order.
    fn containers(&self, pool_uuid: &str) -> Result<Vec<ContRecord>> {
        self.scan(CONTAINERS, &format!("{pool_uuid}/"))
    }

    /// A container of a pool by UUID or label.
    fn find_container(&self, pool_uuid: &str, id: &str) -> Result<Option<ContRecord>> {
        let uuid = match uuid::Uuid::parse_str(id) {
            Ok(u) => u.to_string(),
            Err(_) => match self.get::<String>(CONT_LABELS, &format!("{pool_uuid}/{id}"))? {
                Some(u) => u,
                None => return Ok(None),
            },
        };
        self.get(CONTAINERS, &format!("{pool_uuid}/{uuid}"))
    }

    /// Version of the management data, bumped by every change.
    fn data_version(&self) -> Result<u64> {
        Ok(self.get(META, DATA_VERSION)?.unwrap_or(0))
    }
}

fn collect_prefix<T: ReadableTable<&'static str, &'static [u8]>>(
    table: &T,
    prefix: &str,
) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for entry in table.range(prefix..)? {
        let (k, v) = entry?;
        if !k.value().starts_with(prefix) {
            break;
        }
        out.push(v.value().to_vec());
    }
    Ok(out)
}

impl Reader for View {
    fn raw(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>> {
        let t = self.tx.open_table(table)?;
        Ok(t.get(key)?.map(|v| v.value().to_vec()))
    }

    fn raw_prefix(&self, table: Table, prefix: &str) -> Result<Vec<Vec<u8>>> {
        collect_prefix(&self.tx.open_table(table)?, prefix)
    }
}

impl Reader for Txn<'_> {
    fn raw(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>> {
        let t = self.tx.open_table(table)?;
        let v = t.get(key)?.map(|v| v.value().to_vec());
        Ok(v)
    }

    fn raw_prefix(&self, table: Table, prefix: &str) -> Result<Vec<Vec<u8>>> {
        collect_prefix(&self.tx.open_table(table)?, prefix)
    }
}

impl Txn<'_> {
    fn put<T: Serialize>(&mut self, table: Table, key: &str, value: &T) -> Result<()> {
        let bytes = serde_json::to_vec(value)?;
        self.tx.open_table(table)?.insert(key, bytes.as_slice())?;
        Ok(())
    }

    fn remove(&mut self, table: Table, key: &str) -> Result<()> {
        self.tx.open_table(table)?.remove(key)?;
        Ok(())
    }

    fn bump_version(&mut self) -> Result<()> {
        let v = self.data_version()? + 1;
        self.put(META, DATA_VERSION, &v)
    }

    /// Writes a pool and keeps its label index in step.
    pub fn put_pool(&mut self, pool: &PoolRecord) -> Result<()> {
        if let Some(old) = self.pool(&pool.uuid)?
            && old.label != pool.label
        {
            self.remove(POOL_LABELS, &old.label)?;
        }
        self.put(POOLS, &pool.uuid, pool)?;
        self.put(POOL_LABELS, &pool.label, &pool.uuid)?;
        self.bump_version()
    }

    /// Removes a pool with all its containers.
    pub fn delete_pool(&mut self, pool: &PoolRecord) -> Result<()> {
        for cont in self.containers(&pool.uuid)? {
            self.delete_container(&cont)?;
        }
        self.remove(POOLS, &pool.uuid)?;
        self.remove(POOL_LABELS, &pool.label)?;
        self.bump_version()
    }

    /// Writes a container and keeps its label index in step.
    pub fn put_container(&mut self, cont: &ContRecord) -> Result<()> {
        let key = format!("{}/{}", cont.pool_uuid, cont.uuid);
        if let Some(old) = self.get::<ContRecord>(CONTAINERS, &key)?
            && old.label != cont.label
        {
            self.remove(CONT_LABELS, &format!("{}/{}", cont.pool_uuid, old.label))?;
        }
        self.put(CONTAINERS, &key, cont)?;
        self.put(
            CONT_LABELS,
            &format!("{}/{}", cont.pool_uuid, cont.label),
            &cont.uuid,
        )?;
        self.bump_version()
    }

    /// Removes a container and its label.
    pub fn delete_container(&mut self, cont: &ContRecord) -> Result<()> {
        self.remove(CONTAINERS, &format!("{}/{}", cont.pool_uuid, cont.uuid))?;
        self.remove(CONT_LABELS, &format!("{}/{}", cont.pool_uuid, cont.label))?;
        self.bump_version()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::tests::{sample_container, sample_pool};

    #[test]
    fn state_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.redb");
        {
            let store = Store::open(&path).unwrap();
            store
                .write(|t| {
                    t.put_pool(&sample_pool("tank"))?;
                    t.put_container(&sample_container(&sample_pool("tank"), "vol"))
                })
                .unwrap();
        }
        let store = Store::open(&path).unwrap();
        store
            .read(|v| {
                let pool = v.resolve_pool("tank")?;
                assert_eq!(v.containers(&pool.uuid)?.len(), 1);
                assert!(v.find_container(&pool.uuid, "vol")?.is_some());
                assert!(v.data_version()? >= 2);
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn failed_transactions_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        let err = store.write(|t| {
            t.put_pool(&sample_pool("tank"))?;
            Err::<(), _>(EngineError::Plain("boom".into()))
        });
        assert!(err.is_err());
        store
            .read(|v| {
                assert!(v.pools()?.is_empty());
                assert!(v.pool_with_label("tank")?.is_none());
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn relabel_moves_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        let mut pool = sample_pool("old");
        store.write(|t| t.put_pool(&pool)).unwrap();
        pool.label = "new".into();
        store.write(|t| t.put_pool(&pool)).unwrap();
        store
            .read(|v| {
                assert!(v.pool_with_label("old")?.is_none());
                assert_eq!(v.resolve_pool("new")?.uuid, pool.uuid);
                Ok(())
            })
            .unwrap();
    }
}
