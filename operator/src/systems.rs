//! DaosSystem → management client, cached per system and rebuilt when the
//! DaosSystem's spec (its uid and generation) or its TLS Secret (its
//! resourceVersion) changes. Building the client is shared with the CSI
//! driver (`dpufs_kube::system_client`); this module looks the DaosSystem up
//! and speaks the operator's [`Error`].

use crate::error::{Error, Result};
use dpufs_api::DaosSystem;
use dpufs_kube::SystemClientCache;
use kube::{Api, Client};
use std::path::PathBuf;
use std::time::Duration;

pub use dpufs_kube::SystemClient;

/// Clients per DaosSystem name.
pub struct SystemClients {
    kube: Client,
    cache: SystemClientCache,
}

impl std::fmt::Debug for SystemClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemClients")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl SystemClients {
    /// `tls_root` is where TLS Secrets are written out, one directory per system.
    pub fn new(kube: Client, tls_root: PathBuf) -> SystemClients {
        SystemClients {
            kube,
            cache: SystemClientCache::new(tls_root),
        }
    }

    /// Where DAOS's client libraries are, for DaosSystems with `backend: daos`.
    pub fn with_daos_lib(mut self, dir: Option<PathBuf>) -> SystemClients {
        self.cache = self.cache.with_daos_lib(dir);
        self
    }

    /// How long one DAOS call may take, retries included (default 30 s).
    pub fn with_request_timeout(mut self, timeout: Duration) -> SystemClients {
        self.cache = self.cache.with_request_timeout(timeout);
        self
    }

    /// The client of the named DaosSystem; the DaosSystem and its Secret are
    /// read on every call, so a change is used by the next reconcile.
    pub async fn get(&self, name: &str) -> Result<SystemClient> {
        let systems: Api<DaosSystem> = Api::all(self.kube.clone());
        let sys = systems
            .get_opt(name)
            .await?
            .ok_or_else(|| Error::SystemNotFound(name.to_string()))?;
        Ok(self.cache.client(&self.kube, &sys).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_kube::SystemClientError;

    #[test]
    fn versions_need_a_spoken_wire() {
        assert!(dpufs_kube::check_version("s", "2.8.5").is_ok());
        assert!(dpufs_kube::check_version("s", "2.6.5").is_ok());
        for bad in ["2.4.1", "3.8.0", "2", "", "x.y.z"] {
            let e = Error::from(dpufs_kube::check_version("s", bad).unwrap_err());
            assert_eq!(e.system_reason(), "VersionIncompatible", "{bad}");
        }
    }

    #[test]
    fn client_errors_keep_their_messages_and_reasons() {
        let cases = [
            (
                SystemClientError::SecretMissing {
                    system: "s".into(),
                    secret: "ns/n".into(),
                },
                "SecretMissing",
            ),
            (
                SystemClientError::SecretInvalid {
                    system: "s".into(),
                    secret: "ns/n".into(),
                    message: "lacks key admin.key".into(),
                },
                "SecretInvalid",
            ),
            (
                SystemClientError::Config {
                    system: "s".into(),
                    message: "m".into(),
                },
                "ConfigInvalid",
            ),
            (
                SystemClientError::Daos(dpufs_daos::DaosError::Config("x".into())),
                "ConfigInvalid",
            ),
        ];
        for (e, reason) in cases {
            let text = e.to_string();
            let e = Error::from(e);
            assert_eq!(e.to_string(), text);
            assert_eq!(e.system_reason(), reason, "{e}");
        }
    }
}
