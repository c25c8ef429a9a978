//! `dpufs certs generate DIR`: a DAOS certificate set (CA, admin, agent,
//! server) in DAOS's layout and file modes, for development clusters and tests.
//! `dpufs certs secrets`: the same set, and the node agent's signing key, as Kubernetes
//! Secrets (what the chart's install hook runs, [`secrets`]).
//! `dpufs certs dpu`: the certificates of the control channel between hosts and their DPUs'
//! agents ([`dpu`]).

mod dpu;
mod secrets;

use crate::output::Out;
use clap::Subcommand;
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum CertsCmd {
    /// Writes daosCA.crt/.key, admin, agent and server certificates and keys,
    /// and clients/agent.crt into DIR.
    Generate {
        /// Target directory (created; existing files are replaced).
        dir: PathBuf,
    },
    /// Makes the Secrets a DAOS system and its clients need, in the cluster of the kubeconfig
    /// (or of the pod it runs in): a certificate set (daosCA.crt, server.crt, server.key,
    /// admin.crt, admin.key), the node agent's signing key (agent.key, agent.pub) and, for DPU
    /// mode, the control channel's certificates (ca.crt, agent.crt, agent.key, host.crt,
    /// host.key). A Secret that exists is left as it is, so running it again (an upgrade)
    /// rotates nothing.
    Secrets(secrets::SecretsArgs),
    /// Writes the certificates of the control channel between hosts and the dpufs agents on
    /// their DPUs into DIR: a CA (ca.crt, ca.key), the agents' server pair (agent.crt,
    /// agent.key) for the names and addresses given, and the hosts' client pair (host.crt,
    /// host.key). Keys are written with mode 0600.
    Dpu(dpu::DpuArgs),
}

pub async fn run(cmd: CertsCmd, out: Out) -> anyhow::Result<()> {
    let dir = match cmd {
        CertsCmd::Generate { dir } => dir,
        CertsCmd::Secrets(args) => return secrets::run(args, out).await,
        CertsCmd::Dpu(args) => return dpu::run(args, out),
    };
    dpufs_daos::certs::generate(&dir)
        .map_err(|e| anyhow::anyhow!("generating certificates in {}: {e}", dir.display()))?;
    out.show(
        &json!({ "dir": dir, "components": ["admin", "agent", "server"] }),
        |_| {
            println!("DAOS certificates written to {}:", dir.display());
            println!("  daosCA.crt daosCA.key   the CA (keep the key private)");
            println!("  admin.crt admin.key     for dpufs/dmg (admin commands)");
            println!("  agent.crt agent.key     for agents; clients/agent.crt for servers");
            println!(
                "  server.crt server.key   for the engine: dpufs-engine --tls-dir {}",
                dir.display()
            );
        },
    )
}
