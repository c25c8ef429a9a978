//! System membership, leadership and rank control.

use crate::engine::Engine;
use crate::error::{Result, der};
use crate::ranks::{JOINED, Member, STOPPED};
use crate::store::Reader;
use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::ranks::{format_ranks, parse_ranks};
use dpufs_proto::engine::v1 as eng;
use dpufs_proto::mgmt;

/// DAOS 2.8's default system `self_heal` property, which SystemQuery reports: a system
/// without it makes dmg warn that self-healing is disabled.
const SYSTEM_SELF_HEAL: &str = "exclude;pool_exclude;pool_rebuild";

/// The data-plane provider the engine's ranks speak.
pub const PROVIDER: &str = "dpufs+tcp";

impl Engine {
    /// SystemQuery: every rank, filtered by rank set and state mask.
    pub fn system_query(&self, req: mgmt::SystemQueryReq) -> Result<mgmt::SystemQueryResp> {
        let wanted = parse_ranks(&req.ranks)
            .ok_or_else(|| der(Der::Inval, format!("invalid rank set {:?}", req.ranks)))?;
        let members = self.ranks().members();
        let absent: Vec<u32> = wanted
            .iter()
            .copied()
            .filter(|r| !members.iter().any(|m| m.rank == *r))
            .collect();
        let members = members
            .into_iter()
            .filter(|m| wanted.is_empty() || wanted.contains(&m.rank))
            .filter(|m| req.state_mask == 0 || req.state_mask & state(m).1 != 0)
            .map(|m| self.member(m))
            .collect();
        Ok(mgmt::SystemQueryResp {
            members,
            absentranks: if absent.is_empty() {
                String::new()
            } else {
                format_ranks(&absent)
            },
            absenthosts: String::new(),
            data_version: self.store().read(|v| v.data_version())?,
            providers: vec![PROVIDER.into()],
            sys_self_heal_policy: SYSTEM_SELF_HEAL.into(),
        })
    }

    fn member(&self, m: Member) -> mgmt::SystemMember {
        mgmt::SystemMember {
            addr: self.advertise().to_string(),
            uuid: m.uuid.clone(),
            rank: m.rank,
            incarnation: m.incarnation,
            state: state(&m).0.into(),
            fabric_uri: format!("{PROVIDER}://{}", m.endpoint),
            fabric_contexts: self.cfg.targets_per_rank,
            info: String::new(),
            // Each simulated rank stands for a node of its own.
            fault_domain: format!("/rank{}", m.rank),
            // RFC 3339, as DAOS sends it (dmg refuses anything else).
            last_update: rfc3339(m.last_update_unix),
            secondary_fabric_uris: Vec::new(),
        }
    }

    /// LeaderQuery: this engine, or the leader it follows.
    pub fn leader_query(&self, _req: mgmt::LeaderQueryReq) -> Result<mgmt::LeaderQueryResp> {
        Ok(mgmt::LeaderQueryResp {
            current_leader: self.leader().to_string(),
            replicas: self.replicas(),
            down_replicas: Vec::new(),
        })
    }

    /// The management-service leader's address.
    pub fn leader(&self) -> String {
        self.cfg
            .leader
            .clone()
            .unwrap_or_else(|| self.advertise().to_string())
    }

    fn replicas(&self) -> Vec<String> {
        let me = self.advertise().to_string();
        match &self.cfg.leader {
            Some(leader) => vec![leader.clone(), me],
            None => vec![me],
        }
    }

    /// Refuses leader-only work on a replica that does not lead, as DAOS's
    /// `checkLeaderRequest` does, naming the leader.
    pub fn require_leader(&self) -> Result<()> {
        match &self.cfg.leader {
            Some(hint) => Err(crate::error::EngineError::NotLeader {
                hint: hint.clone(),
                replicas: self.replicas(),
            }),
            None => Ok(()),
        }
    }

    /// Stops a rank; its targets turn disabled in every pool on it.
    pub fn rank_stop(&self, req: eng::RankReq) -> Result<eng::RankResp> {
        let m = self
            .ranks()
            .stop(req.rank)
            .ok_or_else(|| unknown_rank(req.rank))?;
        tracing::info!(rank = m.rank, "rank stopped");
        Ok(eng::RankResp {
            rank: m.rank,
            state: state(&m).0.into(),
        })
    }

    /// Starts a stopped rank again.
    pub async fn rank_start(&self, req: eng::RankReq) -> Result<eng::RankResp> {
        let m = self
            .ranks()
            .start_rank(req.rank)
            .await?
            .ok_or_else(|| unknown_rank(req.rank))?;
        tracing::info!(rank = m.rank, endpoint = %m.endpoint, "rank started");
        Ok(eng::RankResp {
            rank: m.rank,
            state: state(&m).0.into(),
        })
    }
}

fn state(m: &Member) -> (&'static str, u32) {
    if m.joined { JOINED } else { STOPPED }
}

fn unknown_rank(rank: u32) -> crate::error::EngineError {
    der(
        Der::Nonexist,
        format!("rank {rank} is not a member of the system"),
    )
}

/// Seconds since the epoch as RFC 3339 in UTC (`2026-11-26T19:53:17Z`).
fn rfc3339(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn member_update_times_are_rfc3339() {
        assert_eq!(super::rfc3339(1_795_721_597), "2026-11-26T19:33:17Z");
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
    }
}
