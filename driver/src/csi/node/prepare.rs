//! What staging a volume means on any node, before and after the volume is attached: shared by
//! host-mode NodeStageVolume ([`super::stage`]: a FUSE mount at the staging path) and the DPU
//! agent's StageVolume (`crate::dpu::agent`: a vhost-user-fs export shown to the host).
//!
//! [`Stager::plan`] resolves the volume's tenant from its container (the request record the
//! controller wrote — never from the caller) and how the system's volumes are served; it
//! writes nothing but, for a DAOS system served through libdfs, the tenant's uid on this node
//! ([`TenantUids`]). [`Planned::write`] then signs the worker of an engine volume a capability
//! for exactly that container as the node agent (a libdfs worker instead runs as the tenant's
//! uid, which DAOS's agent vouches for), writes the QoS file and the stage record, and returns
//! the worker's arguments ([`Stager::prepare`] does both).
//! [`Stager::serve`] then has the keeper attach the volume (a FUSE mount at the staging path, or
//! a vhost-user socket) and serve it with a worker, undoing a first stage's files if it cannot.
//! [`Stager::release`] undoes it: the keeper stops the worker and lets the volume go, then the
//! files go.

use super::record::{StagedVolume, VolumeFiles};
use crate::csi::controller::RequestRecord;
use crate::csi::directory::{Directory, DirectoryError, SystemClients, VolumeAccess};
use crate::csi::error::{StageError, TenantError};
use crate::csi::label::REQUEST_ATTR;
use crate::csi::qos;
use crate::csi::volume_id::{VolumeId, VolumeIdError};
use crate::launcher::{Attachment, VolumeState, WantedVolume, ensure_volume};
use dpufs_node_api::handover::AccessMode;
use dpufs_node_api::keeper::{Reply, Request as KeeperRequest};
use dpufs_node_api::qos::QosLimits;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::agent::NodeAgent;
use super::uids::TenantUids;

pub(super) fn node_err(step: &str) -> impl FnOnce(String) -> StageError + '_ {
    move |detail| StageError::Node {
        step: step.to_string(),
        detail,
    }
}

/// How a stage's access reads in messages.
pub(crate) fn describe(access: AccessMode) -> &'static str {
    match access {
        AccessMode::ReadOnly => "reading only",
        AccessMode::MultiWriter => "reading and writing",
        AccessMode::SingleWriter => "reading and writing by one pod",
    }
}

/// The access of a stage that tells only readers from writers: DPU mode's, whose virtio-fs
/// devices are multi-writer even for a ReadWriteOncePod claim (docs/dpu.md).
pub(crate) fn shared_access(read_only: bool) -> AccessMode {
    if read_only {
        AccessMode::ReadOnly
    } else {
        AccessMode::MultiWriter
    }
}

/// What a node needs to prepare volumes: where its records go, its directory, its agent key,
/// its limit, the arguments every worker gets (the fabric), and its tenants' uids (for
/// volumes of DAOS systems served through libdfs).
#[derive(Clone)]
pub struct Stager {
    state_dir: PathBuf,
    dir: Arc<dyn Directory>,
    agent: NodeAgent,
    max_volumes: i64,
    worker_args: Vec<String>,
    uids: Arc<TenantUids>,
    /// Volumes planned and not recorded yet (see [`Reservation`]).
    reserved: Arc<Mutex<HashSet<String>>>,
}

/// A place under `max_volumes` held for a volume from the moment its stage is planned until
/// its record is written or the stage gives up: stages of different volumes run at once, and
/// without it two of them could both pass the check for the last place.
#[derive(Debug)]
struct Reservation {
    reserved: Arc<Mutex<HashSet<String>>>,
    id: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("state_dir", &self.state_dir)
            .field("agent", &self.agent)
            .field("max_volumes", &self.max_volumes)
            .finish_non_exhaustive()
    }
}

