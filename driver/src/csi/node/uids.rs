//! Which uid a tenant's workers run as on this node, for volumes served through DAOS's own
//! libdfs (`backend: daos`): DAOS's agent identifies a process by the uid it connects with,
//! so each tenant needs a uid of its own, the same for all its volumes on this node.
//!
//! A tenant whose DaosTenant names a `uid` gets that one on every node. Otherwise the node
//! plugin takes one from a range it is given (`--tenant-uids 20000-20999`), the lowest free
//! one first. Either way it records the mapping in `<state-dir>/csi/tenant-uids.json` before
//! any worker runs under it: a restarted plugin, or one whose range changed, keeps the uids
//! it gave. Next to the record it writes what the node's `daos_agent` must be told
//! (docs/real-daos.md, "Tenants and uids"): `agent-user-map.yaml`, the `client_user_map` of
//! DAOS 2.8's agent, and `tenant-users.passwd` / `tenant-users.group`, the name-service
//! entries DAOS 2.6's agent needs instead.

use super::record::{load_json, save_json, write_private};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The record's file name in the records directory.
pub const RECORD: &str = "tenant-uids.json";
/// The agent's `client_user_map` (DAOS 2.8 and later).
pub const AGENT_MAP: &str = "agent-user-map.yaml";
/// passwd and group entries for DAOS 2.6's agent, which names uids through the name service.
pub const PASSWD: &str = "tenant-users.passwd";
pub const GROUP: &str = "tenant-users.group";

/// An inclusive range of uids, `FIRST-LAST`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl std::str::FromStr for UidRange {
    type Err = String;

    fn from_str(s: &str) -> Result<UidRange, String> {
        let bad = || format!("uid range {s:?}: expected FIRST-LAST, e.g. 20000-20999");
        let (first, last) = s.split_once('-').ok_or_else(bad)?;
        let (first, last): (u32, u32) = (
            first.trim().parse().map_err(|_| bad())?,
            last.trim().parse().map_err(|_| bad())?,
        );
        if first > last {
            return Err(format!("uid range {s:?}: {first} is above {last}"));
        }
        // Below 1000 are the system's own accounts; u32::MAX is (uid_t)-1, "no change".
        if first < 1000 || last == u32::MAX {
            return Err(format!(
                "uid range {s:?}: tenant uids must be at least 1000 and below {}",
                u32::MAX
            ));
        }
        Ok(UidRange { first, last })
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Why a tenant gets no uid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UidError {
    #[error(
        "this node serves DAOS volumes as a uid of their tenant's and has no uid range for \
         tenants: start the node plugin with --tenant-uids FIRST-LAST"
    )]
    NoRange,
    #[error(
        "every uid of this node's tenant range {range} is taken ({taken} tenants); widen \
         --tenant-uids"
    )]
    Exhausted { range: UidRange, taken: usize },
    #[error("principal {0:?} names no DAOS user (expected name@)")]
    NotAUser(String),
    #[error(
        "uid {uid}, which the DaosTenant of {principal:?} names, is this node's uid of \
         {holder:?} already; give the tenant another uid"
    )]
    Taken {
        uid: u32,
        principal: String,
        holder: String,
    },
    #[error("the tenant uid record {path}: {detail}")]
    Record { path: PathBuf, detail: String },
}

/// What `tenant-uids.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Record {
    /// DAOS user principal (`name@`) → uid.
    uids: BTreeMap<String, u32>,
    /// Uids a principal had before its DaosTenant named another, → that principal: workers
    /// started before may still run as them, so they are never given to another tenant and
    /// stay in the agent's files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    retired: BTreeMap<u32, String>,
}

impl Record {
    /// Every uid given and who has it, retired ones included.
    fn holders(&self) -> impl Iterator<Item = (&str, u32)> {
        let current = self.uids.iter().map(|(p, u)| (p.as_str(), *u));
        current.chain(self.retired.iter().map(|(u, p)| (p.as_str(), *u)))
    }
}

/// The node's tenant uids: the range, and the record of what was given.
#[derive(Debug)]
pub struct TenantUids {
    dir: PathBuf,
    range: Option<UidRange>,
    /// The record as last written; held while a uid is chosen and written.
    record: Mutex<Record>,
}

impl TenantUids {
    /// The uids recorded in `dir` (the records directory), giving new ones from `range`
    /// (none: this node serves no DAOS volume, and says so when asked to).
    pub fn open(dir: &Path, range: Option<UidRange>) -> Result<TenantUids, UidError> {
        let path = dir.join(RECORD);
        let record = load_json::<Record>(&path)
            .map_err(|e| UidError::Record {
                path: path.clone(),
                detail: e.to_string(),
            })?
            .unwrap_or_default();
        Ok(TenantUids {
            dir: dir.to_path_buf(),
            range,
            record: Mutex::new(record),
        })
    }

