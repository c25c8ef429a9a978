//! Pool lifecycle with DAOS's semantics (docs/engine.md, "Semantics kept from DAOS").
//! Every mutation validates fully first and then commits in one store
//! transaction, so bad input leaves nothing behind.

use crate::acl::{self, AclTarget};
use crate::engine::{Engine, MIN_TIER_BYTES_PER_TARGET};
use crate::error::{EngineError, Result, der, fault};
use crate::records::{AclRecord, PoolRecord, Stored, now_unix};
use crate::store::{Reader, Txn};
use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::fault::FaultCode;
use dpufs_proto::daos::label::validate_label;
use dpufs_proto::daos::props::{self, POOL_PROPS, PropValue};
use dpufs_proto::daos::ranks::format_ranks;
use dpufs_proto::mgmt::{self, pool_property::Value};
use std::collections::BTreeMap;

/// The pool layout version of DAOS 2.8 (its pool global version): what a new pool has and
/// what it could be upgraded to.
const POOL_LAYOUT_VERSION: u32 = 4;

/// Most pool-service replicas DAOS allows (2 × svc_rf max + 1).
const MAX_SVC_REPS: u32 = 9;
/// DAOS's default pool-service redundancy (5 replicas).
const DEFAULT_SVC_RF: u32 = 2;

/// PoolQuery mask bits.
pub mod mask {
    pub const SPACE: u64 = 1;
    pub const REBUILD_STATUS: u64 = 2;
    pub const ENGINES_ENABLED: u64 = 4;
    pub const ENGINES_DISABLED: u64 = 8;
    pub const ENGINES_DEAD: u64 = 16;
    pub const REBUILD_MAX_LAYOUT_VER: u64 = 32;
    pub const SELF_HEAL_POLICY: u64 = 64;
    /// What a zero mask means (`DefaultPoolQueryMask`).
    pub const DEFAULT: u64 = SPACE | REBUILD_STATUS | ENGINES_DISABLED | REBUILD_MAX_LAYOUT_VER;
}

/// Finds a settable pool property and checks its value; labels also follow
/// DAOS's label rules.
fn checked_prop(
    p: &mgmt::PoolProperty,
    at_create: bool,
) -> Result<(&'static props::PropDef, PropValue)> {
    let (def, value) = crate::props::POOL.checked(p.number, p.value.clone(), at_create)?;
    if let PropValue::Str(label) = &value
        && def.number == props::POOL_LABEL
    {
        validate_label(label).map_err(|e| der(Der::Inval, format!("invalid pool label: {e}")))?;
    }
    Ok((def, value))
}

fn to_wire(number: u32, v: PropValue) -> mgmt::PoolProperty {
    mgmt::PoolProperty {
        number,
        value: Some(v.into()),
    }
}

/// The pool's label from a create request; DAOS refuses a create without one.
fn create_label(req: &mgmt::PoolCreateReq) -> Result<String> {
    let label = req
        .properties
        .iter()
        .find(|p| p.number == props::POOL_LABEL);
    match label.map(|p| &p.value) {
        Some(Some(Value::Strval(s))) if !s.is_empty() => Ok(s.clone()),
        _ => Err(fault(
            FaultCode::PoolNoLabel,
            "pool label property is required",
        )),
    }
}

impl Engine {
    /// PoolCreate: idempotent by UUID, label required and unique.
    pub fn pool_create(&self, req: mgmt::PoolCreateReq) -> Result<mgmt::PoolCreateResp> {
        let uuid = uuid::Uuid::parse_str(&req.uuid)
            .map_err(|_| {
                der(
                    Der::Inval,
                    format!("pool UUID {:?} is not a UUID", req.uuid),
                )
            })?
            .to_string();
        let record = self.store().write(|t| {
            if let Some(existing) = t.pool(&uuid)? {
                return Ok(existing);
            }
            let record = self.new_pool(t, &uuid, &req)?;
            t.put_pool(&record)?;
            for &rank in &record.ranks {
                std::fs::create_dir_all(self.pool_dir(rank, &uuid))?;
            }
            Ok(record)
        })?;
        Ok(mgmt::PoolCreateResp {
            status: 0,
            svc_ldr: record.svc_reps[0],
            svc_reps: record.svc_reps.clone(),
            tgt_ranks: record.ranks.clone(),
            tier_bytes: record.tier_bytes.to_vec(),
            // Without MD-on-SSD DAOS reports the metadata (SCM) bytes of each rank.
            mem_file_bytes: record.tier_bytes[0],
            md_on_ssd_active: false,
        })
    }

