//! DPU mode end to end (docs/dpu.md, "What was tested here"): three machines on one, as
//! network namespaces. The engine is alone on the storage network; the DPU (this test's own
//! namespace) runs the CSI controller, the mount keeper, the workers and `dpufs-csi
//! dpu-agent`, with a link to each side; the host is a QEMU guest (its QEMU in the host
//! namespace, which has a link to the DPU only) running the CSI node shim, to which the test
//! speaks as kubelet. The agent checks pods with an API server (the in-repo fake, served on
//! the DPU's host link), hot-plugs each staged volume into the guest through QEMU's monitor,
//! and the guest's kernel mounts it as virtio-fs.
//!
//! The guest test needs QEMU and the guest assets (`dpufs_e2e::guest`): without them it prints
//! SKIPPED (a failure with `DPUFS_REQUIRE_GUEST=1`). Everything needs root.

mod dpu_mode_support;

use dpu_mode_support::host::{GuestData, HostGuest, Reply};
use dpu_mode_support::{DpuBed, Topology, cpu_seconds, key, manifest, sha, tag};
use dpufs_e2e::csi_bed::{cap, wait_until};
use dpufs_e2e::guest::GuestAssets;
use dpufs_e2e::volume::EngineVolume;
use dpufs_proto::csi::v1::{self as csi, volume_capability::access_mode::Mode};
use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tonic::Code;

/// A guest command's limit (a write loop under TCG takes a few seconds).
const COMMAND_WITHIN: Duration = Duration::from_secs(120);
/// Kubelet's limit on a CSI call: NodePublishVolume includes a hot-plug and the guest probing
/// the new function.
const CALL_WITHIN: Duration = Duration::from_secs(90);
/// The I/O run whose CPU time is measured, in MiB written (and read back).
const CPU_RUN_MIB: u64 = 128;
/// Files of 64 KiB the write loop writes when nothing stops it.
const LOOP_FILES: usize = 200;
/// How long the guest's writer is watched after its worker was killed.
const WATCH_STRANDED: Duration = Duration::from_secs(5);

/// The host namespace has no route to the storage network: neither the engine's management
/// service nor its fabric data service can be reached from there, while the DPU (the test's
/// namespace) reaches both over the storage link.
#[test]
fn the_host_cannot_connect_to_the_engine() {
    let net = Topology::create();
    let vol = EngineVolume::start_on(1, 1 << 30, Some(net.engine_network()));
    let mgmt: SocketAddr = vol.engine.addr.parse().expect("the engine's address");
    let fabric = vol.fabric_addr();
    assert_eq!(mgmt.ip(), net.engine_ip);
    assert_eq!(fabric.ip(), net.engine_ip);
    for addr in [mgmt, fabric] {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("the DPU reaches {addr}: {e}"));
        let err = net
            .host
            .connect(addr, Duration::from_secs(3))
            .expect_err("the host must not reach the storage network");
        let io = err
            .downcast_ref::<std::io::Error>()
            .unwrap_or_else(|| panic!("{err:#}"));
        assert_eq!(
            io.raw_os_error(),
            Some(libc::ENETUNREACH),
            "connecting to {addr} from the host: {err:#}"
        );
    }
    // Its one route: its link to the DPU.
    let routes = std::process::Command::new("ip")
        .args(["-n", net.host.name(), "-4", "route"])
        .output()
        .expect("ip route");
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert_eq!(routes.lines().count(), 1, "{routes}");
    assert!(routes.contains(&format!("src {}", net.host_ip)), "{routes}");
}

/// One volume as a pod uses it, with the paths kubelet names.
#[derive(Debug, Clone)]
struct Use {
    id: String,
    staging: String,
    target: String,
    /// The pod kubelet names in the volume context: (namespace, name, uid).
    pod: (String, String, String),
}

impl Use {
    fn new(id: &str, namespace: &str, pod: &str, uid: &str) -> Use {
        Use {
            id: id.to_string(),
            staging: format!(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/dfs.dpufs.io/{}/globalmount",
                key(id)
            ),
            target: format!(
                "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/pv-{namespace}-{pod}/mount"
            ),
            pod: (namespace.into(), pod.into(), uid.into()),
        }
    }

    /// The directories kubelet makes before it calls the plugin.
    fn dirs(&self) -> String {
        let parent = self.target.rsplit_once('/').expect("a parent").0;
        format!("{} {parent}", self.staging)
    }
}

