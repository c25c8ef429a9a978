//! What every case uses: the verdict of a case, checks of gRPC answers, the capabilities the
//! driver advertises, and the context that creates volumes, snapshots, staging and target
//! directories and cleans them up after the case.

use super::Config;
use dpufs_proto::csi::v1::controller_client::ControllerClient;
use dpufs_proto::csi::v1::controller_service_capability::rpc::Type as CtlCap;
use dpufs_proto::csi::v1::identity_client::IdentityClient;
use dpufs_proto::csi::v1::node_client::NodeClient;
use dpufs_proto::csi::v1::node_service_capability::rpc::Type as NodeCap;
use dpufs_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use dpufs_proto::csi::v1::{self as csi, VolumeCapability};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

pub(crate) use super::caps::Caps;
pub(crate) use access_mode::Mode;

/// Why a case did not pass.
#[derive(Debug)]
pub(crate) enum Verdict {
    Fail(String),
    Skip(String),
}

/// The result of a case.
pub(crate) type Check = Result<(), Verdict>;

/// Ends the case as failed with a formatted message.
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err($crate::csi_sanity::support::Verdict::Fail(format!($($arg)*)))
    };
}

/// Fails the case with a formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            $crate::csi_sanity::support::fail!($($arg)*);
        }
    };
}

pub(crate) use {ensure, fail};

/// Ends the case as skipped.
pub(crate) fn skip<T>(why: impl Into<String>) -> Result<T, Verdict> {
    Err(Verdict::Skip(why.into()))
}

/// A status as `Code: message`.
pub(crate) fn describe(s: &Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// Checks of an RPC's answer.
pub(crate) trait Answer<T> {
    /// The response of a call that must succeed.
    fn expect_ok(self, what: &str) -> Result<T, Verdict>;
    /// A call that must fail with `want`; CSI also wants `status.details` empty.
    fn expect_code(self, want: Code, what: &str) -> Check;
}

impl<T> Answer<T> for Result<Response<T>, Status> {
    fn expect_ok(self, what: &str) -> Result<T, Verdict> {
        match self {
            Ok(r) => Ok(r.into_inner()),
            Err(s) => fail!("{what}: expected OK, got {}", describe(&s)),
        }
    }

    fn expect_code(self, want: Code, what: &str) -> Check {
        match self {
            Ok(_) => fail!("{what}: expected {want:?}, got OK"),
            Err(s) if s.code() != want => fail!("{what}: expected {want:?}, got {}", describe(&s)),
            Err(s) if !s.details().is_empty() => fail!(
                "{what}: {want:?} as expected, but status.details carries {} bytes (CSI: it MUST be empty)",
                s.details().len()
            ),
            Err(_) => Ok(()),
        }
    }
}

/// What a case made that its clean-up removes.
#[derive(Debug, Default)]
pub(crate) struct Made {
    seq: usize,
    volumes: Vec<String>,
    snapshots: Vec<String>,
    /// (volume id, staging path)
    staged: Vec<(String, String)>,
    /// (volume id, target path)
    published: Vec<(String, String)>,
    /// (volume id, node id) of ControllerPublishVolume
    attached: Vec<(String, String)>,
    /// Directories the suite created, in order.
    dirs: Vec<PathBuf>,
}

/// Everything a case talks to and what it made.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub cfg: Arc<Config>,
    pub ctl: ControllerClient<Channel>,
    pub ctl_ident: IdentityClient<Channel>,
    pub node: Option<NodeClient<Channel>>,
    pub node_ident: Option<IdentityClient<Channel>>,
    pub caps: Arc<Caps>,
    /// Part of every name, so runs against one driver do not meet.
    pub run_id: String,
    pub state: Arc<Mutex<Made>>,
}

impl Ctx {
    fn made(&self) -> std::sync::MutexGuard<'_, Made> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A unique name `sanity-<what>-<run>-<n>`.
    pub(crate) fn name(&self, what: &str) -> String {
        let n = {
            let mut made = self.made();
            made.seq += 1;
            made.seq
        };
        format!("sanity-{what}-{}-{n}", self.run_id)
    }

    /// A unique name of exactly `len` characters.
    pub(crate) fn name_of_length(&self, what: &str, len: usize) -> String {
        let mut name = self.name(what);
        while name.len() < len {
            name.push('x');
        }
        name.truncate(len);
        name
    }