    fn new_pool(&self, t: &Txn<'_>, uuid: &str, req: &mgmt::PoolCreateReq) -> Result<PoolRecord> {
        let label = create_label(req)?;
        validate_label(&label).map_err(|e| der(Der::Inval, format!("invalid pool label: {e}")))?;
        if t.pool_with_label(&label)?.is_some() {
            return Err(fault(
                FaultCode::PoolDuplicateLabel,
                format!("pool label {label:?} already exists"),
            ));
        }
        let ranks = self.select_ranks(req)?;
        let mut explicit = BTreeMap::new();
        for p in req
            .properties
            .iter()
            .filter(|p| p.number != props::POOL_LABEL)
        {
            let (def, value) = checked_prop(p, true)?;
            explicit.insert(def.number, Stored::from(value));
        }
        let domains = ranks.len() as u64;
        if let Some(Stored::Num(rf)) = explicit.get(&props::POOL_RD_FAC)
            && *rf >= domains
        {
            return Err(der(
                Der::Inval,
                format!("rd_fac {rf} needs more than {domains} fault domains"),
            ));
        }
        let svc_reps = svc_replicas(req, &explicit, &ranks)?;
        let tier_bytes = self.tier_bytes(req, ranks.len() as u64)?;
        self.check_capacity(t, &ranks, tier_bytes)?;
        let acl_entries = if req.acl.is_empty() {
            AclTarget::Pool.default_acl()
        } else {
            acl::check_acl(&req.acl, AclTarget::Pool)?
        };
        let owner_user = owner_or_nobody(&req.user, false)?;
        let owner_group = owner_or_nobody(&req.user_group, true)?;
        Ok(PoolRecord {
            uuid: uuid.to_string(),
            label,
            acl: AclRecord {
                entries: acl_entries,
                owner_user,
                owner_group,
            },
            props: with_defaults(explicit, domains),
            ranks,
            tier_bytes,
            svc_reps,
            used_bytes: [0, 0],
            created_unix: now_unix(),
        })
    }

    /// Explicit ranks must all be running members; otherwise `num_ranks` of
    /// the running ranks, or all of them.
    fn select_ranks(&self, req: &mgmt::PoolCreateReq) -> Result<Vec<u32>> {
        let joined = self.ranks().joined();
        if joined.is_empty() {
            return Err(fault(
                FaultCode::DataPlaneNotStarted,
                "no rank of the system is running",
            ));
        }
        if !req.ranks.is_empty() {
            let mut ranks = req.ranks.clone();
            ranks.sort_unstable();
            ranks.dedup();
            if let Some(bad) = ranks.iter().find(|r| !joined.contains(r)) {
                return Err(fault(
                    FaultCode::PoolInvalidRanks,
                    format!(
                        "rank {bad} is not a running member; available ranks {}",
                        format_ranks(&joined)
                    ),
                ));
            }
            return Ok(ranks);
        }
        match req.num_ranks as usize {
            0 => Ok(joined),
            n if n <= joined.len() => Ok(joined[..n].to_vec()),
            n => Err(fault(
                FaultCode::PoolInvalidNumRanks,
                format!(
                    "{n} ranks requested but only {} are available",
                    joined.len()
                ),
            )),
        }
    }

    /// Per-rank tier sizes from either sizing mode, with DAOS's minimums.
    fn tier_bytes(&self, req: &mgmt::PoolCreateReq, nranks: u64) -> Result<[u64; 2]> {
        let sizes = match (
            req.tier_bytes.as_slice(),
            req.tier_ratio.as_slice(),
            req.total_bytes,
        ) {
            (&[t0, t1], [], 0) => [t0, t1],
            ([], &[r0, r1], total) if total > 0 => {
                let valid = |r: f64| (0.0..=1.0).contains(&r);
                if !valid(r0) || !valid(r1) || r0 + r1 > 1.0 + 1e-9 {
                    return Err(der(
                        Der::Inval,
                        format!("tier ratios {r0}, {r1} must be fractions summing to at most 1"),
                    ));
                }
                let per_rank = |r: f64| (total as f64 * r / nranks as f64) as u64;
                [per_rank(r0), per_rank(r1)]
            }
            _ => {
                return Err(EngineError::Plain(
                    "unexpected pool create params: give tier_bytes (2 per-rank values) or total_bytes > 0 with tier_ratio (2 fractions)".into(),
                ));
            }
        };
        let min = MIN_TIER_BYTES_PER_TARGET * self.cfg.targets_per_rank as u64;
        if sizes[0] < min {
            return Err(fault(
                FaultCode::PoolScmTooSmall,
                format!(
                    "metadata tier of {} bytes per rank is below the minimum {min} ({} targets)",
                    sizes[0], self.cfg.targets_per_rank
                ),
            ));
        }
        if sizes[1] > 0 && sizes[1] < min {
            return Err(fault(
                FaultCode::PoolNvmeTooSmall,
                format!(
                    "data tier of {} bytes per rank is below the minimum {min} ({} targets)",
                    sizes[1], self.cfg.targets_per_rank
                ),
            ));
        }
        Ok(sizes)
    }

