//! CreateVolume: plan, find or create the container, complete what a stopped create left.

use super::*;
use crate::csi::volume_id::SnapshotId;
use dpufs_daos::SnapshotRef;

/// The snapshot a request asks to start from: none, or a snapshot id of ours (another
/// driver's id or a volume source cannot be).
fn content_source(
    source: Option<&csi::VolumeContentSource>,
) -> Result<Option<SnapshotId>, CreateVolumeError> {
    use csi::volume_content_source::Type;
    match source.and_then(|s| s.r#type.as_ref()) {
        None => Ok(None),
        Some(Type::Volume(_)) => Err(CreateVolumeError::ContentSource),
        Some(Type::Snapshot(s)) => match SnapshotId::parse(&s.snapshot_id) {
            Ok(id) => Ok(Some(id)),
            Err(VolumeIdError::Empty) => Err(CreateVolumeError::MissingSnapshotId),
            Err(_) => Err(CreateVolumeError::SnapshotNotFound(s.snapshot_id.clone())),
        },
    }
}

/// Everything CreateVolume works out before touching the container.
pub(super) struct Plan {
    name: String,
    params: VolumeParams,
    capacity: Capacity,
    clients: SystemClients,
    tenant: Tenant,
    pool: PoolRef,
    label: String,
    record: RequestRecord,
    /// The snapshot to clone, for a volume made from one.
    source: Option<SnapshotId>,
    /// The caps of the request's mutable parameters.
    qos: QosLimits,
}

impl Plan {
    fn attributes(&self) -> BTreeMap<String, Vec<u8>> {
        let mut attrs = BTreeMap::new();
        attrs.insert(NAME_ATTR.to_string(), self.name.as_bytes().to_vec());
        let optional = [
            (PVC_NAMESPACE_ATTR, &self.params.pvc_namespace),
            (PVC_NAME_ATTR, &self.params.pvc_name),
            (PV_NAME_ATTR, &self.params.pv_name),
        ];
        for (key, value) in optional {
            if let Some(v) = value.as_ref().filter(|v| !v.is_empty()) {
                attrs.insert(key.to_string(), v.as_bytes().to_vec());
            }
        }
        if self.qos.is_limited() {
            attrs.insert(QOS_ATTR.to_string(), self.qos.encode().into_bytes());
        }
        attrs.insert(
            REQUEST_ATTR.to_string(),
            serde_json::to_vec(&self.record).expect("a request record serializes"),
        );
        attrs
    }

    fn pool_id(&self) -> String {
        self.pool.uuid.to_string()
    }

    fn step(&self, what: &str) -> String {
        format!(
            "{what} (volume {:?}, container {} in pool {:?})",
            self.name, self.label, self.pool.name
        )
    }

    fn daos(&self, what: &str) -> impl FnOnce(DaosError) -> CreateVolumeError + '_ {
        let step = self.step(what);
        move |source| CreateVolumeError::Daos { step, source }
    }
}

impl ControllerService {
    /// CreateVolume.
    pub async fn create(&self, req: CreateVolumeRequest) -> Result<Volume, CreateVolumeError> {
        if req.name.is_empty() {
            return Err(CreateVolumeError::MissingName);
        }
        label::validate_name(&req.name).map_err(|source| CreateVolumeError::InvalidName {
            name: req.name.clone(),
            source,
        })?;
        if req.volume_capabilities.is_empty() {
            return Err(CreateVolumeError::MissingCapabilities);
        }
        for cap in &req.volume_capabilities {
            check_capability(cap)?;
        }
        let source = content_source(req.volume_content_source.as_ref())?;
        let qos = params::parse_mutable(&req.mutable_parameters)?.apply(QosLimits::UNLIMITED);
        let params = params::parse(&req.parameters)?;
        let capacity = Capacity::of(req.capacity_range.as_ref())?;
        let _name_guard = self.locks.try_lock(format!("volume name {:?}", req.name))?;
        let system = match &params.system {
            Some(s) => s.clone(),
            None => self.dir.default_system().await?,
        };
        check_topology(req.accessibility_requirements.as_ref(), &system)?;
        let clients = self.dir.system(&system).await?;
        let tenant = self.dir.tenant(params.pvc_namespace.as_deref()).await?;
        let pool = match params.provisioning {
            Provisioning::Container => self.shared_pool(&system, &params, &tenant).await?,
            Provisioning::Pool if source.is_some() => {
                return Err(CreateVolumeError::SourceForOwnPool);
            }
            Provisioning::Pool => PoolRef {
                name: label::label_for(&req.name),
                uuid: dedicated::pool_uuid(&system, &req.name),
            },
        };
        let record = RequestRecord {
            system: system.clone(),
            pool: pool.name.clone(),
            tenant: tenant.name.clone(),
            principal: tenant.principal.clone(),
            properties: params.properties.clone(),
            source_snapshot: source.as_ref().map(|s| s.to_string()),
        };
        if let Some(snap) = &source
            && (snap.volume.system != system || snap.volume.pool != pool.uuid)
        {
            return Err(CreateVolumeError::SnapshotElsewhere {
                snapshot: snap.to_string(),
                snapshot_pool: snap.volume.pool.to_string(),
                pool: pool.name.clone(),
            });
        }
        let plan = Plan {
            source,
            qos,
            label: label::label_for(&req.name),
            name: req.name,
            params,
            capacity,
            clients,
            tenant,
            pool,
            record,
        };
        self.provision(plan).await
    }