/// A stage decided but not written yet ([`Stager::plan`]).
#[derive(Debug)]
pub struct Planned {
    /// The record to write: whose volume it is (from its container) and where it is served.
    pub volume: StagedVolume,
    files: VolumeFiles,
    limits: QosLimits,
    served_by: ServedBy,
    new: bool,
    /// A new volume's place under `max_volumes`, held until the record is written.
    reservation: Option<Reservation>,
}

/// What the volume's worker serves it from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ServedBy {
    /// The engine's data service at this fabric address, with a capability the node agent
    /// signs.
    Engine(std::net::SocketAddr),
    /// DAOS's libdfs, loaded from `lib`, in a worker running as the tenant's `uid`.
    Daos { lib: PathBuf, uid: u32 },
}

impl ServedBy {
    /// The worker's backend arguments for `volume`, whose capability file is `capability`.
    fn worker_args(&self, volume: &StagedVolume, capability: &Path) -> Vec<String> {
        let mut args = self.backend_args(volume, capability);
        // The only writer anywhere: the kernel may cache names, attributes and pages hard.
        if volume.access() == AccessMode::SingleWriter {
            args.extend(["--access".into(), AccessMode::SingleWriter.as_str().into()]);
        }
        args
    }

    fn backend_args(&self, volume: &StagedVolume, capability: &Path) -> Vec<String> {
        match self {
            ServedBy::Engine(data) => vec![
                "--backend".into(),
                format!("engine:{data}"),
                "--capability".into(),
                capability.display().to_string(),
            ],
            ServedBy::Daos { lib, uid } => {
                let mut args = vec![
                    "--backend".into(),
                    format!("daos:{}/{}", volume.pool, volume.container),
                    "--daos-lib".into(),
                    lib.display().to_string(),
                    "--uid".into(),
                    uid.to_string(),
                    "--gid".into(),
                    uid.to_string(),
                ];
                // No capability limits this worker's rights: DAOS opens the container
                // read-only instead.
                if volume.read_only {
                    args.extend(["--access".into(), AccessMode::ReadOnly.as_str().into()]);
                }
                args
            }
        }
    }
}

impl Planned {
    /// Signs the worker's capability as the node agent and writes it, the QoS file and the
    /// stage record; returns the worker's arguments.
    pub fn write(self, stager: &Stager) -> Result<Prepared, StageError> {
        let Planned {
            volume,
            files,
            limits,
            served_by,
            new,
            reservation,
        } = self;
        make_records_dir(&stager.records_dir())
            .map_err(|e| node_err("creating the records directory")(e.to_string()))?;
        if let ServedBy::Engine(_) = served_by {
            stager
                .agent
                .issue(&volume, &files.capability)
                .map_err(node_err("signing the worker's capability"))?;
        }
        limits
            .store(&files.qos)
            .map_err(|e| node_err("writing the QoS file")(e.to_string()))?;
        volume
            .save(&files.record)
            .map_err(|e| node_err("writing the stage record")(e.to_string()))?;
        // The record counts the volume from now on.
        drop(reservation);
        let mut worker_args = served_by.worker_args(&volume, &files.capability);
        worker_args.extend(["--qos".to_string(), files.qos.display().to_string()]);
        worker_args.extend(stager.worker_args.iter().cloned());
        Ok(Prepared {
            volume,
            files,
            worker_args,
            new,
        })
    }
}

/// A volume prepared for its worker: recorded, with its capability and QoS file written.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub volume: StagedVolume,
    pub files: VolumeFiles,
    /// The worker's arguments: backend (with its capability, or its uid), QoS file, fabric.
    pub worker_args: Vec<String>,
    /// There was no record before this stage.
    pub new: bool,
}

impl Prepared {
    /// After a failed attach: a first stage leaves nothing behind; a repeated one keeps the
    /// record of what is attached.
    fn discard(&self) {
        if self.new {
            for f in [&self.files.record, &self.files.capability, &self.files.qos] {
                let _ = std::fs::remove_file(f);
            }
        }
    }
}

