//! Container administration. Real DAOS creates containers only through
//! libdaos, so this is a trait: the engine backend speaks the engine's
//! container service; a libdaos backend (feature `daos-ffi`) covers real DAOS.

use crate::error::Result;
use crate::mgmt::{Acl, MgmtClient};
use crate::session::Session;
use dpufs_proto::daos::props::PropValue;
use dpufs_proto::engine::v1::{self as eng, container_svc_client::ContainerSvcClient};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Everything needed to create a container.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// Pool UUID or label.
    pub pool: String,
    /// Client-chosen UUID, for retry-safe creates.
    pub uuid: Option<uuid::Uuid>,
    pub label: String,
    /// Container properties (number, value).
    pub properties: Vec<(u32, PropValue)>,
    /// ACE strings; empty means the default container ACL.
    pub acl: Vec<String>,
    pub owner_user: String,
    pub owner_group: String,
    pub attributes: BTreeMap<String, Vec<u8>>,
}

/// A container as the backend reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerInfo {
    pub pool_uuid: String,
    pub uuid: String,
    pub label: String,
    /// Every property with a value, by number.
    pub properties: BTreeMap<u32, PropValue>,
    pub acl: Acl,
    pub snapshot_count: u32,
    pub created_unix: u64,
}

/// A point-in-time, read-only view of a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub epoch: u64,
    pub name: String,
    pub created_unix: u64,
}

/// Names a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotRef {
    Epoch(u64),
    Name(String),
}

/// Container administration against some DAOS backend.
#[async_trait::async_trait]
pub trait ContainerAdmin: Send + Sync + std::fmt::Debug {
    /// Creates a container; retrying with the same UUID and label returns it.
    async fn create(&self, spec: &ContainerSpec) -> Result<ContainerInfo>;
    async fn destroy(&self, pool: &str, cont: &str, force: bool) -> Result<()>;
    async fn query(&self, pool: &str, cont: &str) -> Result<ContainerInfo>;
    async fn list(&self, pool: &str) -> Result<Vec<ContainerInfo>>;
    /// Sets mutable properties; all or nothing.
    async fn set_properties(
        &self,
        pool: &str,
        cont: &str,
        props: Vec<(u32, PropValue)>,
    ) -> Result<ContainerInfo>;
    async fn get_acl(&self, pool: &str, cont: &str) -> Result<Acl>;
    async fn overwrite_acl(&self, pool: &str, cont: &str, entries: Vec<String>) -> Result<Acl>;
    async fn update_acl(&self, pool: &str, cont: &str, entries: Vec<String>) -> Result<Acl>;
    async fn delete_acl(&self, pool: &str, cont: &str, principal: &str) -> Result<Acl>;
    /// Sets attributes; an empty value deletes one. Returns all attributes.
    async fn set_attributes(
        &self,
        pool: &str,
        cont: &str,
        attrs: BTreeMap<String, Vec<u8>>,
    ) -> Result<BTreeMap<String, Vec<u8>>>;
    async fn get_attributes(&self, pool: &str, cont: &str) -> Result<BTreeMap<String, Vec<u8>>>;
    async fn snapshot_create(&self, pool: &str, cont: &str, name: &str) -> Result<Snapshot>;
    async fn snapshot_list(&self, pool: &str, cont: &str) -> Result<Vec<Snapshot>>;
    async fn snapshot_destroy(
        &self,
        pool: &str,
        cont: &str,
        snap: SnapshotRef,
    ) -> Result<Vec<Snapshot>>;
    /// Makes the container `target` describes (in the source's pool) from a snapshot of
    /// `cont`: an independent, writable copy of the snapshot's contents. Retrying with the
    /// same UUID and label returns it.
    async fn clone_snapshot(
        &self,
        pool: &str,
        cont: &str,
        snap: SnapshotRef,
        target: &ContainerSpec,
    ) -> Result<ContainerInfo>;
}

