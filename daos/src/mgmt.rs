//! The DAOS management client: pools, ACLs, system membership.

use crate::error::{DaosError, Result};
use crate::principal;
use crate::session::{ClientConfig, Session};
use crate::wire::{self, ServerVersion, Wire};
use dpufs_proto::daos::props::PropValue;
use dpufs_proto::mgmt::{self, mgmt_svc_client::MgmtSvcClient};
use serde::Serialize;
use std::sync::Arc;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use uuid::Uuid;

/// How big a new pool is.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolSize {
    /// Total bytes over all ranks, split into [metadata, data] by the ratios.
    Total { bytes: u64, tier_ratio: [f64; 2] },
    /// Bytes per rank for each tier, [metadata, data].
    PerRank { tier_bytes: [u64; 2] },
}

impl PoolSize {
    /// A total size with DAOS's default 6 % / 94 % tier split.
    pub fn total(bytes: u64) -> PoolSize {
        PoolSize::Total {
            bytes,
            tier_ratio: [0.06, 0.94],
        }
    }
}

/// Everything PoolCreate takes.
#[derive(Debug, Clone)]
pub struct PoolSpec {
    /// Client-chosen UUID; the same UUID makes a retried create return the same pool.
    pub uuid: Uuid,
    pub label: String,
    pub size: PoolSize,
    /// Explicit ranks; empty lets the server choose.
    pub ranks: Vec<u32>,
    /// Number of ranks when none are named; 0 means all.
    pub num_ranks: u32,
    /// Pool-service replicas; 0 means the server default.
    pub num_svc_reps: u32,
    /// Further properties (number, value); the label is added from `label`.
    pub properties: Vec<(u32, PropValue)>,
    /// ACE strings; empty means the default ACL.
    pub acl: Vec<String>,
    /// The owner's principal (`name@`, the `@` added when missing); empty means the
    /// calling process's user, as dmg does.
    pub owner_user: String,
    /// The owner group's principal; empty means the calling process's group.
    pub owner_group: String,
}

impl PoolSpec {
    /// A spec with a fresh UUID and defaults for everything else.
    pub fn new(label: impl Into<String>, size: PoolSize) -> PoolSpec {
        PoolSpec {
            uuid: Uuid::new_v4(),
            label: label.into(),
            size,
            ranks: Vec::new(),
            num_ranks: 0,
            num_svc_reps: 0,
            properties: Vec::new(),
            acl: Vec::new(),
            owner_user: String::new(),
            owner_group: String::new(),
        }
    }
}

/// What PoolCreate reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolCreated {
    pub uuid: String,
    pub svc_leader: u32,
    pub svc_replicas: Vec<u32>,
    pub target_ranks: Vec<u32>,
    /// Bytes per rank for each tier.
    pub tier_bytes_per_rank: Vec<u64>,
}

/// Usage of one storage tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierUsage {
    /// `SCM` (metadata) or `NVME` (data).
    pub media: String,
    pub total: u64,
    pub free: u64,
}

/// A pool as PoolQuery reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolInfo {
    pub uuid: String,
    pub label: String,
    /// `Ready`, `TargetsExcluded`, ...
    pub state: String,
    pub total_targets: u32,
    pub active_targets: u32,
    pub disabled_targets: u32,
    pub tiers: Vec<TierUsage>,
    pub disabled_ranks: String,
    pub svc_leader: u32,
    pub svc_replicas: Vec<u32>,
    /// Rebuild state name (`idle`, `busy`, `done`, ...).
    pub rebuild_state: String,
    pub total_engines: u32,
}

impl PoolInfo {
    /// Some targets are disabled.
    pub fn is_degraded(&self) -> bool {
        self.disabled_targets > 0
    }

    /// The tier that holds the pool's data: NVMe, or SCM when the pool has no NVMe (where
    /// DAOS puts data then).
    pub fn data_tier(&self) -> Option<&TierUsage> {
        let tier = |media: &str| {
            self.tiers
                .iter()
                .find(|t| t.media.eq_ignore_ascii_case(media) && t.total > 0)
        };
        tier("NVME").or_else(|| tier("SCM"))
    }

    /// The bytes of data the pool can hold (its data tier's size); `None` when it reports
    /// no tiers.
    pub fn data_bytes(&self) -> Option<u64> {
        self.data_tier().map(|t| t.total)
    }
}