    fn check_capacity(&self, t: &Txn<'_>, ranks: &[u32], tiers: [u64; 2]) -> Result<()> {
        let need = tiers[0].saturating_add(tiers[1]);
        let pools = t.pools()?;
        for &rank in ranks {
            let used: u64 = pools
                .iter()
                .filter(|p| p.ranks.contains(&rank))
                .map(|p| p.tier_bytes[0] + p.tier_bytes[1])
                .sum();
            let free = self.cfg.capacity_per_rank.saturating_sub(used);
            if need > free {
                return Err(der(
                    Der::NoSpace,
                    format!("rank {rank} has {free} bytes free, the pool needs {need} per rank"),
                ));
            }
        }
        Ok(())
    }

    /// PoolDestroy: refused while containers exist unless recursive.
    pub fn pool_destroy(&self, req: mgmt::PoolDestroyReq) -> Result<mgmt::PoolDestroyResp> {
        let _serial = self.volumes().lifecycle();
        let pool = self.store().write(|t| {
            let pool = t.resolve_pool(&req.id)?;
            let containers = t.containers(&pool.uuid)?.len();
            if containers > 0 && !req.recursive {
                return Err(fault(
                    FaultCode::PoolHasContainers,
                    format!("pool {} has {containers} container(s)", pool.label),
                ));
            }
            t.delete_pool(&pool)?;
            Ok(pool)
        })?;
        self.volumes().close_pool(&pool.uuid);
        for &rank in &pool.ranks {
            let dir = self.pool_dir(rank, &pool.uuid);
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                // The record is gone; start-up removes the orphaned directory.
                tracing::warn!(path = %dir.display(), error = %e, "pool directory not removed");
            }
        }
        Ok(mgmt::PoolDestroyResp { status: 0 })
    }

    /// PoolEvict: the engine has no pool handles outside the data service yet,
    /// so a valid pool always evicts zero handles.
    pub fn pool_evict(&self, req: mgmt::PoolEvictReq) -> Result<mgmt::PoolEvictResp> {
        self.store().read(|v| v.resolve_pool(&req.id))?;
        Ok(mgmt::PoolEvictResp {
            status: 0,
            count: 0,
        })
    }

    /// PoolQuery: space, targets, ranks and state as the mask asks. The data tier's free
    /// space is what the containers' files leave.
    pub fn pool_query(&self, req: mgmt::PoolQueryReq) -> Result<mgmt::PoolQueryResp> {
        let mut pool = self.store().read(|v| v.resolve_pool(&req.id))?;
        pool.used_bytes[crate::dfs_service::data_tier(&pool)] =
            self.volumes().pool_budget(&pool)?.used();
        let query_mask = if req.query_mask == 0 {
            mask::DEFAULT
        } else {
            req.query_mask
        };
        let (up, down): (Vec<u32>, Vec<u32>) =
            pool.ranks.iter().partition(|r| self.ranks().is_joined(**r));
        let tpr = self.cfg.targets_per_rank;
        let total_targets = pool.ranks.len() as u32 * tpr;
        let disabled_targets = down.len() as u32 * tpr;
        let degraded = !down.is_empty();
        let rebuild_state = mgmt::pool_rebuild_status::State::Idle as i32;
        let ranks_if = |bit: u64, ranks: &[u32]| {
            if query_mask & bit != 0 {
                format_ranks(ranks)
            } else {
                String::new()
            }
        };
        Ok(mgmt::PoolQueryResp {
            status: 0,
            uuid: pool.uuid.clone(),
            label: pool.label.clone(),
            total_targets,
            active_targets: total_targets - disabled_targets,
            disabled_targets,
            rebuild: (query_mask & mask::REBUILD_STATUS != 0).then_some(mgmt::PoolRebuildStatus {
                status: 0,
                state: rebuild_state,
                objects: 0,
                records: 0,
                derived_state: rebuild_state,
                degraded,
            }),
            tier_stats: if query_mask & mask::SPACE != 0 {
                tier_stats(&pool, total_targets)
            } else {
                Vec::new()
            },
            version: 1,
            leader: pool.svc_reps[0],
            enabled_ranks: ranks_if(mask::ENGINES_ENABLED, &up),
            disabled_ranks: ranks_if(mask::ENGINES_DISABLED, &down),
            total_engines: pool.ranks.len() as u32,
            pool_layout_ver: POOL_LAYOUT_VERSION,
            upgrade_layout_ver: POOL_LAYOUT_VERSION,
            state: if degraded {
                mgmt::PoolServiceState::TargetsExcluded
            } else {
                mgmt::PoolServiceState::Ready
            } as i32,
            svc_ldr: pool.svc_reps[0],
            svc_reps: pool.svc_reps.clone(),
            query_mask,
            mem_file_bytes: pool.tier_bytes[0],
            dead_ranks: ranks_if(mask::ENGINES_DEAD, &down),
            md_on_ssd_active: false,
            self_heal_policy: String::new(),
            sys_self_heal_policy: String::new(),
        })
    }

    /// ListPools, answered from the store like DAOS's MS database.
    pub fn list_pools(&self, _req: mgmt::ListPoolsReq) -> Result<mgmt::ListPoolsResp> {
        self.store().read(|v| {
            let pools = v
                .pools()?
                .into_iter()
                .map(|p| mgmt::list_pools_resp::Pool {
                    uuid: p.uuid,
                    label: p.label,
                    svc_reps: p.svc_reps,
                    state: "Ready".into(),
                    rebuild_state: "idle".into(),
                })
                .collect();
            Ok(mgmt::ListPoolsResp {
                status: 0,
                pools,
                data_version: v.data_version()?,
            })
        })
    }

    /// PoolSetProp: the label first (unique), then the rest; all or nothing.
    pub fn pool_set_prop(&self, req: mgmt::PoolSetPropReq) -> Result<mgmt::PoolSetPropResp> {
        if req.properties.is_empty() {
            return Err(der(Der::Inval, "no properties to set"));
        }
        self.store().write(|t| {
            let mut pool = t.resolve_pool(&req.id)?;
            for p in &req.properties {
                let (def, value) = checked_prop(p, false)?;
                match value {
                    PropValue::Str(label) if def.number == props::POOL_LABEL => {
                        if t.pool_with_label(&label)?.is_some_and(|u| u != pool.uuid) {
                            return Err(fault(
                                FaultCode::PoolDuplicateLabel,
                                format!("pool label {label:?} already exists"),
                            ));
                        }
                        pool.label = label;
                    }
                    value => {
                        pool.props.insert(def.number, value.into());
                    }
                }
            }
            t.put_pool(&pool)
        })?;
        Ok(mgmt::PoolSetPropResp { status: 0 })
    }

    /// PoolGetProp: the request must name the properties it wants.
    pub fn pool_get_prop(&self, req: mgmt::PoolGetPropReq) -> Result<mgmt::PoolGetPropResp> {
        if req.properties.is_empty() {
            return Err(der(Der::Inval, "name the properties to get"));
        }
        let pool = self.store().read(|v| v.resolve_pool(&req.id))?;
        let mut out = Vec::new();
        for p in &req.properties {
            if let Some(value) = pool_prop(&pool, p.number)? {
                out.push(to_wire(p.number, value));
            }
        }
        Ok(mgmt::PoolGetPropResp {
            status: 0,
            properties: out,
        })
    }

    /// PoolGetACL.
    pub fn pool_get_acl(&self, req: mgmt::GetAclReq) -> Result<mgmt::AclResp> {
        let pool = self.store().read(|v| v.resolve_pool(&req.id))?;
        Ok(acl_resp(&pool))
    }

    /// PoolOverwriteACL, PoolUpdateACL and PoolDeleteACL: `change` computes the
    /// new entries from the current ones.
    pub fn pool_modify_acl(
        &self,
        id: &str,
        change: impl FnOnce(&[String]) -> Result<Vec<String>>,
    ) -> Result<mgmt::AclResp> {
        let pool = self.store().write(|t| {
            let mut pool = t.resolve_pool(id)?;
            pool.acl.entries = change(&pool.acl.entries)?;
            t.put_pool(&pool)?;
            Ok(pool)
        })?;
        Ok(acl_resp(&pool))
    }

    /// ListContainers: UUIDs only, as DAOS.
    pub fn list_containers(&self, req: mgmt::ListContReq) -> Result<mgmt::ListContResp> {
        self.store().read(|v| {
            let pool = v.resolve_pool(&req.id)?;
            let containers = v
                .containers(&pool.uuid)?
                .into_iter()
                .map(|c| mgmt::list_cont_resp::Cont { uuid: c.uuid })
                .collect();
            Ok(mgmt::ListContResp {
                status: 0,
                containers,
            })
        })
    }
}

