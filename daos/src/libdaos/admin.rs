//! `ContainerAdmin` over libdaos and libdfs: what the operator and the CSI controller do
//! to containers, on a real DAOS system.
//!
//! Where DAOS and dpufs's engine differ, this backend keeps dpufs's meaning:
//! - dpufs's own container properties (chunk size, quota: numbers from 0x1F00) are not
//!   DAOS's; they are kept as container attributes `dpufs.prop.<number>` and reported with
//!   the DAOS properties. The chunk size is also given to DFS at creation, where it counts.
//! - DAOS stores no snapshot names: a snapshot's name is kept in the attribute
//!   `dpufs.snapshot.<epoch>`.
//! - DAOS picks container UUIDs itself: a retried create finds the container by its label.
//! - DAOS has no container clones.
//!
//! Each call connects to the pool, does its work on a blocking thread and disconnects.

use super::{ContHandle, LibDaos, PoolHandle};
use crate::containers::{ContainerAdmin, ContainerInfo, ContainerSpec, Snapshot, SnapshotRef};
use crate::error::{DaosError, Result};
use crate::mgmt::Acl;
use dpufs_proto::daos::props::{self, PropValue};
use std::collections::BTreeMap;

/// Attribute names that hold what DAOS has no place for.
const PROP_ATTR: &str = "dpufs.prop.";
const SNAPSHOT_ATTR: &str = "dpufs.snapshot.";
/// Where dpufs's own property numbers start.
const DPUFS_PROPS: u32 = 0x1F00;

/// Containers through libdaos.
#[derive(Debug, Clone, Copy)]
pub struct LibDaosContainers {
    lib: &'static LibDaos,
}

impl LibDaosContainers {
    pub fn new(lib: &'static LibDaos) -> LibDaosContainers {
        LibDaosContainers { lib }
    }

    /// Runs `f` with a connection to `pool` on a blocking thread.
    async fn with_pool<T: Send + 'static>(
        &self,
        pool: &str,
        write: bool,
        f: impl FnOnce(&PoolHandle) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (lib, pool) = (self.lib, pool.to_string());
        tokio::task::spawn_blocking(move || f(&lib.connect(&pool, write)?))
            .await
            .map_err(|e| DaosError::Config(format!("libdaos call: {e}")))?
    }
}

/// The container's facts with dpufs's own properties, from its attributes, put back.
fn full_query(pool: &PoolHandle, cont: &str) -> Result<ContainerInfo> {
    let handle = pool.open(cont, false)?;
    let mut info = handle.query()?;
    for (name, value) in handle.attributes()? {
        let Some(number) = name.strip_prefix(PROP_ATTR) else {
            continue;
        };
        let number = u32::from_str_radix(number.trim_start_matches("0x"), 16).ok();
        let value = String::from_utf8_lossy(&value).parse::<u64>().ok();
        if let (Some(n), Some(v)) = (number, value) {
            info.properties.insert(n, PropValue::Num(v));
        }
    }
    Ok(info)
}

/// Properties as this backend stores them: DAOS's own, and dpufs's as attributes.
struct Stored {
    daos: Vec<(u32, PropValue)>,
    attributes: BTreeMap<String, Vec<u8>>,
}

/// `props` split into DAOS's own and dpufs's.
fn split_props(props: &[(u32, PropValue)]) -> Result<Stored> {
    let mut stored = Stored {
        daos: Vec::new(),
        attributes: BTreeMap::new(),
    };
    for (n, v) in props {
        if *n < DPUFS_PROPS {
            stored.daos.push((*n, v.clone()));
            continue;
        }
        let PropValue::Num(v) = v else {
            return Err(DaosError::Invalid {
                message: format!("property {n:#x} takes a number"),
                der: None,
            });
        };
        stored
            .attributes
            .insert(format!("{PROP_ATTR}{n:#x}"), v.to_string().into_bytes());
    }
    Ok(stored)
}

