//! The engine's management services as their gRPC clients reach them (DAOS's `MgmtSvc`, our
//! `ContainerSvc` and `RankControl`: the operator, the CSI controller, `dmg`-like tools). The
//! first input byte picks the method; the rest is its request message, decoded as tonic would
//! and served by the engine's own handlers. The promise beyond decoding: every request is
//! answered, a response or a status, and no handler panics (a panic in the blocking task a
//! handler runs on would reach the client as "engine task failed").
//!
//! The engine keeps its state from input to input, as it does between a client's calls; the
//! seeds name the pool and container [`FuzzEngine`] made by their labels (`fuzz`).

use crate::engine::FuzzEngine;
use dpufs_engine::service::EngineServices;
use dpufs_proto::daos::props::CONT_DPUFS_QUOTA;
use dpufs_proto::daos::{COMPONENT_HEADER, VERSION_HEADER, WIRE_VERSION};
use dpufs_proto::engine::v1::{
    self as eng, container_svc_server::ContainerSvc, rank_control_server::RankControl,
};
use dpufs_proto::mgmt::{self, mgmt_svc_server::MgmtSvc};
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Status};

/// What a panicking handler task is answered with (`engine::service`).
const PANICKED: &str = "engine task failed";

/// The methods, in the order the first input byte picks them (modulo their number), each with
/// its request type and the service trait that serves it.
macro_rules! methods {
    ($($name:literal => $service:ident :: $method:ident ($request:ty)),+ $(,)?) => {
        const METHODS: &[&str] = &[$($name),+];

        /// Serves `body` as a request of method `index`; `None` when it does not decode.
        async fn serve(
            services: &EngineServices,
            index: usize,
            body: &[u8],
        ) -> Option<Result<(), Status>> {
            let mut method = 0;
            $(
                if index == method {
                    let request = caller(<$request>::decode(body).ok()?);
                    let answer = $service::$method(services, request).await;
                    return Some(answer.map(drop));
                }
                method += 1;
            )+
            unreachable!("method {index} of {method}")
        }
    };
}

methods! {
    "LeaderQuery" => MgmtSvc::leader_query(mgmt::LeaderQueryReq),
    "PoolCreate" => MgmtSvc::pool_create(mgmt::PoolCreateReq),
    "PoolDestroy" => MgmtSvc::pool_destroy(mgmt::PoolDestroyReq),
    "PoolEvict" => MgmtSvc::pool_evict(mgmt::PoolEvictReq),
    "PoolQuery" => MgmtSvc::pool_query(mgmt::PoolQueryReq),
    "PoolSetProp" => MgmtSvc::pool_set_prop(mgmt::PoolSetPropReq),
    "PoolGetProp" => MgmtSvc::pool_get_prop(mgmt::PoolGetPropReq),
    "PoolGetACL" => MgmtSvc::pool_get_acl(mgmt::GetAclReq),
    "PoolOverwriteACL" => MgmtSvc::pool_overwrite_acl(mgmt::ModifyAclReq),
    "PoolUpdateACL" => MgmtSvc::pool_update_acl(mgmt::ModifyAclReq),
    "PoolDeleteACL" => MgmtSvc::pool_delete_acl(mgmt::DeleteAclReq),
    "ListPools" => MgmtSvc::list_pools(mgmt::ListPoolsReq),
    "ListContainers" => MgmtSvc::list_containers(mgmt::ListContReq),
    "ContSetOwner" => MgmtSvc::cont_set_owner(mgmt::ContSetOwnerReq),
    "SystemQuery" => MgmtSvc::system_query(mgmt::SystemQueryReq),
    "ContCreate" => ContainerSvc::cont_create(eng::ContCreateReq),
    "ContDestroy" => ContainerSvc::cont_destroy(eng::ContDestroyReq),
    "ContQuery" => ContainerSvc::cont_query(eng::ContRef),
    "ContList" => ContainerSvc::cont_list(eng::ContListReq),
    "ContSetProp" => ContainerSvc::cont_set_prop(eng::ContSetPropReq),
    "ContGetAcl" => ContainerSvc::cont_get_acl(eng::ContRef),
    "ContOverwriteAcl" => ContainerSvc::cont_overwrite_acl(eng::ContModifyAclReq),
    "ContUpdateAcl" => ContainerSvc::cont_update_acl(eng::ContModifyAclReq),
    "ContDeleteAcl" => ContainerSvc::cont_delete_acl(eng::ContDeleteAclReq),
    "ContSetAttr" => ContainerSvc::cont_set_attr(eng::ContSetAttrReq),
    "ContGetAttr" => ContainerSvc::cont_get_attr(eng::ContRef),
    "SnapshotCreate" => ContainerSvc::snapshot_create(eng::SnapshotCreateReq),
    "SnapshotList" => ContainerSvc::snapshot_list(eng::ContRef),
    "SnapshotDestroy" => ContainerSvc::snapshot_destroy(eng::SnapshotDestroyReq),
    "ContCloneSnapshot" => ContainerSvc::cont_clone_snapshot(eng::ContCloneReq),
    "RankStop" => RankControl::rank_stop(eng::RankReq),
    "RankStart" => RankControl::rank_start(eng::RankReq),
}