/// A pool as ListPools reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolSummary {
    pub uuid: String,
    pub label: String,
    pub state: String,
    pub svc_replicas: Vec<u32>,
}

/// An access-control list with its owners.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Acl {
    pub entries: Vec<String>,
    pub owner_user: String,
    pub owner_group: String,
}

/// A member (rank) of the DAOS system.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Member {
    pub rank: u32,
    pub uuid: String,
    pub state: String,
    pub addr: String,
    pub fabric_uri: String,
    pub fault_domain: String,
    pub incarnation: u64,
}

/// Who leads the management service (LeaderQuery, `dmg system leader-query`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaderInfo {
    /// `host:port` of the current leader.
    pub leader: String,
    /// `host:port` of every replica, the leader included.
    pub replicas: Vec<String>,
}

/// Client of `mgmt.MgmtSvc`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MgmtClient {
    session: Arc<Session>,
}

/// Calls `MgmtSvc.$method`; `$adapt(&mut request, wire)` first makes the request what
/// the server's release expects.
macro_rules! rpc {
    ($self:ident, $timeout:expr, $req:expr, $method:ident) => {
        rpc!($self, $timeout, $req, $method, |_, _| ())
    };
    ($self:ident, $timeout:expr, $req:expr, $method:ident, $adapt:expr) => {
        $self
            .session
            .call($timeout, $req, |ch, mut r, wire| async move {
                ($adapt)(r.get_mut(), wire);
                MgmtSvcClient::new(ch).$method(r).await
            })
            .await
    };
}

/// The owner and group of a new pool: the spec's, else the calling process's, as dmg
/// does (never empty: that would make the pool `NOBODY@`'s).
fn owners(spec: &PoolSpec) -> Result<(String, String)> {
    let given = |name: &str| (!name.is_empty()).then(|| principal::principal(name));
    match (given(&spec.owner_user), given(&spec.owner_group)) {
        (Some(user), Some(group)) => Ok((user, group)),
        (user, group) => {
            let (caller, callers_group) = principal::caller()?;
            Ok((user.unwrap_or(caller), group.unwrap_or(callers_group)))
        }
    }
}

/// Responses that carry a DAOS status in their body. Real DAOS never sends a
/// non-zero one (it turns them into errors), but a non-conforming server
/// might: check anyway.
fn body_status(status: i32, what: &str) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(DaosError::from_der(status, what))
    }
}

fn wire_prop(number: u32, value: PropValue) -> mgmt::PoolProperty {
    mgmt::PoolProperty {
        number,
        value: Some(value.into()),
    }
}

/// Pool properties as `wire` carries them (dpufs numbers values as DAOS 2.8 does).
fn props_to_wire(props: &mut [mgmt::PoolProperty], wire: Wire) {
    for p in props {
        if let Some(value) = p.value.take() {
            p.value = Some(wire.prop_to_wire(p.number, value.into()).into());
        }
    }
}

/// A PoolQuery answer as the server's release encoded it.
enum QueryAnswer {
    V2_6(mgmt::v2_6::PoolQueryResp),
    V2_8(mgmt::PoolQueryResp),
}

/// The PoolQuery mask sent to 2.6 servers: everything but the enabled and dead rank
/// lists. A 2.6 server's default leaves the disabled ranks out, and it refuses a mask
/// with both the enabled and the disabled lists.
const QUERY_MASK_2_6: u64 = !(0x4 | 0x10);

/// PoolQuery on `wire`: a 2.6 answer is decoded with 2.6's message (the 2.8 one fails
/// on its field 21).
async fn pool_query_on(
    ch: Channel,
    mut req: Request<mgmt::PoolQueryReq>,
    wire: Wire,
) -> std::result::Result<Response<QueryAnswer>, Status> {
    match wire {
        Wire::V2_8 => Ok(MgmtSvcClient::new(ch)
            .pool_query(req)
            .await?
            .map(QueryAnswer::V2_8)),
        Wire::V2_6 => {
            req.get_mut().query_mask = QUERY_MASK_2_6;
            let mut grpc = tonic::client::Grpc::new(ch);
            grpc.ready()
                .await
                .map_err(|e| Status::unknown(format!("service was not ready: {e}")))?;
            let codec =
                tonic_prost::ProstCodec::<mgmt::PoolQueryReq, mgmt::v2_6::PoolQueryResp>::default();
            let path =
                tonic::codegen::http::uri::PathAndQuery::from_static("/mgmt.MgmtSvc/PoolQuery");
            Ok(grpc.unary(req, path, codec).await?.map(QueryAnswer::V2_6))
        }
    }
}

