//! DAOS pool and container property numbers (`daos_prop.h`), with the names
//! `dmg`/`daos` use, their value kinds, ranges, defaults and mutability. Both
//! the engine (which enforces them) and the CLI (which parses `name:value`)
//! read this one table.

use std::fmt;

/// A property value as it travels: string or unsigned number.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum PropValue {
    Str(String),
    Num(u64),
}

/// What values a property takes.
#[derive(Debug, Clone, Copy)]
pub enum PropKind {
    /// Free-form string (validated by the owner of the semantics, e.g. labels).
    Str,
    /// Number within an inclusive range.
    Num { min: u64, max: u64 },
    /// One of a set of named numbers.
    Choice(&'static [(&'static str, u64)]),
    /// A bit set of named flags, written `a;b` by DAOS's tools.
    Flags(&'static [(&'static str, u64)]),
}

/// When a property may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// At create and afterwards.
    ReadWrite,
    /// Only at create; immutable afterwards.
    CreateOnly,
    /// Never by a client; the server maintains it.
    ReadOnly,
}

/// One property's definition.
#[derive(Debug, Clone, Copy)]
pub struct PropDef {
    pub number: u32,
    pub name: &'static str,
    pub kind: PropKind,
    pub access: Access,
    /// Value a new pool or container gets when none is given.
    pub default: Option<u64>,
}

/// Why a property value is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropError(pub String);

impl fmt::Display for PropError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PropError {}

const fn num(min: u64, max: u64) -> PropKind {
    PropKind::Num { min, max }
}

const fn def(
    number: u32,
    name: &'static str,
    kind: PropKind,
    access: Access,
    default: Option<u64>,
) -> PropDef {
    PropDef {
        number,
        name,
        kind,
        access,
        default,
    }
}

use Access::{CreateOnly, ReadOnly, ReadWrite};

pub const POOL_LABEL: u32 = 1;
pub const POOL_ACL: u32 = 2;
pub const POOL_OWNER: u32 = 6;
pub const POOL_OWNER_GROUP: u32 = 7;
pub const POOL_SVC_LIST: u32 = 8;
pub const POOL_RD_FAC: u32 = 11;
pub const POOL_SVC_RF: u32 = 19;

/// Pool properties (`enum daos_pool_props`), DAOS 2.8 defaults.
pub const POOL_PROPS: &[PropDef] = &[
    def(POOL_LABEL, "label", PropKind::Str, ReadWrite, None),
    def(3, "space_rb", num(0, 100), ReadWrite, Some(5)),
    def(
        4,
        "self_heal",
        PropKind::Flags(&[("exclude", 1), ("rebuild", 2), ("delay_rebuild", 4)]),
        ReadWrite,
        Some(3),
    ),
    def(
        5,
        "reclaim",
        PropKind::Choice(&[
            ("disabled", 0),
            ("lazy", 1),
            ("snapshot", 2),
            ("batch", 3),
            ("time", 4),
        ]),
        ReadWrite,
        Some(1),
    ),
    def(POOL_OWNER, "owner", PropKind::Str, ReadOnly, None),
    def(POOL_OWNER_GROUP, "group", PropKind::Str, ReadOnly, None),
    def(POOL_SVC_LIST, "svc_list", PropKind::Str, ReadOnly, None),
    def(
        9,
        "ec_cell_sz",
        num(1 << 10, 1 << 30),
        ReadWrite,
        Some(128 << 10),
    ),
    def(
        10,
        "data_thresh",
        num(0, u64::MAX),
        ReadWrite,
        Some(4 << 10),
    ),
    def(POOL_RD_FAC, "rd_fac", num(0, 4), ReadWrite, Some(3)),
    def(12, "ec_pda", num(0, u32::MAX as u64), ReadWrite, Some(1)),
    def(
        13,
        "rp_pda",
        num(0, u32::MAX as u64),
        ReadWrite,
        Some(u32::MAX as u64),
    ),
    def(14, "global_version", num(0, u64::MAX), ReadOnly, Some(4)),
    def(
        15,
        "upgrade_status",
        PropKind::Choice(&[
            ("not started", 0),
            ("in progress", 1),
            ("completed", 2),
            ("failed", 3),
        ]),
        ReadOnly,
        Some(0),
    ),
    def(
        16,
        "scrub",
        PropKind::Choice(&[("off", 0), ("lazy", 1), ("timed", 2)]),
        ReadWrite,
        Some(0),
    ),
    def(17, "scrub_freq", num(0, u64::MAX), ReadWrite, Some(604_800)),
    def(18, "scrub_thresh", num(0, u64::MAX), ReadWrite, Some(0)),
    def(POOL_SVC_RF, "svc_rf", num(0, 4), CreateOnly, Some(2)),
    def(20, "obj_version", num(0, u64::MAX), ReadOnly, Some(1)),
    def(
        21,
        "perf_domain",
        PropKind::Choice(&[("root", 255), ("group", 200)]),
        CreateOnly,
        Some(255),
    ),
    def(
        22,
        "checkpoint",
        PropKind::Choice(&[("disabled", 0), ("timed", 1), ("lazy", 2)]),
        ReadWrite,
        Some(1),
    ),
    def(23, "checkpoint_freq", num(1, 1 << 20), ReadWrite, Some(5)),
    def(24, "checkpoint_thresh", num(10, 75), ReadWrite, Some(50)),
    def(
        25,
        "reintegration",
        PropKind::Choice(&[("data_sync", 0), ("no_data_sync", 1), ("incremental", 2)]),
        ReadWrite,
        Some(0),
    ),
    def(26, "svc_ops_enabled", num(0, 1), ReadWrite, Some(1)),
    def(27, "svc_ops_entry_age", num(60, 600), ReadWrite, Some(300)),
];

