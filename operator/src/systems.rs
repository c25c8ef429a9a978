//! DaosSystem → management client, cached per system and rebuilt when the
//! DaosSystem's spec (its uid and generation) or its TLS Secret (its
//! resourceVersion) changes.

use crate::error::{Error, Result};
use dpufs_api::DaosSystem;
use dpufs_daos::{ClientConfig, DaosError, EngineContainers, MgmtClient, TlsFiles};
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
        check_version(name, &sys.spec.version)?;
        let secret_name = sys
            .spec
            .tls
            .as_ref()
            .map(|tls| format!("{}/{}", tls.secret_ref.namespace, tls.secret_ref.name))
            .unwrap_or_default();
        let secret = match &sys.spec.tls {
            Some(tls) => {
                let api: Api<Secret> =
                    Api::namespaced(self.kube.clone(), &tls.secret_ref.namespace);
                Some(api.get_opt(&tls.secret_ref.name).await?.ok_or_else(|| {
                    Error::SecretMissing {
                        system: name.to_string(),
                        secret: secret_name.clone(),
                    }
                })?)
            }
            None => None,
        };
        // The spec (generation), not the resourceVersion: the DaosSystem
        // controller's status writes must not rebuild every client.
        let version = format!(
            "{}/{}/{}",
            sys.metadata.uid.clone().unwrap_or_default(),
            sys.metadata.generation.unwrap_or_default(),
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
        let secret_err = |message: String| Error::SecretInvalid {
            system: name.to_string(),
            secret: secret_name.clone(),
            message,
        };
        let mut cfg = ClientConfig::new(sys.spec.endpoints.clone());
        cfg.system = sys.spec.name.clone();
        cfg.request_timeout = self.request_timeout;
        // Endpoints first, so that a configuration error found once the TLS
        // files are in place is about the Secret.
        MgmtClient::new(cfg.clone()).map_err(|e| cfg_err(e.to_string()))?;
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
                    .ok_or_else(|| secret_err(format!("lacks key {key}")))?;
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
        let mgmt = MgmtClient::new(cfg).map_err(|e| match e {
            DaosError::Config(m) => secret_err(m),
            e => e.into(),
        })?;
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

/// Checks `spec.version` against the DAOS release whose management wire dpufs
/// speaks: the same major.minor (DAOS's rule for admin tools), any patch.
pub fn check_version(system: &str, version: &str) -> Result<()> {
    let major_minor = |v: &str| {
        let mut it = v.split('.');
        Some((
            it.next()?.parse::<u32>().ok()?,
            it.next()?.parse::<u32>().ok()?,
        ))
    };
    let wire = major_minor(dpufs_proto::daos::WIRE_VERSION);
    if wire.is_some() && major_minor(version) == wire {
        Ok(())
    } else {
        Err(Error::VersionUnsupported {
            system: system.to_string(),
            version: version.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_need_the_wire_major_minor() {
        assert!(check_version("s", "2.8.0").is_ok());
        assert!(check_version("s", "2.8.5").is_ok());
        for bad in ["2.6.1", "3.8.0", "2", "", "x.y.z"] {
            let e = check_version("s", bad).unwrap_err();
            assert_eq!(e.system_reason(), "VersionIncompatible", "{bad}");
        }
    }
}