fn acl_resp(pool: &PoolRecord) -> mgmt::AclResp {
    mgmt::AclResp {
        status: 0,
        acl: Some(mgmt::AccessControlList {
            entries: pool.acl.entries.clone(),
            owner_user: pool.acl.owner_user.clone(),
            owner_group: pool.acl.owner_group.clone(),
        }),
    }
}

/// One property of a pool as GetProp reports it; None when unset.
fn pool_prop(pool: &PoolRecord, number: u32) -> Result<Option<PropValue>> {
    Ok(match number {
        props::POOL_LABEL => Some(PropValue::Str(pool.label.clone())),
        props::POOL_OWNER => Some(PropValue::Str(pool.acl.owner_user.clone())),
        props::POOL_OWNER_GROUP => Some(PropValue::Str(pool.acl.owner_group.clone())),
        props::POOL_SVC_LIST => Some(PropValue::Str(format_ranks(&pool.svc_reps))),
        props::POOL_ACL => return Err(der(Der::Inval, "get the pool ACL with PoolGetACL")),
        n if props::find(POOL_PROPS, n).is_none() => {
            return Err(der(Der::Inval, format!("unknown pool property number {n}")));
        }
        n => pool.props.get(&n).map(PropValue::from),
    })
}

/// Explicit properties plus DAOS's defaults for everything numeric; rd_fac's
/// default is clamped to the fault domains available.
fn with_defaults(mut explicit: BTreeMap<u32, Stored>, domains: u64) -> BTreeMap<u32, Stored> {
    for def in POOL_PROPS {
        if let Some(d) = def.default {
            let d = if def.number == props::POOL_RD_FAC {
                d.min(domains - 1)
            } else {
                d
            };
            explicit.entry(def.number).or_insert(Stored::Num(d));
        }
    }
    explicit
}