    /// The uid of `principal`'s workers: `fixed` (what its DaosTenant names) when there is
    /// one, else the one recorded, else the lowest free one of the range; recorded (with the
    /// agent's files) before it is returned. A fixed uid replaces one the node gave before
    /// for new workers; the old one is retired, never given again (workers started before
    /// may still run as it).
    pub fn uid_of(&self, principal: &str, fixed: Option<u32>) -> Result<u32, UidError> {
        let user = user_name(principal)?;
        let mut record = self.record.lock().unwrap_or_else(|p| p.into_inner());
        let recorded = record.uids.get(principal).copied();
        let uid = match (fixed, recorded) {
            (Some(uid), Some(was)) if uid == was => return Ok(uid),
            (None, Some(was)) => return Ok(was),
            (Some(uid), _) => {
                let holder = record.holders().find(|(p, u)| *u == uid && *p != principal);
                if let Some((holder, _)) = holder {
                    return Err(UidError::Taken {
                        uid,
                        principal: principal.to_string(),
                        holder: holder.to_string(),
                    });
                }
                uid
            }
            (None, None) => self.free_uid(&record)?,
        };
        let mut next = record.clone();
        if let Some(was) = recorded {
            next.retired.insert(was, principal.to_string());
        }
        next.retired.remove(&uid);
        next.uids.insert(principal.to_string(), uid);
        self.write(&next)?;
        *record = next;
        tracing::info!(principal, user, uid, "tenant uid given");
        Ok(uid)
    }

    /// The lowest uid of the range no principal has or had.
    fn free_uid(&self, record: &Record) -> Result<u32, UidError> {
        let range = self.range.ok_or(UidError::NoRange)?;
        let taken: std::collections::BTreeSet<u32> = record.holders().map(|(_, u)| u).collect();
        (range.first..=range.last)
            .find(|u| !taken.contains(u))
            .ok_or(UidError::Exhausted {
                range,
                taken: taken.len(),
            })
    }

    /// The agent's files first, the record last: a uid is given once the record holds it.
    fn write(&self, record: &Record) -> Result<(), UidError> {
        super::prepare::make_records_dir(&self.dir).map_err(|e| UidError::Record {
            path: self.dir.clone(),
            detail: e.to_string(),
        })?;
        let files = [
            (AGENT_MAP, agent_user_map(record)),
            (PASSWD, passwd(record)),
            (GROUP, group(record)),
        ];
        for (name, text) in files {
            let path = self.dir.join(name);
            write_private(&path, text.as_bytes()).map_err(|e| UidError::Record {
                path,
                detail: e.to_string(),
            })?;
        }
        let path = self.dir.join(RECORD);
        save_json(&path, record).map_err(|e| UidError::Record {
            path,
            detail: e.to_string(),
        })
    }
}

/// The DAOS user name of a principal: `name@` (or `name@domain`) → `name`.
fn user_name(principal: &str) -> Result<&str, UidError> {
    match principal.split_once('@') {
        Some((name, _)) if !name.is_empty() => Ok(name),
        _ => Err(UidError::NotAUser(principal.to_string())),
    }
}

/// Name → uid, in uid order (principals were checked when they were recorded).
fn users(record: &Record) -> Vec<(&str, u32)> {
    let mut users: Vec<(&str, u32)> = record
        .holders()
        .filter_map(|(p, u)| Some((user_name(p).ok()?, u)))
        .collect();
    users.sort_by_key(|(_, u)| *u);
    users
}

/// The `credential_config` section of a DAOS 2.8 agent's configuration naming every uid.
fn agent_user_map(record: &Record) -> String {
    let mut out = String::from(
        "# Written by dpufs-csi node: the tenant uids of this node, for daos_agent.yml (DAOS 2.8+).\n\
         credential_config:\n  client_user_map:\n",
    );
    for (user, uid) in users(record) {
        out += &format!("    {uid}:\n      user: {user}\n      group: {user}\n");
    }
    out
}

/// passwd(5) lines, one per tenant user, with no login.
fn passwd(record: &Record) -> String {
    users(record)
        .into_iter()
        .map(|(user, uid)| {
            format!("{user}:x:{uid}:{uid}:dpufs tenant:/nonexistent:/usr/sbin/nologin\n")
        })
        .collect()
}

