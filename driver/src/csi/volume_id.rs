//! Volume ids: `v1/<system>/<pool-uuid>/<container-uuid>`.
//!
//! The id alone names the volume: the DAOS system (a DaosSystem's `name`, 1 to 15 of
//! `A-Z a-z 0-9 . _ -`, so never a `/`), the pool and the container by UUID (labels may be
//! reused after a delete; UUIDs are not). UUIDs are written in their canonical lower-case
//! hyphenated form, so one volume has exactly one id.
//!
//! The parser tells two kinds of bad ids apart: an id that starts with `v1/` is one of ours
//! and, if it does not parse, is malformed (INVALID_ARGUMENT); anything else is *foreign*
//! (another driver's, or a conformance suite's made-up id), which can name no volume of
//! ours (DeleteVolume: OK, ValidateVolumeCapabilities: NOT_FOUND).

use std::fmt;
use uuid::Uuid;

/// The prefix of every id this driver hands out (format version 1).
pub const PREFIX: &str = "v1/";

/// Longest DAOS system name (`DAOS_SYS_NAME_MAX`).
pub const MAX_SYSTEM_NAME: usize = 15;

/// A volume: a container in a pool of a DAOS system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VolumeId {
    pub system: String,
    pub pool: Uuid,
    pub container: Uuid,
}

/// Why a string is not a volume id of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeIdError {
    /// The id is empty.
    #[error("the volume id is empty")]
    Empty,
    /// Not in our format at all: some other driver's id, or made up.
    #[error(
        "volume id {0:?} was not issued by dfs.dpufs.io (ids look like v1/<system>/<pool-uuid>/<container-uuid>)"
    )]
    Foreign(String),
    /// Our format, but broken.
    #[error(
        "volume id {id:?} is malformed: {reason} (ids look like v1/<system>/<pool-uuid>/<container-uuid>)"
    )]
    Malformed { id: String, reason: String },
}

/// Whether `name` is a valid DAOS system name: 1 to 15 of `A-Z a-z 0-9 . _ -`.
pub fn valid_system_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SYSTEM_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl VolumeId {
    /// A volume id; `system` must be a valid system name (checked by [`VolumeId::parse`]
    /// when read back, and by the directory when systems are configured).
    pub fn new(system: impl Into<String>, pool: Uuid, container: Uuid) -> VolumeId {
        VolumeId {
            system: system.into(),
            pool,
            container,
        }
    }

    /// Parses an id; see the module documentation for the two kinds of errors.
    pub fn parse(id: &str) -> Result<VolumeId, VolumeIdError> {
        if id.is_empty() {
            return Err(VolumeIdError::Empty);
        }
        let Some(rest) = id.strip_prefix(PREFIX) else {
            return Err(VolumeIdError::Foreign(id.to_string()));
        };
        let malformed = |reason: String| VolumeIdError::Malformed {
            id: id.to_string(),
            reason,
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let [system, pool, container] = parts[..] else {
            return Err(malformed(format!(
                "expected 3 parts after v1/, found {}",
                parts.len()
            )));
        };
        if !valid_system_name(system) {
            return Err(malformed(format!(
                "{system:?} is not a DAOS system name (1 to {MAX_SYSTEM_NAME} letters, digits, ., _ or -)"
            )));
        }
        let uuid = |what: &str, text: &str| -> Result<Uuid, VolumeIdError> {
            match Uuid::try_parse(text) {
                // Only the canonical form, so that each volume has exactly one id.
                Ok(u) if u.hyphenated().to_string() == text => Ok(u),
                _ => Err(malformed(format!(
                    "{what} {text:?} is not a lower-case hyphenated UUID"
                ))),
            }
        };
        Ok(VolumeId {
            system: system.to_string(),
            pool: uuid("pool", pool)?,
            container: uuid("container", container)?,
        })
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}/{}/{}",
            self.system,
            self.pool.hyphenated(),
            self.container.hyphenated()
        )
    }
}

impl std::str::FromStr for VolumeId {
    type Err = VolumeIdError;