/// Pool-service replicas: svc_rf (2 × rf + 1) or num_svc_reps, clamped to the
/// pool's ranks; the first one leads.
fn svc_replicas(
    req: &mgmt::PoolCreateReq,
    explicit: &BTreeMap<u32, Stored>,
    ranks: &[u32],
) -> Result<Vec<u32>> {
    let wanted = match (explicit.get(&props::POOL_SVC_RF), req.num_svc_reps) {
        (Some(Stored::Num(rf)), _) => 2 * *rf as u32 + 1,
        (_, 0) => 2 * DEFAULT_SVC_RF + 1,
        (_, n) if n > MAX_SVC_REPS => {
            return Err(fault(
                FaultCode::PoolInvalidServiceReps,
                format!("{n} service replicas requested, at most {MAX_SVC_REPS} allowed"),
            ));
        }
        (_, n) => n,
    };
    Ok(ranks.iter().copied().take(wanted as usize).collect())
}

fn owner_or_nobody(principal: &str, group: bool) -> Result<String> {
    if principal.is_empty() {
        return Ok("NOBODY@".into());
    }
    acl::check_owner(principal, group)?;
    Ok(principal.to_string())
}

fn tier_stats(pool: &PoolRecord, targets: u32) -> Vec<mgmt::StorageUsageStats> {
    let nranks = pool.ranks.len() as u64;
    [mgmt::StorageMediaType::Scm, mgmt::StorageMediaType::Nvme]
        .into_iter()
        .enumerate()
        .map(|(i, media)| {
            let total = pool.tier_bytes[i] * nranks;
            let free = total.saturating_sub(pool.used_bytes[i]);
            let per_target = free / targets.max(1) as u64;
            mgmt::StorageUsageStats {
                total,
                free,
                min: per_target,
                max: per_target,
                mean: per_target,
                media_type: media as i32,
            }
        })
        .collect()
}
