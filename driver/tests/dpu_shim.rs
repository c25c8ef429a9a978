//! The host shim (`dpufs-csi node --mode dpu-host`) against the DPU agent on this machine
//! (docs/dpu.md, "Tests"): kubelet's calls reach the agent and its answers come back with their
//! codes. The shim's virtio-fs mount needs a guest kernel with the device; here no device
//! appears, so a publish the agent accepts ends UNAVAILABLE at the mount, after the agent
//! staged the volume.

mod dpu_bed;

use dpu_bed::{DpuBed, HOST_NODE, SHIM_USER};
use dpufs_e2e::csi_bed::{cap, connect, unix};
use dpufs_proto::csi::v1::node_client::NodeClient;
use dpufs_proto::csi::v1::volume_capability::access_mode::Mode;
use dpufs_proto::csi::v1::{self as csi};
use dpufs_proto::dpu::v1 as pb;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use tonic::Code;
use tonic::transport::Channel;

/// The shim as a process, with a client on its socket.
struct Shim {
    process: Child,
    node: NodeClient<Channel>,
    state: PathBuf,
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Shim {
    /// Starts the shim for [`HOST_NODE`]; it finds its agent through the API server.
    async fn start(dpu: &mut DpuBed) -> Shim {
        let kubeconfig = dpu.shim_kubeconfig().await;
        let socket = dpu.bed.path("shim.sock");
        let state = dpu.bed.path("host-state");
        let process = Command::new(env!("CARGO_BIN_EXE_dpufs-csi"))
            .args(["node", "--mode", "dpu-host", "--node-id", HOST_NODE])
            .arg("--endpoint")
            .arg(unix(&socket))
            .arg("--dpu-agent-port")
            .arg(dpu.port.to_string())
            .arg("--tls-ca")
            .arg(dpu.certs.join("ca.crt"))
            .arg("--tls-cert")
            .arg(dpu.certs.join("host.crt"))
            .arg("--tls-key")
            .arg(dpu.certs.join("host.key"))
            .arg("--state-dir")
            .arg(&state)
            .arg("--mount-root")
            .arg(dpu.bed.dir.path())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(dpu_bed::log(&dpu.bed, "shim"))
            .stderr(dpu_bed::log(&dpu.bed, "shim"))
            .spawn()
            .expect("spawn the shim");
        let node = NodeClient::new(connect(&socket).await);
        Shim {
            process,
            node,
            state,
        }
    }

    async fn stage(&self, id: &str, staging: &Path) -> Result<(), tonic::Status> {
        self.node
            .clone()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn publish(
        &self,
        id: &str,
        staging: &Path,
        target: &Path,
        pod: Option<(&str, &str, &str)>,
    ) -> Result<(), tonic::Status> {
        let mut context = HashMap::new();
        if let Some((namespace, name, uid)) = pod {
            for (k, v) in [
                ("csi.storage.k8s.io/pod.namespace", namespace),
                ("csi.storage.k8s.io/pod.name", name),
                ("csi.storage.k8s.io/pod.uid", uid),
            ] {
                context.insert(k.to_string(), v.to_string());
            }
        }
        self.node
            .clone()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
                volume_context: context,
                ..Default::default()
            })
            .await
            .map(drop)
    }

    /// Every file the shim keeps.
    fn files(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    walk(&e.path(), out);
                } else {
                    out.push(e.path());
                }
            }
        }
        let mut out = vec![];
        walk(&self.state, &mut out);
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shim_forwards_to_the_agent_and_keeps_its_codes() {
    let mut dpu = DpuBed::start().await;
    let shim = Shim::start(&mut dpu).await;
    // NodeGetInfo: this host, and the system its DPU reaches (the agent's Probe).
    let info = shim
        .node
        .clone()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap_or_else(|e| panic!("NodeGetInfo: {e:?}\n{}", dpu.bed.log("shim")))
        .into_inner();
    assert_eq!(info.node_id, HOST_NODE);
    let segments = info.accessible_topology.unwrap().segments;
    assert_eq!(segments["dpufs.io/node"], HOST_NODE);
    assert_eq!(segments["dpufs.io/daos-system"], "daos_server");

    let id = dpu.bed.create("vol-a", "ns-a").await.volume_id;
    let uid = dpu.pod_with_volume("ns-a", "trainer", HOST_NODE, &id).await;
    let other = dpu.pod_with_volume("ns-b", "other", HOST_NODE, &id).await;
    let staging = dpu.bed.path("vol-a-globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    let target = dpu.bed.path("pod/mount");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();

    // NodeStageVolume records, twice; nothing reaches the DPU yet.
    shim.stage(&id, &staging).await.expect("stage");
    shim.stage(&id, &staging)
        .await
        .expect("the same stage again");
    let elsewhere = dpu.bed.path("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let e = shim.stage(&id, &elsewhere).await.expect_err("another path");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(dpu.keeper_list().is_empty());

    // A pod of another tenant: the agent's refusal, with its code.
    let e = shim
        .publish(&id, &staging, &target, Some(("ns-b", "other", &other)))
        .await
        .expect_err("another tenant's pod");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("team-b"), "{e:?}");
    // No pod information (a CSIDriver without podInfoOnMount).
    let e = shim
        .publish(&id, &staging, &target, None)
        .await
        .expect_err("no pod");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(dpu.keeper_list().is_empty(), "nothing staged on the DPU");

    // The right pod: the agent stages the volume; the device never appears in this kernel.
    let e = shim
        .publish(&id, &staging, &target, Some(("ns-a", "trainer", &uid)))
        .await
        .expect_err("no virtio-fs device in this kernel");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("virtio-fs"), "{e:?}");
    let exported = dpu.keeper_list();
    assert_eq!(exported.len(), 1, "the agent staged the volume at publish");
    assert!(exported[0].pid.is_some());

    // NodeGetVolumeStats of a path where nothing is mounted.
    let e = shim
        .node
        .clone()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: staging.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .expect_err("nothing mounted there");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // The host holds its records only: no key, capability or fabric state.
    let files = shim.files();
    assert!(!files.is_empty());
    for f in &files {
        assert_eq!(
            f.extension().and_then(|x| x.to_str()),
            Some("json"),
            "{f:?}"
        );
        let text = std::fs::read_to_string(f).unwrap();
        assert!(!text.contains("team-a"), "no tenant on the host: {text}");
    }

    // kill -9 (Child::kill) and a restart of the shim change nothing on the DPU.
    let before = dpu.keeper_list();
    drop(shim);
    let shim = Shim::start(&mut dpu).await;
    assert_eq!(dpu.keeper_list(), before);
    // The restarted shim knows the stage, and NodeUnstageVolume reaches the agent, twice.
    for _ in 0..2 {
        shim.node
            .clone()
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .expect("unstage");
    }
    assert!(dpu.keeper_list().is_empty(), "{:?}", dpu.keeper_list());
    assert!(shim.files().is_empty(), "{:?}", shim.files());
    // The shim's only API call: finding its DPU; both asked only what the chart grants.
    let calls: Vec<_> = dpu
        .fake
        .api_calls(SHIM_USER)
        .into_iter()
        .map(|c| (c.group, c.resource, c.verb))
        .collect();
    assert_eq!(calls, [(String::new(), "nodes".into(), "list".into())]);
    dpu.assert_calls_granted();
    // And the agent, asked directly, agrees nothing is staged.
    let listed = dpu
        .client()
        .list_volumes(pb::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
}