/// The engine backend: the engine's `dpufs.engine.v1.ContainerSvc`, reached
/// through the same session (leader, headers, retries) as the management client.
#[derive(Debug, Clone)]
pub struct EngineContainers {
    session: Arc<Session>,
}

impl EngineContainers {
    /// Container admin on the engine the management client talks to.
    pub fn new(mgmt: &MgmtClient) -> EngineContainers {
        EngineContainers {
            session: mgmt.session(),
        }
    }
}

macro_rules! cont_rpc {
    ($self:ident, $req:expr, $method:ident) => {
        $self
            .session
            .call(
                $self.session.cfg.request_timeout,
                $req,
                |ch, r, _| async move { ContainerSvcClient::new(ch).$method(r).await },
            )
            .await
    };
}

fn create_req(spec: &ContainerSpec) -> eng::ContCreateReq {
    eng::ContCreateReq {
        pool: spec.pool.clone(),
        uuid: spec.uuid.map(|u| u.to_string()).unwrap_or_default(),
        label: spec.label.clone(),
        properties: wire_props(spec.properties.clone()),
        acl: spec.acl.clone(),
        owner_user: spec.owner_user.clone(),
        owner_group: spec.owner_group.clone(),
        attributes: spec.attributes.clone().into_iter().collect(),
    }
}

impl SnapshotRef {
    /// The wire's (epoch, name): the name counts when the epoch is 0.
    fn wire(self) -> (u64, String) {
        match self {
            SnapshotRef::Epoch(e) => (e, String::new()),
            SnapshotRef::Name(n) => (0, n),
        }
    }
}

fn cref(pool: &str, cont: &str) -> eng::ContRef {
    eng::ContRef {
        pool: pool.into(),
        cont: cont.into(),
    }
}

fn wire_props(props: Vec<(u32, PropValue)>) -> Vec<eng::ContProperty> {
    props
        .into_iter()
        .map(|(number, v)| eng::ContProperty {
            number,
            value: Some(v.into()),
        })
        .collect()
}

fn info(c: eng::ContInfo) -> ContainerInfo {
    let properties = c
        .properties
        .into_iter()
        .filter_map(|p| Some((p.number, p.value?.into())))
        .collect();
    ContainerInfo {
        pool_uuid: c.pool_uuid,
        uuid: c.uuid,
        label: c.label,
        properties,
        acl: acl(c.acl),
        snapshot_count: c.snapshot_count,
        created_unix: c.created_unix,
    }
}

fn acl(a: Option<eng::ContAcl>) -> Acl {
    let a = a.unwrap_or_default();
    Acl {
        entries: a.entries,
        owner_user: a.owner_user,
        owner_group: a.owner_group,
    }
}

fn snapshot(s: eng::Snapshot) -> Snapshot {
    Snapshot {
        epoch: s.epoch,
        name: s.name,
        created_unix: s.created_unix,
    }
}

#[async_trait::async_trait]
impl ContainerAdmin for EngineContainers {
    async fn create(&self, spec: &ContainerSpec) -> Result<ContainerInfo> {
        Ok(info(cont_rpc!(self, create_req(spec), cont_create)?))
    }

    async fn clone_snapshot(
        &self,
        pool: &str,
        cont: &str,
        snap: SnapshotRef,
        target: &ContainerSpec,
    ) -> Result<ContainerInfo> {
        let (epoch, snapshot_name) = snap.wire();
        let req = eng::ContCloneReq {
            source: Some(cref(pool, cont)),
            epoch,
            snapshot_name,
            target: Some(create_req(target)),
        };
        Ok(info(cont_rpc!(self, req, cont_clone_snapshot)?))
    }

    async fn destroy(&self, pool: &str, cont: &str, force: bool) -> Result<()> {
        let req = eng::ContDestroyReq {
            cont: Some(cref(pool, cont)),
            force,
        };
        cont_rpc!(self, req, cont_destroy).map(|_| ())
    }