    pub(crate) fn ctl(&self) -> ControllerClient<Channel> {
        self.ctl.clone()
    }

    /// Skips unless the controller endpoint serves the Controller service.
    pub(crate) fn need_controller(&self) -> Check {
        if self.caps.controller_service {
            return Ok(());
        }
        match &self.caps.plugin_error {
            Some(e) => skip(format!(
                "the controller endpoint's GetPluginCapabilities failed ({e})"
            )),
            None => skip("the controller endpoint does not advertise CONTROLLER_SERVICE"),
        }
    }

    pub(crate) fn has_ctl(&self, cap: CtlCap) -> bool {
        self.caps.controller_service && self.caps.controller.contains(&(cap as i32))
    }

    /// Skips unless the controller advertises `cap`.
    pub(crate) fn need_ctl(&self, cap: CtlCap) -> Check {
        self.need_controller()?;
        if !self.has_ctl(cap) {
            return skip(format!(
                "the controller does not advertise {}",
                cap.as_str_name()
            ));
        }
        Ok(())
    }

    /// The Node client; skips without a node endpoint.
    pub(crate) fn need_node(&self) -> Result<NodeClient<Channel>, Verdict> {
        match &self.node {
            Some(n) => Ok(n.clone()),
            None => skip(format!("no node endpoint: {}", self.cfg.node_absent_reason)),
        }
    }

    /// The Node client, or the status a call without a node endpoint gets.
    pub(crate) fn node_or_status(&self) -> Result<NodeClient<Channel>, Status> {
        self.node
            .clone()
            .ok_or_else(|| Status::failed_precondition("csi_sanity: no node endpoint"))
    }

    pub(crate) fn has_node(&self, cap: NodeCap) -> bool {
        self.node.is_some() && self.caps.node.contains(&(cap as i32))
    }

    /// Skips unless the node advertises `cap`.
    pub(crate) fn need_node_cap(&self, cap: NodeCap) -> Check {
        self.need_node()?;
        if !self.has_node(cap) {
            return skip(format!("the node does not advertise {}", cap.as_str_name()));
        }
        Ok(())
    }

