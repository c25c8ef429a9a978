//! StorageClass parameters of `dfs.dpufs.io` (CreateVolume `parameters`).
//!
//! | key | value |
//! |---|---|
//! | `system` | a DaosSystem name; default: the only one configured |
//! | `pool` | a DaosPool name; default: the tenant's only allowed pool |
//! | `provisioning` | `container` (default: a container per volume in `pool`) or `pool` (not built yet) |
//! | `objectClass`, `directoryObjectClass`, `fileObjectClass` | DAOS object classes, as on a DaosContainer |
//! | `chunkSize` | byte size 4Ki–1Gi, as on a DaosContainer |
//! | `redundancyFactor` | 0–4, as on a DaosContainer |
//! | `csi.storage.k8s.io/*` | accepted; only the PVC namespace and name and the PV name are used |
//!
//! Any other key is refused with a message naming it (INVALID_ARGUMENT). There is
//! deliberately no `volumeMode`: that name belongs to the PVC field `Filesystem|Block`.

use crate::csi::volume_id::valid_system_name;
use dpufs_api::ByteQuantity;
use dpufs_node_api::qos::QosLimits;
use dpufs_proto::daos::props::{
    CONT_DPUFS_CHUNK_SIZE, CONT_LAYOUT_TYPE, CONT_RD_FAC, LAYOUT_POSIX, PropValue,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

pub const SYSTEM: &str = "system";
pub const POOL: &str = "pool";
pub const PROVISIONING: &str = "provisioning";
pub const OBJECT_CLASS: &str = "objectClass";
pub const DIRECTORY_OBJECT_CLASS: &str = "directoryObjectClass";
pub const FILE_OBJECT_CLASS: &str = "fileObjectClass";
pub const CHUNK_SIZE: &str = "chunkSize";
pub const REDUNDANCY_FACTOR: &str = "redundancyFactor";

/// Keys the external-provisioner adds (`--extra-create-metadata`) and reserves.
pub const K8S_PREFIX: &str = "csi.storage.k8s.io/";
pub const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
pub const PV_NAME: &str = "csi.storage.k8s.io/pv/name";

/// The keys of our own, in the order messages list them.
pub const OWN_KEYS: [&str; 8] = [
    SYSTEM,
    POOL,
    PROVISIONING,
    OBJECT_CLASS,
    DIRECTORY_OBJECT_CLASS,
    FILE_OBJECT_CLASS,
    CHUNK_SIZE,
    REDUNDANCY_FACTOR,
];

/// Smallest and largest chunk size (the DaosContainer CRD's bounds).
pub const MIN_CHUNK_SIZE: u64 = 4 << 10;
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;
/// Largest DAOS redundancy factor.
pub const MAX_REDUNDANCY_FACTOR: u8 = 4;
/// Longest object class name accepted (the CRD's bound).
const MAX_OBJECT_CLASS: usize = 32;

/// What one volume is: a container in a shared pool, or a pool of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Provisioning {
    #[default]
    Container,
    Pool,
}

/// Properties of the container created for a volume. Object classes are recorded and
/// checked but not applied yet (see `docs/csi.md`), as for DaosContainers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerProperties {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory_object_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_object_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redundancy_factor: Option<u8>,
}

impl ContainerProperties {
    /// The DAOS container properties to create the container with (the quota is the
    /// controller's, from the capacity).
    pub fn daos_properties(&self) -> Vec<(u32, PropValue)> {
        let mut props = vec![(CONT_LAYOUT_TYPE, PropValue::Num(LAYOUT_POSIX))];
        if let Some(rf) = self.redundancy_factor {
            props.push((CONT_RD_FAC, PropValue::Num(u64::from(rf))));
        }
        if let Some(chunk) = self.chunk_size {
            props.push((CONT_DPUFS_CHUNK_SIZE, PropValue::Num(chunk)));
        }
        props
    }

    /// Whether any object class is asked for (not applied yet).
    pub fn has_object_classes(&self) -> bool {
        self.object_class.is_some()
            || self.directory_object_class.is_some()
            || self.file_object_class.is_some()
    }
}