impl MgmtClient {
    /// A client for the given configuration; connects on first use.
    pub fn new(cfg: ClientConfig) -> Result<MgmtClient> {
        Ok(MgmtClient {
            session: Arc::new(Session::new(cfg)?),
        })
    }

    /// The session, shared with the container admin of the same engine.
    pub(crate) fn session(&self) -> Arc<Session> {
        self.session.clone()
    }

    fn sys(&self) -> String {
        self.session.cfg.system.clone()
    }

    fn timeout(&self) -> std::time::Duration {
        self.session.cfg.request_timeout
    }

    /// The DAOS version of the servers, once a call has settled it: exact when a
    /// server named it (it refused the newest wire), major.minor when a 2.8 server
    /// accepted the call.
    pub fn server_version(&self) -> Option<ServerVersion> {
        self.session.server_version()
    }

    /// PoolCreate. Idempotent: retrying with the same `spec.uuid` returns the same pool.
    pub async fn pool_create(&self, spec: &PoolSpec) -> Result<PoolCreated> {
        let mut properties = vec![wire_prop(
            dpufs_proto::daos::props::POOL_LABEL,
            PropValue::Str(spec.label.clone()),
        )];
        properties.extend(
            spec.properties
                .iter()
                .cloned()
                .map(|(n, v)| wire_prop(n, v)),
        );
        let (user, user_group) = owners(spec)?;
        let mut req = mgmt::PoolCreateReq {
            uuid: spec.uuid.to_string(),
            sys: self.sys(),
            user,
            user_group,
            acl: spec.acl.clone(),
            properties,
            num_svc_reps: spec.num_svc_reps,
            num_ranks: spec.num_ranks,
            ranks: spec.ranks.clone(),
            ..Default::default()
        };
        match spec.size {
            PoolSize::Total { bytes, tier_ratio } => {
                req.total_bytes = bytes;
                req.tier_ratio = tier_ratio.to_vec();
            }
            PoolSize::PerRank { tier_bytes } => req.tier_bytes = tier_bytes.to_vec(),
        }
        let adapt = |r: &mut mgmt::PoolCreateReq, wire| props_to_wire(&mut r.properties, wire);
        let resp = rpc!(
            self,
            self.session.cfg.create_timeout,
            req,
            pool_create,
            adapt
        )?;
        body_status(resp.status, "pool create")?;
        Ok(PoolCreated {
            uuid: spec.uuid.to_string(),
            svc_leader: resp.svc_ldr,
            svc_replicas: resp.svc_reps,
            target_ranks: resp.tgt_ranks,
            tier_bytes_per_rank: resp.tier_bytes,
        })
    }

    /// PoolDestroy. `recursive` also destroys containers; `force` ignores open handles.
    pub async fn pool_destroy(&self, id: &str, force: bool, recursive: bool) -> Result<()> {
        let req = mgmt::PoolDestroyReq {
            sys: self.sys(),
            id: id.into(),
            force,
            recursive,
            ..Default::default()
        };
        body_status(
            rpc!(self, self.timeout(), req, pool_destroy)?.status,
            "pool destroy",
        )
    }

    /// PoolEvict: closes every handle to the pool; returns how many.
    pub async fn pool_evict(&self, id: &str) -> Result<i32> {
        let req = mgmt::PoolEvictReq {
            sys: self.sys(),
            id: id.into(),
            ..Default::default()
        };
        let resp = rpc!(self, self.timeout(), req, pool_evict)?;
        body_status(resp.status, "pool evict")?;
        Ok(resp.count)
    }

