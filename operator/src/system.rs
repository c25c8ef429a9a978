//! The DaosSystem controller: asks the management service who leads it
//! (LeaderQuery) and which ranks it has (SystemQuery), with the credentials
//! of the DaosSystem, and writes what it found as status.
//!
//! [`plan_status`] decides the status from the previous one and what the
//! query returned (pure, unit-tested); [`reconcile`] queries, writes the
//! status with server-side apply only when it changed, and records an event
//! when `Ready` flips.

use crate::Context;
use crate::conditions::set_condition;
use crate::error::{Error, Result};
use crate::pool::publish;
use crate::reconcile::{STALE_RETRY, StatusWrite, apply_status, log_results, measured};
use dpufs_api::{DaosSystem, DaosSystemStatus, condition};
use dpufs_daos::{LeaderInfo, Member, ServerVersion};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use std::sync::Arc;

/// Reason of `Ready=True`.
pub const REACHABLE: &str = "Reachable";

/// What the management service said.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub leader: LeaderInfo,
    pub members: Vec<Member>,
    /// The servers' release as the calls learned it.
    pub server_version: Option<ServerVersion>,
}

/// Why the management service could not be asked, for the condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub message: String,
}

impl Failure {
    /// The condition of a failed query. The message is the error's text; when
    /// the system cannot be reached and the text names no endpoint, the
    /// endpoints are added, so the condition says where the operator looked.
    pub fn of(err: &Error, endpoints: &[String]) -> Failure {
        let reason = err.system_reason();
        let mut message = err.to_string();
        if matches!(reason, "Unreachable" | "TlsRejected")
            && !endpoints.iter().any(|e| message.contains(e.as_str()))
        {
            message = format!("{message} (endpoints {})", endpoints.join(", "));
        }
        Failure { reason, message }
    }
}

/// The status after a query: `observed` is what the management service
/// answered, or why it could not be asked. Returns the status and whether
/// `Ready` changed (a transition worth an event).
///
/// When the query fails, `leader`, `replicas` and `ranks` are cleared: they
/// are unknown, and the printer columns must not show a leader that may be
/// gone.
pub fn plan_status(
    previous: &DaosSystemStatus,
    generation: Option<i64>,
    observed: std::result::Result<&Observation, &Failure>,
) -> (DaosSystemStatus, bool) {
    let mut status = DaosSystemStatus {
        observed_generation: generation,
        conditions: previous.conditions.clone(),
        ..Default::default()
    };
    let changed = match observed {
        Ok(obs) => {
            status.leader = (!obs.leader.leader.is_empty()).then(|| obs.leader.leader.clone());
            status.replicas = obs.leader.replicas.clone();
            status.server_version = obs.server_version.map(|v| v.to_string());
            let mut members = obs.members.clone();
            members.sort_by_key(|m| m.rank);
            status.ranks = members
                .iter()
                .map(|m| {
                    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
                    DaosSystemStatus::rank(m.rank, &m.state, some(&m.addr), some(&m.fault_domain))
                })
                .collect();
            let joined = members
                .iter()
                .filter(|m| m.state.eq_ignore_ascii_case("joined"))
                .count();
            let message = format!(
                "the management service answers; leader {}, {joined} of {} ranks joined",
                status.leader.as_deref().unwrap_or("unknown"),
                members.len()
            );
            set_condition(
                &mut status.conditions,
                condition::READY,
                true,
                REACHABLE,
                &message,
                generation,
            )
        }
        Err(f) => set_condition(
            &mut status.conditions,
            condition::READY,
            false,
            f.reason,
            &f.message,
            generation,
        ),
    };
    (status, changed)
}

/// Asks the management service of `sys` who leads it and which ranks it has.
pub async fn observe(ctx: &Context, sys: &DaosSystem) -> Result<Observation> {
    let client = ctx.systems.get(&sys.name_any()).await?;
    let leader = client.mgmt.leader_query().await?;
    let members = client.mgmt.system_query().await?;
    let server_version = client.mgmt.server_version();
    if let Some(servers) = server_version {
        dpufs_kube::check_servers(&sys.name_any(), &sys.spec.version, servers)?;
    }
    Ok(Observation {
        leader,
        members,
        server_version,
    })
}

fn key(sys: &DaosSystem) -> String {
    format!("DaosSystem/{}", sys.name_any())
}

/// Reconciles one DaosSystem.
pub async fn reconcile(sys: Arc<DaosSystem>, ctx: Arc<Context>) -> Result<Action> {
    measured(&ctx, "DaosSystem", &key(&sys), reconcile_inner(&sys, &ctx)).await
}

async fn reconcile_inner(sys: &DaosSystem, ctx: &Context) -> Result<Action> {
    let api: Api<DaosSystem> = Api::all(ctx.client.clone());
    let previous = sys.status.clone().unwrap_or_default();
    let observed = observe(ctx, sys).await;
    let outcome: std::result::Result<&Observation, Failure> = observed
        .as_ref()
        .map_err(|e| Failure::of(e, &sys.spec.endpoints));
    let (status, changed) = plan_status(
        &previous,
        sys.metadata.generation,
        outcome.as_ref().map(|o| *o),
    );
    if status != previous && apply_status(&api, sys, &status).await? == StatusWrite::Stale {
        return Ok(Action::requeue(STALE_RETRY));
    }
    if changed {
        match &outcome {
            Ok(_) => {
                let note = format!(
                    "the management service answers (leader {})",
                    status.leader.as_deref().unwrap_or("unknown")
                );
                publish(ctx, sys, EventType::Normal, "Ready", note).await;
            }
            Err(f) => publish(ctx, sys, EventType::Warning, f.reason, f.message.clone()).await,
        }
    }
    match observed {
        Ok(_) => Ok(Action::requeue(ctx.system_probe)),
        Err(e) => Err(e),
    }
}