pub const CONT_LABEL: u32 = 0x1001;
pub const CONT_LAYOUT_TYPE: u32 = 0x1002;
pub const CONT_RD_FAC: u32 = 0x1007;
pub const CONT_ACL: u32 = 0x100A;
pub const CONT_OWNER: u32 = 0x100D;
pub const CONT_GROUP: u32 = 0x100E;

/// Container layout type of a DFS (POSIX) container.
pub const LAYOUT_POSIX: u64 = 1;

/// dpufs extensions, numbered far above DAOS's container properties so a new DAOS number
/// never clashes. DFS chunk size of the container's files (DAOS sets it at `dfs_cont_create`,
/// `daos cont create --chunk-size`; a libdfs backend passes it there).
pub const CONT_DPUFS_CHUNK_SIZE: u32 = 0x1F01;
/// dpufs extension: bytes the container may hold, 0 for no limit. The embedded engine
/// enforces it (ENOSPC); real DAOS has no container quotas, so there it is advisory.
pub const CONT_DPUFS_QUOTA: u32 = 0x1F02;

/// Container properties (`enum daos_cont_props`) dpufs supports. `rd_fac`'s
/// default is the pool's, so it has none here.
pub const CONT_PROPS: &[PropDef] = &[
    def(CONT_LABEL, "label", PropKind::Str, ReadWrite, None),
    def(
        CONT_LAYOUT_TYPE,
        "layout_type",
        PropKind::Choice(&[
            ("unknown", 0),
            ("POSIX", 1),
            ("HDF5", 2),
            ("PYTHON", 3),
            ("SPARK", 4),
            ("DATABASE", 5),
            ("ROOT", 6),
            ("SEISMIC", 7),
            ("METEO", 8),
        ]),
        CreateOnly,
        Some(0),
    ),
    def(
        0x1003,
        "layout_version",
        num(0, u64::MAX),
        CreateOnly,
        Some(1),
    ),
    def(
        0x1004,
        "cksum",
        PropKind::Choice(&[
            ("off", 0),
            ("crc16", 1),
            ("crc32", 2),
            ("crc64", 3),
            ("sha1", 4),
            ("sha256", 5),
            ("sha512", 6),
            ("adler32", 7),
        ]),
        CreateOnly,
        Some(0),
    ),
    def(
        0x1005,
        "cksum_size",
        num(1, 1 << 30),
        CreateOnly,
        Some(32 << 10),
    ),
    def(
        0x1006,
        "srv_cksum",
        PropKind::Choice(&[("off", 0), ("on", 1)]),
        CreateOnly,
        Some(0),
    ),
    def(CONT_RD_FAC, "rd_fac", num(0, 4), CreateOnly, None),
    def(
        0x1008,
        "rd_lvl",
        PropKind::Choice(&[("rank", 1), ("node", 2), ("pool_fd", 3)]),
        CreateOnly,
        Some(2),
    ),
    def(0x1009, "max_snapshot", num(0, u64::MAX), ReadWrite, Some(0)),
    def(CONT_OWNER, "owner", PropKind::Str, ReadOnly, None),
    def(CONT_GROUP, "group", PropKind::Str, ReadOnly, None),
    def(0x1012, "status", num(0, u64::MAX), ReadOnly, Some(0)),
    def(0x1014, "ec_cell_sz", num(0, 1 << 30), CreateOnly, Some(0)),
    def(
        0x1015,
        "ec_pda",
        num(0, u32::MAX as u64),
        CreateOnly,
        Some(1),
    ),
    def(
        0x1016,
        "rp_pda",
        num(0, u32::MAX as u64),
        CreateOnly,
        Some(u32::MAX as u64),
    ),
    def(
        0x1017,
        "global_version",
        num(0, u64::MAX),
        ReadOnly,
        Some(3),
    ),
    def(
        0x1018,
        "scrub_disabled",
        PropKind::Choice(&[("false", 0), ("true", 1)]),
        ReadWrite,
        Some(0),
    ),
    def(0x1019, "obj_version", num(0, u64::MAX), ReadOnly, Some(1)),
    def(
        CONT_DPUFS_CHUNK_SIZE,
        "dpufs_chunk_size",
        num(4 << 10, 1 << 30),
        CreateOnly,
        Some(1 << 20),
    ),
    def(
        CONT_DPUFS_QUOTA,
        "dpufs_quota",
        num(0, u64::MAX),
        ReadWrite,
        Some(0),
    ),
    def(
        0x101A,
        "perf_domain",
        PropKind::Choice(&[("root", 255), ("group", 200)]),
        CreateOnly,
        Some(255),
    ),
];

