//! Containers: create/destroy/query/list, properties, ACLs and attributes, with
//! DAOS's container semantics (docs/engine.md, "Semantics kept from DAOS"); snapshots and
//! clones are in `snapshots.rs`.

use crate::acl::{self, AclTarget};
use crate::engine::Engine;
use crate::error::{EngineError, Result, der};
use crate::records::{AclRecord, ContRecord, PoolRecord, Stored, now_unix};
use crate::store::{Reader, Txn};
use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::label::validate_label;
use dpufs_proto::daos::props::{self, CONT_PROPS, PropValue};
use dpufs_proto::engine::v1 as eng;
use dpufs_proto::mgmt;
use std::collections::BTreeMap;

/// DAOS's limit on attribute names.
const MAX_ATTR_NAME: usize = 511;

fn checked_prop(
    p: &eng::ContProperty,
    at_create: bool,
) -> Result<(&'static props::PropDef, PropValue)> {
    crate::props::CONTAINER.checked(p.number, p.value.clone(), at_create)
}

fn not_found(pool: &PoolRecord, id: &str) -> EngineError {
    der(
        Der::Nonexist,
        format!("container {id:?} not found in pool {}", pool.label),
    )
}

impl Engine {
    pub(crate) fn resolve<R: Reader>(
        &self,
        r: &R,
        cont: &eng::ContRef,
    ) -> Result<(PoolRecord, ContRecord)> {
        let pool = r.resolve_pool(&cont.pool)?;
        let found = r.find_container(&pool.uuid, &cont.cont)?;
        let c = found.ok_or_else(|| not_found(&pool, &cont.cont))?;
        Ok((pool, c))
    }

    pub(crate) fn cont_ref(req: Option<eng::ContRef>) -> Result<eng::ContRef> {
        req.ok_or_else(|| der(Der::Inval, "no container named"))
    }

    /// Checks a new container's label and gives its UUID: the one asked for, or a fresh one.
    pub(crate) fn new_container_uuid(label: &str, uuid: &str) -> Result<String> {
        validate_label(label)
            .map_err(|e| der(Der::Inval, format!("invalid container label: {e}")))?;
        let uuid = match uuid {
            "" => uuid::Uuid::new_v4(),
            u => uuid::Uuid::parse_str(u)
                .map_err(|_| der(Der::Inval, format!("container UUID {u:?} is not a UUID")))?,
        };
        Ok(uuid.to_string())
    }

    /// Creates a container; a repeat with the same UUID and label returns it.
    pub fn cont_create(&self, req: eng::ContCreateReq) -> Result<eng::ContInfo> {
        let uuid = Self::new_container_uuid(&req.label, &req.uuid)?;
        let cont = self.store().write(|t| {
            let pool = t.resolve_pool(&req.pool)?;
            if let Some(existing) = t.find_container(&pool.uuid, &uuid)? {
                return if existing.label == req.label {
                    Ok(existing)
                } else {
                    Err(der(
                        Der::Exist,
                        format!("container {uuid} exists with label {:?}", existing.label),
                    ))
                };
            }
            if t.find_container(&pool.uuid, &req.label)?.is_some() {
                return Err(der(
                    Der::Exist,
                    format!(
                        "container label {:?} is taken in pool {}",
                        req.label, pool.label
                    ),
                ));
            }
            let cont = new_container(&pool, uuid.clone(), &req)?;
            t.put_container(&cont)?;
            Ok(cont)
        })?;
        Ok(cont_info(&cont))
    }

    /// Destroys a container with its snapshots and their namespaces: the record first
    /// (durably), then the files, so a crash between leaves only files start-up removes.
    pub fn cont_destroy(&self, req: eng::ContDestroyReq) -> Result<eng::ContDestroyResp> {
        let cref = Self::cont_ref(req.cont)?;
        let _serial = self.volumes().lifecycle();
        let (pool, cont) = self.store().write(|t| {
            let (pool, cont) = self.resolve(t, &cref)?;
            t.delete_container(&cont)?;
            Ok((pool, cont))
        })?;
        self.volumes().remove(&pool, &cont.uuid, None)?;
        Ok(eng::ContDestroyResp {})
    }

    pub fn cont_query(&self, cref: eng::ContRef) -> Result<eng::ContInfo> {
        let (_, cont) = self.store().read(|v| self.resolve(v, &cref))?;
        Ok(cont_info(&cont))
    }

