//! The DPU agent on real processes, sockets and certificates (docs/dpu.md, "Tests"): its
//! control channel's mutual TLS, its checks of the host's claims against the API server, the
//! idempotence of every call, and its restart.

mod dpu_bed;

use dpu_bed::{
    AGENT_USER, Clusters, DPU_NODE, DpuBed, HOST_NODE, client_with, files, stage_request,
};
use dpufs_proto::dpu::v1 as pb;
use tonic::Code;

/// A refused handshake: the client sees the connection fail (UNAVAILABLE) or, in TLS 1.3,
/// where the server checks the client's certificate after the client's side of the handshake is
/// done, the connection closed under its first call (CANCELLED), or the server's alert in it
/// (UNKNOWN, "transport error"). The agent's log counts the refusals on its side.
fn handshake_refused(e: &tonic::Status) {
    assert!(
        matches!(
            e.code(),
            Code::Unavailable | Code::Cancelled | Code::Unknown
        ),
        "{e:?}"
    );
}

/// Fails unless `result` is an error with `code` whose message contains every one of `words`.
fn refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, words: &[&str]) {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), code, "{status:?}");
    for w in words {
        assert!(
            status.message().contains(w),
            "{:?} does not say {w:?}",
            status.message()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_channel_refuses_clients_without_the_right_certificate() {
    let dpu = DpuBed::start().await;
    // The right client.
    let probe = dpu
        .client()
        .probe(pb::ProbeRequest {})
        .await
        .expect("the host's certificate is accepted")
        .into_inner();
    assert!(probe.ready, "{probe:?}");
    assert_eq!(probe.api_version, 1);
    assert_eq!(probe.agent_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(probe.dpu_node, DPU_NODE);
    assert_eq!(probe.host_node, HOST_NODE, "the pairing label");
    assert_eq!(
        probe
            .topology
            .get("dpufs.io/daos-system")
            .map(String::as_str),
        Some("daos_server")
    );
    // A client certificate of another CA.
    let other = dpu.bed.path("other-certs");
    dpu_bed::certs(&other);
    let e = client_with(&files(&other, "host"), &dpu.addr())
        .probe(pb::ProbeRequest {})
        .await
        .expect_err("a certificate of another CA is refused");
    handshake_refused(&e);
    // The agent's own pair (a server certificate) as a client.
    let e = client_with(&files(&dpu.certs, "agent"), &dpu.addr())
        .probe(pb::ProbeRequest {})
        .await
        .expect_err("a server certificate is no client's");
    handshake_refused(&e);
    // No client certificate at all.
    let e = dpu_bed::client_without_certificate(&dpu.certs.join("ca.crt"), &dpu.addr())
        .probe(pb::ProbeRequest {})
        .await
        .expect_err("no certificate is refused");
    handshake_refused(&e);
    let log = dpu.agent_log();
    assert!(
        log.matches("TLS handshake refused").count() >= 3,
        "the agent logs each refusal:\n{log}"
    );
    // The shim checks the agent too: a CA that did not sign the agent's certificate.
    let e = client_with(&files(&other, "host"), &dpu.addr())
        .probe(pb::ProbeRequest {})
        .await
        .expect_err("refused");
    assert!(format!("{e:?}").contains("certificate"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cannot_stage_for_a_pod_the_api_server_does_not_show() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams};
    use serde_json::json;
    let dpu = DpuBed::start().await;
    let mine = dpu.bed.create("vol-a", "ns-a").await.volume_id;
    let theirs = dpu.bed.create("vol-b", "ns-b").await.volume_id;
    let a = dpu
        .pod_with_volume("ns-a", "trainer", HOST_NODE, &mine)
        .await;
    let b = dpu
        .pod_with_volume("ns-b", "other", HOST_NODE, &theirs)
        .await;
    // Tenant A's pod, with a claim of its own bound to tenant B's volume (a PersistentVolume
    // written by hand): the namespace does not belong to B's tenant.
    let stolen = dpu
        .pod_with_volume("ns-a", "thief", HOST_NODE, &theirs)
        .await;
    let far = dpu.pod_with_volume("ns-a", "far", "host-2", &mine).await;
    let done = dpu.pod_with_volume("ns-a", "done", HOST_NODE, &mine).await;
    Api::<Pod>::namespaced(dpu.fake.client(), "ns-a")
        .patch_status(
            "done",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .expect("the pod's status");
    let (pool, _) = mine.rsplit_once('/').unwrap();
    let made_up = format!("{pool}/0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b");
    let third = dpu.bed.create("vol-c", "ns-a").await.volume_id;
    let mut client = dpu.client();
    // Each: PERMISSION_DENIED, the message naming what did not match.
    let refusals = [
        (
            "tenant A's pod, with a claim of its own bound to tenant B's volume (a \
             PersistentVolume written by hand): the namespace does not belong to B's tenant",
            stage_request(&theirs, HOST_NODE, ("ns-a", "thief", &stolen)),
            vec!["ns-a", "team-a", "team-b"],
        ),
        (
            "the host lies: tenant A's pod, said to be in B's namespace",
            stage_request(&theirs, HOST_NODE, ("ns-b", "trainer", &a)),
            vec!["ns-b/trainer", "does not exist"],
        ),
        (
            "the host lies: B's pod's name with A's pod's UID",
            stage_request(&theirs, HOST_NODE, ("ns-b", "other", &a)),
            vec!["UID", &b],
        ),
        (
            "a pod of A on another node",
            stage_request(&mine, HOST_NODE, ("ns-a", "far", &far)),
            vec!["host-2", HOST_NODE],
        ),
        (
            "a pod of A that has finished",
            stage_request(&mine, HOST_NODE, ("ns-a", "done", &done)),
            vec!["ns-a/done", "finished", "Succeeded"],
        ),
        (
            "a volume id that names no volume: before the API server shows a pod of this host \
             that uses it, the host learns nothing of a volume, not even that it does not exist",
            stage_request(&made_up, HOST_NODE, ("ns-a", "trainer", &a)),
            vec!["ns-a/trainer", "uses no PersistentVolumeClaim"],
        ),
        (
            "A's pod asking for a volume its claim is not bound to",
            stage_request(&third, HOST_NODE, ("ns-a", "trainer", &a)),
            vec!["trainer-data", &third],
        ),
        (
            "another host's name",
            stage_request(&mine, "host-2", ("ns-a", "trainer", &a)),
            vec![HOST_NODE, "host-2"],
        ),
    ];
    for (case, request, words) in refusals {
        eprintln!("case: {case}");
        refused(
            client.stage_volume(request).await,
            Code::PermissionDenied,
            &words,
        );
    }
    // No pod.
    let mut no_pod = stage_request(&mine, HOST_NODE, ("ns-a", "trainer", &a));
    no_pod.pod = None;
    refused(
        client.stage_volume(no_pod).await,
        Code::InvalidArgument,
        &["podInfoOnMount"],
    );
    assert!(
        dpu.records().is_empty(),
        "nothing recorded: {:?}",
        dpu.records()
    );
    assert!(dpu.keeper_list().is_empty(), "nothing exported");
    // The agent asked the API server nothing the chart does not grant it.
    dpu.assert_calls_granted();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_idempotent_and_list_pages() {
    let dpu = DpuBed::start().await;
    let mut client = dpu.client();
    let mut volumes = vec![];
    for i in 0..3 {
        let id = dpu.bed.create(&format!("vol-{i}"), "ns-a").await.volume_id;
        let uid = dpu
            .pod_with_volume("ns-a", &format!("pod-{i}"), HOST_NODE, &id)
            .await;
        volumes.push((id, uid));
    }
    let mut devices = vec![];
    for (i, (id, uid)) in volumes.iter().enumerate() {
        let pod = ("ns-a", &*format!("pod-{i}"), uid.as_str());
        let first = client
            .stage_volume(stage_request(id, HOST_NODE, pod))
            .await
            .unwrap_or_else(|e| panic!("stage {id}: {e:?}\n{}", dpu.agent_log()))
            .into_inner()
            .device
            .unwrap();
        let again = client
            .stage_volume(stage_request(id, HOST_NODE, pod))
            .await
            .expect("the same stage again")
            .into_inner()
            .device
            .unwrap();
        assert_eq!(first, again);
        assert_eq!(first.transport, pb::DeviceTransport::VhostUserFs as i32);
        // The volume's tag, within DOCA SNAP's 20 bytes.
        let volume = dpufs_csi::csi::volume_id::VolumeId::parse(id).unwrap();
        assert_eq!(first.tag, dpufs_csi::dpu::tag::tag_of(&volume));
        assert!(
            first.tag.len() < dpufs_csi::dpu::tag::MAX_TAG_BYTES,
            "{first:?}"
        );
        devices.push(first);
    }
    let tags: std::collections::BTreeSet<&str> = devices.iter().map(|d| d.tag.as_str()).collect();
    assert_eq!(tags.len(), 3, "one tag per volume");
    let workers: Vec<_> = dpu.keeper_list();
    assert_eq!(workers.len(), 3, "one export per volume: {workers:?}");
    assert!(workers.iter().all(|v| v.pid.is_some()), "{workers:?}");
    // Stats, twice.
    for _ in 0..2 {
        let stats = client
            .get_volume_stats(pb::GetVolumeStatsRequest {
                volume_id: volumes[0].0.clone(),
            })
            .await
            .expect("stats")
            .into_inner();
        let bytes = stats.bytes.expect("bytes from the worker");
        assert_eq!(bytes.total, 512 << 20, "the volume's quota: {stats:?}");
        assert!(bytes.available <= bytes.total);
        let inodes = stats.inodes.expect("inodes");
        assert!(
            inodes.available > 0 && inodes.total >= inodes.available,
            "{inodes:?}"
        );
        let condition = stats.condition.expect("a condition");
        // Nothing is attached (--attach none): no frontend has connected.
        assert!(condition.abnormal, "{condition:?}");
        assert!(condition.message.contains("no frontend"), "{condition:?}");
    }
    refused(
        client
            .get_volume_stats(pb::GetVolumeStatsRequest {
                volume_id: dpu.bed.create("not-staged", "ns-a").await.volume_id,
            })
            .await,
        Code::NotFound,
        &["not staged"],
    );
    // List: pages of two, in the order of the ids, each page the same when asked again.
    let mut sorted: Vec<String> = volumes.iter().map(|(id, _)| id.clone()).collect();
    sorted.sort();
    let lister = client.clone();
    let page = |token: String| {
        let mut client = lister.clone();
        async move {
            client
                .list_volumes(pb::ListVolumesRequest {
                    max_entries: 2,
                    starting_token: token,
                })
                .await
                .expect("list")
                .into_inner()
        }
    };
    let first = page(String::new()).await;
    assert_eq!(first, page(String::new()).await);
    let ids = |p: &pb::ListVolumesResponse| -> Vec<String> {
        p.entries.iter().map(|e| e.volume_id.clone()).collect()
    };
    assert_eq!(ids(&first), sorted[..2]);
    assert!(!first.next_token.is_empty());
    let second = page(first.next_token.clone()).await;
    assert_eq!(ids(&second), sorted[2..]);
    assert!(second.next_token.is_empty(), "the last page");
    let listed: Vec<_> = first.entries.iter().chain(&second.entries).collect();
    for e in listed {
        let staged = volumes
            .iter()
            .position(|(id, _)| *id == e.volume_id)
            .unwrap();
        assert_eq!(e.device.as_ref(), Some(&devices[staged]));
    }
    refused(
        client
            .list_volumes(pb::ListVolumesRequest {
                max_entries: 2,
                starting_token: "not a token".into(),
            })
            .await,
        Code::Aborted,
        &["not a token"],
    );
    // Unstage, twice; and a volume never staged.
    for (id, _) in &volumes {
        for _ in 0..2 {
            client
                .unstage_volume(pb::UnstageVolumeRequest {
                    volume_id: id.clone(),
                    host_node: HOST_NODE.into(),
                })
                .await
                .expect("unstage");
        }
    }
    let (pool, _) = sorted[0].rsplit_once('/').unwrap();
    client
        .unstage_volume(pb::UnstageVolumeRequest {
            volume_id: format!("{pool}/{}", uuid::Uuid::new_v4()),
            host_node: HOST_NODE.into(),
        })
        .await
        .expect("a volume never staged");
    assert!(dpu.keeper_list().is_empty(), "{:?}", dpu.keeper_list());
    assert!(dpu.records().is_empty(), "{:?}", dpu.records());
    let sockets = std::fs::read_dir(dpu.bed.state.join("vhost-user"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(sockets, 0, "the sockets are gone");
    let empty = page(String::new()).await;
    assert!(empty.entries.is_empty() && empty.next_token.is_empty());
    // Another host may not unstage here.
    refused(
        client
            .unstage_volume(pb::UnstageVolumeRequest {
                volume_id: sorted[0].clone(),
                host_node: "host-2".into(),
            })
            .await,
        Code::PermissionDenied,
        &["host-2"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_readopts_its_workers() {
    let mut dpu = DpuBed::start().await;
    let mut staged = vec![];
    for i in 0..2 {
        let id = dpu.bed.create(&format!("vol-{i}"), "ns-a").await.volume_id;
        let uid = dpu
            .pod_with_volume("ns-a", &format!("pod-{i}"), HOST_NODE, &id)
            .await;
        let request = stage_request(&id, HOST_NODE, ("ns-a", &format!("pod-{i}"), &uid));
        let device = dpu
            .client()
            .stage_volume(request.clone())
            .await
            .unwrap_or_else(|e| panic!("stage: {e:?}\n{}", dpu.agent_log()))
            .into_inner()
            .device;
        staged.push((request, device));
    }
    let before = dpu.keeper_list();
    assert_eq!(before.len(), 2);
    let agent = dpu.agent.take().expect("the agent");
    dpufs_e2e::kill9(agent.id());
    let mut agent = agent;
    let _ = agent.wait();
    // The workers serve on without their agent.
    assert_eq!(dpu.keeper_list(), before);
    dpu.start_agent();
    let mut client = dpu.client();
    for (request, device) in &staged {
        let again = client
            .stage_volume(request.clone())
            .await
            .expect("the restarted agent answers")
            .into_inner()
            .device;
        assert_eq!(&again, device, "the same device");
    }
    assert_eq!(
        dpu.keeper_list(),
        before,
        "the same exports and worker pids"
    );
    for (request, _) in &staged {
        client
            .unstage_volume(pb::UnstageVolumeRequest {
                volume_id: request.volume_id.clone(),
                host_node: HOST_NODE.into(),
            })
            .await
            .expect("unstage");
    }
}

/// Under DPF the DPU is a Node of its own cluster, while the host's pods, claims and
/// PersistentVolumes are in the host cluster (`--host-cluster-kubeconfig`): the agent reads its
/// pairing from the cluster it runs in and checks the pod in the host's. Each fake API server
/// holds only its own part, so a call to the wrong one fails the stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pairing_comes_from_the_dpus_cluster_and_the_pod_from_the_hosts() {
    let dpu = DpuBed::start_in(Clusters::Two).await;
    let mut client = dpu.client();
    let probe = client
        .probe(pb::ProbeRequest {})
        .await
        .expect("probe")
        .into_inner();
    assert!(probe.ready, "{probe:?}\n{}", dpu.agent_log());
    assert_eq!(probe.host_node, HOST_NODE, "the label in the DPU's cluster");
    let id = dpu.bed.create("vol-a", "ns-a").await.volume_id;
    let uid = dpu.pod_with_volume("ns-a", "trainer", HOST_NODE, &id).await;
    let device = client
        .stage_volume(stage_request(&id, HOST_NODE, ("ns-a", "trainer", &uid)))
        .await
        .unwrap_or_else(|e| panic!("stage: {e:?}\n{}", dpu.agent_log()))
        .into_inner()
        .device
        .unwrap();
    let volume = dpufs_csi::csi::volume_id::VolumeId::parse(&id).unwrap();
    assert_eq!(device.tag, dpufs_csi::dpu::tag::tag_of(&volume));
    // The pod in the host cluster, the DPU's Node in its own: nothing else asked of either.
    let resources = |fake: &dpufs_kube::testing::FakeApiServer| {
        fake.api_calls(AGENT_USER)
            .into_iter()
            .map(|c| format!("{} {}", c.verb, c.resource))
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(
        resources(&dpu.fake),
        [
            "get persistentvolumeclaims",
            "get persistentvolumes",
            "get pods"
        ]
        .map(String::from)
        .into(),
    );
    assert_eq!(
        resources(dpu.node_cluster()),
        ["get nodes".to_string()].into()
    );
    dpu.assert_calls_granted();
    client
        .unstage_volume(pb::UnstageVolumeRequest {
            volume_id: id.clone(),
            host_node: HOST_NODE.into(),
        })
        .await
        .expect("unstage");
    assert!(dpu.keeper_list().is_empty(), "{:?}", dpu.keeper_list());
}

/// The agent's pod check and pairing against a real kube-apiserver, as a user bound to exactly
/// the agent's rules (docs/dpu.md, "RBAC"): what the API server really stores and serves for
/// pods, claims, PersistentVolumes and Nodes is what the agent reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_checks_on_a_real_api_server() {
    use dpufs_csi::dpu::agent::pods::{self, PodCheckError, PodRef, PodRefusal};
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use serde_json::json;
    let Some(server) = dpufs_e2e::kube_api::KubeApiServer::start("pod_checks_on_a_real_api_server")
    else {
        return;
    };
    let admin = server.client().await;
    let create = |object: serde_json::Value| {
        let admin = admin.clone();
        async move {
            let kind = object["kind"].as_str().unwrap().to_string();
            let (group_version, plural) = match kind.as_str() {
                "ClusterRole" => ("rbac.authorization.k8s.io/v1", "clusterroles"),
                "ClusterRoleBinding" => ("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
                "Namespace" => ("v1", "namespaces"),
                "ServiceAccount" => ("v1", "serviceaccounts"),
                "Node" => ("v1", "nodes"),
                "Pod" => ("v1", "pods"),
                "PersistentVolumeClaim" => ("v1", "persistentvolumeclaims"),
                "PersistentVolume" => ("v1", "persistentvolumes"),
                other => panic!("{other}"),
            };
            let (group, version) = group_version.split_once('/').unwrap_or(("", group_version));
            let resource = kube::api::ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: group_version.into(),
                kind: kind.clone(),
                plural: plural.into(),
            };
            let api: Api<kube::api::DynamicObject> = match object["metadata"]["namespace"].as_str()
            {
                Some(ns) => Api::namespaced_with(admin, ns, &resource),
                None => Api::all_with(admin, &resource),
            };
            let o: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
            api.create(&PostParams::default(), &o)
                .await
                .unwrap_or_else(|e| panic!("creating a {kind}: {e}"))
        }
    };
    // Exactly what the chart grants the agent in one cluster (tools/chart/api-calls.yaml): its
    // calls in the host cluster and its own Node.
    let rules: Vec<serde_json::Value> = [dpu_bed::AGENT_COMPONENT, dpu_bed::AGENT_NODE_COMPONENT]
        .into_iter()
        .flat_map(dpufs_kube::testing::rbac::granted)
        .map(|(group, resource, verb)| {
            json!({"apiGroups": [group], "resources": [resource], "verbs": [verb]})
        })
        .collect();
    create(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                  "metadata": {"name": "dpufs-dpu-agent"}, "rules": rules}),
    )
    .await;
    create(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                  "metadata": {"name": "dpufs-dpu-agent"},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": "dpufs-dpu-agent"},
                  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                "name": dpu_bed::AGENT_USER}]}),
    )
    .await;
    create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-a"}})).await;
    // No controller-manager makes the namespace's default service account; pods need it.
    create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                  "metadata": {"name": "default", "namespace": "ns-a"}}))
    .await;
    create(json!({"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": DPU_NODE, "labels": {"provisioning.dpu.nvidia.com/host": HOST_NODE}}}))
    .await;
    let volume_id =
        "v1/daos_server/6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f/0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b";
    let pvc = create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                  "metadata": {"name": "data", "namespace": "ns-a"},
                  "spec": {"accessModes": ["ReadWriteMany"], "volumeName": "pv-data",
                           "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}}))
    .await;
    create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
                  "metadata": {"name": "pv-data"},
                  "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                           "storageClassName": "",
                           "csi": {"driver": "dfs.dpufs.io", "volumeHandle": volume_id},
                           "claimRef": {"namespace": "ns-a", "name": "data",
                                        "uid": pvc.metadata.uid.clone().unwrap()}}}))
    .await;
    // Without kube-controller-manager nobody binds: the claim's status is written here.
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), "ns-a")
        .patch_status(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound"}})),
        )
        .await
        .expect("the claim's status");
    for (name, node) in [
        ("trainer", HOST_NODE),
        ("far", "host-2"),
        ("done", HOST_NODE),
    ] {
        create(json!({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": name, "namespace": "ns-a"},
                      "spec": {"nodeName": node, "automountServiceAccountToken": false,
                               "containers": [{"name": "c", "image": "busybox"}],
                               "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}))
        .await;
    }
    let uid = |name: &'static str| {
        let admin = admin.clone();
        async move {
            Api::<Pod>::namespaced(admin, "ns-a")
                .get(name)
                .await
                .unwrap()
                .metadata
                .uid
                .unwrap()
        }
    };
    // The agent's identity: the administrator impersonating the agent's user.
    let mut config = kube::config::Kubeconfig::read_from(&server.kubeconfig).unwrap();
    for user in &mut config.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.impersonate = Some(dpu_bed::AGENT_USER.to_string());
        }
    }
    let agent = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(config, &Default::default())
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        dpufs_csi::dpu::pairing::host_of(&agent, DPU_NODE)
            .await
            .unwrap(),
        HOST_NODE
    );
    let trainer = PodRef {
        namespace: "ns-a".into(),
        name: "trainer".into(),
        uid: uid("trainer").await,
    };
    pods::check(&agent, &trainer, HOST_NODE, volume_id)
        .await
        .expect("the pod, its node and its claim check out");
    let refusal = |r: Result<(), PodCheckError>| match r {
        Err(PodCheckError::Refused(r)) => r,
        other => panic!("not refused: {other:?}"),
    };
    let lying = PodRef {
        uid: uid("far").await,
        ..trainer.clone()
    };
    assert!(matches!(
        refusal(pods::check(&agent, &lying, HOST_NODE, volume_id).await),
        PodRefusal::OtherUid { .. }
    ));
    let far = PodRef {
        name: "far".into(),
        ..lying
    };
    assert!(matches!(
        refusal(pods::check(&agent, &far, HOST_NODE, volume_id).await),
        PodRefusal::OtherNode { .. }
    ));
    let other_volume = volume_id.replace("0b8a9c55", "1b8a9c55");
    assert!(matches!(
        refusal(pods::check(&agent, &trainer, HOST_NODE, &other_volume).await),
        PodRefusal::NoClaimOfVolume { .. }
    ));
    let missing = PodRef {
        name: "nobody".into(),
        ..trainer.clone()
    };
    assert!(matches!(
        refusal(pods::check(&agent, &missing, HOST_NODE, volume_id).await),
        PodRefusal::NoSuchPod(_)
    ));
    // A finished pod, its phase written as kubelet would.
    Api::<Pod>::namespaced(admin.clone(), "ns-a")
        .patch_status(
            "done",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .expect("the pod's status");
    let done = PodRef {
        name: "done".into(),
        uid: uid("done").await,
        ..trainer.clone()
    };
    assert!(matches!(
        refusal(pods::check(&agent, &done, HOST_NODE, volume_id).await),
        PodRefusal::Finished { .. }
    ));
}
