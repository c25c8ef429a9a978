//! The DPF storage plugin end to end over its unix socket: a tonic client plays DPF's SNAP
//! node driver against `dpufs_csi::dpf::serve_until`, with an in-memory agent behind it that
//! counts what it is asked to stage and unstage. What is checked: the wire answers (names,
//! capabilities, devices, pages, codes) and that repeats never stage or unstage twice.

use dpf::AccessMode;
use dpf::identity_service_client::IdentityServiceClient;
use dpf::storage_plugin_service_capability::{Type as CapabilityType, rpc};
use dpf::storage_plugin_service_client::StoragePluginServiceClient;
use dpufs_csi::dpf::{BackendError, Device, DeviceBackend, DeviceSpec, serve_until};
use dpufs_e2e::csi_bed::{connect, tempdir, try_connect};
use dpufs_proto::nvidia::storage::plugins::v1 as dpf;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::Code;
use tonic::transport::Channel;

/// Volume ids the in-memory agent treats specially.
const MISSING: &str = "v1/sys/pool/missing";
const FORBIDDEN: &str = "v1/sys/pool/other-tenant";
/// Staging it takes a while, so that calls overlap.
const SLOW: &str = "v1/sys/pool/slow";
/// Staging it stops half-way: it leaves something behind but no device.
const HALF: &str = "v1/sys/pool/half";

/// The DPU agent as the plugin sees it, in memory: one device per volume, named as the agent
/// names virtio-fs tags (a short, stable name derived from the volume id).
#[derive(Default)]
struct MemoryAgent {
    devices: Mutex<BTreeMap<String, Device>>,
    /// What a create that stopped half-way left, by volume id.
    leftovers: Mutex<BTreeSet<String>>,
    stagings: AtomicUsize,
    unstagings: AtomicUsize,
    ready: AtomicBool,
}

impl MemoryAgent {
    fn tag(volume_id: &str) -> String {
        // FNV-1a: stable across runs, unlike std's hasher.
        let hash = volume_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("dpufs-{hash:016x}")
    }

    fn counts(&self) -> (usize, usize) {
        (
            self.stagings.load(Ordering::SeqCst),
            self.unstagings.load(Ordering::SeqCst),
        )
    }
}

#[tonic::async_trait]
impl DeviceBackend for MemoryAgent {
    async fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    async fn create(&self, spec: &DeviceSpec) -> Result<String, BackendError> {
        match spec.volume_id.as_str() {
            MISSING => {
                return Err(BackendError::NotFound(format!(
                    "volume {}: its container does not exist",
                    spec.volume_id
                )));
            }
            FORBIDDEN => {
                return Err(BackendError::Refused(
                    "the volume's tenant may not use this host".into(),
                ));
            }
            SLOW => tokio::time::sleep(Duration::from_millis(300)).await,
            HALF => {
                self.leftovers
                    .lock()
                    .unwrap()
                    .insert(spec.volume_id.clone());
                return Err(BackendError::Failed("the worker did not start".into()));
            }
            _ => {}
        }
        self.stagings.fetch_add(1, Ordering::SeqCst);
        let name = MemoryAgent::tag(&spec.volume_id);
        let device = Device {
            name: name.clone(),
            spec: spec.clone(),
        };
        let mut devices = self.devices.lock().unwrap();
        assert!(
            devices.insert(spec.volume_id.clone(), device).is_none(),
            "the plugin asked to create {} twice",
            spec.volume_id
        );
        Ok(name)
    }