/// The parsed parameters of a CreateVolume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeParams {
    pub system: Option<String>,
    pub pool: Option<String>,
    pub provisioning: Provisioning,
    pub properties: ContainerProperties,
    pub pvc_namespace: Option<String>,
    pub pvc_name: Option<String>,
    pub pv_name: Option<String>,
}

/// Why the parameters are not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// Keys that are neither ours nor `csi.storage.k8s.io/*` (sorted).
    #[error(
        "unknown StorageClass parameter{} {}; dfs.dpufs.io accepts {} and csi.storage.k8s.io/* keys",
        if .0.len() == 1 { "" } else { "s" },
        .0.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", "),
        OWN_KEYS.join(", ")
    )]
    Unknown(Vec<String>),
    /// A known key with a value it cannot take.
    #[error("StorageClass parameter {key}={value:?} is invalid: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
    /// Mutable parameters (a VolumeAttributesClass's) that are not ours (sorted).
    #[error(
        "unknown VolumeAttributesClass parameter{} {}; dfs.dpufs.io accepts {}",
        if .0.len() == 1 { "" } else { "s" },
        .0.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", "),
        MUTABLE_KEYS.join(", ")
    )]
    UnknownMutable(Vec<String>),
    /// A mutable parameter with a value it cannot take.
    #[error("VolumeAttributesClass parameter {key}={value:?} is invalid: {reason}")]
    InvalidMutable {
        key: String,
        value: String,
        reason: String,
    },
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> ParamError {
    ParamError::Invalid {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Parses CreateVolume parameters.
pub fn parse(params: &HashMap<String, String>) -> Result<VolumeParams, ParamError> {
    let mut unknown: Vec<String> = params
        .keys()
        .filter(|k| !OWN_KEYS.contains(&k.as_str()) && !k.starts_with(K8S_PREFIX))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ParamError::Unknown(unknown));
    }
    let get = |k: &str| params.get(k).map(String::as_str);
    let mut out = VolumeParams::default();
    if let Some(v) = get(SYSTEM) {
        if !valid_system_name(v) {
            return Err(invalid(
                SYSTEM,
                v,
                "a DAOS system name is 1 to 15 letters, digits, ., _ or -",
            ));
        }
        out.system = Some(v.to_string());
    }
    if let Some(v) = get(POOL) {
        if !valid_object_name(v) {
            return Err(invalid(
                POOL,
                v,
                "name a DaosPool: lower-case letters, digits, - and ., starting and ending with a letter or digit",
            ));
        }
        out.pool = Some(v.to_string());
    }
    match get(PROVISIONING) {
        None | Some("container") => {}
        Some("pool") if out.pool.is_some() => {
            return Err(invalid(
                PROVISIONING,
                "pool",
                "a volume with a pool of its own goes in no shared pool: remove the parameter pool",
            ));
        }
        Some("pool") => out.provisioning = Provisioning::Pool,
        Some(v) => return Err(invalid(PROVISIONING, v, "use container or pool")),
    }
    for (key, slot) in [
        (OBJECT_CLASS, &mut out.properties.object_class),
        (
            DIRECTORY_OBJECT_CLASS,
            &mut out.properties.directory_object_class,
        ),
        (FILE_OBJECT_CLASS, &mut out.properties.file_object_class),
    ] {
        if let Some(v) = get(key) {
            if !valid_object_class(v) {
                return Err(invalid(
                    key,
                    v,
                    "not a DAOS object class; use S<n>/SX (no redundancy), RP_<replicas>G<groups> or EC_<data>P<parity>G<groups>, for example SX, RP_3G1 or EC_8P2GX",
                ));
            }
            *slot = Some(v.to_string());
        }
    }
    if let Some(v) = get(CHUNK_SIZE) {
        let bytes = ByteQuantity::Quantity(v.to_string())
            .bytes()
            .map_err(|e| invalid(CHUNK_SIZE, v, e.to_string()))?;
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&bytes) {
            return Err(invalid(CHUNK_SIZE, v, "out of range: use from 4Ki to 1Gi"));
        }
        out.properties.chunk_size = Some(bytes);
    }
    if let Some(v) = get(REDUNDANCY_FACTOR) {
        match v.parse::<u8>() {
            Ok(rf) if rf <= MAX_REDUNDANCY_FACTOR && !v.starts_with('+') => {
                out.properties.redundancy_factor = Some(rf)
            }
            _ => return Err(invalid(REDUNDANCY_FACTOR, v, "use an integer from 0 to 4")),
        }
    }
    if let Some(v) = get(PVC_NAMESPACE) {
        if !valid_namespace(v) {
            return Err(invalid(PVC_NAMESPACE, v, "not a namespace name"));
        }
        out.pvc_namespace = Some(v.to_string());
    }
    out.pvc_name = get(PVC_NAME).map(str::to_string);
    out.pv_name = get(PV_NAME).map(str::to_string);
    Ok(out)
}

