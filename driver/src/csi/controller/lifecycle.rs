//! DeleteVolume, ValidateVolumeCapabilities, ControllerExpandVolume and ControllerModifyVolume
//! on an existing volume.

use super::*;

impl ControllerService {
    /// DeleteVolume: destroys the container of a volume of ours (and the volume's own pool,
    /// for `provisioning: pool`); unknown ids are OK.
    pub async fn delete(&self, req: DeleteVolumeRequest) -> Result<(), DeleteVolumeError> {
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(DeleteVolumeError::MissingId),
            Err(VolumeIdError::Foreign(_)) => {
                tracing::info!(volume_id = %req.volume_id, "not an id of ours: nothing to delete");
                return Ok(());
            }
            Err(e) => return Err(DeleteVolumeError::MalformedId(e)),
        };
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let clients = self.dir.system(&id.system).await?;
        let (pool, cont) = (id.pool.to_string(), id.container.to_string());
        let daos = |what: &str| {
            let step = format!("{what} (volume {id})");
            move |source| DeleteVolumeError::Daos { step, source }
        };
        let Some(info) = find(&clients, &pool, &cont)
            .await
            .map_err(daos("looking the container up"))?
        else {
            tracing::info!(volume_id = %id, "volume already gone");
            return Ok(());
        };
        if !label::is_volume_label(&info.label) {
            return Err(DeleteVolumeError::NotOurs {
                id: id.to_string(),
                container: cont,
                label: info.label,
            });
        }
        let snapshots = clients
            .containers
            .snapshot_list(&pool, &cont)
            .await
            .map_err(daos("listing its snapshots"))?;
        if !snapshots.is_empty() {
            // Its snapshots need the container: hidden now, destroyed with the last one.
            let mark = [(snapshots::DELETED_ATTR.to_string(), b"1".to_vec())];
            clients
                .containers
                .set_attributes(&pool, &cont, mark.into_iter().collect())
                .await
                .map_err(daos("hiding it until its snapshots are deleted"))?;
            tracing::info!(volume_id = %id, snapshots = snapshots.len(), "volume hidden; its container goes with its last snapshot");
            return Ok(());
        }
        match dedicated::destroy_volume(&clients, &pool, &cont, &info.label).await {
            Ok(()) => {
                tracing::info!(volume_id = %id, "volume deleted");
                Ok(())
            }
            Err(DaosError::Busy { message, .. }) => Err(DeleteVolumeError::InUse {
                id: id.to_string(),
                message,
            }),
            Err(e) => Err(daos("destroying the container")(e)),
        }
    }

    /// ValidateVolumeCapabilities.
    pub async fn validate(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, ValidateVolumeError> {
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(ValidateVolumeError::MissingId),
            Err(e) => return Err(ValidateVolumeError::MalformedId(e)),
        };
        if req.volume_capabilities.is_empty() {
            return Err(ValidateVolumeError::MissingCapabilities);
        }
        let clients = self.dir.system(&id.system).await?;
        find(&clients, &id.pool.to_string(), &id.container.to_string())
            .await
            .map_err(|source| ValidateVolumeError::Daos {
                step: format!("looking volume {id} up"),
                source,
            })?
            .ok_or_else(|| ValidateVolumeError::NotFound(id.to_string()))?;
        let unsupported = req
            .volume_capabilities
            .iter()
            .find_map(|c| check_capability(c).err().map(|e| e.to_string()))
            .or_else(|| {
                (!req.parameters.is_empty())
                    .then(|| params::parse(&req.parameters).err().map(|e| e.to_string()))
                    .flatten()
            });
        Ok(match unsupported {
            Some(message) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
        })
    }

    /// ControllerExpandVolume: raises the container's quota. Online: nothing to do on
    /// nodes, the new quota applies to open mounts at once.
    pub async fn expand(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, ExpandVolumeError> {
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(ExpandVolumeError::MissingId),
            Err(e) => return Err(ExpandVolumeError::MalformedId(e)),
        };
        let range = req
            .capacity_range
            .as_ref()
            .ok_or(ExpandVolumeError::MissingCapacity)?;
        let capacity = Capacity::of(Some(range))?;
        if capacity.required == 0 {
            return Err(ExpandVolumeError::MissingCapacity);
        }
        if let Some(cap) = &req.volume_capability {
            check_capability(cap)?;
        }
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let clients = self.dir.system(&id.system).await?;
        let (pool, cont) = (id.pool.to_string(), id.container.to_string());
        let daos = |what: &str| {
            let step = format!("{what} (volume {id})");
            move |source| ExpandVolumeError::Daos { step, source }
        };
        let info = find(&clients, &pool, &cont)
            .await
            .map_err(daos("looking the container up"))?
            .ok_or_else(|| ExpandVolumeError::NotFound(id.to_string()))?;
        if !label::is_volume_label(&info.label) {
            return Err(ExpandVolumeError::NotOurs {
                id: id.to_string(),
                container: cont,
                label: info.label,
            });
        }
        let response = |bytes: u64| ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
            node_expansion_required: false,
        };
        match quota_of(&info) {
            // No quota: the volume is already as large as the pool.
            None => return Ok(response(capacity.required)),
            Some(q) if q >= capacity.required => return Ok(response(q)),
            Some(_) => {}
        }
        let pool_info = clients
            .mgmt
            .pool_query(&pool)
            .await
            .map_err(daos("querying the pool"))?;
        if let Some(p) = pool_info.data_bytes()
            && capacity.required > p
        {
            return Err(CapacityError::ExceedsPool {
                pool: pool_info.label,
                requested: capacity.required,
                pool_bytes: p,
            }
            .into());
        }
        clients
            .containers
            .set_properties(
                &pool,
                &cont,
                vec![(CONT_DPUFS_QUOTA, PropValue::Num(capacity.required))],
            )
            .await
            .map_err(daos("setting the quota"))?;
        tracing::info!(volume_id = %id, capacity = capacity.required, "volume expanded");
        Ok(response(capacity.required))
    }

    /// ControllerModifyVolume: changes the volume's QoS caps (its container's [`QOS_ATTR`]),
    /// which the node plugins staging it pass on to their workers
    /// ([`crate::csi::qos`]). Every parameter is checked before anything changes.
    pub async fn modify(
        &self,
        req: csi::ControllerModifyVolumeRequest,
    ) -> Result<(), ModifyVolumeError> {
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(VolumeIdError::Empty) => return Err(ModifyVolumeError::MissingId),
            Err(e) => return Err(ModifyVolumeError::MalformedId(e)),
        };
        let change = params::parse_mutable(&req.mutable_parameters)?;
        let _guard = self.locks.try_lock(format!("volume {id}"))?;
        let clients = self.dir.system(&id.system).await?;
        let (pool, cont) = (id.pool.to_string(), id.container.to_string());
        let daos = |what: &str| {
            let step = format!("{what} (volume {id})");
            move |source| ModifyVolumeError::Daos { step, source }
        };
        let info = find(&clients, &pool, &cont)
            .await
            .map_err(daos("looking the container up"))?
            .ok_or_else(|| ModifyVolumeError::NotFound(id.to_string()))?;
        if !label::is_volume_label(&info.label) {
            return Err(ModifyVolumeError::NotOurs {
                id: id.to_string(),
                container: cont,
                label: info.label,
            });
        }
        let attrs = clients
            .containers
            .get_attributes(&pool, &cont)
            .await
            .map_err(daos("reading its attributes"))?;
        if attrs.contains_key(snapshots::DELETED_ATTR) {
            // Deleted, kept only for its snapshots.
            return Err(ModifyVolumeError::NotFound(id.to_string()));
        }
        let before = crate::csi::qos::of(&id, &attrs);
        let after = change.apply(before);
        if after != before {
            let set = [(QOS_ATTR.to_string(), after.encode().into_bytes())];
            clients
                .containers
                .set_attributes(&pool, &cont, set.into_iter().collect())
                .await
                .map_err(daos("setting its QoS limits"))?;
        }
        tracing::info!(volume_id = %id, "volume modified: {after}");
        Ok(())
    }
}