    pub fn cont_list(&self, req: eng::ContListReq) -> Result<eng::ContListResp> {
        self.store().read(|v| {
            let pool = v.resolve_pool(&req.pool)?;
            let containers = v.containers(&pool.uuid)?.iter().map(cont_info).collect();
            Ok(eng::ContListResp { containers })
        })
    }

    /// Sets mutable properties, the label included; all or nothing. A new quota applies
    /// to the open namespace at once.
    pub fn cont_set_prop(&self, req: eng::ContSetPropReq) -> Result<eng::ContInfo> {
        if req.properties.is_empty() {
            return Err(der(Der::Inval, "no properties to set"));
        }
        let cref = Self::cont_ref(req.cont)?;
        let mut quota_changed = false;
        let mut changed = None;
        let info = self.update_container(&cref, |t, cont| {
            quota_changed = req
                .properties
                .iter()
                .any(|p| p.number == props::CONT_DPUFS_QUOTA);
            for p in &req.properties {
                let (def, value) = checked_prop(p, false)?;
                match value {
                    PropValue::Str(label) if def.number == props::CONT_LABEL => {
                        validate_label(&label).map_err(|e| {
                            der(Der::Inval, format!("invalid container label: {e}"))
                        })?;
                        if t.find_container(&cont.pool_uuid, &label)?
                            .is_some_and(|c| c.uuid != cont.uuid)
                        {
                            return Err(der(
                                Der::Exist,
                                format!("container label {label:?} is taken"),
                            ));
                        }
                        cont.label = label;
                    }
                    value => {
                        cont.props.insert(def.number, value.into());
                    }
                }
            }
            changed = Some(cont.clone());
            Ok(())
        })?;
        if quota_changed && let Some(cont) = changed {
            self.volumes().quota_changed(&cont);
        }
        Ok(info)
    }