async fn stage(host: &HostGuest, u: &Use) -> Result<(), tonic::Status> {
    host.node
        .clone()
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: u.id.clone(),
            staging_target_path: u.staging.clone(),
            volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
            ..Default::default()
        })
        .await
        .map(drop)
}

async fn publish(host: &HostGuest, u: &Use) -> Result<(), tonic::Status> {
    let (ns, name, uid) = &u.pod;
    let context = [
        ("csi.storage.k8s.io/pod.namespace", ns),
        ("csi.storage.k8s.io/pod.name", name),
        ("csi.storage.k8s.io/pod.uid", uid),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.clone()))
    .collect();
    let mut request = tonic::Request::new(csi::NodePublishVolumeRequest {
        volume_id: u.id.clone(),
        staging_target_path: u.staging.clone(),
        target_path: u.target.clone(),
        volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
        volume_context: context,
        ..Default::default()
    });
    request.set_timeout(CALL_WITHIN);
    host.node
        .clone()
        .node_publish_volume(request)
        .await
        .map(drop)
}

async fn unpublish_and_unstage(host: &HostGuest, u: &Use) {
    host.node
        .clone()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: u.id.clone(),
            target_path: u.target.clone(),
        })
        .await
        .expect("NodeUnpublishVolume");
    let mut request = tonic::Request::new(csi::NodeUnstageVolumeRequest {
        volume_id: u.id.clone(),
        staging_target_path: u.staging.clone(),
    });
    request.set_timeout(CALL_WITHIN);
    host.node
        .clone()
        .node_unstage_volume(request)
        .await
        .expect("NodeUnstageVolume");
}

/// How long each step took, printed as it goes.
#[derive(Debug)]
struct Steps {
    started: Instant,
    last: Instant,
}

impl Steps {
    fn new() -> Steps {
        let now = Instant::now();
        Steps {
            started: now,
            last: now,
        }
    }