    /// A CreateVolume request of the test size and parameters with one mount capability.
    pub(crate) fn volume_request(&self, name: &str, mode: Mode) -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: name.to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: self.cfg.volume_size,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_cap(mode)],
            parameters: self.cfg.volume_parameters.clone(),
            ..Default::default()
        }
    }

    /// CreateVolume; a volume made is deleted after the case.
    pub(crate) async fn try_create_volume(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let answer = self.ctl().create_volume(req).await;
        if let Ok(r) = &answer
            && let Some(v) = &r.get_ref().volume
            && !v.volume_id.is_empty()
        {
            self.made().volumes.push(v.volume_id.clone());
        }
        answer
    }

    /// CreateVolume that must succeed with a volume that has an id.
    pub(crate) async fn create_volume(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::Volume, Verdict> {
        let name = req.name.clone();
        let r = self
            .try_create_volume(req)
            .await
            .expect_ok(&format!("CreateVolume {name}"))?;
        match r.volume {
            Some(v) if !v.volume_id.is_empty() => Ok(v),
            other => fail!("CreateVolume {name} answered without a volume id: {other:?}"),
        }
    }

    /// A new single-node-writer volume of the test size.
    pub(crate) async fn new_volume(&self, what: &str) -> Result<csi::Volume, Verdict> {
        self.need_ctl(CtlCap::CreateDeleteVolume)?;
        let req = self.volume_request(&self.name(what), Mode::SingleNodeWriter);
        self.create_volume(req).await
    }

    /// CreateSnapshot; a snapshot made is deleted after the case.
    pub(crate) async fn try_create_snapshot(
        &self,
        name: &str,
        source: &str,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let answer = self
            .ctl()
            .create_snapshot(csi::CreateSnapshotRequest {
                name: name.to_string(),
                source_volume_id: source.to_string(),
                parameters: self.cfg.snapshot_parameters.clone(),
                ..Default::default()
            })
            .await;
        if let Ok(r) = &answer
            && let Some(s) = &r.get_ref().snapshot
            && !s.snapshot_id.is_empty()
        {
            let mut made = self.made();
            if !made.snapshots.contains(&s.snapshot_id) {
                made.snapshots.push(s.snapshot_id.clone());
            }
        }
        answer
    }

    /// A snapshot of `source` that is ready to use (CreateSnapshot repeated until it says so,
    /// as a CO polls), with an id, its source and a creation time.
    pub(crate) async fn create_snapshot(
        &self,
        name: &str,
        source: &str,
    ) -> Result<csi::Snapshot, Verdict> {
        let start = Instant::now();
        loop {
            let r = self
                .try_create_snapshot(name, source)
                .await
                .expect_ok(&format!("CreateSnapshot {name}"))?;
            let Some(snap) = r.snapshot else {
                fail!("CreateSnapshot {name} answered without a snapshot");
            };
            check_snapshot(&snap, source)?;
            if snap.ready_to_use {
                return Ok(snap);
            }
            ensure!(
                start.elapsed() < Duration::from_secs(120),
                "snapshot {name} not ready to use after 120 s"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// A volume and a ready snapshot of it.
    pub(crate) async fn volume_with_snapshot(
        &self,
        what: &str,
    ) -> Result<(csi::Volume, csi::Snapshot), Verdict> {
        let volume = self.new_volume(what).await?;
        let snap = self
            .create_snapshot(&self.name(&format!("{what}-snap")), &volume.volume_id)
            .await?;
        Ok((volume, snap))
    }

    /// A new staging directory (the CO creates it), removed after the case.
    pub(crate) fn staging_path(&self) -> Result<PathBuf, Verdict> {
        let dir = self.cfg.staging_dir.join(self.name("staging"));
        self.make_dir(&dir)?;
        Ok(dir)
    }

    /// A target path whose parent exists (the CO creates it; the driver creates the target).
    pub(crate) fn target_path(&self) -> Result<PathBuf, Verdict> {
        let parent = self.cfg.mount_dir.join(self.name("pod"));
        self.make_dir(&parent)?;
        let target = parent.join("target");
        self.made().dirs.push(target.clone());
        Ok(target)
    }

    fn make_dir(&self, dir: &Path) -> Check {
        if let Err(e) = std::fs::create_dir(dir) {
            fail!("creating {}: {e}", dir.display());
        }
        self.made().dirs.push(dir.to_path_buf());
        Ok(())
    }

    /// NodeStageVolume with the volume's context; unstaged after the case.
    pub(crate) async fn stage(
        &self,
        volume: &csi::Volume,
        staging: &Path,
        mode: Mode,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let node = self.node_or_status()?;
        let staging = staging.display().to_string();
        let answer = node
            .clone()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: staging.clone(),
                volume_capability: Some(mount_cap(mode)),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            })
            .await;
        if answer.is_ok() {
            let entry = (volume.volume_id.clone(), staging);
            let mut made = self.made();
            if !made.staged.contains(&entry) {
                made.staged.push(entry);
            }
        }
        answer
    }

    /// NodePublishVolume with the volume's context; unpublished after the case.
    pub(crate) async fn publish(
        &self,
        volume: &csi::Volume,
        staging: Option<&Path>,
        target: &Path,
        mode: Mode,
        readonly: bool,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let node = self.node_or_status()?;
        let target = target.display().to_string();
        let answer = node
            .clone()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: staging.map(|p| p.display().to_string()).unwrap_or_default(),
                target_path: target.clone(),
                volume_capability: Some(mount_cap(mode)),
                readonly,
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            })
            .await;
        if answer.is_ok() {
            let entry = (volume.volume_id.clone(), target);
            let mut made = self.made();
            if !made.published.contains(&entry) {
                made.published.push(entry);
            }
        }
        answer
    }

    /// ControllerPublishVolume of `volume` to `node`; unpublished after the case.
    pub(crate) async fn controller_publish(
        &self,
        volume: &str,
        node: &str,
        readonly: bool,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let answer = self
            .ctl()
            .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: volume.to_string(),
                node_id: node.to_string(),
                volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
                readonly,
                ..Default::default()
            })
            .await;
        if answer.is_ok() {
            let entry = (volume.to_string(), node.to_string());
            let mut made = self.made();
            if !made.attached.contains(&entry) {
                made.attached.push(entry);
            }
        }
        answer
    }

    /// The node's id from NodeGetInfo.
    pub(crate) async fn node_id(&self) -> Result<String, Verdict> {
        let info = self
            .need_node()?
            .node_get_info(csi::NodeGetInfoRequest {})
            .await
            .expect_ok("NodeGetInfo")?;
        ensure!(!info.node_id.is_empty(), "NodeGetInfo has an empty node_id");
        Ok(info.node_id)
    }

    /// A staging path for `volume`, staged when the node stages (`None` otherwise).
    pub(crate) async fn stage_if_needed(
        &self,
        volume: &csi::Volume,
        mode: Mode,
    ) -> Result<Option<PathBuf>, Verdict> {
        if !self.has_node(NodeCap::StageUnstageVolume) {
            return Ok(None);
        }
        let staging = self.staging_path()?;
        self.stage(volume, &staging, mode)
            .await
            .expect_ok("NodeStageVolume")?;
        Ok(Some(staging))
    }

    /// Unpublishes, unstages and deletes what the case made, then removes the directories the
    /// suite made; what went wrong, if anything.
    pub(crate) async fn cleanup(&self) -> Result<(), String> {
        let made = std::mem::take(&mut *self.made());
        let mut errors = Vec::new();
        if let Some(node) = &self.node {
            for (id, target) in made.published.iter().rev() {
                let req = csi::NodeUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    target_path: target.clone(),
                };
                if let Err(s) = node.clone().node_unpublish_volume(req).await {
                    errors.push(format!("NodeUnpublishVolume {target}: {}", describe(&s)));
                }
            }
            for (id, staging) in made.staged.iter().rev() {
                let req = csi::NodeUnstageVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging.clone(),
                };
                if let Err(s) = node.clone().node_unstage_volume(req).await {
                    errors.push(format!("NodeUnstageVolume {staging}: {}", describe(&s)));
                }
            }
        }
        for (id, node) in made.attached.iter().rev() {
            let req = csi::ControllerUnpublishVolumeRequest {
                volume_id: id.clone(),
                node_id: node.clone(),
                ..Default::default()
            };
            if let Err(s) = self.ctl().controller_unpublish_volume(req).await {
                errors.push(format!("ControllerUnpublishVolume {id}: {}", describe(&s)));
            }
        }
        for id in made.snapshots.iter().rev() {
            let req = csi::DeleteSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            };
            if let Err(s) = self.ctl().delete_snapshot(req).await {
                errors.push(format!("DeleteSnapshot {id}: {}", describe(&s)));
            }
        }
        for id in made.volumes.iter().rev() {
            let req = csi::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            };
            if let Err(s) = self.ctl().delete_volume(req).await {
                errors.push(format!("DeleteVolume {id}: {}", describe(&s)));
            }
        }
        // Never recursively: a directory that is still a mount point must show up here.
        for dir in made.dirs.iter().rev() {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => errors.push(format!("removing {}: {e}", dir.display())),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

/// A mount capability (no fs type, no flags) with `mode`.
pub(crate) fn mount_cap(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// What csi-sanity checks of every snapshot: an id, the source and a creation time.
pub(crate) fn check_snapshot(snap: &csi::Snapshot, source: &str) -> Check {
    ensure!(
        !snap.snapshot_id.is_empty(),
        "a snapshot without an id: {snap:?}"
    );
    ensure!(
        snap.source_volume_id == source,
        "snapshot {} names source {:?}, not {source:?}",
        snap.snapshot_id,
        snap.source_volume_id
    );
    ensure!(
        snap.creation_time
            .as_ref()
            .is_some_and(|t| t.seconds > 0 || t.nanos > 0),
        "snapshot {} has no creation time",
        snap.snapshot_id
    );
    Ok(())
}

/// A volume id no driver has: csi-sanity's "unique valid volume id" of a foreign shape.
pub(crate) fn unknown_id(cx: &Ctx, what: &str) -> String {
    cx.name(&format!("no-such-{what}"))
}

/// The mounts at exactly `path` in this process's mount table.
pub(crate) fn mounts_at(path: &Path) -> usize {
    dpufs_node_api::mountinfo::read()
        .map(|all| all.iter().filter(|m| m.mountpoint == path).count())
        .unwrap_or(0)
}

/// A map from pairs.
pub(crate) fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
