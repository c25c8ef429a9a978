//! Which DAOS management wire a server speaks (docs/daos-wire-versions.md).
//!
//! A DAOS server accepts an admin tool of its own major.minor only, and no call tells
//! an admin its version. So the client announces the newest wire it speaks; a server
//! of another minor refuses with fault 616, whose description names the server's exact
//! version; when dpufs speaks that release's wire too, the session switches to it and
//! repeats the call. The messages dpufs sends and reads are identical in 2.6 and 2.8
//! except where this module and `MgmtClient::pool_query` say.

use dpufs_proto::daos::props::PropValue;
use dpufs_proto::mgmt::{self, v2_6};
use std::fmt;

/// A DAOS management wire dpufs speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    /// DAOS 2.6: another PoolQueryResp and rebuild-state numbering, and `perf_domain`'s
    /// `group` is 3. (It has no incremental reintegration either: a 2.6 server refuses
    /// that value itself, with DER_INVAL.)
    V2_6,
    /// DAOS 2.8: the wire of `proto/daos/mgmt`, and the one the embedded engine serves.
    V2_8,
}

/// The `perf_domain` pool property (21).
const PERF_DOMAIN: u32 = 21;
/// `perf_domain=group` as DAOS 2.6 and 2.8 number it.
const GROUP_2_6: u64 = 3;
const GROUP_2_8: u64 = 200;

impl Wire {
    /// What the client announces before it knows better.
    pub const NEWEST: Wire = Wire::V2_8;

    /// Every wire dpufs speaks, oldest first.
    pub const ALL: [Wire; 2] = [Wire::V2_6, Wire::V2_8];

    /// The wire of a DAOS release, `None` when dpufs does not speak it.
    pub fn of(version: &ServerVersion) -> Option<Wire> {
        Wire::ALL
            .into_iter()
            .find(|w| w.major_minor() == (version.major, version.minor))
    }

    pub fn major_minor(self) -> (u32, u32) {
        match self {
            Wire::V2_6 => (2, 6),
            Wire::V2_8 => (2, 8),
        }
    }

    /// `2.6 and 2.8`, for messages that say what dpufs speaks.
    pub fn supported() -> String {
        let names: Vec<String> = Wire::ALL.iter().map(Wire::to_string).collect();
        names.join(" and ")
    }

    /// A pool property as this wire carries it; dpufs numbers values as DAOS 2.8 does.
    pub fn prop_to_wire(self, number: u32, value: PropValue) -> PropValue {
        match (self, number, value) {
            (Wire::V2_6, PERF_DOMAIN, PropValue::Num(GROUP_2_8)) => PropValue::Num(GROUP_2_6),
            (_, _, value) => value,
        }
    }

    /// A pool property as this wire carried it, numbered as DAOS 2.8 does.
    pub fn prop_from_wire(self, number: u32, value: PropValue) -> PropValue {
        match (self, number, value) {
            (Wire::V2_6, PERF_DOMAIN, PropValue::Num(GROUP_2_6)) => PropValue::Num(GROUP_2_8),
            (_, _, value) => value,
        }
    }
}

/// A 2.6 PoolQueryResp as the 2.8 message: the dead ranks move from field 21 to 22,
/// the rebuild state is renumbered, and 2.8's additions stay unset.
pub(crate) fn query_resp_from_2_6(r: v2_6::PoolQueryResp) -> mgmt::PoolQueryResp {
    mgmt::PoolQueryResp {
        status: r.status,
        uuid: r.uuid,
        label: r.label,
        total_targets: r.total_targets,
        active_targets: r.active_targets,
        disabled_targets: r.disabled_targets,
        rebuild: r.rebuild.map(rebuild_from_2_6),
        tier_stats: r.tier_stats,
        version: r.version,
        leader: r.leader,
        enabled_ranks: r.enabled_ranks,
        disabled_ranks: r.disabled_ranks,
        total_engines: r.total_engines,
        pool_layout_ver: r.pool_layout_ver,
        upgrade_layout_ver: r.upgrade_layout_ver,
        state: r.state,
        svc_ldr: r.svc_ldr,
        svc_reps: r.svc_reps,
        query_mask: r.query_mask,
        dead_ranks: r.dead_ranks,
        ..Default::default()
    }
}

fn rebuild_from_2_6(r: v2_6::PoolRebuildStatus) -> mgmt::PoolRebuildStatus {
    use mgmt::pool_rebuild_status::State;
    use v2_6::pool_rebuild_status::State as State2_6;
    let state = match State2_6::try_from(r.state) {
        Ok(State2_6::Idle) => State::Idle,
        Ok(State2_6::Done) => State::Done,
        Ok(State2_6::Busy) => State::Busy,
        // 2.6 has no other state; an unknown number is shown as 2.8's "failed" rather
        // than as a state the server did not report.
        Err(_) => State::Failed,
    };
    mgmt::PoolRebuildStatus {
        status: r.status,
        state: state as i32,
        objects: r.objects,
        records: r.records,
        ..Default::default()
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.major_minor();
        write!(f, "{major}.{minor}")
    }
}

/// A DAOS server's version as far as the client knows it: a 2.8 server that accepts
/// the client's announcement never says its patch level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: Option<u32>,
}