    async fn query(&self, pool: &str, cont: &str) -> Result<ContainerInfo> {
        Ok(info(cont_rpc!(self, cref(pool, cont), cont_query)?))
    }

    async fn list(&self, pool: &str) -> Result<Vec<ContainerInfo>> {
        let req = eng::ContListReq { pool: pool.into() };
        Ok(cont_rpc!(self, req, cont_list)?
            .containers
            .into_iter()
            .map(info)
            .collect())
    }

    async fn set_properties(
        &self,
        pool: &str,
        cont: &str,
        props: Vec<(u32, PropValue)>,
    ) -> Result<ContainerInfo> {
        let req = eng::ContSetPropReq {
            cont: Some(cref(pool, cont)),
            properties: wire_props(props),
        };
        Ok(info(cont_rpc!(self, req, cont_set_prop)?))
    }

    async fn get_acl(&self, pool: &str, cont: &str) -> Result<Acl> {
        Ok(acl(cont_rpc!(self, cref(pool, cont), cont_get_acl)?.acl))
    }

    async fn overwrite_acl(&self, pool: &str, cont: &str, entries: Vec<String>) -> Result<Acl> {
        let req = eng::ContModifyAclReq {
            cont: Some(cref(pool, cont)),
            entries,
        };
        Ok(acl(cont_rpc!(self, req, cont_overwrite_acl)?.acl))
    }

    async fn update_acl(&self, pool: &str, cont: &str, entries: Vec<String>) -> Result<Acl> {
        let req = eng::ContModifyAclReq {
            cont: Some(cref(pool, cont)),
            entries,
        };
        Ok(acl(cont_rpc!(self, req, cont_update_acl)?.acl))
    }

    async fn delete_acl(&self, pool: &str, cont: &str, principal: &str) -> Result<Acl> {
        let req = eng::ContDeleteAclReq {
            cont: Some(cref(pool, cont)),
            principal: principal.into(),
        };
        Ok(acl(cont_rpc!(self, req, cont_delete_acl)?.acl))
    }

    async fn set_attributes(
        &self,
        pool: &str,
        cont: &str,
        attrs: BTreeMap<String, Vec<u8>>,
    ) -> Result<BTreeMap<String, Vec<u8>>> {
        let req = eng::ContSetAttrReq {
            cont: Some(cref(pool, cont)),
            attributes: attrs.into_iter().collect(),
        };
        Ok(cont_rpc!(self, req, cont_set_attr)?
            .attributes
            .into_iter()
            .collect())
    }

    async fn get_attributes(&self, pool: &str, cont: &str) -> Result<BTreeMap<String, Vec<u8>>> {
        Ok(cont_rpc!(self, cref(pool, cont), cont_get_attr)?
            .attributes
            .into_iter()
            .collect())
    }

    async fn snapshot_create(&self, pool: &str, cont: &str, name: &str) -> Result<Snapshot> {
        let req = eng::SnapshotCreateReq {
            cont: Some(cref(pool, cont)),
            name: name.into(),
        };
        Ok(snapshot(cont_rpc!(self, req, snapshot_create)?))
    }

    async fn snapshot_list(&self, pool: &str, cont: &str) -> Result<Vec<Snapshot>> {
        Ok(cont_rpc!(self, cref(pool, cont), snapshot_list)?
            .snapshots
            .into_iter()
            .map(snapshot)
            .collect())
    }

    async fn snapshot_destroy(
        &self,
        pool: &str,
        cont: &str,
        snap: SnapshotRef,
    ) -> Result<Vec<Snapshot>> {
        let (epoch, name) = snap.wire();
        let req = eng::SnapshotDestroyReq {
            cont: Some(cref(pool, cont)),
            epoch,
            name,
        };
        Ok(cont_rpc!(self, req, snapshot_destroy)?
            .snapshots
            .into_iter()
            .map(snapshot)
            .collect())
    }
}