/// A Kubernetes object name (DNS subdomain): at most 253 characters, dot-separated labels
/// of lower-case letters, digits and `-`, each starting and ending with a letter or digit.
pub fn valid_object_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns_label)
}

/// A Kubernetes namespace name (DNS label, at most 63 characters).
pub fn valid_namespace(s: &str) -> bool {
    s.len() <= 63 && dns_label(s)
}

fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// `S<n>|SX`, `RP_<n>G<n|X>` or `EC_<n>P<n>G<n|X>` (the DaosContainer CRD's rule).
pub fn valid_object_class(s: &str) -> bool {
    fn digits(s: &str) -> bool {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    }
    fn groups(s: &str) -> bool {
        s == "X" || digits(s)
    }
    if s.len() > MAX_OBJECT_CLASS {
        return false;
    }
    if let Some(rest) = s.strip_prefix("RP_") {
        return rest
            .split_once('G')
            .is_some_and(|(r, g)| digits(r) && groups(g));
    }
    if let Some(rest) = s.strip_prefix("EC_") {
        return rest.split_once('P').is_some_and(|(d, pg)| {
            digits(d)
                && pg
                    .split_once('G')
                    .is_some_and(|(p, g)| digits(p) && groups(g))
        });
    }
    s.strip_prefix('S').is_some_and(groups)
}

/// Mutable parameters (`mutable_parameters` of CreateVolume and ControllerModifyVolume, a
/// VolumeAttributesClass's `parameters`): the volume's QoS caps, enforced by its workers.
pub const MAX_THROUGHPUT: &str = "maxThroughputMiBps";
/// Read and write requests per second.
pub const MAX_IOPS: &str = "maxIops";
/// The mutable keys, in the order messages list them.
pub const MUTABLE_KEYS: [&str; 2] = [MAX_THROUGHPUT, MAX_IOPS];
/// The value that lifts a cap.
pub const UNLIMITED: &str = "unlimited";
/// Largest caps accepted: 1 TiB/s and a billion requests per second, beyond any node.
const MAX_THROUGHPUT_MIBPS: u64 = 1 << 20;
const MAX_IOPS_VALUE: u64 = 1_000_000_000;

/// What a set of mutable parameters changes: each key given sets its cap (`Some(Some(n))`)
/// or lifts it (`Some(None)`, the value `unlimited`); a key not given leaves the cap as it
/// is (CSI: "only keys that are specified should result in modifications").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosChange {
    pub max_throughput_mibps: Option<Option<u64>>,
    pub max_iops: Option<Option<u64>>,
}

impl QosChange {
    /// `limits` with this change made.
    pub fn apply(&self, limits: QosLimits) -> QosLimits {
        QosLimits {
            max_throughput_mibps: self
                .max_throughput_mibps
                .unwrap_or(limits.max_throughput_mibps),
            max_iops: self.max_iops.unwrap_or(limits.max_iops),
        }
    }
}