impl ServerVersion {
    /// `major.minor.patch`, with DAOS's optional leading `v`.
    pub fn parse(text: &str) -> Option<ServerVersion> {
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Some(major)), Some(Some(minor)), Some(Some(patch)), None) => {
                Some(ServerVersion {
                    major,
                    minor,
                    patch: Some(patch),
                })
            }
            _ => None,
        }
    }

    /// The server's version in the description of a version refusal: fault 616
    /// (`components server:2.6.5 and admin:2.8.0 are not compatible`) or 617
    /// (`versions 2.6.5 and 0.0.0 are not compatible in insecure mode`). DAOS names
    /// the server first in both.
    pub fn from_refusal(description: &str) -> Option<ServerVersion> {
        description
            .split_whitespace()
            .find_map(|word| ServerVersion::parse(word.strip_prefix("server:").unwrap_or(word)))
    }

    /// A server of `wire` whose patch level is unknown.
    pub fn of_wire(wire: Wire) -> ServerVersion {
        let (major, minor) = wire.major_minor();
        ServerVersion {
            major,
            minor,
            patch: None,
        }
    }

    /// The `x-daos-version` to announce to this server: its own version, which passes
    /// DAOS's check in every mode.
    pub fn announce(&self) -> String {
        format!("{}.{}.{}", self.major, self.minor, self.patch.unwrap_or(0))
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.patch {
            Some(patch) => write!(f, "{}.{}.{patch}", self.major, self.minor),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

impl serde::Serialize for ServerVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, patch: u32) -> ServerVersion {
        ServerVersion {
            major,
            minor,
            patch: Some(patch),
        }
    }

    #[test]
    fn the_server_version_is_read_from_both_refusals() {
        let fault_616 = "components server:2.6.5 and admin:2.8.0 are not compatible";
        assert_eq!(ServerVersion::from_refusal(fault_616), Some(v(2, 6, 5)));
        let fault_617 = "versions 2.8.1 and 0.0.0 are not compatible in insecure mode";
        assert_eq!(ServerVersion::from_refusal(fault_617), Some(v(2, 8, 1)));
        assert_eq!(ServerVersion::from_refusal("no version here: 2.6"), None);
        assert_eq!(ServerVersion::parse("v2.6.5"), Some(v(2, 6, 5)));
        for bad in ["2.6", "2.6.5.1", "2.6.x", "2.8.0-rc1", ""] {
            assert_eq!(ServerVersion::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_2_6_and_2_8_have_a_wire() {
        assert_eq!(Wire::of(&v(2, 6, 5)), Some(Wire::V2_6));
        assert_eq!(Wire::of(&v(2, 8, 0)), Some(Wire::V2_8));
        assert_eq!(Wire::of(&v(2, 4, 1)), None);
        assert_eq!(Wire::of(&v(3, 6, 0)), None);
        assert_eq!(Wire::supported(), "2.6 and 2.8");
        assert_eq!(v(2, 6, 5).announce(), "2.6.5");
        assert_eq!(ServerVersion::of_wire(Wire::V2_8).announce(), "2.8.0");
        assert_eq!(ServerVersion::of_wire(Wire::V2_8).to_string(), "2.8");
    }

    /// A 2.6.5 PoolQueryResp, encoded by hand as the 2.6 server does (field 21 the
    /// dead-rank string "[]", rebuild state 1 = done): the 2.8 message cannot decode
    /// it; the 2.6 one can, and becomes the 2.8 facts.
    #[test]
    fn a_2_6_pool_query_answer_decodes_and_is_renumbered() {
        use prost::Message;
        let mut bytes = vec![0x12, 3];
        bytes.extend_from_slice(b"abc"); // 2 uuid
        bytes.extend_from_slice(&[0x20, 8, 0x28, 8]); // 4, 5 targets
        bytes.extend_from_slice(&[0x3a, 2, 0x10, 1]); // 7 rebuild { 2 state = 1 }
        bytes.extend_from_slice(&[0x70, 1]); // 14 total_engines
        bytes.extend_from_slice(&[0xaa, 0x01, 2]); // 21 dead_ranks, length-delimited
        bytes.extend_from_slice(b"[]");
        let err = mgmt::PoolQueryResp::decode(bytes.as_slice()).unwrap_err();
        assert!(err.to_string().contains("invalid wire type"), "{err}");
        let old = v2_6::PoolQueryResp::decode(bytes.as_slice()).expect("2.6 decodes");
        let r = query_resp_from_2_6(old);
        assert_eq!((r.uuid.as_str(), r.total_targets), ("abc", 8));
        assert_eq!((r.dead_ranks.as_str(), r.mem_file_bytes), ("[]", 0));
        let state = |r: &mgmt::PoolQueryResp| r.rebuild.as_ref().map(|rb| rb.state());
        assert_eq!(state(&r), Some(mgmt::pool_rebuild_status::State::Done));
        for (old, new) in [(0, "IDLE"), (1, "DONE"), (2, "BUSY"), (9, "FAILED")] {
            let rb = v2_6::PoolRebuildStatus {
                state: old,
                ..Default::default()
            };
            assert_eq!(rebuild_from_2_6(rb).state().as_str_name(), new, "{old}");
        }
    }

    #[test]
    fn perf_domain_group_is_translated_for_2_6_only() {
        let group = PropValue::Num(GROUP_2_8);
        let to_2_6 = Wire::V2_6.prop_to_wire(PERF_DOMAIN, group.clone());
        assert_eq!(to_2_6, PropValue::Num(3));
        assert_eq!(Wire::V2_6.prop_from_wire(PERF_DOMAIN, to_2_6), group);
        assert_eq!(Wire::V2_8.prop_to_wire(PERF_DOMAIN, group.clone()), group);
        assert_eq!(
            Wire::V2_8.prop_from_wire(PERF_DOMAIN, PropValue::Num(3)),
            PropValue::Num(3)
        );
        // 3 is an ordinary number elsewhere, and root (255) is the same in both.
        assert_eq!(
            Wire::V2_6.prop_from_wire(PERF_DOMAIN + 1, PropValue::Num(3)),
            PropValue::Num(3)
        );
        assert_eq!(
            Wire::V2_6.prop_from_wire(PERF_DOMAIN, PropValue::Num(255)),
            PropValue::Num(255)
        );
    }
}
