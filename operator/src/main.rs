//! `dpufs-operator`: the dpufs controllers. So far it prints the
//! CustomResourceDefinitions of the dpufs kinds.

mod crds;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { out: None } => crds::print(&mut std::io::stdout().lock()),
        Command::Crds { out: Some(dir) } => crds::write(&dir),
    }
}