/// Parses mutable parameters; nothing is applied when any of them is wrong.
pub fn parse_mutable(params: &HashMap<String, String>) -> Result<QosChange, ParamError> {
    let mut unknown: Vec<String> = params
        .keys()
        .filter(|k| !MUTABLE_KEYS.contains(&k.as_str()))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ParamError::UnknownMutable(unknown));
    }
    let cap = |key: &str, max: u64, unit: &str| -> Result<Option<Option<u64>>, ParamError> {
        let Some(v) = params.get(key) else {
            return Ok(None);
        };
        if v == UNLIMITED {
            return Ok(Some(None));
        }
        match v.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) && !v.starts_with('+') => Ok(Some(Some(n))),
            _ => Err(ParamError::InvalidMutable {
                key: key.to_string(),
                value: v.clone(),
                reason: format!(
                    "use a whole number of {unit} from 1 to {max}, or {UNLIMITED} to lift the cap"
                ),
            }),
        }
    };
    Ok(QosChange {
        max_throughput_mibps: cap(MAX_THROUGHPUT, MAX_THROUGHPUT_MIBPS, "MiB/s")?,
        max_iops: cap(MAX_IOPS, MAX_IOPS_VALUE, "requests per second")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_parameters_mean_defaults() {
        assert_eq!(parse(&HashMap::new()), Ok(VolumeParams::default()));
    }

    #[test]
    fn every_key_is_read() {
        let p = parse(&map(&[
            (SYSTEM, "daos_server"),
            (POOL, "training"),
            (PROVISIONING, "container"),
            (OBJECT_CLASS, "SX"),
            (DIRECTORY_OBJECT_CLASS, "RP_3G1"),
            (FILE_OBJECT_CLASS, "EC_8P2GX"),
            (CHUNK_SIZE, "64Ki"),
            (REDUNDANCY_FACTOR, "2"),
            (PVC_NAMESPACE, "team-a"),
            (PVC_NAME, "data"),
            (PV_NAME, "pvc-123"),
            ("csi.storage.k8s.io/fstype", "ignored"),
        ]))
        .unwrap();
        assert_eq!(p.system.as_deref(), Some("daos_server"));
        assert_eq!(p.pool.as_deref(), Some("training"));
        assert_eq!(p.provisioning, Provisioning::Container);
        assert_eq!(
            p.properties,
            ContainerProperties {
                object_class: Some("SX".into()),
                directory_object_class: Some("RP_3G1".into()),
                file_object_class: Some("EC_8P2GX".into()),
                chunk_size: Some(64 << 10),
                redundancy_factor: Some(2),
            }
        );
        assert_eq!(p.pvc_namespace.as_deref(), Some("team-a"));
        assert_eq!(p.pvc_name.as_deref(), Some("data"));
        assert_eq!(p.pv_name.as_deref(), Some("pvc-123"));
        assert!(
            p.properties
                .daos_properties()
                .contains(&(CONT_DPUFS_CHUNK_SIZE, PropValue::Num(64 << 10)))
        );
        assert!(
            p.properties
                .daos_properties()
                .contains(&(CONT_RD_FAC, PropValue::Num(2)))
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse(&map(&[("volumeMode", "Filesystem"), ("pool", "p")])).unwrap_err();
        assert_eq!(err, ParamError::Unknown(vec!["volumeMode".into()]));
        assert!(err.to_string().contains("\"volumeMode\""), "{err}");
        let err = parse(&map(&[("zeta", "1"), ("alpha", "2")])).unwrap_err();
        assert_eq!(
            err,
            ParamError::Unknown(vec!["alpha".into(), "zeta".into()])
        );
        assert!(
            err.to_string().contains("parameters \"alpha\", \"zeta\""),
            "{err}"
        );
        // Our keys are case-sensitive.
        assert!(matches!(
            parse(&map(&[("Pool", "p")])),
            Err(ParamError::Unknown(_))
        ));
    }

    #[test]
    fn bad_values_are_named() {
        for (k, v) in [
            (SYSTEM, ""),
            (SYSTEM, "much-too-long-system-name"),
            (POOL, "Training"),
            (POOL, "-x"),
            (POOL, ""),
            (PROVISIONING, "volume"),
            (OBJECT_CLASS, "S"),
            (OBJECT_CLASS, "RP_3"),
            (OBJECT_CLASS, "EC_8G1"),
            (OBJECT_CLASS, "ec_8p2gx"),
            (DIRECTORY_OBJECT_CLASS, "RP_G1"),
            (FILE_OBJECT_CLASS, "SY"),
            (CHUNK_SIZE, "1Ki"),
            (CHUNK_SIZE, "2Gi"),
            (CHUNK_SIZE, "lots"),
            (CHUNK_SIZE, "-4Ki"),
            (REDUNDANCY_FACTOR, "5"),
            (REDUNDANCY_FACTOR, "-1"),
            (REDUNDANCY_FACTOR, "+1"),
            (REDUNDANCY_FACTOR, "one"),
            (PVC_NAMESPACE, "Team_A"),
        ] {
            match parse(&map(&[(k, v)])) {
                Err(ParamError::Invalid { key, value, .. }) => {
                    assert_eq!((key.as_str(), value.as_str()), (k, v))
                }
                other => panic!("{k}={v:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn pool_provisioning_names_no_pool() {
        let p = parse(&map(&[(PROVISIONING, "pool")])).unwrap();
        assert_eq!(p.provisioning, Provisioning::Pool);
        assert_eq!(p.pool, None);
        assert_eq!(
            parse(&map(&[(PROVISIONING, "container")]))
                .unwrap()
                .provisioning,
            Provisioning::Container
        );
        match parse(&map(&[(PROVISIONING, "pool"), (POOL, "fast")])) {
            Err(ParamError::Invalid { key, reason, .. }) => {
                assert_eq!(key, PROVISIONING);
                assert!(reason.contains("remove the parameter pool"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn chunk_sizes_at_the_bounds() {
        for (v, bytes) in [
            ("4Ki", 4096),
            ("4096", 4096),
            ("1Gi", 1 << 30),
            ("1.5Mi", 3 << 19),
        ] {
            let p = parse(&map(&[(CHUNK_SIZE, v)])).unwrap();
            assert_eq!(p.properties.chunk_size, Some(bytes), "{v}");
        }
    }

    #[test]
    fn object_classes() {
        for ok in [
            "S1", "SX", "S32", "RP_2G1", "RP_3GX", "EC_8P2GX", "EC_4P1G8",
        ] {
            assert!(valid_object_class(ok), "{ok}");
        }
        for bad in [
            "", "S", "X", "RP_", "RP_3", "RP_XG1", "EC_8P", "EC_8P2G", "EC_P2G1", "sx",
        ] {
            assert!(!valid_object_class(bad), "{bad}");
        }
    }

    #[test]
    fn names() {
        assert!(valid_object_name("training"));
        assert!(valid_object_name("a.b-c"));
        assert!(!valid_object_name("a..b"));
        assert!(!valid_object_name(&"a".repeat(254)));
        assert!(valid_namespace("team-a"));
        assert!(!valid_namespace(&"a".repeat(64)));
        assert!(!valid_namespace("a.b"));
    }

    #[test]
    fn mutable_parameters_set_lift_or_keep_each_cap() {
        let change =
            parse_mutable(&map(&[(MAX_THROUGHPUT, "200"), (MAX_IOPS, UNLIMITED)])).unwrap();
        let before = QosLimits {
            max_throughput_mibps: Some(50),
            max_iops: Some(1000),
        };
        let after = change.apply(before);
        assert_eq!(after.max_throughput_mibps, Some(200));
        assert_eq!(after.max_iops, None);
        // A key not given keeps its cap.
        let only_iops = parse_mutable(&map(&[(MAX_IOPS, "10")])).unwrap();
        assert_eq!(only_iops.apply(before).max_throughput_mibps, Some(50));
        assert_eq!(
            parse_mutable(&HashMap::new()).unwrap().apply(before),
            before
        );
    }

    #[test]
    fn bad_mutable_parameters_say_what_to_use() {
        let e = parse_mutable(&map(&[("iops", "5"), ("qos", "gold")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"unknown VolumeAttributesClass parameters "iops", "qos"; dfs.dpufs.io accepts maxThroughputMiBps, maxIops"#
        );
        for bad in ["0", "-1", "+5", "1.5", "fast", "", "1048577"] {
            let e = parse_mutable(&map(&[(MAX_THROUGHPUT, bad)])).unwrap_err();
            assert!(
                e.to_string().contains("from 1 to 1048576, or unlimited"),
                "{bad:?}: {e}"
            );
        }
        let e = parse_mutable(&map(&[(MAX_THROUGHPUT, "10"), (MAX_IOPS, "0")])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("VolumeAttributesClass parameter maxIops=\"0\""),
            "{e}"
        );
    }
}
