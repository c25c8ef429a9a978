//! `dpufs-engine`: runs the embedded DAOS-compatible engine.

use anyhow::{Context, bail};
use clap::Parser;
use dpufs_engine::admission::AdmissionLimits;
use dpufs_engine::dfs_service::fabric::{DataServer, FabricOptions};
use dpufs_engine::server::{router, serve_tcp, serve_tls, serve_unix};
use dpufs_engine::service::EngineServices;
use dpufs_engine::{Engine, EngineConfig};
use dpufs_fabric::soft::DeviceOptions;
use dpufs_fabric::{Provider, ProviderKind};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// The embedded single-node DAOS-compatible engine of dpufs.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Where pools, containers and data live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Management address: `HOST:PORT` (port 0 picks one) or `unix:PATH`.
    #[arg(long, default_value = "127.0.0.1:10001")]
    listen: String,
    /// Serve plaintext h2c with no client authentication (DAOS's insecure mode).
    #[arg(long)]
    insecure: bool,
    /// Directory with daosCA.crt, server.crt and server.key for mutual TLS.
    #[arg(long, conflicts_with = "insecure")]
    tls_dir: Option<PathBuf>,
    /// Storage each rank offers, in bytes (both tiers together).
    #[arg(long, default_value_t = 64 << 30)]
    capacity: u64,
    /// Number of simulated ranks.
    #[arg(long, default_value_t = 1)]
    ranks: u32,
    /// Targets per rank.
    #[arg(long, default_value_t = 4)]
    targets: u32,
    /// Run as a management-service replica that does not lead: answer
    /// LeaderQuery and send every other call to this leader (`HOST:PORT`).
    #[arg(long, value_name = "HOST:PORT")]
    follow: Option<String>,
    /// DAOS system name.
    #[arg(long, default_value = dpufs_proto::daos::DEFAULT_SYSTEM)]
    system: String,
    /// Serve DFS over the fabric, honouring capabilities signed by the node agent whose
    /// public key (PEM) is in this file (repeatable). Without one, no data service runs.
    #[arg(long = "agent-key", value_name = "PEM")]
    agent_keys: Vec<PathBuf>,
    /// Handshake address of the fabric data service (port 0 picks one). The software
    /// device's QPs accept their connections on the same IP (another port): workers on other
    /// nodes connect to both, so give an address they reach, not a wildcard.
    #[arg(long, default_value = "127.0.0.1:0")]
    fabric_listen: SocketAddr,
    /// The fabric provider of the data service: `soft` (the node's software RDMA device) or
    /// `verbs` (the RDMA device $DPUFS_RDMA_DEVICE names, else the first; needs a build with
    /// the `rdma` feature).
    #[arg(long, default_value = "soft")]
    fabric_provider: ProviderKind,
    /// Name of this node's software fabric device (its directory: $DPUFS_FABRIC_DIR or
    /// /dev/shm/dpufs-fabric).
    #[arg(long, default_value = "dpufs-engine")]
    fabric_device: String,
    /// Seconds of clock skew between node agents and this engine tolerated when checking
    /// a capability's expiry.
    #[arg(long, default_value_t = 30)]
    capability_skew_secs: u64,
    /// Milliseconds a management client has from its TCP connect to the end of its TLS
    /// handshake and HTTP/2 preface; a client that takes longer is closed.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    setup_timeout_ms: u64,
    /// Management connections that may be setting up at once; one more is closed at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    max_pending_connections: u64,
}