/// A request as our management client sends it: from an admin of this DAOS version (a caller
/// without the headers is refused before any handler runs, which would leave nothing to fuzz).
fn caller<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    let meta = request.metadata_mut();
    meta.insert(COMPONENT_HEADER, MetadataValue::from_static("admin"));
    meta.insert(VERSION_HEADER, MetadataValue::from_static(WIRE_VERSION));
    request
}

pub struct MgmtHarness {
    services: EngineServices,
    runtime: tokio::runtime::Runtime,
    _engine: FuzzEngine,
}

impl MgmtHarness {
    pub fn new() -> MgmtHarness {
        let engine = FuzzEngine::start();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        MgmtHarness {
            services: EngineServices::new(engine.engine()),
            runtime,
            _engine: engine,
        }
    }

    /// Whether the request decoded and the engine answered it with a response.
    pub fn run(&self, data: &[u8]) -> bool {
        let Some((&selector, body)) = data.split_first() else {
            return false;
        };
        let index = usize::from(selector) % METHODS.len();
        let served = self.runtime.block_on(serve(&self.services, index, body));
        match served {
            None => false,
            Some(Ok(())) => true,
            Some(Err(status)) => {
                let panicked =
                    status.code() == Code::Internal && status.message().contains(PANICKED);
                assert!(
                    !panicked,
                    "{} panicked: {}",
                    METHODS[index],
                    status.message()
                );
                false
            }
        }
    }
}

fn request(method: &str, message: impl Message) -> Vec<u8> {
    let index = METHODS.iter().position(|m| *m == method).expect("a method");
    let mut out = vec![index as u8];
    message.encode(&mut out).expect("to memory");
    out
}

/// The pool and the container the harness's engine has (by label).
const POOL: &str = "fuzz";
const CONT: &str = "fuzz";

fn cont_ref(cont: &str) -> Option<eng::ContRef> {
    Some(eng::ContRef {
        pool: POOL.into(),
        cont: cont.into(),
    })
}

fn label(number: u32, label: &str) -> mgmt::PoolProperty {
    mgmt::PoolProperty {
        number,
        value: Some(mgmt::pool_property::Value::Strval(label.into())),
    }
}

