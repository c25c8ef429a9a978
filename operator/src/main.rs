//! `dpufs-operator`: the dpufs controllers (`run`) and the
//! CustomResourceDefinitions of the dpufs kinds (`crds`).

mod crds;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use dpufs_operator::{Context, health::Liveness, leader::LeaseLock, metrics, run_as_leader};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "dpufs-operator",
    version,
    about = "Kubernetes operator of dpufs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions of DaosSystem, DaosPool,
    /// DaosContainer and DaosTenant as one YAML stream.
    Crds {
        /// Write one file per CRD into this directory instead
        /// (`manifests/crds` in the repository).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Run the DaosSystem, DaosPool, DaosContainer and DaosTenant controllers
    /// (in-cluster config or KUBECONFIG); only the replica holding the Lease
    /// acts.
    Run {
        /// Where /metrics and /healthz are served.
        #[arg(long, default_value = "0.0.0.0:8080", env = "METRICS_ADDR")]
        metrics_addr: String,
        /// Name of the leader-election Lease.
        #[arg(long, default_value = "dpufs-operator")]
        lease_name: String,
        /// Namespace of the Lease (normally the operator's own).
        #[arg(long, default_value = "default", env = "POD_NAMESPACE")]
        lease_namespace: String,
        /// This replica's identity in the Lease.
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Lease duration in seconds; renewed every third of it.
        #[arg(long, default_value_t = 15)]
        lease_seconds: u64,
        /// Where DaosSystem TLS Secrets are written out for the DAOS client.
        #[arg(long, default_value = "/tmp/dpufs-operator/tls")]
        tls_dir: PathBuf,
        /// The directory of DAOS's client libraries (libdfs.so and libdaos), for
        /// DaosSystems with `backend: daos`; the DAOS agent's socket directory comes from
        /// DAOS_AGENT_DRPC_DIR, as for DAOS's own tools.
        #[arg(long, env = "DPUFS_DAOS_LIB")]
        daos_lib: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { out: None } => crds::print(&mut std::io::stdout().lock()),
        Command::Crds { out: Some(dir) } => crds::write(&dir),
        Command::Run {
            metrics_addr,
            lease_name,
            lease_namespace,
            identity,
            lease_seconds,
            tls_dir,
            daos_lib,
        } => tokio::runtime::Runtime::new()?.block_on(run(
            metrics_addr,
            Lease {
                name: lease_name,
                namespace: lease_namespace,
                identity,
                duration: Duration::from_secs(lease_seconds),
            },
            tls_dir,
            daos_lib,
        )),
    }
}

/// The leader-election Lease and this replica's identity in it.
struct Lease {
    name: String,
    namespace: String,
    identity: Option<String>,
    duration: Duration,
}

async fn run(
    metrics_addr: String,
    lease: Lease,
    tls_dir: PathBuf,
    daos_lib: Option<PathBuf>,
) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let mut ctx = Context::new(client.clone(), tls_dir);
    ctx.systems = ctx.systems.with_daos_lib(daos_lib);
    let ctx = Arc::new(ctx);
    let listener = tokio::net::TcpListener::bind(&metrics_addr)
        .await
        .with_context(|| format!("binding {metrics_addr}"))?;
    // Standbys and leader call the API every third of the lease: two leases without an
    // answer mean the loop hangs or the API server is out of reach.
    let liveness = Arc::new(Liveness::new(lease.duration * 2));
    tokio::spawn(metrics::serve(
        listener,
        ctx.metrics.clone(),
        liveness.clone(),
    ));
    let identity = lease
        .identity
        .unwrap_or_else(|| format!("dpufs-operator-{}", uuid::Uuid::new_v4()));
    let lock = LeaseLock::new(
        kube::Api::namespaced(client, &lease.namespace),
        &lease.name,
        &identity,
        lease.duration,
    )
    .with_liveness(liveness);
    tracing::info!(%identity, lease = %lease.name, "waiting for leadership");
    tokio::select! {
        r = run_as_leader(ctx, lock) => match r {
            Ok(()) => Ok(()),
            Err(e) => Err(anyhow::anyhow!("{e}; exiting so that only one replica acts")),
        },
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