/// group(5) lines, one group per tenant user.
fn group(record: &Record) -> String {
    users(record)
        .into_iter()
        .map(|(user, uid)| format!("{user}:x:{uid}:\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(s: &str) -> UidRange {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_parse_and_refuse_what_no_tenant_may_have() {
        assert_eq!(
            range("20000-20999"),
            UidRange {
                first: 20000,
                last: 20999
            }
        );
        assert_eq!(range("5000-5000").to_string(), "5000-5000");
        for bad in [
            "",
            "20000",
            "a-b",
            "20-10",
            "0-100",
            "999-2000",
            "1000-4294967295",
        ] {
            assert!(bad.parse::<UidRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_tenant_keeps_its_uid_and_the_next_gets_the_lowest_free() {
        let dir = tempfile::tempdir().unwrap();
        let uids = TenantUids::open(dir.path(), Some(range("20001-20003"))).unwrap();
        assert_eq!(uids.uid_of("team-a@", None).unwrap(), 20001);
        assert_eq!(uids.uid_of("team-b@", None).unwrap(), 20002);
        assert_eq!(uids.uid_of("team-a@", None).unwrap(), 20001);
        // A restarted plugin, even with another range, keeps what it gave.
        let again = TenantUids::open(dir.path(), Some(range("30000-30001"))).unwrap();
        assert_eq!(again.uid_of("team-b@", None).unwrap(), 20002);
        assert_eq!(again.uid_of("team-c@", None).unwrap(), 30000);
        assert_eq!(again.record.lock().unwrap().uids.len(), 3);
    }

    #[test]
    fn a_uid_the_tenant_names_wins_and_is_never_shared() {
        let dir = tempfile::tempdir().unwrap();
        // No range at all: named uids need none.
        let uids = TenantUids::open(dir.path(), None).unwrap();
        assert_eq!(uids.uid_of("team-a@", Some(30001)).unwrap(), 30001);
        assert_eq!(uids.uid_of("team-a@", Some(30001)).unwrap(), 30001);
        let err = uids.uid_of("team-b@", Some(30001)).unwrap_err();
        assert!(matches!(err, UidError::Taken { uid: 30001, .. }), "{err}");
        assert!(err.to_string().contains("team-a@"), "{err}");
        // A uid named later replaces the one the node gave.
        let other = tempfile::tempdir().unwrap();
        let ranged = TenantUids::open(other.path(), Some(range("20001-20009"))).unwrap();
        assert_eq!(ranged.uid_of("team-c@", None).unwrap(), 20001);
        assert_eq!(ranged.uid_of("team-c@", Some(30003)).unwrap(), 30003);
        assert_eq!(ranged.uid_of("team-c@", None).unwrap(), 30003);
        // Workers of team-c may still run as 20001: nobody else gets it, and the agent keeps
        // naming it.
        assert_eq!(ranged.uid_of("team-d@", None).unwrap(), 20002);
        let err = ranged.uid_of("team-e@", Some(20001)).unwrap_err();
        assert!(matches!(err, UidError::Taken { uid: 20001, .. }), "{err}");
        let record = ranged.record.lock().unwrap().clone();
        assert_eq!(
            users(&record),
            [("team-c", 20001), ("team-d", 20002), ("team-c", 30003)]
        );
    }

    #[test]
    fn an_exhausted_or_missing_range_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let uids = TenantUids::open(dir.path(), Some(range("20001-20001"))).unwrap();
        uids.uid_of("team-a@", None).unwrap();
        let err = uids.uid_of("team-b@", None).unwrap_err();
        assert!(matches!(err, UidError::Exhausted { taken: 1, .. }), "{err}");
        assert!(err.to_string().contains("--tenant-uids"), "{err}");
        // Refused tenants are not recorded.
        assert_eq!(uids.record.lock().unwrap().uids.len(), 1);
        let none = TenantUids::open(tempfile::tempdir().unwrap().path(), None).unwrap();
        assert_eq!(none.uid_of("team-a@", None).unwrap_err(), UidError::NoRange);
        assert!(matches!(
            uids.uid_of("@", None).unwrap_err(),
            UidError::NotAUser(_)
        ));
    }

    #[test]
    fn the_agent_files_name_every_recorded_uid() {
        let dir = tempfile::tempdir().unwrap();
        let uids = TenantUids::open(dir.path(), Some(range("20001-20009"))).unwrap();
        uids.uid_of("team-b@", None).unwrap();
        uids.uid_of("team-a@example", None).unwrap();
        let read = |name| std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(
            read(AGENT_MAP).lines().skip(1).collect::<Vec<_>>(),
            [
                "credential_config:",
                "  client_user_map:",
                "    20001:",
                "      user: team-b",
                "      group: team-b",
                "    20002:",
                "      user: team-a",
                "      group: team-a",
            ]
        );
        assert_eq!(
            read(PASSWD),
            "team-b:x:20001:20001:dpufs tenant:/nonexistent:/usr/sbin/nologin\n\
             team-a:x:20002:20002:dpufs tenant:/nonexistent:/usr/sbin/nologin\n"
        );
        assert_eq!(read(GROUP), "team-b:x:20001:\nteam-a:x:20002:\n");
        let record: serde_json::Value = serde_json::from_str(&read(RECORD)).unwrap();
        assert_eq!(record["uids"]["team-a@example"], 20002);
    }

    #[test]
    fn a_damaged_record_is_refused_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(RECORD), "{not json").unwrap();
        let err = TenantUids::open(dir.path(), Some(range("20001-20009"))).unwrap_err();
        assert!(matches!(err, UidError::Record { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(RECORD)).unwrap(),
            "{not json"
        );
    }
}