/// Valid calls, in an order a fresh engine accepts them all: a second pool made, changed and
/// destroyed; a second container made, changed, snapshotted, cloned and destroyed.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let pool = |id: &str| mgmt::PoolQueryReq {
        id: id.into(),
        ..Default::default()
    };
    let cont = |c: &str| cont_ref(c).expect("a ref");
    vec![
        (
            "mgmt-00-leader",
            request("LeaderQuery", mgmt::LeaderQueryReq::default()),
        ),
        (
            "mgmt-01-system",
            request("SystemQuery", mgmt::SystemQueryReq::default()),
        ),
        (
            "mgmt-02-pool-create",
            request(
                "PoolCreate",
                mgmt::PoolCreateReq {
                    uuid: "00000000-0000-4000-8000-0000000000f2".into(),
                    user: "root@".into(),
                    user_group: "root@".into(),
                    acl: vec!["A::OWNER@:rw".into(), "A:G:GROUP@:r".into()],
                    properties: vec![label(1, "fuzz2")],
                    tier_bytes: vec![16 << 20, 64 << 20],
                    ..Default::default()
                },
            ),
        ),
        ("mgmt-03-pool-query", request("PoolQuery", pool(POOL))),
        (
            "mgmt-04-pools",
            request("ListPools", mgmt::ListPoolsReq::default()),
        ),
        (
            "mgmt-05-pool-set-prop",
            request(
                "PoolSetProp",
                mgmt::PoolSetPropReq {
                    id: "fuzz2".into(),
                    properties: vec![label(1, "fuzz3")],
                    ..Default::default()
                },
            ),
        ),
        (
            "mgmt-06-pool-get-prop",
            request(
                "PoolGetProp",
                mgmt::PoolGetPropReq {
                    id: "fuzz3".into(),
                    properties: vec![mgmt::PoolProperty {
                        number: 1,
                        value: None,
                    }],
                    ..Default::default()
                },
            ),
        ),
        (
            "mgmt-07-pool-acl-update",
            request(
                "PoolUpdateACL",
                mgmt::ModifyAclReq {
                    id: "fuzz3".into(),
                    entries: vec!["A::alice@:r".into()],
                    ..Default::default()
                },
            ),
        ),
        (
            "mgmt-08-pool-acl-delete",
            request(
                "PoolDeleteACL",
                mgmt::DeleteAclReq {
                    id: "fuzz3".into(),
                    principal: "u:alice@".into(),
                    ..Default::default()
                },
            ),
        ),
        (
            "mgmt-09-pool-destroy",
            request(
                "PoolDestroy",
                mgmt::PoolDestroyReq {
                    id: "fuzz3".into(),
                    force: true,
                    ..Default::default()
                },
            ),
        ),
        (
            "mgmt-10-cont-create",
            request(
                "ContCreate",
                eng::ContCreateReq {
                    pool: POOL.into(),
                    label: "c2".into(),
                    properties: vec![eng::ContProperty {
                        number: CONT_DPUFS_QUOTA,
                        value: Some(eng::cont_property::Value::Numval(8 << 20)),
                    }],
                    attributes: [("k".to_string(), b"v".to_vec())].into(),
                    ..Default::default()
                },
            ),
        ),
        (
            "mgmt-11-cont-list",
            request("ContList", eng::ContListReq { pool: POOL.into() }),
        ),
        (
            "mgmt-12-cont-set-attr",
            request(
                "ContSetAttr",
                eng::ContSetAttrReq {
                    cont: cont_ref("c2"),
                    attributes: [("dpufs.k".to_string(), b"v2".to_vec())].into(),
                },
            ),
        ),
        ("mgmt-13-cont-get-attr", request("ContGetAttr", cont("c2"))),
        (
            "mgmt-14-cont-acl-update",
            request(
                "ContUpdateAcl",
                eng::ContModifyAclReq {
                    cont: cont_ref("c2"),
                    entries: vec!["A::bob@:rw".into()],
                },
            ),
        ),
        (
            "mgmt-15-snapshot-create",
            request(
                "SnapshotCreate",
                eng::SnapshotCreateReq {
                    cont: cont_ref("c2"),
                    name: "s1".into(),
                },
            ),
        ),
        ("mgmt-16-snapshot-list", request("SnapshotList", cont("c2"))),
        (
            "mgmt-17-clone",
            request(
                "ContCloneSnapshot",
                eng::ContCloneReq {
                    source: cont_ref("c2"),
                    snapshot_name: "s1".into(),
                    target: Some(eng::ContCreateReq {
                        pool: POOL.into(),
                        label: "c3".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ),
        ),
        (
            "mgmt-18-snapshot-destroy",
            request(
                "SnapshotDestroy",
                eng::SnapshotDestroyReq {
                    cont: cont_ref("c2"),
                    name: "s1".into(),
                    ..Default::default()
                },
            ),
        ),
        (
            "mgmt-19-cont-destroy",
            request(
                "ContDestroy",
                eng::ContDestroyReq {
                    cont: cont_ref("c3"),
                    force: true,
                },
            ),
        ),
        ("mgmt-20-cont-query", request("ContQuery", cont(CONT))),
    ]
}
