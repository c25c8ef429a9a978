// Over 600 lines: every Controller RPC end to end against one engine fixture and one socket client.
//! The CSI Identity and Controller services end to end: a real engine process, the server
//! on a real unix socket in a temporary directory, and a tonic client over that socket.
//! What the controller claims to have made is checked in the engine itself.

use dpufs_csi::csi::controller::{DEFAULT_CAPACITY, RequestRecord};
use dpufs_csi::csi::directory::StaticConfig;
use dpufs_csi::csi::label::{
    NAME_ATTR, PVC_NAME_ATTR, PVC_NAMESPACE_ATTR, QOS_ATTR, REQUEST_ATTR, label_for,
};
use dpufs_csi::csi::{StaticDirectory, TOPOLOGY_SYSTEM_KEY, VolumeId, serve_controller_until};
use dpufs_daos::{ContainerAdmin, ContainerInfo, ContainerSpec, EngineContainers};
use dpufs_daos::{PoolSize, PoolSpec};
use dpufs_e2e::csi_bed::{cap, connect};
use dpufs_e2e::{EngineOpts, EngineProcess};
use dpufs_proto::csi::v1::controller_client::ControllerClient;
use dpufs_proto::csi::v1::identity_client::IdentityClient;
use dpufs_proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use dpufs_proto::csi::v1::{
    self as csi, CapacityRange, ControllerExpandVolumeRequest, CreateVolumeRequest,
    DeleteVolumeRequest, ValidateVolumeCapabilitiesRequest, VolumeCapability,
};
use dpufs_proto::daos::props::{CONT_DPUFS_CHUNK_SIZE, CONT_DPUFS_QUOTA, CONT_LAYOUT_TYPE};
use dpufs_proto::daos::props::{LAYOUT_POSIX, PropValue};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tonic::Code;
use tonic::transport::Channel;
use uuid::Uuid;

const GIB: i64 = 1 << 30;
const FAST: &str = "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f";
const BULK: &str = "0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b";
/// In the directory, not in DAOS.
const GHOST: &str = "9d3c2b1a-0f1e-4d2c-8b3a-493827160504";

/// An engine with two pools, the controller serving on a socket, and clients.
struct Bed {
    _dir: tempfile::TempDir,
    _engine: EngineProcess,
    admin: EngineContainers,
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), dpufs_csi::csi::ServeError>>>,
    ctl: ControllerClient<Channel>,
    id: IdentityClient<Channel>,
}

impl Bed {
    async fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let engine = EngineProcess::start(&dir.path().join("engine"), EngineOpts::default())
            .expect("engine");
        let mgmt = engine.client();
        for (label, uuid, bytes) in [("fast", FAST, 2u64 << 30), ("bulk", BULK, 1 << 30)] {
            let mut spec = PoolSpec::new(label, PoolSize::total(bytes));
            spec.uuid = uuid.parse().unwrap();
            mgmt.pool_create(&spec).await.expect("pool create");
        }
        let config: StaticConfig = serde_json::from_value(serde_json::json!({
            "system": {"endpoints": [engine.addr], "requestTimeoutSeconds": 20},
            "pools": {"fast": FAST, "bulk": BULK, "ghost": GHOST},
            "tenants": [
                {"name": "team-a", "principal": "team-a@", "namespaces": ["ns-a"], "allowedPools": ["fast", "bulk", "ghost"]},
                {"name": "team-b", "principal": "team-b@", "namespaces": ["ns-b"], "allowedPools": ["fast"]},
                {"name": "default", "principal": "dpufs@", "allowedPools": ["fast"]}
            ],
            "defaultTenant": "default"
        }))
        .unwrap();
        let directory = Arc::new(StaticDirectory::new(config).unwrap());
        let socket = dir.path().join("csi").join("csi.sock");
        let endpoint = format!("unix://{}", socket.display());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            serve_controller_until(&endpoint, directory, async {
                let _ = stopped.await;
            })
            .await
        });
        let channel = connect(&socket).await;
        Bed {
            admin: EngineContainers::new(&mgmt),
            _engine: engine,
            _dir: dir,
            socket,
            stop: Some(stop),
            server: Some(server),
            ctl: ControllerClient::new(channel.clone()),
            id: IdentityClient::new(channel),
        }
    }

    async fn create(&self, req: CreateVolumeRequest) -> Result<csi::Volume, tonic::Status> {
        self.ctl
            .clone()
            .create_volume(req)
            .await
            .map(|r| r.into_inner().volume.expect("a volume"))
    }

    async fn delete(&self, id: &str) -> Result<(), tonic::Status> {
        self.ctl
            .clone()
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .map(|_| ())
    }

    async fn validate(
        &self,
        id: &str,
        caps: Vec<VolumeCapability>,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, tonic::Status> {
        self.ctl
            .clone()
            .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: id.into(),
                volume_capabilities: caps,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner())
    }

    async fn container(&self, pool: &str, label: &str) -> Option<ContainerInfo> {
        match self.admin.query(pool, label).await {
            Ok(info) => Some(info),
            Err(dpufs_daos::DaosError::NotFound { .. }) => None,
            Err(e) => panic!("query {label}: {e}"),
        }
    }

    async fn count(&self, pool: &str) -> usize {
        self.admin.list(pool).await.unwrap().len()
    }

    /// Stops the server and checks it ended cleanly and removed its socket.
    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.server.take().unwrap().await.unwrap().unwrap();
        assert!(!self.socket.exists(), "the socket file is removed at exit");
    }
}

