//! `dpufs`: the command line of dpufs. DAOS administration in dmg's terms
//! (`pool`, `cont`, `system`) against a real DAOS management service or the
//! embedded engine, and `up`/`down` for the one-command local stack.

mod acl;
mod bench;
mod certs;
mod cont;
mod output;
mod pool;
mod props;
mod size;
mod system;
mod up;

use anyhow::bail;
use clap::{Args, Parser, Subcommand};
use dpufs_daos::{ClientConfig, MgmtClient, TlsFiles};
use output::Out;
use std::path::Path;
use std::process::ExitCode;

/// dpufs: DAOS volumes for Kubernetes GPU clusters, and its admin tool.
#[derive(Debug, Parser)]
#[command(name = "dpufs", version)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
struct Global {
    /// Management service endpoint, HOST:PORT or unix:/PATH [default: the
    /// one a running `dpufs up` recorded in ./.dpufs/endpoint, else
    /// 127.0.0.1:10001]
    #[arg(long, env = "DPUFS_ENDPOINT", global = true)]
    endpoint: Option<String>,
    /// DAOS system name.
    #[arg(long, env = "DPUFS_SYSTEM", global = true, default_value = dpufs_proto::daos::DEFAULT_SYSTEM)]
    system: String,
    /// Print results as JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Talk plaintext to a server in DAOS's insecure mode (implied for the
    /// engine of `dpufs up`).
    #[arg(long, global = true, conflicts_with = "tls_dir")]
    insecure: bool,
    /// Mutual TLS (DAOS's default) with daosCA.crt, admin.crt and admin.key
    /// from this directory (see `dpufs certs generate`).
    #[arg(
        long,
        env = "DPUFS_TLS_DIR",
        global = true,
        default_value = "/etc/daos/certs"
    )]
    tls_dir: std::path::PathBuf,
}

impl Global {
    /// The endpoint to use: the flag or environment, else what `dpufs up`
    /// recorded here, else DAOS's default port on this host.
    fn target(&self) -> Target {
        if let Some(endpoint) = &self.endpoint {
            return Target {
                endpoint: endpoint.clone(),
                from_up: false,
            };
        }
        match up::recorded_endpoint() {
            Some(endpoint) => Target {
                endpoint,
                from_up: true,
            },
            None => Target {
                endpoint: format!("127.0.0.1:{}", dpufs_proto::daos::DEFAULT_PORT),
                from_up: false,
            },
        }
    }
}

/// Where the management service is.
#[derive(Debug)]
struct Target {
    endpoint: String,
    /// Recorded by `dpufs up`, whose engine is insecure by construction
    /// (plaintext on loopback), so no `--insecure` is needed to reach it.
    from_up: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Pools: create, list, query, destroy, properties, ACLs.
    #[command(subcommand)]
    Pool(pool::PoolCmd),
    /// Containers: create, list, query, destroy, properties, ACLs, owner, snapshots.
    #[command(subcommand)]
    Cont(cont::ContCmd),
    /// System members (ranks): query, stop, start.
    #[command(subcommand)]
    System(system::SystemCmd),
    /// Runs the local stack (engine, default pool and container mounted at ./mnt) until Ctrl-C.
    Up(up::UpArgs),
    /// Stops what an interrupted `dpufs up` left running.
    Down(up::DownArgs),
    /// What the local stack of `dpufs up` runs: engine, pools, containers, worker, mount.
    Status(up::StatusArgs),
    /// DAOS certificates for development clusters and tests.
    #[command(subcommand)]
    Certs(certs::CertsCmd),
    /// Benchmarks side by side: a dpufs mount, the engine's backing directory, peers (the fio
    /// matrix; `bench meta`: metadata and small files).
    Bench(bench::BenchArgs),
}

/// The management client for an endpoint: DAOS's mutual TLS with the admin
/// certificate from `tls_dir`, or plaintext when that is None (insecure mode).
pub fn connect(tls_dir: Option<&Path>, endpoint: &str, system: &str) -> anyhow::Result<MgmtClient> {
    let mut cfg = ClientConfig::new(vec![endpoint.to_string()]);
    cfg.system = system.to_string();
    if let Some(tls_dir) = tls_dir {
        if !tls_dir.join("admin.crt").exists() {
            bail!(
                "no admin certificate in {} for DAOS's mutual TLS: give --tls-dir DIR \
                 (`dpufs certs generate DIR` makes a development set) or --insecure",
                tls_dir.display()
            );
        }
        cfg = cfg.with_tls(TlsFiles::in_dir(tls_dir, "admin"));
    }
    Ok(MgmtClient::new(cfg)?)
}

async fn run(cli: Cli, target: &Target) -> anyhow::Result<()> {
    let g = &cli.global;
    let out = Out { json: g.json };
    let insecure = g.insecure || target.from_up;
    let tls_dir = (!insecure).then_some(g.tls_dir.as_path());
    let client = || connect(tls_dir, &target.endpoint, &g.system);
    match cli.command {
        Command::Pool(cmd) => pool::run(cmd, &client()?, out).await,
        Command::Cont(cmd) => cont::run(cmd, &client()?, out).await,
        Command::System(cmd) => system::run(cmd, &client()?, out).await,
        Command::Up(args) => up::up(args, &g.system).await,
        Command::Down(args) => up::down(args).await,
        Command::Status(args) => up::status(args, &g.system, out).await,
        Command::Certs(cmd) => certs::run(cmd, out).await,
        Command::Bench(args) => bench::run(args).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let target = cli.global.target();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(cli, &target)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::print_error(&e, &target.endpoint);
            ExitCode::FAILURE
        }
    }
}
