//! The DPF storage plugin served by the real DPU agent (`dpufs-csi dpu-agent --dpf-socket`):
//! a client playing SNAP's node driver creates, reads, lists and deletes the device of a real
//! volume, and the keeper, the agent's control channel and the API server's record of calls
//! show what happened on the DPU (docs/dpu.md, "Under NVIDIA DPF").

mod dpu_bed;

use dpf::AccessMode;
use dpf::identity_service_client::IdentityServiceClient;
use dpf::storage_plugin_service_client::StoragePluginServiceClient;
use dpu_bed::{AGENT_USER, DpuBed};
use dpufs_e2e::csi_bed::connect;
use dpufs_node_api::transport::Attachment;
use dpufs_proto::dpu::v1 as pb;
use dpufs_proto::nvidia::storage::plugins::v1 as dpf;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snap_creates_reads_lists_and_deletes_a_volumes_device_on_the_agent() {
    let dpu = DpuBed::start().await;
    let volume = dpu.bed.create("vol-dpf", "ns-a").await;
    let channel = connect(&dpu.dpf_socket()).await;
    let mut snap = StoragePluginServiceClient::new(channel.clone());
    let probe = IdentityServiceClient::new(channel)
        .probe(dpf::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true), "the agent knows its host");

    let request = dpf::CreateDeviceRequest {
        volume_id: volume.volume_id.clone(),
        access_modes: vec![AccessMode::Rwx as i32],
        volume_mode: "Filesystem".into(),
        publish_context: Default::default(),
        volume_context: volume.volume_context.clone(),
        storage_parameters: [("pool".to_string(), "fast".to_string())].into(),
    };
    let device = snap
        .create_device(request.clone())
        .await
        .expect("CreateDevice")
        .into_inner()
        .device_name;
    // The volume's tag, within DOCA SNAP's 20 bytes (the name SNAP exposes).
    let id = dpufs_csi::csi::volume_id::VolumeId::parse(&request.volume_id).unwrap();
    assert_eq!(device, dpufs_csi::dpu::tag::tag_of(&id));
    assert!(
        device.len() < dpufs_csi::dpu::tag::MAX_TAG_BYTES,
        "{device}"
    );

    // On the DPU: the keeper exports the volume on a vhost-user socket with a worker behind
    // it, and the agent's control channel shows the same device.
    let exported = dpu.keeper_list();
    let [served] = exported.as_slice() else {
        panic!("one volume exported: {exported:?}")
    };
    let Attachment::VhostUser { socket } = &served.attachment else {
        panic!("a vhost-user export: {served:?}")
    };
    assert!(socket.exists(), "{}", socket.display());
    let worker = served.pid.expect("a worker serves it");
    let listed = dpu
        .client()
        .list_volumes(pb::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].volume_id, volume.volume_id);
    assert_eq!(listed[0].device.as_ref().unwrap().tag, device);

    // Repeated: the same device, the same worker.
    let again = snap.create_device(request.clone()).await.unwrap();
    assert_eq!(again.into_inner().device_name, device);
    assert_eq!(dpu.keeper_list()[0].pid, Some(worker));

    let got = snap
        .get_device(dpf::GetDeviceRequest {
            volume_id: volume.volume_id.clone(),
            device_name: device.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.access_modes, vec![AccessMode::Rwx as i32]);
    assert_eq!(got.volume_mode, "Filesystem");
    assert_eq!(got.volume_context, request.volume_context);
    assert_eq!(got.storage_parameters, request.storage_parameters);
    let page = snap
        .list_devices(dpf::ListDevicesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.entries[0].volume_id, volume.volume_id);
    assert_eq!(page.entries[0].device_name, device);
    assert_eq!(page.next_token, "");

    // Read-only against the read-write staging: the agent's conflict carries through.
    let mut reader = request.clone();
    reader.access_modes = vec![AccessMode::Rox as i32];
    let conflict = snap.create_device(reader).await.unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists, "{conflict:?}");
    // Ids the agent refuses keep the agent's codes.
    let mut foreign = request.clone();
    foreign.volume_id = "pvc-0d1c2b3a".into();
    let e = snap.create_device(foreign).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("pvc-0d1c2b3a does not exist"), "{e:?}");

    // SNAP's driver is on the DPU: the agent asked the API server about no pod.
    let calls = dpu.fake.api_calls(AGENT_USER);
    assert!(
        calls.iter().all(|c| c.resource != "pods"),
        "no pod is checked for SNAP: {calls:?}"
    );

    // Deleted: the export, the worker and the records go; repeats change nothing.
    for _ in 0..2 {
        snap.delete_device(dpf::DeleteDeviceRequest {
            volume_id: volume.volume_id.clone(),
            device_name: device.clone(),
        })
        .await
        .expect("DeleteDevice");
        assert!(dpu.keeper_list().is_empty(), "{:?}", dpu.keeper_list());
        assert!(!socket.exists());
        assert!(
            dpu.bed
                .state
                .join("dpf")
                .read_dir()
                .map_or(true, |mut d| d.next().is_none()),
            "the plugin's record is gone"
        );
    }
    dpufs_e2e::csi_bed::wait_until("the worker to exit", || {
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        unsafe { libc::kill(worker as i32, 0) != 0 }
    });
    let gone = snap
        .get_device(dpf::GetDeviceRequest {
            volume_id: volume.volume_id.clone(),
            device_name: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    assert!(
        snap.list_devices(dpf::ListDevicesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .entries
            .is_empty()
    );
}