    fn from_str(s: &str) -> Result<VolumeId, VolumeIdError> {
        VolumeId::parse(s)
    }
}

/// A snapshot of a volume: `v1/<system>/<pool-uuid>/<container-uuid>/<epoch>`, the DAOS
/// snapshot's epoch in decimal (the volume id and one more part, so neither parses as the
/// other).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SnapshotId {
    pub volume: VolumeId,
    pub epoch: u64,
}

impl SnapshotId {
    /// Parses a snapshot id; the errors are [`VolumeId::parse`]'s kinds.
    pub fn parse(id: &str) -> Result<SnapshotId, VolumeIdError> {
        if id.is_empty() {
            return Err(VolumeIdError::Empty);
        }
        if !id.starts_with(PREFIX) {
            return Err(VolumeIdError::Foreign(id.to_string()));
        }
        let malformed = |reason: &str| VolumeIdError::Malformed {
            id: id.to_string(),
            reason: reason.to_string(),
        };
        let (volume, epoch) = id
            .rsplit_once('/')
            .ok_or_else(|| malformed("expected 4 parts after v1/"))?;
        let epoch = match epoch.parse::<u64>() {
            // Only the canonical form: no sign, no leading zeros, not 0.
            Ok(e) if e > 0 && e.to_string() == epoch => e,
            _ => return Err(malformed("the epoch is not a positive decimal number")),
        };
        let volume = VolumeId::parse(volume).map_err(|e| match e {
            VolumeIdError::Malformed { reason, .. } => malformed(&reason),
            other => other,
        })?;
        Ok(SnapshotId { volume, epoch })
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.volume, self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POOL: &str = "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f";
    const CONT: &str = "0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b";

    fn sample() -> VolumeId {
        VolumeId::new(
            "daos_server",
            Uuid::parse_str(POOL).unwrap(),
            Uuid::parse_str(CONT).unwrap(),
        )
    }

    #[test]
    fn formats_and_parses_back() {
        let id = sample();
        let text = id.to_string();
        assert_eq!(text, format!("v1/daos_server/{POOL}/{CONT}"));
        assert_eq!(VolumeId::parse(&text), Ok(id));
        // Within CSI's 128-byte limit even with the longest system name.
        let long = VolumeId::new("a".repeat(MAX_SYSTEM_NAME), Uuid::max(), Uuid::max());
        assert!(long.to_string().len() <= 128);
        assert_eq!(VolumeId::parse(&long.to_string()), Ok(long));
    }

    #[test]
    fn empty_and_foreign_ids() {
        assert_eq!(VolumeId::parse(""), Err(VolumeIdError::Empty));
        for foreign in [
            "reallyfakevolumeid",
            "some-vol-id",
            "V1/daos_server/x/y",
            "v2/daos_server/a/b",
            "/v1/daos_server",
            "v1",
            POOL,
        ] {
            assert!(
                matches!(VolumeId::parse(foreign), Err(VolumeIdError::Foreign(_))),
                "{foreign:?}"
            );
        }
    }

    #[test]
    fn malformed_ids_of_ours() {
        for (bad, why) in [
            ("v1/", "3 parts"),
            ("v1/daos_server", "3 parts"),
            (&format!("v1/daos_server/{POOL}"), "3 parts"),
            (&format!("v1/daos_server/{POOL}/{CONT}/extra"), "3 parts"),
            (&format!("v1//{POOL}/{CONT}"), "system name"),
            (&format!("v1/a b/{POOL}/{CONT}"), "system name"),
            (
                &format!("v1/{}/{POOL}/{CONT}", "s".repeat(16)),
                "system name",
            ),
            (&format!("v1/daos_server/not-a-uuid/{CONT}"), "pool"),
            (
                &format!("v1/daos_server/{POOL}/{}", CONT.to_uppercase()),
                "container",
            ),
            (
                &format!("v1/daos_server/{}/{CONT}", POOL.replace('-', "")),
                "pool",
            ),
            (&format!("v1/daos_server/{{{POOL}}}/{CONT}"), "pool"),
        ] {
            match VolumeId::parse(bad) {
                Err(VolumeIdError::Malformed { reason, .. }) => {
                    assert!(reason.contains(why), "{bad:?}: {reason}")
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn system_names() {
        assert!(valid_system_name("daos_server"));
        assert!(valid_system_name("a.b-c_1"));
        assert!(!valid_system_name(""));
        assert!(!valid_system_name("a/b"));
        assert!(!valid_system_name(&"x".repeat(16)));
        assert!(!valid_system_name("é"));
    }

    fn system_name() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._-]{1,15}"
    }

    proptest! {
        #[test]
        fn any_volume_id_round_trips(sys in system_name(), p in any::<u128>(), c in any::<u128>()) {
            let id = VolumeId::new(sys, Uuid::from_u128(p), Uuid::from_u128(c));
            prop_assert_eq!(VolumeId::parse(&id.to_string()), Ok(id));
        }

        #[test]
        fn random_strings_never_panic_and_are_classified(s in any::<String>()) {
            match VolumeId::parse(&s) {
                Ok(id) => prop_assert_eq!(id.to_string(), s),
                Err(VolumeIdError::Empty) => prop_assert!(s.is_empty()),
                Err(VolumeIdError::Foreign(_)) => prop_assert!(!s.starts_with(PREFIX)),
                Err(VolumeIdError::Malformed { .. }) => prop_assert!(s.starts_with(PREFIX)),
            }
        }

        #[test]
        fn id_like_strings_never_panic(s in "v1/[A-Za-z0-9._/{}-]{0,100}") {
            // Anything that parses is canonical: formatting gives the input back.
            if let Ok(id) = VolumeId::parse(&s) {
                prop_assert_eq!(id.to_string(), s);
            } else {
                let malformed = matches!(VolumeId::parse(&s), Err(VolumeIdError::Malformed { .. }));
                prop_assert!(malformed, "{:?} is ours but not reported malformed", s);
            }
        }

        #[test]
        fn mutated_ids_never_panic(
            sys in system_name(),
            p in any::<u128>(),
            c in any::<u128>(),
            at in any::<prop::sample::Index>(),
            ch in any::<char>(),
            cut in any::<bool>(),
        ) {
            let good = VolumeId::new(sys, Uuid::from_u128(p), Uuid::from_u128(c)).to_string();
            let mut chars: Vec<char> = good.chars().collect();
            let i = at.index(chars.len());
            if cut { chars.truncate(i) } else { chars.insert(i, ch) }
            let s: String = chars.into_iter().collect();
            match VolumeId::parse(&s) {
                Ok(id) => prop_assert_eq!(id.to_string(), s),
                Err(VolumeIdError::Empty) => prop_assert!(s.is_empty()),
                Err(VolumeIdError::Foreign(_)) => prop_assert!(!s.starts_with(PREFIX)),
                Err(VolumeIdError::Malformed { .. }) => prop_assert!(s.starts_with(PREFIX)),
            }
        }
    }

    #[test]
    fn snapshot_ids_round_trip_and_are_not_volume_ids() {
        let v = "v1/daos_server/6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f/0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b";
        let s = SnapshotId::parse(&format!("{v}/42")).unwrap();
        assert_eq!(s.epoch, 42);
        assert_eq!(s.to_string(), format!("{v}/42"));
        assert!(matches!(
            VolumeId::parse(&s.to_string()),
            Err(VolumeIdError::Malformed { .. })
        ));
        assert!(matches!(
            SnapshotId::parse(v),
            Err(VolumeIdError::Malformed { .. })
        ));
        for bad in ["0", "042", "-1", "+1", "x", "", "18446744073709551616"] {
            assert!(
                matches!(
                    SnapshotId::parse(&format!("{v}/{bad}")),
                    Err(VolumeIdError::Malformed { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            SnapshotId::parse("snap-1"),
            Err(VolumeIdError::Foreign(_))
        ));
        assert!(matches!(SnapshotId::parse(""), Err(VolumeIdError::Empty)));
    }
}