    /// The shared pool of a container-per-volume request: the one named, or the tenant's
    /// only one; the tenant must be allowed in it.
    async fn shared_pool(
        &self,
        system: &str,
        params: &VolumeParams,
        tenant: &Tenant,
    ) -> Result<PoolRef, CreateVolumeError> {
        let pool_name = match (&params.pool, tenant.allowed_pools.as_slice()) {
            (Some(p), _) => p.clone(),
            (None, [only]) => only.clone(),
            (None, allowed) => {
                return Err(CreateVolumeError::PoolRequired {
                    tenant: tenant.name.clone(),
                    allowed: allowed.to_vec(),
                });
            }
        };
        if !tenant.allowed_pools.contains(&pool_name) {
            return Err(CreateVolumeError::PoolNotAllowed {
                tenant: tenant.name.clone(),
                pool: pool_name,
                allowed: tenant.allowed_pools.clone(),
            });
        }
        Ok(self.dir.pool(system, &pool_name).await?)
    }

    async fn provision(&self, mut plan: Plan) -> Result<Volume, CreateVolumeError> {
        if plan.params.provisioning == Provisioning::Pool {
            let spec = dedicated::pool_spec(
                &plan.label,
                plan.pool.uuid,
                plan.capacity.bytes,
                &plan.tenant.principal,
            );
            dedicated::ensure_pool(&plan.clients, &spec)
                .await
                .map_err(plan.daos("creating the volume's own pool"))?;
        }
        let pool_info = match plan.clients.mgmt.pool_query(&plan.pool_id()).await {
            Ok(info) => info,
            Err(DaosError::NotFound { .. }) => {
                return Err(CreateVolumeError::PoolMissing {
                    system: plan.record.system.clone(),
                    pool: plan.pool.name.clone(),
                    uuid: plan.pool_id(),
                });
            }
            Err(e) => return Err(plan.daos("querying the pool")(e)),
        };
        let pool_bytes = pool_info.data_bytes();
        plan.capacity.fit_default(pool_bytes);
        let plan = &plan;
        let fits_pool = |bytes: u64| match pool_bytes {
            Some(p) if bytes > p => Err(CapacityError::ExceedsPool {
                pool: plan.pool.name.clone(),
                requested: bytes,
                pool_bytes: p,
            }),
            _ => Ok(()),
        };
        self.check_other_pools(plan).await?;
        let existing = find(&plan.clients, &plan.pool_id(), &plan.label)
            .await
            .map_err(plan.daos("looking the volume up"))?;
        let (info, fresh) = match existing {
            Some(info) => (info, false),
            None => {
                fits_pool(plan.capacity.bytes)?;
                match self.create_container(plan).await {
                    Ok(info) => (info, true),
                    // Another controller created it meanwhile: continue with that one.
                    Err(CreateVolumeError::Daos {
                        source: DaosError::Exists { .. },
                        ..
                    }) => {
                        let info = find(&plan.clients, &plan.pool_id(), &plan.label)
                            .await
                            .map_err(plan.daos("looking the volume up again"))?
                            .ok_or_else(|| {
                                plan.daos("creating the container")(DaosError::Exists {
                                    message: "a container with this UUID or label exists but cannot be found by label".into(),
                                    der: None,
                                })
                            })?;
                        (info, false)
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let uuid = container_uuid(&info).map_err(plan.daos("reading the container"))?;
        let id = VolumeId::new(plan.record.system.clone(), plan.pool.uuid, uuid);
        let _id_guard = self.locks.try_lock(format!("volume {id}"))?;
        let attrs = if fresh {
            plan.attributes()
        } else {
            plan.clients
                .containers
                .get_attributes(&plan.pool_id(), &info.uuid)
                .await
                .map_err(plan.daos("reading the container's attributes"))?
        };
        let quota = self.check_existing(plan, &info, &attrs)?;
        let quota = match quota {
            Some(q) => q,
            None => {
                // Created by an attempt that stopped before setting the quota.
                fits_pool(plan.capacity.bytes)?;
                plan.clients
                    .containers
                    .set_properties(
                        &plan.pool_id(),
                        &info.uuid,
                        vec![(CONT_DPUFS_QUOTA, PropValue::Num(plan.capacity.bytes))],
                    )
                    .await
                    .map_err(plan.daos("setting the quota"))?;
                plan.capacity.bytes
            }
        };
        let acl = volume_acl(&plan.tenant.principal);
        if !same_acl(&info.acl.entries, &acl) {
            plan.clients
                .containers
                .overwrite_acl(&plan.pool_id(), &info.uuid, acl)
                .await
                .map_err(plan.daos("setting the ACL"))?;
        }
        let missing: BTreeMap<String, Vec<u8>> = plan
            .attributes()
            .into_iter()
            .filter(|(k, v)| attrs.get(k) != Some(v))
            .collect();
        if !missing.is_empty() {
            plan.clients
                .containers
                .set_attributes(&plan.pool_id(), &info.uuid, missing)
                .await
                .map_err(plan.daos("setting the attributes"))?;
        }
        if plan.params.properties.has_object_classes() {
            tracing::warn!(
                volume = %plan.name,
                "object classes are recorded but not applied yet (the engine has none; a libdaos backend will set them at create)"
            );
        }
        tracing::info!(
            volume = %plan.name,
            volume_id = %id,
            tenant = %plan.tenant.name,
            capacity = quota,
            created = fresh,
            "volume provisioned"
        );
        Ok(self.volume(plan, &id, quota, &info.label))
    }

    /// Refuses a name that already has a volume in another pool the tenant may use, or in a
    /// pool of its own when this request asks for a shared one.
    async fn check_other_pools(&self, plan: &Plan) -> Result<(), CreateVolumeError> {
        if plan.params.provisioning == Provisioning::Container {
            let own = dedicated::pool_uuid(&plan.record.system, &plan.name).to_string();
            match plan.clients.mgmt.pool_query(&own).await {
                Ok(_) => {
                    return Err(CreateVolumeError::InOtherPool {
                        name: plan.name.clone(),
                        pool: plan.label.clone(),
                        requested: plan.pool.name.clone(),
                    });
                }
                Err(DaosError::NotFound { .. }) => {}
                Err(e) => return Err(plan.daos("looking for a pool of the volume's own")(e)),
            }
        }
        for other in &plan.tenant.allowed_pools {
            if *other == plan.pool.name {
                continue;
            }
            let Ok(pool) = self.dir.pool(&plan.record.system, other).await else {
                continue;
            };
            let found = find(&plan.clients, &pool.uuid.to_string(), &plan.label)
                .await
                .map_err(plan.daos("looking the volume up in the tenant's other pools"))?;
            if found.is_some() {
                return Err(CreateVolumeError::InOtherPool {
                    name: plan.name.clone(),
                    pool: other.clone(),
                    requested: plan.pool.name.clone(),
                });
            }
        }
        Ok(())
    }

    async fn create_container(&self, plan: &Plan) -> Result<ContainerInfo, CreateVolumeError> {
        let mut properties = plan.params.properties.daos_properties();
        properties.push((CONT_DPUFS_QUOTA, PropValue::Num(plan.capacity.bytes)));
        let spec = ContainerSpec {
            pool: plan.pool_id(),
            // Derived from the pool and the name, so a retried create names the same one.
            uuid: Some(Uuid::new_v5(&plan.pool.uuid, plan.name.as_bytes())),
            label: plan.label.clone(),
            properties,
            acl: volume_acl(&plan.tenant.principal),
            owner_user: String::new(),
            owner_group: String::new(),
            attributes: plan.attributes(),
        };
        let Some(snap) = &plan.source else {
            return plan
                .clients
                .containers
                .create(&spec)
                .await
                .map_err(plan.daos("creating the container"));
        };
        let (pool, cont) = (
            snap.volume.pool.to_string(),
            snap.volume.container.to_string(),
        );
        match plan
            .clients
            .containers
            .clone_snapshot(&pool, &cont, SnapshotRef::Epoch(snap.epoch), &spec)
            .await
        {
            Err(DaosError::NotFound { .. }) => {
                Err(CreateVolumeError::SnapshotNotFound(snap.to_string()))
            }
            other => other.map_err(plan.daos("cloning the snapshot")),
        }
    }

    /// Compares an existing container with the request; returns its quota (None: not set
    /// yet, to be completed).
    fn check_existing(
        &self,
        plan: &Plan,
        info: &ContainerInfo,
        attrs: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Option<u64>, CreateVolumeError> {
        if let Some(other) = attrs.get(NAME_ATTR)
            && other.as_slice() != plan.name.as_bytes()
        {
            return Err(CreateVolumeError::LabelTaken {
                label: plan.label.clone(),
                other: String::from_utf8_lossy(other).into_owned(),
            });
        }
        let mut differences = Vec::new();
        let record = attrs
            .get(REQUEST_ATTR)
            .and_then(|r| serde_json::from_slice::<RequestRecord>(r).ok());
        match record {
            Some(rec) => {
                if rec.principal != plan.record.principal {
                    differences.push(format!(
                        "it belongs to tenant {:?} ({}), the request to tenant {:?} ({})",
                        rec.tenant, rec.principal, plan.record.tenant, plan.record.principal
                    ));
                }
                if rec.source_snapshot != plan.record.source_snapshot {
                    differences.push(format!(
                        "it was made from {}, the request from {}",
                        rec.source_snapshot.as_deref().unwrap_or("nothing"),
                        plan.record.source_snapshot.as_deref().unwrap_or("nothing")
                    ));
                }
                if rec.properties != plan.record.properties {
                    differences.push(format!(
                        "its properties are {}, the request's {}",
                        serde_json::to_string(&rec.properties).unwrap_or_default(),
                        serde_json::to_string(&plan.record.properties).unwrap_or_default()
                    ));
                }
            }
            None => {
                // A create that stopped before recording itself: only what DAOS keeps.
                let want = &plan.params.properties;
                if let Some(rf) = want.redundancy_factor
                    && num_prop(info, CONT_RD_FAC) != Some(u64::from(rf))
                {
                    differences.push(format!("its redundancyFactor is not {rf}"));
                }
                if let Some(chunk) = want.chunk_size
                    && num_prop(info, CONT_DPUFS_CHUNK_SIZE) != Some(chunk)
                {
                    differences.push(format!("its chunkSize is not {chunk}"));
                }
            }
        }
        let quota = quota_of(info);
        if let Some(q) = quota
            && !plan.capacity.fits(q)
        {
            differences.push(format!(
                "its capacity is {q} bytes, the request asks {}",
                plan.capacity.describe()
            ));
        }
        if differences.is_empty() {
            Ok(quota)
        } else {
            Err(CreateVolumeError::Incompatible {
                name: plan.name.clone(),
                differences,
            })
        }
    }

    fn volume(&self, plan: &Plan, id: &VolumeId, capacity: u64, label: &str) -> Volume {
        let context: HashMap<String, String> = [
            (CTX_SYSTEM, id.system.clone()),
            (CTX_POOL, id.pool.to_string()),
            (CTX_POOL_NAME, plan.pool.name.clone()),
            (CTX_CONTAINER, id.container.to_string()),
            (CTX_CONTAINER_LABEL, label.to_string()),
            (CTX_TENANT, plan.tenant.name.clone()),
            (CTX_PRINCIPAL, plan.tenant.principal.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        Volume {
            capacity_bytes: i64::try_from(capacity).unwrap_or(i64::MAX),
            volume_id: id.to_string(),
            volume_context: context,
            content_source: plan.source.as_ref().map(|s| csi::VolumeContentSource {
                r#type: Some(csi::volume_content_source::Type::Snapshot(
                    csi::volume_content_source::SnapshotSource {
                        snapshot_id: s.to_string(),
                    },
                )),
            }),
            accessible_topology: vec![Topology {
                segments: [(TOPOLOGY_SYSTEM_KEY.to_string(), id.system.clone())].into(),
            }],
        }
    }
}