/// Looks a property up by number.
pub fn find(table: &'static [PropDef], number: u32) -> Option<&'static PropDef> {
    table.iter().find(|p| p.number == number)
}

/// Looks a property up by its tool name (`rf` is DAOS's alias of `rd_fac`).
pub fn find_by_name(table: &'static [PropDef], name: &str) -> Option<&'static PropDef> {
    let name = if name == "rf" { "rd_fac" } else { name };
    table.iter().find(|p| p.name == name)
}

impl PropDef {
    /// Checks that `value` has the right kind and lies in range.
    pub fn check(&self, value: &PropValue) -> Result<(), PropError> {
        let bad = |why: String| Err(PropError(format!("property {}: {why}", self.name)));
        match (self.kind, value) {
            (PropKind::Str, PropValue::Str(_)) => Ok(()),
            (PropKind::Str, PropValue::Num(_)) => bad("expects a string value".into()),
            (_, PropValue::Str(_)) => bad("expects a numeric value".into()),
            (PropKind::Num { min, max }, PropValue::Num(n)) if (min..=max).contains(n) => Ok(()),
            (PropKind::Num { min, max }, PropValue::Num(n)) => {
                bad(format!("{n} is outside {min}..={max}"))
            }
            (PropKind::Choice(opts), PropValue::Num(n)) if opts.iter().any(|(_, v)| v == n) => {
                Ok(())
            }
            (PropKind::Choice(opts), PropValue::Num(n)) => bad(format!(
                "{n} is not one of {}",
                opts.iter()
                    .map(|(s, v)| format!("{s}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            (PropKind::Flags(flags), PropValue::Num(n)) => {
                let all = flags.iter().fold(0, |acc, (_, v)| acc | v);
                if n & !all == 0 {
                    Ok(())
                } else {
                    bad(format!("{n:#x} has bits outside {all:#x}"))
                }
            }
        }
    }

    /// Parses the text form tools accept: a choice name, `a;b` flags, or a number.
    pub fn parse(&self, text: &str) -> Result<PropValue, PropError> {
        let value = match self.kind {
            PropKind::Str => PropValue::Str(text.to_string()),
            PropKind::Choice(opts) => match opts.iter().find(|(s, _)| s.eq_ignore_ascii_case(text))
            {
                Some((_, v)) => PropValue::Num(*v),
                None => self.parse_number(text)?,
            },
            PropKind::Flags(flags) => self.parse_flags(flags, text)?,
            PropKind::Num { .. } => self.parse_number(text)?,
        };
        self.check(&value)?;
        Ok(value)
    }

    /// The text form of a value: choice and flag names where they exist.
    pub fn display(&self, value: &PropValue) -> String {
        match (self.kind, value) {
            (_, PropValue::Str(s)) => s.clone(),
            (PropKind::Choice(opts), PropValue::Num(n)) => opts
                .iter()
                .find(|(_, v)| v == n)
                .map_or_else(|| n.to_string(), |(s, _)| s.to_string()),
            (PropKind::Flags(flags), PropValue::Num(n)) => flags
                .iter()
                .filter(|(_, v)| n & v != 0)
                .map(|(s, _)| *s)
                .collect::<Vec<_>>()
                .join(";"),
            (_, PropValue::Num(n)) => n.to_string(),
        }
    }

    fn parse_number(&self, text: &str) -> Result<PropValue, PropError> {
        let t = text.trim();
        let parsed = match t.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => t.parse(),
        };
        parsed.map(PropValue::Num).map_err(|_| {
            PropError(format!(
                "property {}: {text:?} is not a valid value",
                self.name
            ))
        })
    }

    fn parse_flags(&self, flags: &[(&str, u64)], text: &str) -> Result<PropValue, PropError> {
        if let Ok(v) = self.parse_number(text) {
            return Ok(v);
        }
        let mut bits = 0;
        for word in text.split(';').map(str::trim).filter(|w| !w.is_empty()) {
            match flags.iter().find(|(s, _)| *s == word) {
                Some((_, v)) => bits |= v,
                None => {
                    return Err(PropError(format!(
                        "property {}: unknown flag {word:?}",
                        self.name
                    )));
                }
            }
        }
        Ok(PropValue::Num(bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_named() {
        for table in [POOL_PROPS, CONT_PROPS] {
            for (i, p) in table.iter().enumerate() {
                assert!(
                    table[i + 1..]
                        .iter()
                        .all(|q| q.number != p.number && q.name != p.name)
                );
                if let Some(d) = p.default {
                    assert_eq!(p.check(&PropValue::Num(d)), Ok(()), "default of {}", p.name);
                }
            }
        }
    }

    #[test]
    fn parses_tool_syntax() {
        let reclaim = find_by_name(POOL_PROPS, "reclaim").unwrap();
        assert_eq!(reclaim.parse("time"), Ok(PropValue::Num(4)));
        assert_eq!(reclaim.display(&PropValue::Num(4)), "time");
        let heal = find_by_name(POOL_PROPS, "self_heal").unwrap();
        assert_eq!(heal.parse("exclude;rebuild"), Ok(PropValue::Num(3)));
        assert_eq!(heal.display(&PropValue::Num(3)), "exclude;rebuild");
        assert!(heal.parse("exclude;nonsense").is_err());
        assert_eq!(find_by_name(POOL_PROPS, "rf").unwrap().number, POOL_RD_FAC);
    }

    #[test]
    fn enforces_ranges() {
        let space_rb = find(POOL_PROPS, 3).unwrap();
        assert!(space_rb.parse("100").is_ok());
        assert!(space_rb.parse("101").is_err());
        let ckpt = find_by_name(POOL_PROPS, "checkpoint_thresh").unwrap();
        assert!(ckpt.check(&PropValue::Num(9)).is_err());
        assert!(ckpt.check(&PropValue::Str("x".into())).is_err());
        let label = find(POOL_PROPS, POOL_LABEL).unwrap();
        assert!(label.check(&PropValue::Num(1)).is_err());
    }
}

/// Conversions between [`PropValue`] and the two generated property oneofs.
macro_rules! oneof_conversions {
    ($value:path) => {
        impl From<PropValue> for $value {
            fn from(v: PropValue) -> Self {
                use $value as V;
                match v {
                    PropValue::Str(s) => V::Strval(s),
                    PropValue::Num(n) => V::Numval(n),
                }
            }
        }

        impl From<$value> for PropValue {
            fn from(v: $value) -> Self {
                use $value as V;
                match v {
                    V::Strval(s) => PropValue::Str(s),
                    V::Numval(n) => PropValue::Num(n),
                }
            }
        }
    };
}

oneof_conversions!(crate::mgmt::pool_property::Value);
oneof_conversions!(crate::engine::v1::cont_property::Value);