    /// Reads, changes and writes one container in a transaction.
    pub(crate) fn update_container(
        &self,
        cref: &eng::ContRef,
        change: impl FnOnce(&Txn<'_>, &mut ContRecord) -> Result<()>,
    ) -> Result<eng::ContInfo> {
        let cont = self.store().write(|t| {
            let (_, mut cont) = self.resolve(t, cref)?;
            change(t, &mut cont)?;
            t.put_container(&cont)?;
            Ok(cont)
        })?;
        Ok(cont_info(&cont))
    }

    pub fn cont_get_acl(&self, cref: eng::ContRef) -> Result<eng::ContAclResp> {
        Ok(acl_resp(self.cont_query(cref)?))
    }

    /// ContOverwriteAcl / ContUpdateAcl / ContDeleteAcl.
    pub fn cont_modify_acl(
        &self,
        cref: Option<eng::ContRef>,
        change: impl FnOnce(&[String]) -> Result<Vec<String>>,
    ) -> Result<eng::ContAclResp> {
        let cref = Self::cont_ref(cref)?;
        let info = self.update_container(&cref, |_, cont| {
            cont.acl.entries = change(&cont.acl.entries)?;
            Ok(())
        })?;
        Ok(acl_resp(info))
    }

    /// Sets attributes; an empty value deletes one.
    pub fn cont_set_attr(&self, req: eng::ContSetAttrReq) -> Result<eng::ContAttrResp> {
        let cref = Self::cont_ref(req.cont)?;
        for name in req.attributes.keys() {
            if name.is_empty() || name.len() > MAX_ATTR_NAME {
                return Err(der(
                    Der::Inval,
                    format!("attribute name {name:?} must be 1..={MAX_ATTR_NAME} bytes"),
                ));
            }
        }
        let mut attrs = BTreeMap::new();
        self.update_container(&cref, |_, cont| {
            for (k, v) in req.attributes {
                if v.is_empty() {
                    cont.attrs.remove(&k);
                } else {
                    cont.attrs.insert(k, v);
                }
            }
            attrs = cont.attrs.clone();
            Ok(())
        })?;
        Ok(eng::ContAttrResp {
            attributes: attrs.into_iter().collect(),
        })
    }

    pub fn cont_get_attr(&self, cref: eng::ContRef) -> Result<eng::ContAttrResp> {
        let (_, cont) = self.store().read(|v| self.resolve(v, &cref))?;
        Ok(eng::ContAttrResp {
            attributes: cont.attrs.into_iter().collect(),
        })
    }

    /// ContSetOwner (mgmt.MgmtSvc): the only container mutation DAOS offers over gRPC.
    pub fn cont_set_owner(&self, req: mgmt::ContSetOwnerReq) -> Result<mgmt::DaosResp> {
        if req.owner_user.is_empty() && req.owner_group.is_empty() {
            return Err(der(Der::Inval, "give a new owner user or group"));
        }
        if !req.owner_user.is_empty() {
            acl::check_owner(&req.owner_user, false)?;
        }
        if !req.owner_group.is_empty() {
            acl::check_owner(&req.owner_group, true)?;
        }
        let cref = eng::ContRef {
            pool: req.pool_id,
            cont: req.cont_id,
        };
        self.update_container(&cref, |_, cont| {
            if !req.owner_user.is_empty() {
                cont.acl.owner_user = req.owner_user;
            }
            if !req.owner_group.is_empty() {
                cont.acl.owner_group = req.owner_group;
            }
            Ok(())
        })?;
        Ok(mgmt::DaosResp { status: 0 })
    }
}

pub(crate) fn new_container(
    pool: &PoolRecord,
    uuid: String,
    req: &eng::ContCreateReq,
) -> Result<ContRecord> {
    let mut explicit = BTreeMap::new();
    for p in &req.properties {
        let (def, value) = checked_prop(p, true)?;
        if def.number == props::CONT_LABEL {
            if value != PropValue::Str(req.label.clone()) {
                return Err(der(
                    Der::Inval,
                    "label property differs from the label field",
                ));
            }
            continue;
        }
        explicit.insert(def.number, Stored::from(value));
    }
    let domains = pool.ranks.len() as u64;
    let pool_rf = match pool.props.get(&props::POOL_RD_FAC) {
        Some(Stored::Num(rf)) => *rf,
        _ => 0,
    };
    match explicit.get(&props::CONT_RD_FAC) {
        Some(Stored::Num(rf)) if *rf >= domains => {
            return Err(der(
                Der::Inval,
                format!("rd_fac {rf} needs more than the pool's {domains} fault domains"),
            ));
        }
        Some(_) => {}
        None if pool_rf >= domains => {
            return Err(der(
                Der::Inval,
                format!(
                    "pool rd_fac {pool_rf} exceeds the {domains} fault domains; set rd_fac explicitly"
                ),
            ));
        }
        None => {
            explicit.insert(props::CONT_RD_FAC, Stored::Num(pool_rf));
        }
    }
    for def in CONT_PROPS {
        if let Some(d) = def.default {
            explicit.entry(def.number).or_insert(Stored::Num(d));
        }
    }
    let entries = if req.acl.is_empty() {
        AclTarget::Container.default_acl()
    } else {
        acl::check_acl(&req.acl, AclTarget::Container)?
    };
    let owner = |given: &str, group: bool, inherited: &str| -> Result<String> {
        if given.is_empty() {
            return Ok(inherited.to_string());
        }
        acl::check_owner(given, group)?;
        Ok(given.to_string())
    };
    Ok(ContRecord {
        pool_uuid: pool.uuid.clone(),
        uuid,
        label: req.label.clone(),
        acl: AclRecord {
            entries,
            owner_user: owner(&req.owner_user, false, &pool.acl.owner_user)?,
            owner_group: owner(&req.owner_group, true, &pool.acl.owner_group)?,
        },
        props: explicit,
        attrs: req
            .attributes
            .clone()
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect(),
        snapshots: Vec::new(),
        created_unix: now_unix(),
    })
}

fn to_wire(number: u32, v: PropValue) -> eng::ContProperty {
    eng::ContProperty {
        number,
        value: Some(v.into()),
    }
}

pub(crate) fn cont_info(c: &ContRecord) -> eng::ContInfo {
    let mut properties = vec![
        to_wire(props::CONT_LABEL, PropValue::Str(c.label.clone())),
        to_wire(props::CONT_OWNER, PropValue::Str(c.acl.owner_user.clone())),
        to_wire(props::CONT_GROUP, PropValue::Str(c.acl.owner_group.clone())),
    ];
    properties.extend(c.props.iter().map(|(n, v)| to_wire(*n, v.into())));
    properties.sort_by_key(|p| p.number);
    eng::ContInfo {
        pool_uuid: c.pool_uuid.clone(),
        uuid: c.uuid.clone(),
        label: c.label.clone(),
        properties,
        acl: Some(eng::ContAcl {
            entries: c.acl.entries.clone(),
            owner_user: c.acl.owner_user.clone(),
            owner_group: c.acl.owner_group.clone(),
        }),
        snapshot_count: c.snapshots.len() as u32,
        created_unix: c.created_unix,
    }
}

fn acl_resp(info: eng::ContInfo) -> eng::ContAclResp {
    eng::ContAclResp { acl: info.acl }
}