/// Retries a system that could not be queried with backoff, but never less
/// often than the probe interval, so a system that comes back is seen as soon as a
/// healthy one would be.
pub fn error_policy(sys: Arc<DaosSystem>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next(&key(&sys)).min(ctx.system_probe);
    tracing::warn!(system = %sys.name_any(), error = %err, reason = err.system_reason(), ?delay, "DaosSystem query failed");
    Action::requeue(delay)
}

/// Runs the DaosSystem controller until the stream ends.
pub async fn run(ctx: Arc<Context>) {
    let systems: Api<DaosSystem> = Api::all(ctx.client.clone());
    let results =
        Controller::new(systems, watcher::Config::default()).run(reconcile, error_policy, ctx);
    log_results("DaosSystem", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_daos::DaosError;

    fn member(rank: u32, state: &str) -> Member {
        Member {
            rank,
            uuid: format!("u{rank}"),
            state: state.into(),
            addr: "10.0.0.1:10001".into(),
            fabric_uri: String::new(),
            fault_domain: format!("/rank{rank}"),
            incarnation: 1,
        }
    }

    fn obs(members: Vec<Member>) -> Observation {
        Observation {
            leader: LeaderInfo {
                leader: "10.0.0.1:10001".into(),
                replicas: vec!["10.0.0.1:10001".into()],
            },
            members,
            server_version: ServerVersion::parse("2.6.5"),
        }
    }

    fn ready(s: &DaosSystemStatus) -> (String, String, String) {
        let c = crate::conditions::get(&s.conditions, condition::READY).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn answer_sets_leader_ranks_and_ready() {
        let o = obs(vec![member(1, "stopped"), member(0, "joined")]);
        let (s, changed) = plan_status(&DaosSystemStatus::default(), Some(3), Ok(&o));
        assert!(changed);
        assert_eq!(s.leader.as_deref(), Some("10.0.0.1:10001"));
        assert_eq!(s.replicas, vec!["10.0.0.1:10001".to_string()]);
        assert_eq!(s.observed_generation, Some(3));
        let ranks: Vec<(u32, &str)> = s.ranks.iter().map(|r| (r.rank, r.state.as_str())).collect();
        assert_eq!(ranks, vec![(0, "joined"), (1, "stopped")], "sorted by rank");
        assert_eq!(s.ranks[0].address.as_deref(), Some("10.0.0.1:10001"));
        assert_eq!(s.ranks[1].fault_domain.as_deref(), Some("/rank1"));
        assert_eq!(s.server_version.as_deref(), Some("2.6.5"));
        let (st, reason, msg) = ready(&s);
        assert_eq!((st.as_str(), reason.as_str()), ("True", REACHABLE));
        assert!(msg.contains("1 of 2 ranks joined"), "{msg}");

        // The same answer again: nothing changes, so nothing is written.
        let (again, changed) = plan_status(&s, Some(3), Ok(&o));
        assert!(!changed);
        assert_eq!(again, s);
    }

    #[test]
    fn failure_clears_what_is_unknown_and_names_the_endpoint() {
        let o = obs(vec![member(0, "joined")]);
        let (up, _) = plan_status(&DaosSystemStatus::default(), Some(1), Ok(&o));
        let err = Error::Daos(DaosError::Unreachable {
            endpoints: String::new(),
            cause: "connection refused".into(),
        });
        let f = Failure::of(&err, &["10.0.0.9:10001".into()]);
        assert_eq!(f.reason, "Unreachable");
        assert!(f.message.contains("10.0.0.9:10001"), "{}", f.message);
        let (down, changed) = plan_status(&up, Some(1), Err(&f));
        assert!(changed, "Ready flipped");
        assert_eq!(down.leader, None, "the Leader column must not lie");
        assert!(down.replicas.is_empty() && down.ranks.is_empty());
        assert_eq!(ready(&down).0, "False");
        assert_eq!(ready(&down).1, "Unreachable");
        let (still, changed) = plan_status(&down, Some(1), Err(&f));
        assert!(!changed);
        assert_eq!(still, down, "a second failure writes nothing");
        let (back, changed) = plan_status(&down, Some(1), Ok(&o));
        assert!(changed);
        assert_eq!(back.leader.as_deref(), Some("10.0.0.1:10001"));
    }

    #[test]
    fn endpoints_already_named_are_not_repeated() {
        let err = Error::Daos(DaosError::Unreachable {
            endpoints: "10.0.0.9:10001".into(),
            cause: "connection refused".into(),
        });
        let f = Failure::of(&err, &["10.0.0.9:10001".into()]);
        assert_eq!(
            f.message.matches("10.0.0.9:10001").count(),
            1,
            "{}",
            f.message
        );
        let f = Failure::of(&Error::SystemNotFound("s".into()), &["e:1".into()]);
        assert!(!f.message.contains("e:1"));
    }
}
