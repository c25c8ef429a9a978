//! gRPC glue: each RPC checks the caller, then runs the engine's logic off the
//! async runtime (store commits fsync) and maps errors in `error.rs`.

use crate::acl::{self, AclTarget};
use crate::engine::Engine;
use crate::error::Result;
use crate::version::check_caller;
use dpufs_proto::engine::v1::{
    self as eng, container_svc_server::ContainerSvc, rank_control_server::RankControl,
};
use dpufs_proto::mgmt::{self, mgmt_svc_server::MgmtSvc};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The client certificate's Common Name, put into request extensions by the
/// TLS listener in secure mode.
#[derive(Debug, Clone)]
pub struct PeerCn(pub String);

/// DAOS's server-side checks, in its interceptor order: version (and system
/// name), then, in secure mode, the certificate CN against the method's
/// allow-list.
fn authorize<T>(req: &Request<T>, method: &str, system: &str, sys: &str) -> Result<(), Status> {
    let peer_cn = req.extensions().get::<PeerCn>().map(|p| p.0.as_str());
    check_caller(req.metadata(), sys, system, peer_cn)?;
    match peer_cn {
        Some(cn) if !crate::tls::allowed(method, cn) => Err(Status::permission_denied(format!(
            "{cn:?} may not call {method}"
        ))),
        _ => Ok(()),
    }
}

/// Every gRPC service of the engine, sharing one engine.
#[derive(Debug, Clone)]
pub struct EngineServices {
    engine: Arc<Engine>,
}

impl EngineServices {
    pub fn new(engine: Arc<Engine>) -> EngineServices {
        EngineServices { engine }
    }

