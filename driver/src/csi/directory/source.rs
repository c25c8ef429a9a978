//! The `--directory` flag of `dpufs-csi controller` and `dpufs-csi node`: `kubernetes`
//! (a [`KubeDirectory`] through the in-cluster configuration or `$KUBECONFIG`) or the
//! path of a static directory's JSON file.

use super::{ConfigError, Directory, KubeDirectory, KubeDirectoryConfig, StaticDirectory};
use std::path::PathBuf;
use std::sync::Arc;

/// Where a plugin's directory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectorySource {
    /// The DaosSystem, DaosPool and DaosTenant objects of the cluster.
    Kubernetes,
    /// A static directory's JSON file (write `./kubernetes` for a file of that name).
    File(PathBuf),
}

impl std::str::FromStr for DirectorySource {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<DirectorySource, Self::Err> {
        Ok(match s {
            "kubernetes" => DirectorySource::Kubernetes,
            path => DirectorySource::File(PathBuf::from(path)),
        })
    }
}

/// The directory flags of the controller and node plugins.
#[derive(clap::Args, Debug, Clone)]
pub struct DirectoryArgs {
    /// Where the plugin learns DAOS systems, pools and tenants: `kubernetes` (the
    /// DaosSystem, DaosPool and DaosTenant objects, through the in-cluster configuration or
    /// $KUBECONFIG), or a static directory's JSON file (system with its dataEndpoint,
    /// pools, tenants, defaultTenant). docs/csi.md describes both.
    /// (Required; `dpufs-csi node --mode dpu-host` alone goes without, as it reads no
    /// directory.)
    #[arg(long, value_name = "kubernetes|FILE", required = true)]
    pub directory: Option<DirectorySource>,
    /// With `--directory kubernetes`: the DaosTenant of requests that name no namespace
    /// (CSI clients other than Kubernetes); without it they are refused.
    #[arg(long, value_name = "DAOSTENANT")]
    pub default_tenant: Option<String>,
    /// With `--directory kubernetes`: where DaosSystems' TLS Secrets are written out for
    /// the DAOS client, one directory per DaosSystem.
    #[arg(long, default_value = "/tmp/dpufs-csi/tls")]
    pub tls_dir: PathBuf,
    /// Where DAOS's client libraries (libdaos, libdfs) are, for DAOS systems with `backend:
    /// daos`: the controller creates containers through them, nodes' workers mount volumes
    /// through them (docs/real-daos.md).
    #[arg(long, env = "DPUFS_DAOS_LIB", value_name = "DIR")]
    pub daos_lib: Option<PathBuf>,
}

/// Why the directory cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Static(#[from] ConfigError),
    #[error("connecting to the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(
        "--default-tenant is for --directory kubernetes; a directory file names its defaultTenant"
    )]
    DefaultTenantWithFile,
    #[error("--directory is required: kubernetes, or a static directory's JSON file")]
    Missing,
}

impl DirectoryArgs {
    /// The directory the flags name. A Kubernetes one starts its watches on the current
    /// Tokio runtime and is not ready until they have listed everything.
    pub async fn open(&self) -> Result<Arc<dyn Directory>, OpenError> {
        self.open_in(None).await
    }

    /// The same, a Kubernetes directory reading the cluster of `cluster` when given (the DPU
    /// agent under DPF: the dpufs resources live in the host cluster, not in the DPU's).
    pub async fn open_in(
        &self,
        cluster: Option<kube::Client>,
    ) -> Result<Arc<dyn Directory>, OpenError> {
        match self.directory.as_ref().ok_or(OpenError::Missing)? {
            DirectorySource::File(path) => {
                if self.default_tenant.is_some() {
                    return Err(OpenError::DefaultTenantWithFile);
                }
                Ok(Arc::new(StaticDirectory::from_file(
                    path,
                    self.daos_lib.as_deref(),
                )?))
            }
            DirectorySource::Kubernetes => {
                let client = match cluster {
                    Some(client) => client,
                    None => kube::Client::try_default().await?,
                };
                let mut config = KubeDirectoryConfig::new(self.tls_dir.clone());
                config.default_tenant = self.default_tenant.clone();
                config.daos_lib = self.daos_lib.clone();
                Ok(Arc::new(KubeDirectory::start(client, config)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        directory: DirectoryArgs,
    }

    #[test]
    fn kubernetes_or_a_file() {
        let f = Flags::parse_from(["t", "--directory", "kubernetes", "--default-tenant", "a"]);
        assert_eq!(f.directory.directory, Some(DirectorySource::Kubernetes));
        assert_eq!(f.directory.default_tenant.as_deref(), Some("a"));
        assert_eq!(f.directory.tls_dir, PathBuf::from("/tmp/dpufs-csi/tls"));
        let f = Flags::parse_from(["t", "--directory", "/etc/dpufs/directory.json"]);
        assert_eq!(
            f.directory.directory,
            Some(DirectorySource::File("/etc/dpufs/directory.json".into()))
        );
        assert!(
            Flags::try_parse_from(["t"]).is_err(),
            "--directory is required"
        );
    }

    #[tokio::test]
    async fn a_default_tenant_belongs_to_kubernetes() {
        let f = Flags::parse_from(["t", "--directory", "x.json", "--default-tenant", "a"]);
        assert!(matches!(
            f.directory.open().await,
            Err(OpenError::DefaultTenantWithFile)
        ));
    }
}
