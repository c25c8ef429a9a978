//! DaosSystem → management client, cached per system and rebuilt when the
//! DaosSystem or its TLS Secret changes (keyed by their resourceVersions).

use crate::error::{Error, Result};
use dpufs_api::DaosSystem;
use dpufs_daos::{ClientConfig, EngineContainers, MgmtClient, TlsFiles};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// A cached client and what it was built from.
#[derive(Debug, Clone)]
pub struct SystemClient {
    pub mgmt: MgmtClient,
    pub containers: EngineContainers,
    version: String,
}

/// Clients per DaosSystem name.
pub struct SystemClients {
    kube: Client,
    cache: Mutex<HashMap<String, SystemClient>>,
    tls_root: PathBuf,
    request_timeout: Duration,
}

impl std::fmt::Debug for SystemClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemClients")
            .field("tls_root", &self.tls_root)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl SystemClients {
    /// `tls_root` is where TLS Secrets are written out, one directory per system.
    pub fn new(kube: Client, tls_root: PathBuf) -> SystemClients {
        SystemClients {
            kube,
            cache: Mutex::default(),
            tls_root,
            request_timeout: Duration::from_secs(30),
        }
    }

    /// How long one DAOS call may take, retries included (default 30 s).
    pub fn with_request_timeout(mut self, timeout: Duration) -> SystemClients {
        self.request_timeout = timeout;
        self
    }

    /// The client of the named DaosSystem.
    pub async fn get(&self, name: &str) -> Result<SystemClient> {
        let systems: Api<DaosSystem> = Api::all(self.kube.clone());
        let sys = systems
            .get_opt(name)
            .await?
            .ok_or_else(|| Error::SystemNotFound(name.to_string()))?;
        let secret = match &sys.spec.tls {
            Some(tls) => {
                let api: Api<Secret> =
                    Api::namespaced(self.kube.clone(), &tls.secret_ref.namespace);
                Some(api.get_opt(&tls.secret_ref.name).await?.ok_or_else(|| {
                    Error::SystemConfig {
                        system: name.to_string(),
                        message: format!(
                            "TLS Secret {}/{} not found",
                            tls.secret_ref.namespace, tls.secret_ref.name
                        ),
                    }
                })?)
            }
            None => None,
        };
        let version = format!(
            "{}/{}",
            sys.metadata.resource_version.clone().unwrap_or_default(),
            secret
                .as_ref()
                .and_then(|s| s.metadata.resource_version.clone())
                .unwrap_or_default()
        );
        if let Some(c) = self.cache.lock().expect("lock").get(name)
            && c.version == version
        {
            return Ok(c.clone());
        }
        let cfg_err = |message: String| Error::SystemConfig {
            system: name.to_string(),
            message,
        };
        let mut cfg = ClientConfig::new(sys.spec.endpoints.clone());
        cfg.system = sys.spec.name.clone();
        cfg.request_timeout = self.request_timeout;
        if let Some(secret) = secret {
            let dir = self.tls_root.join(name);
            std::fs::create_dir_all(&dir).map_err(|e| cfg_err(e.to_string()))?;
            // The Secret holds the files gen_certificates.sh writes, under their names.
            for (key, file, mode) in [
                ("daosCA.crt", "daosCA.crt", 0o644),
                ("admin.crt", "admin.crt", 0o644),
                (
                    "admin.key",
                    "admin.key",
                    dpufs_daos::tls::max_key_mode("admin"),
                ),
            ] {
                let data = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .ok_or_else(|| cfg_err(format!("TLS Secret lacks key {key}")))?;
                let path = dir.join(file);
                // Key files are read-only: replace rather than rewrite.
                let _ = std::fs::remove_file(&path);
                std::fs::write(&path, &data.0).map_err(|e| cfg_err(e.to_string()))?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| cfg_err(e.to_string()))?;
            }
            cfg = cfg.with_tls(TlsFiles::in_dir(&dir, "admin"));
        }
        let mgmt = MgmtClient::new(cfg)?;
        let client = SystemClient {
            containers: EngineContainers::new(&mgmt),
            mgmt,
            version,
        };
        self.cache
            .lock()
            .expect("lock")
            .insert(name.to_string(), client.clone());
        Ok(client)
    }
}