    async fn call<Req, Resp>(
        &self,
        method: &'static str,
        req: Request<Req>,
        sys: impl FnOnce(&Req) -> &str,
        f: impl FnOnce(&Engine, Req) -> Result<Resp> + Send + 'static,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
    {
        authorize(&req, method, &self.engine.cfg.system, sys(req.get_ref()))?;
        if method != "LeaderQuery" {
            self.engine.require_leader()?;
        }
        let engine = self.engine.clone();
        let inner = req.into_inner();
        let out = tokio::task::spawn_blocking(move || f(&engine, inner))
            .await
            .map_err(|e| Status::internal(format!("engine task failed: {e}")))?;
        out.map(Response::new).map_err(|e| {
            tracing::debug!(error = %e, "request failed");
            Status::from(e)
        })
    }
}

#[tonic::async_trait]
impl MgmtSvc for EngineServices {
    async fn leader_query(
        &self,
        r: Request<mgmt::LeaderQueryReq>,
    ) -> Result<Response<mgmt::LeaderQueryResp>, Status> {
        self.call("LeaderQuery", r, |q| &q.sys, |e, q| e.leader_query(q))
            .await
    }
    async fn pool_create(
        &self,
        r: Request<mgmt::PoolCreateReq>,
    ) -> Result<Response<mgmt::PoolCreateResp>, Status> {
        self.call("PoolCreate", r, |q| &q.sys, |e, q| e.pool_create(q))
            .await
    }
    async fn pool_destroy(
        &self,
        r: Request<mgmt::PoolDestroyReq>,
    ) -> Result<Response<mgmt::PoolDestroyResp>, Status> {
        self.call("PoolDestroy", r, |q| &q.sys, |e, q| e.pool_destroy(q))
            .await
    }
    async fn pool_evict(
        &self,
        r: Request<mgmt::PoolEvictReq>,
    ) -> Result<Response<mgmt::PoolEvictResp>, Status> {
        self.call("PoolEvict", r, |q| &q.sys, |e, q| e.pool_evict(q))
            .await
    }
    async fn pool_query(
        &self,
        r: Request<mgmt::PoolQueryReq>,
    ) -> Result<Response<mgmt::PoolQueryResp>, Status> {
        self.call("PoolQuery", r, |q| &q.sys, |e, q| e.pool_query(q))
            .await
    }
    async fn pool_set_prop(
        &self,
        r: Request<mgmt::PoolSetPropReq>,
    ) -> Result<Response<mgmt::PoolSetPropResp>, Status> {
        self.call("PoolSetProp", r, |q| &q.sys, |e, q| e.pool_set_prop(q))
            .await
    }
    async fn pool_get_prop(
        &self,
        r: Request<mgmt::PoolGetPropReq>,
    ) -> Result<Response<mgmt::PoolGetPropResp>, Status> {
        self.call("PoolGetProp", r, |q| &q.sys, |e, q| e.pool_get_prop(q))
            .await
    }
    async fn pool_get_acl(
        &self,
        r: Request<mgmt::GetAclReq>,
    ) -> Result<Response<mgmt::AclResp>, Status> {
        self.call("PoolGetACL", r, |q| &q.sys, |e, q| e.pool_get_acl(q))
            .await
    }
    async fn pool_overwrite_acl(
        &self,
        r: Request<mgmt::ModifyAclReq>,
    ) -> Result<Response<mgmt::AclResp>, Status> {
        self.call(
            "PoolOverwriteACL",
            r,
            |q| &q.sys,
            |e, q| e.pool_modify_acl(&q.id, |_| acl::check_acl(&q.entries, AclTarget::Pool)),
        )
        .await
    }
    async fn pool_update_acl(
        &self,
        r: Request<mgmt::ModifyAclReq>,
    ) -> Result<Response<mgmt::AclResp>, Status> {
        self.call(
            "PoolUpdateACL",
            r,
            |q| &q.sys,
            |e, q| {
                e.pool_modify_acl(&q.id, |cur| {
                    acl::update_acl(cur, &q.entries, AclTarget::Pool)
                })
            },
        )
        .await
    }
    async fn pool_delete_acl(
        &self,
        r: Request<mgmt::DeleteAclReq>,
    ) -> Result<Response<mgmt::AclResp>, Status> {
        self.call(
            "PoolDeleteACL",
            r,
            |q| &q.sys,
            |e, q| e.pool_modify_acl(&q.id, |cur| acl::delete_from_acl(cur, &q.principal)),
        )
        .await
    }
    async fn list_pools(
        &self,
        r: Request<mgmt::ListPoolsReq>,
    ) -> Result<Response<mgmt::ListPoolsResp>, Status> {
        self.call("ListPools", r, |q| &q.sys, |e, q| e.list_pools(q))
            .await
    }
    async fn list_containers(
        &self,
        r: Request<mgmt::ListContReq>,
    ) -> Result<Response<mgmt::ListContResp>, Status> {
        self.call("ListContainers", r, |q| &q.sys, |e, q| e.list_containers(q))
            .await
    }
    async fn cont_set_owner(
        &self,
        r: Request<mgmt::ContSetOwnerReq>,
    ) -> Result<Response<mgmt::DaosResp>, Status> {
        self.call("ContSetOwner", r, |q| &q.sys, |e, q| e.cont_set_owner(q))
            .await
    }
    async fn system_query(
        &self,
        r: Request<mgmt::SystemQueryReq>,
    ) -> Result<Response<mgmt::SystemQueryResp>, Status> {
        self.call("SystemQuery", r, |q| &q.sys, |e, q| e.system_query(q))
            .await
    }
}

/// Our own services have no `sys` field.
fn no_sys<T>(_: &T) -> &str {
    ""
}

#[tonic::async_trait]
impl ContainerSvc for EngineServices {
    async fn cont_create(
        &self,
        r: Request<eng::ContCreateReq>,
    ) -> Result<Response<eng::ContInfo>, Status> {
        self.call("ContCreate", r, no_sys, |e, q| e.cont_create(q))
            .await
    }
    async fn cont_destroy(
        &self,
        r: Request<eng::ContDestroyReq>,
    ) -> Result<Response<eng::ContDestroyResp>, Status> {
        self.call("ContDestroy", r, no_sys, |e, q| e.cont_destroy(q))
            .await
    }
    async fn cont_query(
        &self,
        r: Request<eng::ContRef>,
    ) -> Result<Response<eng::ContInfo>, Status> {
        self.call("ContQuery", r, no_sys, |e, q| e.cont_query(q))
            .await
    }
    async fn cont_list(
        &self,
        r: Request<eng::ContListReq>,
    ) -> Result<Response<eng::ContListResp>, Status> {
        self.call("ContList", r, no_sys, |e, q| e.cont_list(q))
            .await
    }
    async fn cont_set_prop(
        &self,
        r: Request<eng::ContSetPropReq>,
    ) -> Result<Response<eng::ContInfo>, Status> {
        self.call("ContSetProp", r, no_sys, |e, q| e.cont_set_prop(q))
            .await
    }
    async fn cont_get_acl(
        &self,
        r: Request<eng::ContRef>,
    ) -> Result<Response<eng::ContAclResp>, Status> {
        self.call("ContGetAcl", r, no_sys, |e, q| e.cont_get_acl(q))
            .await
    }
    async fn cont_overwrite_acl(
        &self,
        r: Request<eng::ContModifyAclReq>,
    ) -> Result<Response<eng::ContAclResp>, Status> {
        self.call("ContOverwriteAcl", r, no_sys, |e, q| {
            e.cont_modify_acl(q.cont, |_| acl::check_acl(&q.entries, AclTarget::Container))
        })
        .await
    }
    async fn cont_update_acl(
        &self,
        r: Request<eng::ContModifyAclReq>,
    ) -> Result<Response<eng::ContAclResp>, Status> {
        self.call("ContUpdateAcl", r, no_sys, |e, q| {
            e.cont_modify_acl(q.cont, |cur| {
                acl::update_acl(cur, &q.entries, AclTarget::Container)
            })
        })
        .await
    }
    async fn cont_delete_acl(
        &self,
        r: Request<eng::ContDeleteAclReq>,
    ) -> Result<Response<eng::ContAclResp>, Status> {
        self.call("ContDeleteAcl", r, no_sys, |e, q| {
            e.cont_modify_acl(q.cont, |cur| acl::delete_from_acl(cur, &q.principal))
        })
        .await
    }
    async fn cont_set_attr(
        &self,
        r: Request<eng::ContSetAttrReq>,
    ) -> Result<Response<eng::ContAttrResp>, Status> {
        self.call("ContSetAttr", r, no_sys, |e, q| e.cont_set_attr(q))
            .await
    }
    async fn cont_get_attr(
        &self,
        r: Request<eng::ContRef>,
    ) -> Result<Response<eng::ContAttrResp>, Status> {
        self.call("ContGetAttr", r, no_sys, |e, q| e.cont_get_attr(q))
            .await
    }
    async fn snapshot_create(
        &self,
        r: Request<eng::SnapshotCreateReq>,
    ) -> Result<Response<eng::Snapshot>, Status> {
        self.call("SnapshotCreate", r, no_sys, |e, q| e.snapshot_create(q))
            .await
    }
    async fn snapshot_list(
        &self,
        r: Request<eng::ContRef>,
    ) -> Result<Response<eng::SnapshotListResp>, Status> {
        self.call("SnapshotList", r, no_sys, |e, q| e.snapshot_list(q))
            .await
    }
    async fn snapshot_destroy(
        &self,
        r: Request<eng::SnapshotDestroyReq>,
    ) -> Result<Response<eng::SnapshotListResp>, Status> {
        self.call("SnapshotDestroy", r, no_sys, |e, q| e.snapshot_destroy(q))
            .await
    }
    async fn cont_clone_snapshot(
        &self,
        r: Request<eng::ContCloneReq>,
    ) -> Result<Response<eng::ContInfo>, Status> {
        self.call("ContCloneSnapshot", r, no_sys, |e, q| {
            e.cont_clone_snapshot(q)
        })
        .await
    }
}

#[tonic::async_trait]
impl RankControl for EngineServices {
    async fn rank_stop(&self, r: Request<eng::RankReq>) -> Result<Response<eng::RankResp>, Status> {
        self.call("RankStop", r, no_sys, |e, q| e.rank_stop(q))
            .await
    }
    async fn rank_start(
        &self,
        r: Request<eng::RankReq>,
    ) -> Result<Response<eng::RankResp>, Status> {
        authorize(&r, "RankStart", &self.engine.cfg.system, "")?;
        let resp = self.engine.rank_start(r.into_inner()).await?;
        Ok(Response::new(resp))
    }
}