    async fn delete(&self, volume_id: &str) -> Result<(), BackendError> {
        let device = self.devices.lock().unwrap().remove(volume_id).is_some();
        let leftover = self.leftovers.lock().unwrap().remove(volume_id);
        if device || leftover {
            self.unstagings.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    async fn get(&self, volume_id: &str) -> Result<Option<Device>, BackendError> {
        Ok(self.devices.lock().unwrap().get(volume_id).cloned())
    }

    async fn list(&self) -> Result<Vec<Device>, BackendError> {
        // Reversed, so that the plugin's own ordering is what the test sees.
        Ok(self
            .devices
            .lock()
            .unwrap()
            .values()
            .rev()
            .cloned()
            .collect())
    }
}

/// The plugin serving on a socket in a temporary directory, and SNAP's clients.
struct Bed {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    agent: Arc<MemoryAgent>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<Result<(), dpufs_csi::csi::ServeError>>,
    snap: StoragePluginServiceClient<Channel>,
    identity: IdentityServiceClient<Channel>,
}

impl Bed {
    async fn new() -> Bed {
        let dir = tempdir("dpf-plugin");
        // The layout SNAP expects: plugins/<plugin name>/dpu.sock.
        let socket = dir.path().join("plugins/dfs.dpufs.io/dpu.sock");
        let agent = Arc::new(MemoryAgent::default());
        agent.ready.store(true, Ordering::SeqCst);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = {
            let socket = socket.clone();
            let backend: Arc<dyn DeviceBackend> = agent.clone();
            tokio::spawn(async move {
                serve_until(&socket, backend, async {
                    let _ = stopped.await;
                })
                .await
            })
        };
        let channel = connect(&socket).await;
        Bed {
            _dir: dir,
            socket,
            agent,
            stop: Some(stop),
            server,
            snap: StoragePluginServiceClient::new(channel.clone()),
            identity: IdentityServiceClient::new(channel),
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.server.await.unwrap().expect("server stops cleanly");
    }

    async fn create(&self, req: dpf::CreateDeviceRequest) -> Result<String, tonic::Status> {
        let mut snap = self.snap.clone();
        snap.create_device(req)
            .await
            .map(|r| r.into_inner().device_name)
    }

    async fn delete(&self, volume_id: &str, device_name: &str) -> Result<(), tonic::Status> {
        let mut snap = self.snap.clone();
        snap.delete_device(dpf::DeleteDeviceRequest {
            volume_id: volume_id.into(),
            device_name: device_name.into(),
        })
        .await
        .map(|_| ())
    }

    async fn get(
        &self,
        volume_id: &str,
        device_name: &str,
    ) -> Result<dpf::GetDeviceResponse, tonic::Status> {
        let mut snap = self.snap.clone();
        snap.get_device(dpf::GetDeviceRequest {
            volume_id: volume_id.into(),
            device_name: device_name.into(),
        })
        .await
        .map(|r| r.into_inner())
    }

    async fn list(
        &self,
        max_entries: i32,
        starting_token: &str,
    ) -> Result<dpf::ListDevicesResponse, tonic::Status> {
        let mut snap = self.snap.clone();
        snap.list_devices(dpf::ListDevicesRequest {
            max_entries,
            starting_token: starting_token.into(),
        })
        .await
        .map(|r| r.into_inner())
    }
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What SNAP's node driver sends for a Filesystem PVC.
fn create_request(volume_id: &str, modes: &[AccessMode]) -> dpf::CreateDeviceRequest {
    dpf::CreateDeviceRequest {
        volume_id: volume_id.into(),
        access_modes: modes.iter().map(|&m| m as i32).collect(),
        volume_mode: "Filesystem".into(),
        publish_context: HashMap::new(),
        volume_context: map(&[("dpufs.csi/name", "pvc-1"), ("tenant", "team-a")]),
        storage_parameters: map(&[("pool", "fast")]),
    }
}

fn assert_code<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, fragment: &str) {
    let status = result.expect_err("an error");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(
        status.message().contains(fragment),
        "{:?} lacks {fragment:?}",
        status.message()
    );
}

#[tokio::test]
async fn identity_names_the_plugin_and_probe_follows_the_agent() {
    let bed = Bed::new().await;
    let mut identity = bed.identity.clone();
    let info = identity
        .get_plugin_info(dpf::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "dfs.dpufs.io");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        info.manifest,
        map(&[("csiDriver", "dfs.dpufs.io"), ("volumeModes", "Filesystem")])
    );
    let ready = |mut c: IdentityServiceClient<Channel>| async move {
        c.probe(dpf::ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    };
    assert_eq!(ready(identity.clone()).await, Some(true));
    bed.agent.ready.store(false, Ordering::SeqCst);
    assert_eq!(ready(identity).await, Some(false));
    bed.stop().await;
}

#[tokio::test]
async fn capabilities_are_file_system_devices_and_listing_and_the_provider_is_the_default() {
    let bed = Bed::new().await;
    let mut snap = bed.snap.clone();
    let caps: Vec<i32> = snap
        .storage_plugin_get_capabilities(dpf::StoragePluginGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .map(|c| match c.r#type {
            Some(CapabilityType::Rpc(r)) => r.r#type,
            None => panic!("a capability without a type"),
        })
        .collect();
    assert_eq!(
        caps,
        vec![
            rpc::Type::CreateDeleteFsDevice as i32,
            rpc::Type::ListDevices as i32
        ]
    );
    let provider = snap
        .get_snap_provider(dpf::GetSnapProviderRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(provider.provider_name, "");
    bed.stop().await;
}

#[tokio::test]
async fn create_get_delete_and_their_repeats() {
    let bed = Bed::new().await;
    let volume = "v1/sys/pool/cont-a";
    let request = create_request(volume, &[AccessMode::Rwx, AccessMode::Rwo]);

    let device = bed.create(request.clone()).await.unwrap();
    assert_eq!(device, MemoryAgent::tag(volume));
    // The same request again: the same device, nothing staged twice.
    assert_eq!(bed.create(request.clone()).await.unwrap(), device);
    assert_eq!(bed.agent.counts(), (1, 0));
    // A repeat whose publish context differs is the same device too (docs/dpu.md).
    let mut other_attachment = request.clone();
    other_attachment.publish_context = map(&[("attachment", "2")]);
    assert_eq!(bed.create(other_attachment).await.unwrap(), device);

    // A repeat with other settings is refused, saying what differs.
    let mut other_modes = request.clone();
    other_modes.access_modes = vec![AccessMode::Rox as i32];
    assert_code(
        bed.create(other_modes).await,
        Code::AlreadyExists,
        "access modes [ACCESS_MODE_RWO, ACCESS_MODE_RWX] (asked [ACCESS_MODE_ROX])",
    );
    let mut other_params = request.clone();
    other_params
        .storage_parameters
        .insert("pool".into(), "bulk".into());
    assert_code(
        bed.create(other_params).await,
        Code::AlreadyExists,
        "storage_parameters differs in pool",
    );
    assert_eq!(bed.agent.counts(), (1, 0));

    // GetDevice reports what the device was made for, by volume id, with or without its
    // device name; another device name is not this volume's device.
    for name in ["", device.as_str()] {
        let got = bed.get(volume, name).await.unwrap();
        assert_eq!(
            got.access_modes,
            vec![AccessMode::Rwo as i32, AccessMode::Rwx as i32]
        );
        assert_eq!(got.volume_mode, "Filesystem");
        assert_eq!(got.volume_context, request.volume_context);
        assert_eq!(got.storage_parameters, request.storage_parameters);
        assert!(got.publish_context.is_empty());
    }
    assert_code(
        bed.get(volume, "dpufs-0000").await,
        Code::NotFound,
        "not \"dpufs-0000\"",
    );

    // Deleting under another device name is refused and leaves the device.
    assert_code(
        bed.delete(volume, "dpufs-0000").await,
        Code::FailedPrecondition,
        "not deleting it",
    );
    assert!(bed.get(volume, "").await.is_ok());
    bed.delete(volume, &device).await.unwrap();
    assert_eq!(bed.agent.counts(), (1, 1));
    // Deleted: delete again (with or without the name) is OK and unstages nothing.
    bed.delete(volume, &device).await.unwrap();
    bed.delete(volume, "").await.unwrap();
    assert_eq!(bed.agent.counts(), (1, 1));
    assert_code(bed.get(volume, "").await, Code::NotFound, volume);
    // A volume that never had a device: delete is OK, get is NOT_FOUND.
    bed.delete("v1/sys/pool/never", "").await.unwrap();
    assert_code(
        bed.get("v1/sys/pool/never", "").await,
        Code::NotFound,
        "has no device on this DPU",
    );
    // A create that stopped half-way shows no device, and its delete cleans up what it left.
    assert_code(
        bed.create(create_request(HALF, &[AccessMode::Rwo])).await,
        Code::Internal,
        "CreateDevice: the worker did not start",
    );
    assert_code(bed.get(HALF, "").await, Code::NotFound, HALF);
    bed.delete(HALF, "").await.unwrap();
    assert!(bed.agent.leftovers.lock().unwrap().is_empty());
    assert_eq!(bed.agent.counts(), (1, 2));
    // Created again after a delete: a fresh staging, the same name.
    assert_eq!(bed.create(request).await.unwrap(), device);
    assert_eq!(bed.agent.counts(), (2, 2));
    bed.stop().await;
}

#[tokio::test]
async fn list_pages_through_five_devices_two_at_a_time() {
    let bed = Bed::new().await;
    let volumes: Vec<String> = (1..=5).map(|i| format!("v1/sys/pool/cont-{i}")).collect();
    for v in &volumes {
        bed.create(create_request(v, &[AccessMode::Rwo]))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut tokens = Vec::new();
    let mut token = String::new();
    loop {
        let page = bed.list(2, &token).await.unwrap();
        assert!(page.entries.len() <= 2);
        seen.extend(
            page.entries
                .into_iter()
                .map(|e| (e.volume_id, e.device_name)),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
        tokens.push(token.clone());
        assert!(tokens.len() < 5, "the pages never end");
    }
    assert_eq!(tokens.len(), 2, "3 pages: {tokens:?}");
    let expected: Vec<(String, String)> = volumes
        .iter()
        .map(|v| (v.clone(), MemoryAgent::tag(v)))
        .collect();
    assert_eq!(seen, expected);
    // A token is replayable: the second page again.
    let again = bed.list(2, &tokens[0]).await.unwrap();
    assert_eq!(
        again
            .entries
            .iter()
            .map(|e| e.volume_id.as_str())
            .collect::<Vec<_>>(),
        [volumes[2].as_str(), volumes[3].as_str()]
    );
    // No maximum: everything at once.
    let all = bed.list(0, "").await.unwrap();
    assert_eq!(all.entries.len(), 5);
    assert!(all.next_token.is_empty());
    // A token the plugin did not give: ABORTED, as CSI's ListVolumes answers; a negative
    // maximum is a malformed request.
    assert_code(
        bed.list(2, "not-a-token").await,
        Code::Aborted,
        "not-a-token",
    );
    assert_code(bed.list(-2, "").await, Code::InvalidArgument, "negative");
    bed.stop().await;
}

#[tokio::test]
async fn malformed_requests_and_refusals_get_their_codes_and_stage_nothing() {
    let bed = Bed::new().await;
    let volume = "v1/sys/pool/cont-m";
    let with = |f: &dyn Fn(&mut dpf::CreateDeviceRequest)| {
        let mut r = create_request(volume, &[AccessMode::Rwo]);
        f(&mut r);
        r
    };
    let cases: Vec<(dpf::CreateDeviceRequest, Code, &str)> = vec![
        (
            with(&|r| r.volume_id.clear()),
            Code::InvalidArgument,
            "CreateDevice needs a volume_id",
        ),
        (
            with(&|r| r.volume_mode = "Block".into()),
            Code::InvalidArgument,
            "dfs.dpufs.io volumes are file systems",
        ),
        (
            with(&|r| r.volume_mode = "Raw".into()),
            Code::InvalidArgument,
            "\"Raw\"",
        ),
        (
            with(&|r| r.access_modes.clear()),
            Code::InvalidArgument,
            "at least one access mode",
        ),
        (
            with(&|r| r.access_modes = vec![0]),
            Code::InvalidArgument,
            "access mode 0",
        ),
        (
            with(&|r| r.access_modes.push(42)),
            Code::InvalidArgument,
            "access mode 42",
        ),
        (
            with(&|r| r.access_modes.push(AccessMode::Rwop as i32)),
            Code::InvalidArgument,
            "ReadWriteOncePod",
        ),
        (
            create_request(MISSING, &[AccessMode::Rwo]),
            Code::NotFound,
            "its container does not exist",
        ),
        (
            create_request(FORBIDDEN, &[AccessMode::Rwo]),
            Code::PermissionDenied,
            "may not use this host",
        ),
    ];
    for (request, code, fragment) in cases {
        assert_code(bed.create(request).await, code, fragment);
    }
    assert_code(
        bed.delete("", "x").await,
        Code::InvalidArgument,
        "DeleteDevice needs a volume_id",
    );
    assert_code(
        bed.get("", "x").await,
        Code::InvalidArgument,
        "GetDevice needs a volume_id",
    );
    assert_eq!(bed.agent.counts(), (0, 0));
    assert!(bed.list(0, "").await.unwrap().entries.is_empty());
    bed.stop().await;
}

/// Every combination of odd fields: each call answers a code the API implies, never a
/// transport error or UNKNOWN (what a panicking handler gives), and the server stays up.
#[tokio::test]
async fn odd_requests_never_break_the_server() {
    let bed = Bed::new().await;
    let long = "v".repeat(64 * 1024);
    let ids = ["", "v1/sys/pool/odd", "\u{0}", "../../etc", long.as_str()];
    let mode_sets: [&[i32]; 7] = [
        &[],
        &[-1],
        &[i32::MAX],
        &[1, 4],
        &[4],
        &[2, 2, 2],
        &[1, 2, 3],
    ];
    let volume_modes = ["", "Filesystem", "Block", "block", "\u{fffd}"];
    let expected = [
        Code::Ok,
        Code::InvalidArgument,
        Code::AlreadyExists,
        Code::NotFound,
    ];
    for id in ids {
        for modes in mode_sets {
            for mode in volume_modes {
                let request = dpf::CreateDeviceRequest {
                    volume_id: id.into(),
                    access_modes: modes.to_vec(),
                    volume_mode: mode.into(),
                    ..Default::default()
                };
                let code = match bed.create(request).await {
                    Ok(_) => Code::Ok,
                    Err(s) => s.code(),
                };
                assert!(
                    expected.contains(&code),
                    "{id:.20?} {modes:?} {mode:?}: {code:?}"
                );
            }
        }
        for name in ["", "x", long.as_str()] {
            let get = bed.get(id, name).await.map(|_| ()).err().map(|s| s.code());
            assert!(
                matches!(get, None | Some(Code::NotFound | Code::InvalidArgument)),
                "{get:?}"
            );
            let delete = bed.delete(id, name).await.err().map(|s| s.code());
            assert!(
                matches!(
                    delete,
                    None | Some(Code::FailedPrecondition | Code::InvalidArgument)
                ),
                "{delete:?}"
            );
        }
    }
    for token in ["", "00", "ff", "0", long.as_str()] {
        for max in [i32::MIN, -1, 0, 1, i32::MAX] {
            let code = bed.list(max, token).await.err().map(|s| s.code());
            assert!(
                matches!(code, None | Some(Code::Aborted | Code::InvalidArgument)),
                "{token:.20?} {max}: {code:?}"
            );
        }
    }
    let mut identity = bed.identity.clone();
    assert!(identity.probe(dpf::ProbeRequest {}).await.is_ok());
    bed.stop().await;
}

#[tokio::test]
async fn concurrent_creates_of_one_volume_stage_it_once() {
    let bed = Arc::new(Bed::new().await);
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let bed = bed.clone();
            tokio::spawn(async move { bed.create(create_request(SLOW, &[AccessMode::Rwo])).await })
        })
        .collect();
    let mut names = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(name) => names.push(name),
            Err(s) => assert_eq!(s.code(), Code::Aborted, "{}", s.message()),
        }
    }
    assert!(!names.is_empty());
    assert!(
        names.iter().all(|n| *n == MemoryAgent::tag(SLOW)),
        "{names:?}"
    );
    assert_eq!(bed.agent.counts(), (1, 0));
    // The loser retries, as SNAP's driver does after ABORTED: the same device.
    assert_eq!(
        bed.create(create_request(SLOW, &[AccessMode::Rwo]))
            .await
            .unwrap(),
        MemoryAgent::tag(SLOW)
    );
    Arc::into_inner(bed).expect("one owner").stop().await;
}

#[tokio::test]
async fn bad_socket_paths_and_a_stopped_plugin_give_clear_errors() {
    let bed = Bed::new().await;
    // A second plugin on the live socket is refused, and the first keeps serving.
    let second = serve_until(&bed.socket, bed.agent.clone(), async {}).await;
    assert!(
        matches!(&second, Err(dpufs_csi::csi::ServeError::InUse(p)) if p == &bed.socket),
        "{second:?}"
    );
    assert!(bed.list(0, "").await.is_ok());

    // A path that is a plain file is not taken over.
    let plain = bed._dir.path().join("plain");
    std::fs::write(&plain, b"keep").unwrap();
    let err = serve_until(&plain, bed.agent.clone(), async {})
        .await
        .expect_err("not a socket");
    assert!(err.to_string().contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(&plain).unwrap(), b"keep");

    // Stopped: the socket file is gone, and SNAP's next call fails as UNAVAILABLE.
    let socket = bed.socket.clone();
    let snap = bed.snap.clone();
    bed.stop().await;
    assert!(!socket.exists());
    let mut snap = snap;
    let status = snap
        .list_devices(dpf::ListDevicesRequest::default())
        .await
        .expect_err("no plugin");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");

    // Nothing at the path at all: the client's error names it.
    let missing = Path::new("/tmp/dpufs-no-such-dir/dpu.sock");
    let err = try_connect(missing, Duration::from_millis(50))
        .await
        .expect_err("nothing listens");
    assert!(err.contains("/tmp/dpufs-no-such-dir/dpu.sock"), "{err}");
}