fn rwx() -> VolumeCapability {
    cap(Mode::MultiNodeMultiWriter)
}

fn request(name: &str, required: i64, params: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![rwx()],
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

const NS_A: (&str, &str) = ("csi.storage.k8s.io/pvc/namespace", "ns-a");
const PVC: (&str, &str) = ("csi.storage.k8s.io/pvc/name", "data");
const PV: (&str, &str) = ("csi.storage.k8s.io/pv/name", "pvc-0001");

fn attrs_text(attrs: &std::collections::BTreeMap<String, Vec<u8>>, key: &str) -> String {
    String::from_utf8(attrs.get(key).cloned().unwrap_or_default()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_and_capabilities_over_the_socket() {
    let bed = Bed::new().await;
    let mut id = bed.id.clone();
    let info = id
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "dfs.dpufs.io");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps = id
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), 3, "{caps:?}");
    let probe = id.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let ctl_caps = bed
        .ctl
        .clone()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(ctl_caps.len(), 10, "{ctl_caps:?}");
    let err = bed
        .ctl
        .clone()
        .controller_publish_volume(csi::ControllerPublishVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(err.details().is_empty());
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_makes_a_container_with_label_attributes_acl_and_quota() {
    let bed = Bed::new().await;
    let name = "pvc-0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b";
    let vol = bed
        .create(request(
            name,
            GIB,
            &[("pool", "fast"), ("chunkSize", "256Ki"), NS_A, PVC, PV],
        ))
        .await
        .unwrap();
    let id = VolumeId::parse(&vol.volume_id).unwrap();
    assert_eq!(id.system, "daos_server");
    assert_eq!(id.pool.to_string(), FAST);
    assert_eq!(vol.capacity_bytes, GIB);
    assert_eq!(vol.volume_context["pool"], FAST);
    assert_eq!(vol.volume_context["poolName"], "fast");
    assert_eq!(vol.volume_context["container"], id.container.to_string());
    assert_eq!(vol.volume_context["tenant"], "team-a");
    assert_eq!(vol.volume_context["principal"], "team-a@");
    assert_eq!(vol.accessible_topology.len(), 1);
    assert_eq!(
        vol.accessible_topology[0].segments,
        HashMap::from([(TOPOLOGY_SYSTEM_KEY.to_string(), "daos_server".to_string())])
    );

    // In the engine: found by the label of the name, with what the controller said.
    let label = label_for(name);
    let info = bed.container(FAST, &label).await.expect("the container");
    assert_eq!(info.uuid, id.container.to_string());
    assert_eq!(vol.volume_context["containerLabel"], label);
    assert_eq!(
        info.properties.get(&CONT_DPUFS_QUOTA),
        Some(&PropValue::Num(1 << 30))
    );
    assert_eq!(
        info.properties.get(&CONT_DPUFS_CHUNK_SIZE),
        Some(&PropValue::Num(256 << 10))
    );
    assert_eq!(
        info.properties.get(&CONT_LAYOUT_TYPE),
        Some(&PropValue::Num(LAYOUT_POSIX))
    );
    let mut acl = bed.admin.get_acl(FAST, &info.uuid).await.unwrap().entries;
    acl.sort();
    assert_eq!(acl, vec!["A::OWNER@:rwdtTaAo", "A::team-a@:rwt"]);
    let attrs = bed.admin.get_attributes(FAST, &info.uuid).await.unwrap();
    assert_eq!(attrs_text(&attrs, NAME_ATTR), name);
    assert_eq!(attrs_text(&attrs, PVC_NAMESPACE_ATTR), "ns-a");
    assert_eq!(attrs_text(&attrs, PVC_NAME_ATTR), "data");
    let record: RequestRecord = serde_json::from_slice(&attrs[REQUEST_ATTR]).unwrap();
    assert_eq!(record.principal, "team-a@");
    assert_eq!(record.pool, "fast");
    assert_eq!(record.properties.chunk_size, Some(256 << 10));
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_is_idempotent_and_refuses_other_settings() {
    let bed = Bed::new().await;
    let name = "pvc-twice";
    let first = bed
        .create(request(name, GIB, &[("pool", "fast"), NS_A]))
        .await
        .unwrap();
    let again = bed
        .create(request(name, GIB, &[("pool", "fast"), NS_A]))
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(bed.count(FAST).await, 1);
    // A range the volume fits is the same request.
    let mut fits = request(name, GIB / 2, &[("pool", "fast"), NS_A]);
    fits.capacity_range.as_mut().unwrap().limit_bytes = 2 * GIB;
    assert_eq!(bed.create(fits).await.unwrap(), first);

    for (what, req) in [
        ("bigger", request(name, 2 * GIB, &[("pool", "fast"), NS_A])),
        (
            "other chunk size",
            request(name, GIB, &[("pool", "fast"), ("chunkSize", "64Ki"), NS_A]),
        ),
        (
            "other tenant",
            request(
                name,
                GIB,
                &[
                    ("pool", "fast"),
                    ("csi.storage.k8s.io/pvc/namespace", "ns-b"),
                ],
            ),
        ),
        ("other pool", request(name, GIB, &[("pool", "bulk"), NS_A])),
    ] {
        let err = bed.create(req).await.unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{what}: {}", err.message());
        assert!(err.message().contains(name), "{what}: {}", err.message());
        assert!(err.details().is_empty());
    }
    assert_eq!(bed.count(FAST).await, 1);
    assert_eq!(bed.count(BULK).await, 0);

    // Concurrent creates of one new name: each succeeds with the same volume or is told
    // to retry (ABORTED); never two containers.
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let mut ctl = bed.ctl.clone();
            let req = request("pvc-race", GIB, &[("pool", "fast"), NS_A]);
            tokio::spawn(async move { ctl.create_volume(req).await })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.unwrap().map(|r| r.into_inner().volume.unwrap()));
    }
    let ids: Vec<String> = results
        .iter()
        .filter_map(|r| match r {
            Ok(v) => Some(v.volume_id.clone()),
            Err(s) => {
                assert_eq!(s.code(), Code::Aborted, "{}", s.message());
                None
            }
        })
        .collect();
    assert!(!ids.is_empty());
    assert!(ids.iter().all(|i| *i == ids[0]));
    assert_eq!(bed.count(FAST).await, 2);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_completes_a_create_that_stopped_half_way() {
    let bed = Bed::new().await;
    let name = "pvc-half-done";
    // What a create that crashed right after making the container leaves: the label, the
    // default ACL, no quota, no attributes.
    let made = bed
        .admin
        .create(&ContainerSpec {
            pool: FAST.into(),
            label: label_for(name),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(quota(&made), None);
    let vol = bed
        .create(request(name, GIB, &[("pool", "fast"), NS_A]))
        .await
        .unwrap();
    assert_eq!(
        VolumeId::parse(&vol.volume_id)
            .unwrap()
            .container
            .to_string(),
        made.uuid,
        "the same container, completed"
    );
    assert_eq!(vol.capacity_bytes, GIB);
    let info = bed.container(FAST, &label_for(name)).await.unwrap();
    assert_eq!(quota(&info), Some(1 << 30));
    let mut acl = info.acl.entries.clone();
    acl.sort();
    assert_eq!(acl, vec!["A::OWNER@:rwdtTaAo", "A::team-a@:rwt"]);
    let attrs = bed.admin.get_attributes(FAST, &info.uuid).await.unwrap();
    assert_eq!(attrs_text(&attrs, NAME_ATTR), name);
    assert!(attrs.contains_key(REQUEST_ATTR));
    assert_eq!(bed.count(FAST).await, 1);
    bed.shutdown().await;
}

fn quota(info: &ContainerInfo) -> Option<u64> {
    match info.properties.get(&CONT_DPUFS_QUOTA) {
        Some(PropValue::Num(q)) if *q > 0 => Some(*q),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_codes_and_create_nothing() {
    let bed = Bed::new().await;
    let err = bed
        .create(request("pvc-x", GIB, &[("volumeMode", "Filesystem")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("\"volumeMode\""),
        "{}",
        err.message()
    );
    let err = bed
        .create(request("pvc-x", GIB, &[("objectClass", "RP_9")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("objectClass"), "{}", err.message());
    let err = bed
        .create(request(
            "pvc-x",
            GIB,
            &[("csi.storage.k8s.io/pvc/namespace", "stranger")],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("\"stranger\""), "{}", err.message());
    let err = bed
        .create(request("pvc-x", 100 * GIB, &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{}", err.message());
    let err = bed
        .create(request("pvc-x", GIB, &[("pool", "bulk")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{}", err.message());
    let err = bed
        .create(request("pvc-x", GIB, &[("pool", "ghost"), NS_A]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("\"ghost\""), "{}", err.message());
    let mut block = request("pvc-x", GIB, &[]);
    block.volume_capabilities[0].access_type = Some(AccessType::Block(BlockVolume {}));
    let err = bed.create(block).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // A pool of its own names no shared pool.
    let err = bed
        .create(request(
            "pvc-x",
            GIB,
            &[("provisioning", "pool"), ("pool", "fast")],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    // rd_fac 2 needs three fault domains; the engine has one rank: DAOS refuses.
    let err = bed
        .create(request("pvc-x", GIB, &[("redundancyFactor", "2")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(err.message().contains("rd_fac"), "{}", err.message());
    assert_eq!(bed.count(FAST).await, 0);
    assert_eq!(bed.count(BULK).await, 0);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_tenant_pool_and_capacity() {
    let bed = Bed::new().await;
    let mut req = request("pvc-defaults", 0, &[]);
    req.capacity_range = None;
    let vol = bed.create(req).await.unwrap();
    assert_eq!(vol.capacity_bytes, DEFAULT_CAPACITY as i64);
    assert_eq!(vol.volume_context["tenant"], "default");
    assert_eq!(vol.volume_context["poolName"], "fast");
    let info = bed
        .container(FAST, &label_for("pvc-defaults"))
        .await
        .unwrap();
    assert_eq!(quota(&info), Some(DEFAULT_CAPACITY));
    assert!(info.acl.entries.contains(&"A::dpufs@:rwt".to_string()));
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_volume_twice_is_ok_and_the_container_is_gone() {
    let bed = Bed::new().await;
    let vol = bed
        .create(request("pvc-del", GIB, &[NS_A, ("pool", "fast")]))
        .await
        .unwrap();
    bed.delete(&vol.volume_id).await.unwrap();
    assert!(bed.container(FAST, &label_for("pvc-del")).await.is_none());
    bed.delete(&vol.volume_id).await.unwrap();
    // Ids of others, and well-formed ids of nothing: OK.
    bed.delete("reallyfakevolumeid").await.unwrap();
    let nothing = VolumeId::new("daos_server", FAST.parse().unwrap(), Uuid::new_v4());
    bed.delete(&nothing.to_string()).await.unwrap();
    let no_pool = VolumeId::new("daos_server", Uuid::new_v4(), Uuid::new_v4());
    bed.delete(&no_pool.to_string()).await.unwrap();
    // Malformed ids of ours and empty ids: INVALID_ARGUMENT.
    for bad in ["", "v1/daos_server", &format!("v1/daos_server/{FAST}/nope")] {
        let err = bed.delete(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}");
    }
    // A system nobody configured: refused, not silently OK.
    let elsewhere = VolumeId::new("elsewhere", Uuid::new_v4(), Uuid::new_v4());
    let err = bed.delete(&elsewhere.to_string()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    // A container the driver did not provision is never deleted through a volume id.
    let shared = bed
        .admin
        .create(&ContainerSpec {
            pool: FAST.into(),
            label: "shared-data".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = VolumeId::new(
        "daos_server",
        FAST.parse().unwrap(),
        shared.uuid.parse().unwrap(),
    );
    let err = bed.delete(&id.to_string()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(bed.container(FAST, "shared-data").await.is_some());
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_volume_capabilities_confirms_only_what_is_supported() {
    let bed = Bed::new().await;
    let vol = bed
        .create(request("pvc-val", GIB, &[NS_A, ("pool", "fast")]))
        .await
        .unwrap();
    let modes = [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ];
    let all: Vec<_> = modes.iter().map(|m| cap(*m)).collect();
    let r = bed.validate(&vol.volume_id, all.clone()).await.unwrap();
    assert_eq!(r.confirmed.unwrap().volume_capabilities, all);
    let mut block = rwx();
    block.access_type = Some(AccessType::Block(BlockVolume {}));
    for unsupported in [
        block,
        cap(Mode::Unknown),
        VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })),
            access_mode: Some(AccessMode {
                mode: Mode::MultiNodeMultiWriter as i32,
            }),
        },
    ] {
        let r = bed
            .validate(&vol.volume_id, vec![rwx(), unsupported.clone()])
            .await
            .unwrap();
        assert!(r.confirmed.is_none(), "{unsupported:?}");
        assert!(!r.message.is_empty());
    }
    // Parameters are checked too.
    let r = bed
        .ctl
        .clone()
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: vol.volume_id.clone(),
            volume_capabilities: vec![rwx()],
            parameters: HashMap::from([("volumeMode".to_string(), "Block".to_string())]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.confirmed.is_none());
    assert!(r.message.contains("volumeMode"), "{}", r.message);
    // Missing volumes: NOT_FOUND, whether the id is ours or not.
    let nothing = VolumeId::new("daos_server", FAST.parse().unwrap(), Uuid::new_v4());
    for id in [nothing.to_string(), "some-vol-id".to_string()] {
        let err = bed.validate(&id, vec![rwx()]).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{id}");
    }
    let err = bed.validate("v1/x", vec![rwx()]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = bed.validate(&vol.volume_id, vec![]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = bed.validate("", vec![rwx()]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_128_character_unicode_name_works() {
    let bed = Bed::new().await;
    let name: String = "pvc-日本語-é-🦀-"
        .chars()
        .cycle()
        .take(128)
        .collect::<String>();
    assert_eq!(name.chars().count(), 128);
    assert!(name.len() > 128, "more than 128 bytes");
    let vol = bed
        .create(request(&name, GIB, &[NS_A, ("pool", "fast")]))
        .await
        .unwrap();
    let again = bed
        .create(request(&name, GIB, &[NS_A, ("pool", "fast")]))
        .await
        .unwrap();
    assert_eq!(vol, again);
    let info = bed.container(FAST, &label_for(&name)).await.unwrap();
    let attrs = bed.admin.get_attributes(FAST, &info.uuid).await.unwrap();
    assert_eq!(attrs_text(&attrs, NAME_ATTR), name);
    bed.delete(&vol.volume_id).await.unwrap();
    assert!(bed.container(FAST, &label_for(&name)).await.is_none());
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expand_volume_raises_the_quota() {
    let bed = Bed::new().await;
    let vol = bed
        .create(request("pvc-grow", GIB, &[NS_A, ("pool", "fast")]))
        .await
        .unwrap();
    let expand = |bytes: i64, id: &str| {
        let mut ctl = bed.ctl.clone();
        let req = ControllerExpandVolumeRequest {
            volume_id: id.to_string(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        async move {
            ctl.controller_expand_volume(req)
                .await
                .map(|r| r.into_inner())
        }
    };
    let r = expand(GIB + GIB / 2, &vol.volume_id).await.unwrap();
    assert_eq!(r.capacity_bytes, GIB + GIB / 2);
    assert!(!r.node_expansion_required);
    let info = bed.container(FAST, &label_for("pvc-grow")).await.unwrap();
    assert_eq!(quota(&info), Some(3 << 29));
    // Already larger: OK, unchanged.
    let r = expand(GIB, &vol.volume_id).await.unwrap();
    assert_eq!(r.capacity_bytes, GIB + GIB / 2);
    let err = expand(100 * GIB, &vol.volume_id).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{}", err.message());
    let nothing = VolumeId::new("daos_server", FAST.parse().unwrap(), Uuid::new_v4());
    let err = expand(GIB, &nothing.to_string()).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = expand(0, &vol.volume_id).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    bed.shutdown().await;
}

/// ControllerModifyVolume: each mutable parameter sets or lifts its QoS cap in the
/// container's attribute and leaves the others; a bad one changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modify_volume_sets_lifts_and_keeps_qos_caps() {
    let bed = Bed::new().await;
    let mut req = request("pvc-qos", GIB, &[NS_A, ("pool", "fast")]);
    req.mutable_parameters = HashMap::from([("maxIops".to_string(), "500".to_string())]);
    let vol = bed.create(req).await.unwrap();
    let uuid = VolumeId::parse(&vol.volume_id)
        .unwrap()
        .container
        .to_string();
    let qos = || async {
        let attrs = bed.admin.get_attributes(FAST, &uuid).await.unwrap();
        attrs_text(&attrs, QOS_ATTR)
    };
    assert_eq!(
        qos().await,
        r#"{"maxIops":500}"#,
        "CreateVolume's mutable parameters"
    );
    let modify = |id: &str, pairs: &[(&str, &str)]| {
        let mut ctl = bed.ctl.clone();
        let req = csi::ControllerModifyVolumeRequest {
            volume_id: id.to_string(),
            mutable_parameters: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        async move { ctl.controller_modify_volume(req).await.map(|_| ()) }
    };
    modify(&vol.volume_id, &[("maxThroughputMiBps", "64")])
        .await
        .unwrap();
    assert_eq!(qos().await, r#"{"maxIops":500,"maxThroughputMiBps":64}"#);
    // Again: the same, OK.
    modify(&vol.volume_id, &[("maxThroughputMiBps", "64")])
        .await
        .unwrap();
    modify(&vol.volume_id, &[("maxIops", "unlimited")])
        .await
        .unwrap();
    assert_eq!(qos().await, r#"{"maxThroughputMiBps":64}"#);
    // One bad value: nothing applied, not even the good one beside it.
    let err = modify(
        &vol.volume_id,
        &[("maxThroughputMiBps", "128"), ("maxIops", "lots")],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        err.message().contains("maxIops=\"lots\""),
        "{}",
        err.message()
    );
    assert_eq!(qos().await, r#"{"maxThroughputMiBps":64}"#);
    let err = modify(&vol.volume_id, &[("tier", "gold")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let nothing = VolumeId::new("daos_server", FAST.parse().unwrap(), Uuid::new_v4());
    let err = modify(&nothing.to_string(), &[("maxIops", "5")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    let err = modify("", &[("maxIops", "5")]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    bed.shutdown().await;
}

/// ListVolumes pages through every volume of the driver, ControllerGetVolume shows one with
/// its condition, GetCapacity reports the pool's free data bytes for its system and 0 for
/// another system's topology.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_get_and_capacity_show_what_exists() {
    let bed = Bed::new().await;
    let mut ids = vec![];
    for name in ["pvc-l1", "pvc-l2", "pvc-l3"] {
        let vol = bed
            .create(request(name, GIB, &[("pool", "fast"), NS_A]))
            .await
            .unwrap();
        ids.push(vol.volume_id);
    }
    ids.sort();
    let mut ctl = bed.ctl.clone();
    let mut seen = vec![];
    let mut token = String::new();
    loop {
        let page = ctl
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        for e in page.entries {
            let v = e.volume.unwrap();
            assert_eq!(v.capacity_bytes, GIB);
            assert!(!e.status.unwrap().volume_condition.unwrap().abnormal);
            seen.push(v.volume_id);
        }
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(seen, ids, "every volume once, in order");
    let bad = ctl
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 0,
            starting_token: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::Aborted);

    let got = ctl
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: ids[0].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().volume_id, ids[0]);
    let condition = got.status.unwrap().volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    bed.delete(&ids[0]).await.unwrap();
    let gone = ctl
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: ids[0].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    let foreign = ctl
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "some-volume".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(foreign.code(), Code::NotFound);

    let capacity = |params: &[(&str, &str)], system: Option<&str>| {
        let mut ctl = bed.ctl.clone();
        let parameters = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let topology = system.map(|s| csi::Topology {
            segments: [(TOPOLOGY_SYSTEM_KEY.to_string(), s.to_string())].into(),
        });
        async move {
            ctl.get_capacity(csi::GetCapacityRequest {
                parameters,
                accessible_topology: topology,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let fast = capacity(&[("pool", "fast")], Some("daos_server")).await;
    assert!(
        fast.available_capacity > 0 && fast.available_capacity <= 2 * GIB,
        "{fast:?}"
    );
    assert!(fast.maximum_volume_size.is_some_and(|m| m <= 2 * GIB));
    let all = capacity(&[], None).await;
    assert!(all.available_capacity >= fast.available_capacity, "{all:?}");
    let other = capacity(&[], Some("elsewhere")).await;
    assert_eq!(other.available_capacity, 0);
    let err = bed
        .ctl
        .clone()
        .get_capacity(csi::GetCapacityRequest {
            parameters: [("tier".to_string(), "gold".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}