impl Args {
    fn admission(&self) -> AdmissionLimits {
        AdmissionLimits {
            setup_timeout: std::time::Duration::from_millis(self.setup_timeout_ms),
            max_pending: self.max_pending_connections as usize,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let acceptor = match (&args.tls_dir, args.insecure) {
        (Some(dir), _) => Some(
            dpufs_engine::tls::acceptor(dir)
                .with_context(|| format!("loading the TLS certificates in {}", dir.display()))?,
        ),
        (None, true) => None,
        (None, false) => bail!("give --tls-dir DIR (DAOS's default, mutual TLS) or --insecure"),
    };
    if args.ranks == 0 || args.targets == 0 {
        bail!("--ranks and --targets must be at least 1");
    }
    let mut cfg = EngineConfig::new(args.data_dir.clone());
    cfg.system = args.system.clone();
    cfg.ranks = args.ranks;
    cfg.capacity_per_rank = args.capacity;
    cfg.targets_per_rank = args.targets;
    cfg.leader = args.follow.clone();

    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
    };

    if let Some(path) = args.listen.strip_prefix("unix:") {
        if acceptor.is_some() {
            bail!("TLS is served on TCP only; use --insecure with a unix socket");
        }
        let _ = std::fs::remove_file(path);
        let listener =
            tokio::net::UnixListener::bind(path).with_context(|| format!("binding {path}"))?;
        let engine = start(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let data = start_data(&engine, &args)?;
        announce(&engine, &args.listen)?;
        let services = EngineServices::new(engine.clone());
        let served = serve_unix(router(services)?, listener, shutdown).await;
        stop_data(&engine, data);
        served
    } else {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let local = listener.local_addr()?;
        let engine = start(cfg, local).await?;
        let data = start_data(&engine, &args)?;
        announce(&engine, &local.to_string())?;
        let router = router(EngineServices::new(engine.clone()))?;
        let served = match acceptor {
            Some(acceptor) => {
                serve_tls(router, listener, acceptor, args.admission(), shutdown).await
            }
            None => serve_tcp(router, listener, args.admission(), shutdown).await,
        };
        stop_data(&engine, data);
        served
    }
}

async fn start(cfg: EngineConfig, advertise: SocketAddr) -> anyhow::Result<Arc<Engine>> {
    let data_dir = cfg.data_dir.display().to_string();
    let engine = Engine::start(cfg, advertise)
        .await
        .with_context(|| format!("starting the engine on {data_dir}"))?;
    Ok(Arc::new(engine))
}

/// Starts the fabric data service when agent keys are given, and records its address in
/// `fabric.addr` beside `engine.addr`.
fn start_data(engine: &Arc<Engine>, args: &Args) -> anyhow::Result<Option<Box<dyn DataServer>>> {
    if args.agent_keys.is_empty() {
        return Ok(None);
    }
    let opts = FabricOptions {
        listen: args.fabric_listen,
        provider: Provider::new(
            args.fabric_provider,
            DeviceOptions::new(args.fabric_device.clone()).listening_on(args.fabric_listen.ip()),
        ),
        agent_keys: args.agent_keys.clone(),
        clock_skew: std::time::Duration::from_secs(args.capability_skew_secs),
    };
    let server = dpufs_engine::dfs_service::fabric::serve(engine.clone(), &opts)
        .context("starting the fabric data service")?;
    let addr = server.local_addr();
    std::fs::write(
        engine.config().data_dir.join("fabric.addr"),
        addr.to_string(),
    )?;
    println!("dpufs-engine data service on fabric {addr}");
    Ok(Some(server))
}

/// Stops the fabric data service, then makes every open volume durable so the next start
/// keeps the write verifier (clients' unsynced changes survived: no EIO at their fsync).
fn stop_data(engine: &Engine, data: Option<Box<dyn DataServer>>) {
    if let Some(server) = data
        && let Err(e) = server.shutdown()
    {
        // Requests may still be in flight: sync, but keep no verifier.
        tracing::warn!(
            "stopping the fabric data service: {e}; the next start draws a new write verifier"
        );
        if let Err(e) = engine.sync_volumes() {
            tracing::warn!("{e}");
        }
        return;
    }
    match engine.stop_volumes() {
        Ok(()) => tracing::info!("every open volume is durable; the write verifier is kept"),
        Err(e) => tracing::warn!("{e}; the next start draws a new write verifier"),
    }
}

/// Prints the one line scripts and tests wait for, and records the address.
fn announce(engine: &Engine, addr: &str) -> anyhow::Result<()> {
    std::fs::write(engine.config().data_dir.join("engine.addr"), addr)?;
    println!(
        "dpufs-engine listening on {addr} (system {}, {} rank(s), data in {})",
        engine.config().system,
        engine.config().ranks,
        engine.config().data_dir.display()
    );
    Ok(())
}