impl Stager {
    /// `state_dir`: the keeper's state directory; the records go to `csi/` in it. `uids`:
    /// the tenants' uids for volumes served through libdfs, recorded in the same place
    /// ([`TenantUids::open`] on [`Stager::records_dir`]).
    pub fn new(
        state_dir: PathBuf,
        dir: Arc<dyn Directory>,
        agent: NodeAgent,
        max_volumes: i64,
        worker_args: Vec<String>,
        uids: Arc<TenantUids>,
    ) -> Stager {
        Stager {
            state_dir,
            dir,
            agent,
            max_volumes,
            worker_args,
            uids,
            reserved: Arc::default(),
        }
    }

    /// `max_volumes_per_node`.
    pub fn max_volumes(&self) -> i64 {
        self.max_volumes
    }

    /// Where the stage records, capabilities and QoS files are.
    pub fn records_dir(&self) -> PathBuf {
        Stager::records_dir_in(&self.state_dir)
    }

    /// Where the records of a node with the state directory `state_dir` are.
    pub fn records_dir_in(state_dir: &Path) -> PathBuf {
        state_dir.join("csi")
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn directory(&self) -> &Arc<dyn Directory> {
        &self.dir
    }

    /// The files of `id`.
    pub fn files(&self, id: &VolumeId) -> VolumeFiles {
        VolumeFiles::of(&self.records_dir(), id)
    }

    /// The record of `id`, if it is staged here.
    pub fn staged(&self, id: &VolumeId) -> Result<Option<StagedVolume>, StageError> {
        StagedVolume::load(&self.files(id).record)
            .map_err(|e| node_err("reading the stage record")(e.to_string()))
    }

    /// Every volume staged here.
    pub fn all_staged(&self) -> Result<Vec<StagedVolume>, StageError> {
        StagedVolume::all(&self.records_dir())
            .map_err(|e| node_err("reading the stage records")(e.to_string()))
    }

    /// Prepares `id` to be served at `at` (the staging path, or the vhost-user socket) with
    /// `access`: [`Stager::plan`], then [`Planned::write`].
    pub async fn prepare(
        &self,
        id: &VolumeId,
        at: &Path,
        access: AccessMode,
    ) -> Result<Prepared, StageError> {
        self.plan(id, at, access).await?.write(self)
    }

    /// What a stage of `id` will record, from its record or from DAOS, writing nothing: the
    /// caller may still refuse it (the DPU agent checks the pod against the tenant first).
    /// The caller holds the volume's lock. A volume already staged is answered from its
    /// record (the same place and access, or refused), with its QoS read again.
    pub async fn plan(
        &self,
        id: &VolumeId,
        at: &Path,
        access: AccessMode,
    ) -> Result<Planned, StageError> {
        let known = self.staged(id)?;
        let new = known.is_none();
        let clients = self.dir.system(&id.system).await?;
        let (mut volume, limits, reservation) = match known {
            Some(v) => {
                let v = check_same(id, v, at, access)?;
                let limits = qos::read(&clients, id)
                    .await
                    .map_err(|source| StageError::Daos {
                        step: format!("reading the QoS limits of volume {id}"),
                        source,
                    })?;
                (v, limits, None)
            }
            None => {
                let reservation = self.reserve(id)?;
                let (v, limits) = self.resolve(&clients, id, at, access).await?;
                (v, limits, Some(reservation))
            }
        };
        let served_by = match clients.volumes {
            VolumeAccess::Engine { data_endpoint } => ServedBy::Engine(
                data_endpoint.ok_or_else(|| StageError::NoDataEndpoint(id.system.clone()))?,
            ),
            VolumeAccess::Daos { lib } => {
                // A tenant deleted since keeps the uid this node gave it.
                let named = self.dir.tenant_named(&volume.tenant).await?;
                let fixed = named.and_then(|t| t.uid);
                let uid = self.uids.uid_of(&volume.principal, fixed)?;
                ServedBy::Daos { lib, uid }
            }
        };
        volume.daos_uid = match served_by {
            ServedBy::Daos { uid, .. } => Some(uid),
            ServedBy::Engine(_) => None,
        };
        Ok(Planned {
            files: self.files(id),
            volume,
            limits,
            served_by,
            new,
            reservation,
        })
    }

    /// Holds a place under `max_volumes` for `id`, which has no record: the records and the
    /// other reservations are counted under the reservations' lock.
    fn reserve(&self, id: &VolumeId) -> Result<Reservation, StageError> {
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        let staged = self.all_staged()?;
        let mut taken: HashSet<&str> = staged.iter().map(|v| v.volume_id.as_str()).collect();
        taken.extend(reserved.iter().map(String::as_str));
        if taken.len() as i64 >= self.max_volumes {
            return Err(StageError::TooManyVolumes {
                max: self.max_volumes,
            });
        }
        let id = id.to_string();
        reserved.insert(id.clone());
        Ok(Reservation {
            reserved: self.reserved.clone(),
            id,
        })
    }

    /// Who the volume belongs to, from DAOS, and what this stage records; and its QoS.
    async fn resolve(
        &self,
        clients: &SystemClients,
        id: &VolumeId,
        at: &Path,
        access: AccessMode,
    ) -> Result<(StagedVolume, QosLimits), StageError> {
        let (pool, container) = (id.pool.to_string(), id.container.to_string());
        let attrs = clients
            .containers
            .get_attributes(&pool, &container)
            .await
            .map_err(|source| StageError::Daos {
                step: format!("reading the attributes of volume {id}"),
                source,
            })?;
        let record: RequestRecord = attrs
            .get(REQUEST_ATTR)
            .and_then(|raw| serde_json::from_slice(raw).ok())
            .ok_or_else(|| StageError::NotOurs {
                id: id.to_string(),
                container: container.clone(),
            })?;
        let mut volume = StagedVolume {
            volume_id: id.to_string(),
            served_at: at.to_path_buf(),
            tenant: record.tenant,
            principal: record.principal,
            pool,
            container,
            read_only: false,
            single_writer: false,
            daos_uid: None,
        };
        volume.set_access(access);
        Ok((volume, qos::of(id, &attrs)))
    }

    /// The pod's namespace (none: the default tenant's request, as from a CSI client that is
    /// not Kubernetes) must belong to the tenant that owns `volume`, which its record holds
    /// from the volume's container, never from the caller.
    pub async fn check_tenant(
        &self,
        volume: &StagedVolume,
        namespace: Option<&str>,
    ) -> Result<(), TenantError> {
        let tenant = match self.dir.tenant(namespace).await {
            Ok(t) => t,
            Err(e @ (DirectoryError::NoTenant(_) | DirectoryError::NoDefaultTenant)) => {
                return Err(TenantError::NoTenant {
                    id: volume.volume_id.clone(),
                    source: e,
                });
            }
            Err(e) => return Err(TenantError::Directory(e)),
        };
        if tenant.name != volume.tenant || tenant.principal != volume.principal {
            return Err(TenantError::OtherTenant {
                id: volume.volume_id.clone(),
                namespace: namespace.unwrap_or_default().to_string(),
                tenant: tenant.name,
                owner: volume.tenant.clone(),
            });
        }
        Ok(())
    }

    /// The keeper attaches `prepared` as `attachment` and serves it with its worker
    /// ([`crate::launcher::ensure_volume`]: what the keeper serves already is adopted, not
    /// served twice). When it cannot, a first stage leaves no file behind
    /// ([`Prepared::discard`]); a repeated one keeps the record of what is attached.
    pub async fn serve(
        &self,
        prepared: &Prepared,
        attachment: Attachment,
    ) -> Result<VolumeState, StageError> {
        let want = WantedVolume {
            name: prepared.files.keeper_volume.clone(),
            attachment,
            worker_args: prepared.worker_args.clone(),
        };
        let state_dir = self.state_dir.clone();
        tokio::task::spawn_blocking(move || ensure_volume(&state_dir, &want))
            .await
            .map_err(|e| node_err("the keeper call")(e.to_string()))
            .and_then(|r| {
                r.map_err(|e| node_err("attaching through the mount keeper")(format!("{e:#}")))
            })
            .inspect_err(|_| prepared.discard())
    }

    /// The keeper stops the volume's worker and lets the volume go (unmounts it, or closes
    /// its vhost-user socket); a volume the keeper does not know is fine.
    pub async fn stop_serving(&self, id: &VolumeId) -> Result<(), StageError> {
        let socket = crate::keeper::Keeper::socket(&self.state_dir);
        let volume = self.files(id).keeper_volume;
        tokio::task::spawn_blocking(move || unmount(&socket, &volume))
            .await
            .map_err(|e| node_err("the keeper call")(e.to_string()))?
            .map_err(node_err("letting the volume go through the mount keeper"))
    }

    /// Removes the volume's capability, QoS file and record (the record last: while it is
    /// there, the volume counts as staged).
    pub fn forget(&self, id: &VolumeId) -> Result<(), StageError> {
        let files = self.files(id);
        for f in [&files.capability, &files.qos, &files.record] {
            match std::fs::remove_file(f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(node_err("removing the stage record")(format!(
                        "{}: {e}",
                        f.display()
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// A directory only its owner may enter (0700, also when it existed): the DPU agent's
/// vhost-user sockets.
pub fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    make_dir_with_mode(dir, 0o700)
}

/// The records directory (0711, also when it existed): its owner's, but others may pass
/// through, because a worker running as its tenant's uid re-reads its QoS file (0644) there.
/// No one else can list it, and the records, capabilities and uid map in it are 0600.
pub fn make_records_dir(dir: &Path) -> std::io::Result<()> {
    make_dir_with_mode(dir, 0o711)
}

fn make_dir_with_mode(dir: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// A stage of a volume already staged: the same place and access (idempotent), or refused.
fn check_same(
    id: &VolumeId,
    v: StagedVolume,
    at: &Path,
    access: AccessMode,
) -> Result<StagedVolume, StageError> {
    if v.served_at != at {
        return Err(StageError::StagedElsewhere {
            id: id.to_string(),
            at: v.served_at.display().to_string(),
            asked: at.display().to_string(),
        });
    }
    if v.access() != access {
        return Err(StageError::OtherAccess {
            id: id.to_string(),
            staged: describe(v.access()),
            asked: describe(access),
        });
    }
    Ok(v)
}

/// Asks the keeper to stop the volume's worker and let it go; a volume the keeper does not
/// know is fine.
fn unmount(socket: &Path, volume: &str) -> Result<(), String> {
    let list = crate::ipc::keeper::list(socket).map_err(|e| format!("{e:#}"))?;
    if !list.volumes.iter().any(|v| v.volume == volume) {
        return Ok(());
    }
    let req = KeeperRequest::Unmount {
        volume: volume.to_string(),
    };
    match crate::ipc::keeper::request(socket, &req).map_err(|e| format!("{e:#}"))? {
        (Reply::Unmounted, _) => Ok(()),
        (other, _) => Err(format!("the keeper answered {other:?}")),
    }
}

/// A volume id a node can act on: ours and well formed. A foreign id names no volume.
pub fn parse_id(raw: &str, rpc: &'static str) -> Result<VolumeId, StageError> {
    match VolumeId::parse(raw) {
        Ok(id) => Ok(id),
        Err(VolumeIdError::Empty) => Err(StageError::MissingId(rpc)),
        Err(VolumeIdError::Foreign(_)) => Err(StageError::NotFound(raw.to_string())),
        Err(e) => Err(StageError::MalformedId(e)),
    }
}