/// The attributes a user sees: dpufs's bookkeeping left out.
fn user_attributes(all: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<u8>> {
    all.into_iter()
        .filter(|(n, _)| !n.starts_with(PROP_ATTR) && !n.starts_with(SNAPSHOT_ATTR))
        .collect()
}

/// The snapshots of the open container, with the names dpufs keeps for them.
fn snapshots_of(handle: &ContHandle) -> Result<Vec<Snapshot>> {
    let names = handle.attributes()?;
    let lib = handle.pool.lib;
    Ok(handle
        .snapshots()?
        .into_iter()
        .map(|epoch| Snapshot {
            epoch,
            name: names
                .get(&format!("{SNAPSHOT_ATTR}{epoch}"))
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .unwrap_or_default(),
            created_unix: lib.unix_seconds(epoch),
        })
        .collect())
}

fn create(pool: &PoolHandle, spec: &ContainerSpec) -> Result<ContainerInfo> {
    let stored = split_props(&spec.properties)?;
    let chunk_size = spec.properties.iter().find_map(|(n, v)| match v {
        PropValue::Num(v) if *n == props::CONT_DPUFS_CHUNK_SIZE => Some(*v),
        _ => None,
    });
    match pool.create_posix(&spec.label, &stored.daos, chunk_size) {
        Ok(_) => {}
        // A retried create: the container made the first time is the answer.
        Err(DaosError::Exists { .. }) => return full_query(pool, &spec.label),
        Err(e) => return Err(e),
    }
    let handle = pool.open(&spec.label, true)?;
    if !spec.acl.is_empty() {
        handle.write_acl(&spec.acl, false)?;
    }
    let mut attrs = spec.attributes.clone();
    attrs.extend(stored.attributes);
    if !attrs.is_empty() {
        handle.set_attributes(&attrs)?;
    }
    drop(handle);
    full_query(pool, &spec.label)
}

fn find_snapshot(handle: &ContHandle, cont: &str, snap: &SnapshotRef) -> Result<u64> {
    snapshots_of(handle)?
        .iter()
        .find(|s| match snap {
            SnapshotRef::Epoch(e) => s.epoch == *e,
            SnapshotRef::Name(n) => s.name == *n,
        })
        .map(|s| s.epoch)
        .ok_or_else(|| DaosError::NotFound {
            message: format!("no snapshot {snap:?} of container {cont}"),
            der: None,
        })
}

#[async_trait::async_trait]
impl ContainerAdmin for LibDaosContainers {
    async fn create(&self, spec: &ContainerSpec) -> Result<ContainerInfo> {
        let spec = spec.clone();
        self.with_pool(&spec.pool.clone(), true, move |p| create(p, &spec))
            .await
    }

    async fn destroy(&self, pool: &str, cont: &str, force: bool) -> Result<()> {
        let cont = cont.to_string();
        self.with_pool(pool, true, move |p| p.destroy(&cont, force))
            .await
    }

    async fn query(&self, pool: &str, cont: &str) -> Result<ContainerInfo> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| full_query(p, &cont))
            .await
    }

    async fn list(&self, pool: &str) -> Result<Vec<ContainerInfo>> {
        self.with_pool(pool, false, |p| {
            p.list()?
                .into_iter()
                .map(|(uuid, _)| full_query(p, &uuid.to_string()))
                .collect()
        })
        .await
    }

    async fn set_properties(
        &self,
        pool: &str,
        cont: &str,
        props: Vec<(u32, PropValue)>,
    ) -> Result<ContainerInfo> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| {
            let stored = split_props(&props)?;
            let handle = p.open(&cont, true)?;
            if !stored.daos.is_empty() {
                handle.set_properties(&stored.daos)?;
            }
            if !stored.attributes.is_empty() {
                handle.set_attributes(&stored.attributes)?;
            }
            drop(handle);
            // A new label names the container from now on.
            let label = stored.daos.iter().find_map(|(n, v)| match v {
                PropValue::Str(l) if *n == props::CONT_LABEL => Some(l.clone()),
                _ => None,
            });
            full_query(p, label.as_deref().unwrap_or(&cont))
        })
        .await
    }

    async fn get_acl(&self, pool: &str, cont: &str) -> Result<Acl> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| p.open(&cont, false)?.acl())
            .await
    }

    async fn overwrite_acl(&self, pool: &str, cont: &str, entries: Vec<String>) -> Result<Acl> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| {
            p.open(&cont, true)?.write_acl(&entries, false)
        })
        .await
    }

    async fn update_acl(&self, pool: &str, cont: &str, entries: Vec<String>) -> Result<Acl> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| {
            p.open(&cont, true)?.write_acl(&entries, true)
        })
        .await
    }

    async fn delete_acl(&self, pool: &str, cont: &str, principal: &str) -> Result<Acl> {
        let (cont, principal) = (cont.to_string(), principal.to_string());
        self.with_pool(pool, false, move |p| {
            p.open(&cont, true)?.delete_acl(&principal)
        })
        .await
    }

    async fn set_attributes(
        &self,
        pool: &str,
        cont: &str,
        attrs: BTreeMap<String, Vec<u8>>,
    ) -> Result<BTreeMap<String, Vec<u8>>> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| {
            let handle = p.open(&cont, true)?;
            handle.set_attributes(&attrs)?;
            Ok(user_attributes(handle.attributes()?))
        })
        .await
    }

    async fn get_attributes(&self, pool: &str, cont: &str) -> Result<BTreeMap<String, Vec<u8>>> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| {
            Ok(user_attributes(p.open(&cont, false)?.attributes()?))
        })
        .await
    }

    async fn snapshot_create(&self, pool: &str, cont: &str, name: &str) -> Result<Snapshot> {
        let (cont, name) = (cont.to_string(), name.to_string());
        self.with_pool(pool, false, move |p| {
            let handle = p.open(&cont, true)?;
            let epoch = handle.snapshot()?;
            if !name.is_empty() {
                let attr = BTreeMap::from([(
                    format!("{SNAPSHOT_ATTR}{epoch}"),
                    name.clone().into_bytes(),
                )]);
                handle.set_attributes(&attr)?;
            }
            Ok(Snapshot {
                epoch,
                name,
                created_unix: p.lib.unix_seconds(epoch),
            })
        })
        .await
    }

    async fn snapshot_list(&self, pool: &str, cont: &str) -> Result<Vec<Snapshot>> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| snapshots_of(&p.open(&cont, false)?))
            .await
    }

    async fn snapshot_destroy(
        &self,
        pool: &str,
        cont: &str,
        snap: SnapshotRef,
    ) -> Result<Vec<Snapshot>> {
        let cont = cont.to_string();
        self.with_pool(pool, false, move |p| {
            let handle = p.open(&cont, true)?;
            let epoch = find_snapshot(&handle, &cont, &snap)?;
            handle.destroy_snapshot(epoch)?;
            let name = BTreeMap::from([(format!("{SNAPSHOT_ATTR}{epoch}"), Vec::new())]);
            handle.set_attributes(&name)?;
            snapshots_of(&handle)
        })
        .await
    }

    async fn clone_snapshot(
        &self,
        _pool: &str,
        cont: &str,
        _snap: SnapshotRef,
        _target: &ContainerSpec,
    ) -> Result<ContainerInfo> {
        Err(DaosError::Invalid {
            message: format!(
                "DAOS has no container clones: container {cont} cannot be copied from a snapshot on a real DAOS system (the embedded engine can)"
            ),
            der: None,
        })
    }
}