    fn done(&mut self, what: &str) {
        let now = Instant::now();
        eprintln!(
            "[dpu_mode] {:6.1} s  {what}",
            (now - self.last).as_secs_f64()
        );
        self.last = now;
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        eprintln!(
            "[dpu_mode] {:6.1} s  in all",
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Everything the steps of the guest test share.
struct Scene {
    dpu: DpuBed,
    host: HostGuest,
    data: GuestData,
    /// Tenant A's volume for its pod, and tenant B's.
    a: Use,
    b: Use,
    steps: Steps,
}

impl Scene {
    /// Has the guest run `command`; panics with the guest's and the agent's logs on failure.
    fn guest(&mut self, command: &str) -> Reply {
        self.host
            .run(command, COMMAND_WITHIN)
            .unwrap_or_else(|e| panic!("{command}: {e:#}\n--- agent\n{}", self.dpu.agent_log()))
    }

    fn fail(&self, what: &str) -> String {
        format!(
            "{what}\n{}\n--- agent\n{}",
            self.host.report(),
            self.dpu.agent_log()
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guest_host_mounts_the_volumes_its_dpu_stages() {
    let Some(assets) = GuestAssets::get("a_guest_host_mounts_the_volumes_its_dpu_stages") else {
        return;
    };
    // Built (when not up to date) before the clock starts.
    for (binary, package) in [
        ("dpufs-csi", "dpufs-csi"),
        ("dpufs", "dpufs"),
        ("dpufs-engine", "dpufs-engine"),
        ("tcp-to-unix", "dpufs-e2e"),
    ] {
        dpufs_e2e::binary(binary, package);
    }
    let mut steps = Steps::new();
    let mut dpu = DpuBed::start().await;
    let vol_a = dpu.bed.create("claim-a", "ns-a").await.volume_id;
    let vol_b = dpu.bed.create("claim-b", "ns-b").await.volume_id;
    let uid_a = dpu.pod_with_volume("ns-a", "pod-a", &vol_a).await;
    let uid_b = dpu.pod_with_volume("ns-b", "pod-b", &vol_b).await;
    steps
        .done("engine in the storage namespace, controller, keeper, two tenants' volumes and pods");

    let data = GuestData::random();
    // QEMU dies with the thread that started it: this one, which outlives the test's steps.
    let host = HostGuest::boot(&dpu, &assets, &data)
        .await
        .unwrap_or_else(|e| panic!("booting the host: {e:#}"));
    dpu.host_started(host.qmp_socket());
    dpu.start_agent();
    steps.done("the host booted with its shim; the agent started");

    let mut s = Scene {
        a: Use::new(&vol_a, "ns-a", "pod-a", &uid_a),
        b: Use::new(&vol_b, "ns-b", "pod-b", &uid_b),
        dpu,
        host,
        data,
        steps,
    };
    the_host_reaches_its_agent_but_not_the_engine(&mut s).await;
    a_host_lying_about_the_tenant_is_refused(&mut s).await;
    each_pod_gets_its_volume_as_a_device(&mut s).await;
    the_host_files_are_the_engines(&mut s);
    the_host_stays_off_the_data_path(&mut s);
    a_new_shim_changes_nothing_on_the_dpu(&mut s).await;
    a_new_agent_adopts_the_workers(&mut s).await;
    let written = a_killed_worker_strands_its_device(&mut s);
    a_rebooted_host_gets_the_volume_back(s, &assets, written).await;
}

/// From the guest, the engine's addresses are unreachable and the agent's is not; the shim
/// found its agent through the API server (DPF's pairing label) and asked it over the
/// guest's network (NodeGetInfo carries the agent's topology).
async fn the_host_reaches_its_agent_but_not_the_engine(s: &mut Scene) {
    let reach = s.guest(&format!(
        "reach net mgmt={} fabric={} agent={}",
        s.dpu.bed.vol.engine.addr,
        s.dpu.bed.vol.fabric_addr(),
        s.dpu.agent_addr
    ));
    for name in ["mgmt", "fabric"] {
        let rc = reach.get(name);
        assert!(
            rc.starts_with("rc 1 ") && rc.contains("Network is unreachable"),
            "the host reached the engine's {name}: {rc}"
        );
    }
    // rc 0: connected, and the agent hung up on an empty TLS handshake.
    assert!(
        ["rc 0 ", "rc 137 "]
            .iter()
            .any(|ok| reach.get("agent").starts_with(ok)),
        "the host must reach its agent: {}",
        reach.get("agent")
    );
    let info = s
        .host
        .node
        .clone()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap_or_else(|e| panic!("{}", s.fail(&format!("NodeGetInfo: {e}"))))
        .into_inner();
    assert_eq!(info.node_id, dpu_mode_support::HOST_NODE);
    let system = s.a.id.split('/').nth(1).unwrap();
    assert_eq!(
        info.accessible_topology
            .unwrap()
            .segments
            .get("dpufs.io/daos-system")
            .map(String::as_str),
        Some(system),
        "the agent's topology"
    );
    s.steps
        .done("the host reaches its agent, not the engine; NodeGetInfo through the agent");
}

/// Tenant B's volume for tenant A's pod: PERMISSION_DENIED from the agent, with nothing
/// staged, exported or plugged.
async fn a_host_lying_about_the_tenant_is_refused(s: &mut Scene) {
    s.guest(&format!("mkdirs dirs {} {}", s.a.dirs(), s.b.dirs()));
    stage(&s.host, &s.b)
        .await
        .expect("NodeStageVolume of B (recorded by the shim)");
    let uid_a = s.a.pod.2.clone();
    let lies = [
        // A's real pod, which has no claim on B.
        ("ns-a", "pod-a"),
        // A's pod said to be in B's namespace: the host lies about the tenant.
        ("ns-b", "pod-a"),
        // B's pod, with A's pod's UID.
        ("ns-b", "pod-b"),
    ];
    for (ns, name) in lies {
        let lie = Use {
            target: Use::new(&s.b.id, ns, name, &uid_a).target,
            pod: (ns.into(), name.into(), uid_a.clone()),
            ..s.b.clone()
        };
        let err = publish(&s.host, &lie)
            .await
            .expect_err("tenant B's volume for tenant A's pod");
        assert_eq!(err.code(), Code::PermissionDenied, "{ns}/{name}: {err}");
    }
    assert!(s.dpu.records().is_empty(), "nothing recorded on the DPU");
    assert!(s.dpu.workers().is_empty(), "nothing exported");
    assert_eq!(
        s.guest("devices refused").get("virtiofs"),
        "0",
        "nothing plugged"
    );
    s.steps
        .done("three lies about B's volume refused (PERMISSION_DENIED), nothing staged");
}

/// Each pod's volume: staged (recorded by the shim), published (the agent checks the pod,
/// stages and hot-plugs; the shim mounts the tag and binds the pod's target).
async fn each_pod_gets_its_volume_as_a_device(s: &mut Scene) {
    stage(&s.host, &s.a).await.expect("NodeStageVolume of A");
    for u in [&s.a, &s.b] {
        let asked = Instant::now();
        if let Err(e) = publish(&s.host, u).await {
            panic!("{}", s.fail(&format!("NodePublishVolume {}: {e}", u.id)));
        }
        eprintln!(
            "[dpu_mode] NodePublishVolume for {}: {:.2} s",
            u.pod.1,
            asked.elapsed().as_secs_f64()
        );
    }
    let devices = s.guest("devices staged");
    assert_eq!(devices.get("virtiofs"), "2");
    let mounted: BTreeSet<&str> = devices.get("mounted").split_whitespace().collect();
    let tags = [tag(&s.a.id), tag(&s.b.id)];
    assert_eq!(mounted, tags.iter().map(String::as_str).collect());
    let mut ids = vec![s.a.id.clone(), s.b.id.clone()];
    ids.sort();
    assert_eq!(s.dpu.records(), ids);
    assert_eq!(s.dpu.workers().len(), 2, "{:?}", s.dpu.workers());
    s.steps
        .done("A and B published: two devices hot-plugged, mounted, bound");
}

/// The guest writes, renames, truncates and lists through each device; another worker on the
/// DPU reads each container back through the engine: the same tree, the same bytes. Each
/// device shows its own tenant's container and nothing else.
fn the_host_files_are_the_engines(s: &mut Scene) {
    for (label, u, blob, principal) in [
        ("a", s.a.clone(), s.data.blob_a.clone(), "team-a@"),
        ("b", s.b.clone(), s.data.blob_b.clone(), "team-b@"),
    ] {
        let io = s.guest(&format!("io {label} {} /data/blob-{label}", u.target));
        check_io(&io, &blob);
        let reader = s.dpu.reader(&u.id, principal, &format!("reader-{label}"));
        assert_eq!(
            manifest(label, &reader.mountpoint),
            io.manifest,
            "volume {label}: what the host wrote and what the engine holds differ"
        );
    }
    s.steps
        .done("files written, renamed, truncated, listed; the same read through the engine");
}

/// What the guest's `io` must have reported for a volume written from `blob`.
fn check_io(io: &Reply, blob: &[u8]) {
    assert_eq!(io.get("before"), "", "a new volume is empty");
    assert_eq!(io.get("sha.blob"), sha(blob));
    assert_eq!(io.get("sha.odd"), sha(&blob[..7 * 65537]));
    assert_eq!(io.get("sha.shrunk"), sha(&blob[..100_000]));
    let mut grown = blob[..7 * 65537].to_vec();
    grown.resize(500_000, 0);
    assert_eq!(io.get("sha.grown"), sha(&grown));
    assert_eq!(io.get("listing"), "OWNER docs ");
    assert_eq!(io.manifest.len(), 6, "{:?}", io.manifest);
}

/// The CPU seconds of the agent and of every worker the keeper lists.
fn dpu_cpu(dpu: &DpuBed) -> (f64, f64) {
    let workers: f64 = dpu
        .workers()
        .into_iter()
        .filter_map(|(_, pid)| pid)
        .map(cpu_seconds)
        .sum();
    (cpu_seconds(dpu.agent_pid()), workers)
}

/// During an I/O run in the guest, the shim's CPU time (read in the guest) next to the
/// agent's and the workers' on the DPU, per GiB moved (docs/benchmarks.md, "DPU mode").
fn the_host_stays_off_the_data_path(s: &mut Scene) {
    let before = dpu_cpu(&s.dpu);
    let run = s.guest(&format!("cpu cpu {} {CPU_RUN_MIB}", s.a.target));
    let after = dpu_cpu(&s.dpu);
    let gib = run.get("bytes").parse::<f64>().unwrap() / f64::from(1u32 << 30);
    // USER_HZ: 100 on x86.
    let shim = run.get("shim_ticks").parse::<f64>().unwrap() / 100.0;
    let (agent, workers) = (after.0 - before.0, after.1 - before.1);
    eprintln!(
        "[dpu_mode] CPU s per GiB moved ({CPU_RUN_MIB} MiB written and read back, {} ms of guest \
         time): shim (host) {:.3}, agent (DPU) {:.3}, workers (DPU) {:.3}",
        run.get("ms"),
        shim / gib,
        agent / gib,
        workers / gib
    );
    assert!(workers > 0.0, "the workers moved the data");
    assert!(
        shim <= 0.01,
        "the shim is off the data path, yet it used {shim} s of CPU during the run"
    );
    s.steps
        .done("an I/O run's CPU time: host shim, DPU agent and workers");
}

/// kill -9 of the shim and a new one: the same workers and records on the DPU; a publish
/// through the new shim is the same; the guest's mounts serve on.
async fn a_new_shim_changes_nothing_on_the_dpu(s: &mut Scene) {
    let workers = s.dpu.workers();
    let records = s.dpu.records();
    let restart = s.guest("restart_shim shim");
    assert_ne!(restart.get("old"), restart.get("new"));
    assert_eq!(s.dpu.workers(), workers, "the keeper's workers");
    assert_eq!(s.dpu.records(), records, "the agent's records");
    if let Err(e) = publish(&s.host, &s.a).await {
        panic!(
            "{}",
            s.fail(&format!("NodePublishVolume through the new shim: {e}"))
        );
    }
    assert_eq!(s.dpu.workers(), workers);
    let back = s.guest(&format!("read_back shimless {}/docs/blob", s.a.target));
    assert_eq!(back.get("sha"), sha(&s.data.blob_a[..100_000]));
    s.steps
        .done("the shim killed and started again: nothing changed on the DPU");
}

/// kill -9 of the agent: the devices serve on without it; a new agent adopts the workers (the
/// same pids), and its StageVolume of a staged volume plugs nothing twice.
async fn a_new_agent_adopts_the_workers(s: &mut Scene) {
    let workers = s.dpu.workers();
    s.dpu.kill_agent();
    assert_eq!(s.dpu.workers(), workers, "the workers outlive the agent");
    let back = s.guest(&format!("read_back agentless {}/docs/blob", s.b.target));
    assert_eq!(
        back.get("sha"),
        sha(&s.data.blob_b[..100_000]),
        "the data path needs no agent"
    );
    s.dpu.start_agent();
    for u in [s.a.clone(), s.b.clone()] {
        if let Err(e) = publish(&s.host, &u).await {
            panic!(
                "{}",
                s.fail(&format!("NodePublishVolume through the new agent: {e}"))
            );
        }
    }
    assert_eq!(
        s.dpu.workers(),
        workers,
        "the new agent adopted the workers"
    );
    assert_eq!(
        s.guest("devices adopted").get("virtiofs"),
        "2",
        "no device plugged twice"
    );
    s.steps
        .done("the agent killed and started again: it adopted the workers");
}

/// kill -9 of the worker behind B's device while the guest writes files to it, one after the
/// other. What docs/worker.md ("Failover") says QEMU 7.2 and a 6.1 guest do: the keeper
/// replaces the worker, QEMU connects to the replacement and sends it nothing, and the guest's
/// write waits without an error; the files written before the kill are whole in the engine,
/// and A's device is not touched. Returns how many files the engine holds whole.
fn a_killed_worker_strands_its_device(s: &mut Scene) -> usize {
    let loop_cmd = format!("loop loop {} {LOOP_FILES}", s.b.target);
    s.guest(&loop_cmd);
    s.host
        .wait_for("loop", "started", COMMAND_WITHIN)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let victim = s.dpu.worker_of(&s.b.id);
    dpufs_e2e::kill9(victim);
    let killed = Instant::now();
    let b_volume = format!("csi-{}", key(&s.b.id));
    wait_until("the keeper's replacement", || {
        s.dpu.worker_of_opt(&s.b.id).is_some_and(|p| p != victim)
    });
    eprintln!(
        "[dpu_mode] the worker behind B's device killed; replaced in {:.0} ms",
        killed.elapsed().as_secs_f64() * 1e3
    );
    // QEMU reconnects its chardev once a second.
    wait_until("QEMU connected to the replacement", || {
        s.dpu
            .bed
            .worker_health(&b_volume)
            .frontend
            .is_some_and(|f| f.connected)
    });
    std::thread::sleep(WATCH_STRANDED);
    let health = s.dpu.bed.worker_health(&b_volume);
    let frontend = health.frontend.expect("a vhost-user-fs worker");
    assert_eq!(frontend.connections, 1, "{health:?}");
    assert_eq!(health.in_flight, 0, "QEMU sends the replacement nothing");
    let waiting = s.guest("waiting stranded");
    assert!(
        waiting
            .results
            .values()
            .any(|w| w.ends_with("request_wait_answer")),
        "the guest's write waits for an answer: {:?}",
        waiting.results
    );
    let looped = s.host.reply_so_far(&loop_cmd);
    assert!(
        !looped.results.contains_key("done")
            && !looped.results.keys().any(|k| k.starts_with("failed")),
        "the write loop neither finished nor failed: {:?}",
        looped.results
    );
    // A's device is another function with another worker.
    let back = s.guest(&format!("read_back other {}/docs/blob", s.a.target));
    assert_eq!(back.get("sha"), sha(&s.data.blob_a[..100_000]));
    // The engine holds every file written before the kill, whole; the one being written is a
    // prefix of what was written, or empty.
    let reader = s.dpu.reader(&s.b.id, "team-b@", "reader-loop");
    let whole = loop_files(&reader.mountpoint.join("loop"), &s.data.chunk);
    assert!(
        whole >= 5,
        "the loop had written 5 files when the worker was killed"
    );
    s.steps.done(&format!(
        "B's worker killed during a write loop: {whole} files whole, the guest's write waits"
    ));
    whole
}

/// Checks the write loop's files under `dir`: all but the last hold `chunk`, the last a
/// prefix of it. Returns how many hold all of it.
fn loop_files(dir: &std::path::Path, chunk: &[u8]) -> usize {
    let mut files: Vec<(usize, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("the loop's directory")
        .map(|e| {
            let e = e.expect("an entry");
            let n = e.file_name().to_string_lossy().parse().expect("a number");
            (n, std::fs::read(e.path()).expect("read"))
        })
        .collect();
    files.sort();
    let numbers: Vec<usize> = files.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        numbers,
        (0..files.len()).collect::<Vec<_>>(),
        "no file skipped"
    );
    let whole = files.iter().filter(|(_, b)| b == chunk).count();
    for (n, bytes) in &files {
        assert!(
            bytes == chunk || (*n == files.len() - 1 && chunk.starts_with(bytes)),
            "file {n} of the loop: {} bytes, not what the guest wrote",
            bytes.len()
        );
    }
    whole
}

/// The documented way back for a stranded device: the host is reset (QEMU killed) and boots
/// again. Its new shim publishes B for its pod: the agent finds the volume staged, plugs it
/// into the new VM, whose driver sets the replacement worker up; the files are there. Then
/// both volumes' ends: unpublish and unstage (unplugged, the workers stopped, nothing left
/// on the DPU), and the host powers off.
async fn a_rebooted_host_gets_the_volume_back(s: Scene, assets: &GuestAssets, whole: usize) {
    let Scene {
        dpu,
        host,
        data,
        a,
        b,
        mut steps,
    } = s;
    host.reset();
    let mut host = HostGuest::boot(&dpu, assets, &data)
        .await
        .unwrap_or_else(|e| panic!("booting the host again: {e:#}"));
    dpu.host_started(host.qmp_socket());
    steps.done("the host reset and booted again");
    host.run(
        &format!("mkdirs dirs {} {}", a.dirs(), b.dirs()),
        COMMAND_WITHIN,
    )
    .unwrap();
    for u in [&a, &b] {
        stage(&host, u).await.expect("NodeStageVolume");
        if let Err(e) = publish(&host, u).await {
            panic!(
                "NodePublishVolume after the reboot: {e}\n{}\n--- agent\n{}",
                host.report(),
                dpu.agent_log()
            );
        }
    }
    let back = host
        .run(
            &format!("read_back rebooted {}/docs/blob", b.target),
            COMMAND_WITHIN,
        )
        .unwrap();
    assert_eq!(back.get("sha"), sha(&data.blob_b[..100_000]));
    let sums = host
        .run(
            &format!("read_back chunk {}/loop/{}", b.target, whole - 1),
            COMMAND_WITHIN,
        )
        .unwrap();
    assert_eq!(
        sums.get("sha"),
        sha(&data.chunk),
        "the loop's last whole file"
    );
    steps.done("after the reboot: B plugged into the new VM, its files there");

    for u in [&a, &b] {
        unpublish_and_unstage(&host, u).await;
    }
    let devices = host.run("devices gone", COMMAND_WITHIN).unwrap();
    assert_eq!(devices.get("virtiofs"), "0", "unplugged");
    assert_eq!(devices.get("mounted"), "");
    assert!(dpu.records().is_empty(), "{:?}", dpu.records());
    assert!(dpu.workers().is_empty(), "{:?}", dpu.workers());
    host.quit(COMMAND_WITHIN).unwrap();
    steps.done("unpublished and unstaged: devices unplugged, nothing left on the DPU");
    drop(dpu);
}