    /// PoolQuery with the server's default mask.
    pub async fn pool_query(&self, id: &str) -> Result<PoolInfo> {
        let req = mgmt::PoolQueryReq {
            sys: self.sys(),
            id: id.into(),
            ..Default::default()
        };
        let r = match self
            .session
            .call(self.timeout(), req, pool_query_on)
            .await?
        {
            QueryAnswer::V2_8(r) => r,
            QueryAnswer::V2_6(r) => wire::query_resp_from_2_6(r),
        };
        body_status(r.status, "pool query")?;
        let state = pool_state(r.total_targets, r.disabled_targets)
            .as_str_name()
            .to_string();
        let rebuild_state = r
            .rebuild
            .as_ref()
            .and_then(|rb| mgmt::pool_rebuild_status::State::try_from(rb.state).ok())
            .map_or_else(String::new, |s| s.as_str_name().to_lowercase());
        Ok(PoolInfo {
            uuid: r.uuid,
            label: r.label,
            state,
            total_targets: r.total_targets,
            active_targets: r.active_targets,
            disabled_targets: r.disabled_targets,
            tiers: r
                .tier_stats
                .iter()
                .map(|t| TierUsage {
                    media: mgmt::StorageMediaType::try_from(t.media_type)
                        .map_or("?", |m| m.as_str_name())
                        .to_string(),
                    total: t.total,
                    free: t.free,
                })
                .collect(),
            disabled_ranks: r.disabled_ranks,
            svc_leader: r.svc_ldr,
            svc_replicas: r.svc_reps,
            rebuild_state,
            total_engines: r.total_engines,
        })
    }

    /// ListPools.
    pub async fn list_pools(&self) -> Result<Vec<PoolSummary>> {
        let r = rpc!(
            self,
            self.timeout(),
            mgmt::ListPoolsReq { sys: self.sys() },
            list_pools
        )?;
        body_status(r.status, "list pools")?;
        Ok(r.pools
            .into_iter()
            .map(|p| PoolSummary {
                uuid: p.uuid,
                label: p.label,
                state: p.state,
                svc_replicas: p.svc_reps,
            })
            .collect())
    }

    /// PoolGetProp for the given property numbers; unset ones are left out.
    pub async fn pool_get_props(&self, id: &str, numbers: &[u32]) -> Result<Vec<(u32, PropValue)>> {
        let properties = numbers
            .iter()
            .map(|&number| mgmt::PoolProperty {
                number,
                value: None,
            })
            .collect();
        let req = mgmt::PoolGetPropReq {
            sys: self.sys(),
            id: id.into(),
            properties,
            ..Default::default()
        };
        let r = rpc!(self, self.timeout(), req, pool_get_prop)?;
        body_status(r.status, "pool get-prop")?;
        let wire = self.session.wire();
        Ok(r.properties
            .into_iter()
            .filter_map(|p| Some((p.number, wire.prop_from_wire(p.number, p.value?.into()))))
            .collect())
    }

    /// PoolSetProp: all given properties or none.
    pub async fn pool_set_props(&self, id: &str, props: Vec<(u32, PropValue)>) -> Result<()> {
        let properties = props.into_iter().map(|(n, v)| wire_prop(n, v)).collect();
        let req = mgmt::PoolSetPropReq {
            sys: self.sys(),
            id: id.into(),
            properties,
            ..Default::default()
        };
        let adapt = |r: &mut mgmt::PoolSetPropReq, wire| props_to_wire(&mut r.properties, wire);
        body_status(
            rpc!(self, self.timeout(), req, pool_set_prop, adapt)?.status,
            "pool set-prop",
        )
    }

    /// PoolGetACL.
    pub async fn pool_get_acl(&self, id: &str) -> Result<Acl> {
        let req = mgmt::GetAclReq {
            sys: self.sys(),
            id: id.into(),
            ..Default::default()
        };
        acl_of(rpc!(self, self.timeout(), req, pool_get_acl)?)
    }

    /// PoolOverwriteACL: replaces the whole ACL.
    pub async fn pool_overwrite_acl(&self, id: &str, entries: Vec<String>) -> Result<Acl> {
        let req = mgmt::ModifyAclReq {
            sys: self.sys(),
            id: id.into(),
            entries,
            ..Default::default()
        };
        acl_of(rpc!(self, self.timeout(), req, pool_overwrite_acl)?)
    }

    /// PoolUpdateACL: adds entries or replaces them per principal.
    pub async fn pool_update_acl(&self, id: &str, entries: Vec<String>) -> Result<Acl> {
        let req = mgmt::ModifyAclReq {
            sys: self.sys(),
            id: id.into(),
            entries,
            ..Default::default()
        };
        acl_of(rpc!(self, self.timeout(), req, pool_update_acl)?)
    }

    /// PoolDeleteACL: removes one principal's entry (`u:name@`, `g:name@`, `OWNER@`, ...).
    pub async fn pool_delete_acl(&self, id: &str, principal: &str) -> Result<Acl> {
        let req = mgmt::DeleteAclReq {
            sys: self.sys(),
            id: id.into(),
            principal: principal.into(),
            ..Default::default()
        };
        acl_of(rpc!(self, self.timeout(), req, pool_delete_acl)?)
    }

