//! What a request is checked against: its capacity range, capabilities and topology, and
//! what DAOS says of an existing container.

use super::*;

/// The capacity a request asks for: its required bytes, or [`DEFAULT_CAPACITY`] capped by
/// its limit; and the range an existing volume must fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub bytes: u64,
    pub required: u64,
    /// 0: no limit.
    pub limit: u64,
}

impl Capacity {
    /// Reads a CSI capacity range.
    pub fn of(range: Option<&CapacityRange>) -> Result<Capacity, CapacityError> {
        let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        if required < 0 || limit < 0 {
            return Err(CapacityError::Negative { required, limit });
        }
        let (required, limit) = (required as u64, limit as u64);
        if limit > 0 && required > limit {
            return Err(CapacityError::RequiredAboveLimit { required, limit });
        }
        let bytes = match (required, limit) {
            (0, 0) => DEFAULT_CAPACITY,
            (0, l) => DEFAULT_CAPACITY.min(l),
            (r, _) => r,
        };
        Ok(Capacity {
            bytes,
            required,
            limit,
        })
    }

    /// A volume whose request names no size gets the default, but no more than its pool's
    /// data tier holds: a default that cannot fit is not the request's fault.
    pub fn fit_default(&mut self, pool_bytes: Option<u64>) {
        if self.required == 0
            && let Some(pool) = pool_bytes
        {
            self.bytes = self.bytes.min(pool);
        }
    }

    /// Whether a volume of `bytes` satisfies the range.
    pub fn fits(&self, bytes: u64) -> bool {
        bytes >= self.required && (self.limit == 0 || bytes <= self.limit)
    }

    pub(super) fn describe(&self) -> String {
        match self.limit {
            0 => format!("at least {} bytes", self.required),
            l => format!("{} to {l} bytes", self.required),
        }
    }
}

/// Checks one volume capability: mount access (fs type empty or `dfs`) with any of the
/// GA access modes a shared file system supports.
pub fn check_capability(cap: &VolumeCapability) -> Result<(), CapabilityError> {
    use volume_capability::access_mode::Mode;
    match &cap.access_type {
        None => return Err(CapabilityError::MissingAccessType),
        Some(volume_capability::AccessType::Block(_)) => return Err(CapabilityError::Block),
        Some(volume_capability::AccessType::Mount(m)) => {
            if !FS_TYPES.contains(&m.fs_type.as_str()) {
                return Err(CapabilityError::FsType(m.fs_type.clone()));
            }
        }
    }
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or(CapabilityError::MissingAccessMode)?
        .mode;
    match Mode::try_from(mode) {
        Ok(
            Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::MultiNodeReaderOnly
            | Mode::MultiNodeSingleWriter
            | Mode::MultiNodeMultiWriter
            // Both services advertise SINGLE_NODE_MULTI_WRITER (ReadWriteOncePod); the node
            // service keeps a SINGLE_NODE_SINGLE_WRITER volume to one target.
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter,
        ) => Ok(()),
        Ok(other) => Err(CapabilityError::AccessMode(other.as_str_name().to_string())),
        Err(_) => Err(CapabilityError::AccessMode(format!("{mode}"))),
    }
}

/// Checks that a volume of `system` may be placed as the request's topology requires: some
/// requisite topology allows the system (names it, or does not constrain it).
pub fn check_topology(
    req: Option<&TopologyRequirement>,
    system: &str,
) -> Result<(), CreateVolumeError> {
    let Some(req) = req.filter(|r| !r.requisite.is_empty()) else {
        return Ok(());
    };
    let allowed = req.requisite.iter().any(|t| {
        t.segments
            .get(TOPOLOGY_SYSTEM_KEY)
            .is_none_or(|s| s == system)
    });
    if allowed {
        return Ok(());
    }
    let requisite = req
        .requisite
        .iter()
        .map(|t| {
            let mut segs: Vec<String> =
                t.segments.iter().map(|(k, v)| format!("{k}={v}")).collect();
            segs.sort();
            format!("{{{}}}", segs.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ");
    Err(CreateVolumeError::Topology {
        system: system.to_string(),
        requisite,
    })
}

pub(super) fn quota_of(info: &ContainerInfo) -> Option<u64> {
    match info.properties.get(&CONT_DPUFS_QUOTA) {
        Some(PropValue::Num(q)) if *q > 0 => Some(*q),
        _ => None,
    }
}

pub(super) fn num_prop(info: &ContainerInfo, number: u32) -> Option<u64> {
    match info.properties.get(&number) {
        Some(PropValue::Num(n)) => Some(*n),
        _ => None,
    }
}

pub(super) fn same_acl(a: &[String], b: &[String]) -> bool {
    a.iter().collect::<BTreeSet<_>>() == b.iter().collect::<BTreeSet<_>>()
}

/// Looks a container up; `None` if it (or its pool) does not exist.
pub(super) async fn find(
    clients: &SystemClients,
    pool: &str,
    cont: &str,
) -> Result<Option<ContainerInfo>, DaosError> {
    match clients.containers.query(pool, cont).await {
        Ok(info) => Ok(Some(info)),
        Err(DaosError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(super) fn container_uuid(info: &ContainerInfo) -> Result<Uuid, DaosError> {
    Uuid::parse_str(&info.uuid).map_err(|_| DaosError::Rpc {
        code: tonic::Code::Internal,
        message: format!("DAOS reported container UUID {:?}", info.uuid),
    })
}
