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
        req: Request<Req>,
        sys: impl FnOnce(&Req) -> &str,
        f: impl FnOnce(&Engine, Req) -> Result<Resp> + Send + 'static,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
    {
        let peer_cn = req.extensions().get::<PeerCn>().map(|p| p.0.clone());
        check_caller(
            req.metadata(),
            sys(req.get_ref()),
            &self.engine.cfg.system,
            peer_cn.as_deref(),
        )
        .map_err(Status::from)?;
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
        self.call(r, |q| &q.sys, |e, q| e.leader_query(q)).await
    }
    async fn pool_create(
        &self,
        r: Request<mgmt::PoolCreateReq>,
    ) -> Result<Response<mgmt::PoolCreateResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.pool_create(q)).await
    }
    async fn pool_destroy(
        &self,
        r: Request<mgmt::PoolDestroyReq>,
    ) -> Result<Response<mgmt::PoolDestroyResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.pool_destroy(q)).await
    }
    async fn pool_evict(
        &self,
        r: Request<mgmt::PoolEvictReq>,
    ) -> Result<Response<mgmt::PoolEvictResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.pool_evict(q)).await
    }
    async fn pool_query(
        &self,
        r: Request<mgmt::PoolQueryReq>,
    ) -> Result<Response<mgmt::PoolQueryResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.pool_query(q)).await
    }
    async fn pool_set_prop(
        &self,
        r: Request<mgmt::PoolSetPropReq>,
    ) -> Result<Response<mgmt::PoolSetPropResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.pool_set_prop(q)).await
    }
    async fn pool_get_prop(
        &self,
        r: Request<mgmt::PoolGetPropReq>,
    ) -> Result<Response<mgmt::PoolGetPropResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.pool_get_prop(q)).await
    }
    async fn pool_get_acl(
        &self,
        r: Request<mgmt::GetAclReq>,
    ) -> Result<Response<mgmt::AclResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.pool_get_acl(q)).await
    }
    async fn pool_overwrite_acl(
        &self,
        r: Request<mgmt::ModifyAclReq>,
    ) -> Result<Response<mgmt::AclResp>, Status> {
        self.call(
            r,
            |q| &q.sys,
            |e, q| {
                e.pool_modify_acl(&q.id, |_| {
                    acl::check_acl(&q.entries, AclTarget::Pool)?;
                    Ok(q.entries.clone())
                })
            },
        )
        .await
    }
    async fn pool_update_acl(
        &self,
        r: Request<mgmt::ModifyAclReq>,
    ) -> Result<Response<mgmt::AclResp>, Status> {
        self.call(
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
        self.call(r, |q| &q.sys, |e, q| e.list_pools(q)).await
    }
    async fn list_containers(
        &self,
        r: Request<mgmt::ListContReq>,
    ) -> Result<Response<mgmt::ListContResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.list_containers(q)).await
    }
    async fn cont_set_owner(
        &self,
        r: Request<mgmt::ContSetOwnerReq>,
    ) -> Result<Response<mgmt::DaosResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.cont_set_owner(q)).await
    }
    async fn system_query(
        &self,
        r: Request<mgmt::SystemQueryReq>,
    ) -> Result<Response<mgmt::SystemQueryResp>, Status> {
        self.call(r, |q| &q.sys, |e, q| e.system_query(q)).await
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
        self.call(r, no_sys, |e, q| e.cont_create(q)).await
    }
    async fn cont_destroy(
        &self,
        r: Request<eng::ContDestroyReq>,
    ) -> Result<Response<eng::ContDestroyResp>, Status> {
        self.call(r, no_sys, |e, q| e.cont_destroy(q)).await
    }
    async fn cont_query(
        &self,
        r: Request<eng::ContRef>,
    ) -> Result<Response<eng::ContInfo>, Status> {
        self.call(r, no_sys, |e, q| e.cont_query(q)).await
    }
    async fn cont_list(
        &self,
        r: Request<eng::ContListReq>,
    ) -> Result<Response<eng::ContListResp>, Status> {
        self.call(r, no_sys, |e, q| e.cont_list(q)).await
    }
    async fn cont_set_prop(
        &self,
        r: Request<eng::ContSetPropReq>,
    ) -> Result<Response<eng::ContInfo>, Status> {
        self.call(r, no_sys, |e, q| e.cont_set_prop(q)).await
    }
    async fn cont_get_acl(
        &self,
        r: Request<eng::ContRef>,
    ) -> Result<Response<eng::ContAclResp>, Status> {
        self.call(r, no_sys, |e, q| e.cont_get_acl(q)).await
    }
    async fn cont_overwrite_acl(
        &self,
        r: Request<eng::ContModifyAclReq>,
    ) -> Result<Response<eng::ContAclResp>, Status> {
        self.call(r, no_sys, |e, q| {
            e.cont_modify_acl(q.cont, |_| {
                acl::check_acl(&q.entries, AclTarget::Container)?;
                Ok(q.entries.clone())
            })
        })
        .await
    }
    async fn cont_update_acl(
        &self,
        r: Request<eng::ContModifyAclReq>,
    ) -> Result<Response<eng::ContAclResp>, Status> {
        self.call(r, no_sys, |e, q| {
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
        self.call(r, no_sys, |e, q| {
            e.cont_modify_acl(q.cont, |cur| acl::delete_from_acl(cur, &q.principal))
        })
        .await
    }
    async fn cont_set_attr(
        &self,
        r: Request<eng::ContSetAttrReq>,
    ) -> Result<Response<eng::ContAttrResp>, Status> {
        self.call(r, no_sys, |e, q| e.cont_set_attr(q)).await
    }
    async fn cont_get_attr(
        &self,
        r: Request<eng::ContRef>,
    ) -> Result<Response<eng::ContAttrResp>, Status> {
        self.call(r, no_sys, |e, q| e.cont_get_attr(q)).await
    }
    async fn snapshot_create(
        &self,
        r: Request<eng::SnapshotCreateReq>,
    ) -> Result<Response<eng::Snapshot>, Status> {
        self.call(r, no_sys, |e, q| e.snapshot_create(q)).await
    }
    async fn snapshot_list(
        &self,
        r: Request<eng::ContRef>,
    ) -> Result<Response<eng::SnapshotListResp>, Status> {
        self.call(r, no_sys, |e, q| e.snapshot_list(q)).await
    }
    async fn snapshot_destroy(
        &self,
        r: Request<eng::SnapshotDestroyReq>,
    ) -> Result<Response<eng::SnapshotListResp>, Status> {
        self.call(r, no_sys, |e, q| e.snapshot_destroy(q)).await
    }
}

#[tonic::async_trait]
impl RankControl for EngineServices {
    async fn rank_stop(&self, r: Request<eng::RankReq>) -> Result<Response<eng::RankResp>, Status> {
        self.call(r, no_sys, |e, q| e.rank_stop(q)).await
    }
    async fn rank_start(
        &self,
        r: Request<eng::RankReq>,
    ) -> Result<Response<eng::RankResp>, Status> {
        let peer_cn = r.extensions().get::<PeerCn>().map(|p| p.0.clone());
        check_caller(
            r.metadata(),
            "",
            &self.engine.cfg.system,
            peer_cn.as_deref(),
        )?;
        let resp = self.engine.rank_start(r.into_inner()).await?;
        Ok(Response::new(resp))
    }
}
