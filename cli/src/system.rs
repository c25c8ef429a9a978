//! `dpufs system ...`: the members (ranks) of the DAOS system, as
//! `dmg system query/stop/start`.

use crate::output::{Out, Table};
use clap::Subcommand;
use dpufs_daos::{EngineRanks, Member, MgmtClient, ServerVersion, Wire};
use serde::Serialize;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum SystemCmd {
    /// Lists the ranks with their state, fabric URI and fault domain.
    Query,
    /// Stops a rank: its targets turn disabled in every pool on it.
    Stop {
        #[arg(long)]
        rank: u32,
    },
    /// Starts a stopped rank again.
    Start {
        #[arg(long)]
        rank: u32,
    },
}

pub async fn run(cmd: SystemCmd, mgmt: &MgmtClient, out: Out) -> anyhow::Result<()> {
    // Rank control is the embedded engine's; real DAOS does this through
    // its control service on each host (dmg system stop/start).
    let ranks = EngineRanks::new(mgmt);
    let (rank, state) = match cmd {
        SystemCmd::Query => return query(mgmt, out).await,
        SystemCmd::Stop { rank } => (rank, ranks.stop(rank).await?),
        SystemCmd::Start { rank } => (rank, ranks.start(rank).await?),
    };
    out.show(&json!({ "rank": rank, "state": state }), |_| {
        println!("rank {rank}: {state}");
    })
}

/// The members, and the DAOS release of the servers (known once the query settled it).
#[derive(Serialize)]
struct Query {
    server_version: Option<ServerVersion>,
    wire: Option<String>,
    members: Vec<Member>,
}

async fn query(mgmt: &MgmtClient, out: Out) -> anyhow::Result<()> {
    let members = mgmt.system_query().await?;
    let server_version = mgmt.server_version();
    let query = Query {
        server_version,
        wire: server_version
            .and_then(|v| Wire::of(&v))
            .map(|w| w.to_string()),
        members,
    };
    out.show(&query, |q| {
        if let (Some(version), Some(wire)) = (&q.server_version, &q.wire) {
            println!("DAOS server {version} (the {wire} management wire)");
        }
        print_members(&q.members);
    })
}

fn print_members(members: &[Member]) {
    let mut t = Table::new(&["Rank", "State", "Fabric URI", "Fault domain"]);
    for m in members {
        t.row([
            m.rank.to_string(),
            m.state.clone(),
            m.fabric_uri.clone(),
            m.fault_domain.clone(),
        ]);
    }
    t.print();
}