    /// ListContainers: the UUIDs of a pool's containers.
    pub async fn list_containers(&self, pool: &str) -> Result<Vec<String>> {
        let req = mgmt::ListContReq {
            sys: self.sys(),
            id: pool.into(),
            ..Default::default()
        };
        let r = rpc!(self, self.timeout(), req, list_containers)?;
        body_status(r.status, "list containers")?;
        Ok(r.containers.into_iter().map(|c| c.uuid).collect())
    }

    /// ContSetOwner; empty strings leave that owner unchanged.
    pub async fn cont_set_owner(
        &self,
        pool: &str,
        cont: &str,
        user: &str,
        group: &str,
    ) -> Result<()> {
        let req = mgmt::ContSetOwnerReq {
            sys: self.sys(),
            cont_id: cont.into(),
            pool_id: pool.into(),
            owner_user: user.into(),
            owner_group: group.into(),
            ..Default::default()
        };
        body_status(
            rpc!(self, self.timeout(), req, cont_set_owner)?.status,
            "container set-owner",
        )
    }

    /// LeaderQuery: the management service's leader and replicas, as the
    /// replica the client reaches reports them.
    pub async fn leader_query(&self) -> Result<LeaderInfo> {
        let req = mgmt::LeaderQueryReq {
            sys: self.sys(),
            hosts: String::new(),
        };
        let r = rpc!(self, self.timeout(), req, leader_query)?;
        Ok(LeaderInfo {
            leader: r.current_leader,
            replicas: r.replicas,
        })
    }

    /// SystemQuery: every member.
    pub async fn system_query(&self) -> Result<Vec<Member>> {
        let req = mgmt::SystemQueryReq {
            sys: self.sys(),
            ..Default::default()
        };
        let r = rpc!(self, self.timeout(), req, system_query)?;
        Ok(r.members
            .into_iter()
            .map(|m| Member {
                rank: m.rank,
                uuid: m.uuid,
                state: m.state,
                addr: m.addr,
                fabric_uri: m.fabric_uri,
                fault_domain: m.fault_domain,
                incarnation: m.incarnation,
            })
            .collect())
    }
}

fn acl_of(r: mgmt::AclResp) -> Result<Acl> {
    body_status(r.status, "pool ACL")?;
    let acl = r.acl.unwrap_or_default();
    Ok(Acl {
        entries: acl.entries,
        owner_user: acl.owner_user,
        owner_group: acl.owner_group,
    })
}

/// A queried pool's state as dmg derives it (DAOS 2.8.0, `UpdateState` in
/// src/control/lib/control/pool.go): the server leaves the reply's `state` unset, so a query
/// that succeeded is Ready, Unknown without targets, TargetsExcluded with disabled ones.
fn pool_state(total_targets: u32, disabled_targets: u32) -> mgmt::PoolServiceState {
    use mgmt::PoolServiceState::{Ready, TargetsExcluded, Unknown};
    match (total_targets, disabled_targets) {
        (0, _) => Unknown,
        (_, 0) => Ready,
        _ => TargetsExcluded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_state_is_derived_as_dmg_derives_it() {
        use mgmt::PoolServiceState::{Ready, TargetsExcluded, Unknown};
        assert_eq!(pool_state(8, 0), Ready);
        assert_eq!(pool_state(8, 2), TargetsExcluded);
        assert_eq!(pool_state(0, 0), Unknown);
    }

    #[test]
    fn pool_data_is_on_nvme_or_else_scm() {
        let info = |scm: u64, nvme: u64| PoolInfo {
            uuid: String::new(),
            label: String::new(),
            state: String::new(),
            total_targets: 0,
            active_targets: 0,
            disabled_targets: 0,
            tiers: vec![
                TierUsage {
                    media: "SCM".into(),
                    total: scm,
                    free: scm,
                },
                TierUsage {
                    media: "NVME".into(),
                    total: nvme,
                    free: nvme,
                },
            ],
            disabled_ranks: String::new(),
            svc_leader: 0,
            svc_replicas: vec![],
            rebuild_state: String::new(),
            total_engines: 0,
        };
        assert_eq!(info(1, 2).data_bytes(), Some(2));
        assert_eq!(info(1, 0).data_bytes(), Some(1));
        assert_eq!(info(0, 0).data_bytes(), None);
    }
}
